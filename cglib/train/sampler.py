"""Group batches (paper Sec. 4): an anchor MAGIC group plus M-1 of its hard-negative groups, N pairs per group.

What an epoch covers, and so which anchor each batch has, is `train.epoch` (epochs.py: "pairs", every training
pair once, or "groups", every group once as the anchor). Each batch is a pure function of (seed, epoch,
position), so a resumed run, every DDP rank and a test all rebuild the same batch from three integers, with no
sampler state to save.

Negatives. The M-1 negatives are drawn at random from the anchor's hard negatives (`Node.hard_negatives`,
threshold `magic.hard_negative_sim`). When there are fewer than M-1, the rest are FALLBACKS, taken in this
order and flagged per group in `GroupBatch.fallback` (the run's log counts them):
  1. the node's own `fallback_negatives` (most similar below the threshold, written by the DAG builder),
  2. other nodes with a recorded `negative_similarity`, most similar first,
  3. groups sharing the nearest ancestor in the MAGIC hierarchy (same l2 parent, then l3, ...), random within
     each tier,
  4. any remaining training group, at random.
Only training groups (with at least one usable training image) are ever drawn.

Pairs. Each group contributes N (image, text) pairs; a text is read only through
`MagicFile.generalized_texts(image)` (text_source "generalized": the image's own generalized captions, or its
l1 node's with magic.generalize: group) or is one of the image's own captions (text_source "original").
  - pairs epoch: the anchor's N pairs are its chunk; each negative group gives N of its pairs, drawn without
    replacement (cycled when it has fewer; repeats counted).
  - groups epoch: images are the group's training images in a seeded random order, cycled when fewer than N
    (every image is used once before any repeats; `GroupBatch.repeated_images` counts the repeats). Texts:
    with node-level captions (magic.generalize: group) the node's captions in a seeded random order, cycled to
    N and paired position by position (they describe the group, so any pairing within it is equally right);
    otherwise one of each sampled image's own texts, at random.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cglib.magic.schema import MagicFile
from cglib.train.epochs import EpochKind, GroupsEpoch, Pair, PairsEpoch, PublishedPairsEpoch, sample_pairs

TextSource = Literal["generalized", "original"]


@dataclass(frozen=True)
class GroupBatch:
    """One batch: M groups (anchor first), N image ids and N texts per group, and how it was built."""

    epoch: int
    index: int
    groups: list[str]
    image_ids: list[list[str]]
    texts: list[list[str]]
    fallback: list[bool]  # per group: True when a negative is a fallback, not a hard negative (anchor: False)
    repeated_images: int = 0  # image slots filled by a repeat because the group has fewer than N images
    meta: dict = field(default_factory=dict)
    # the authors' epoch only: a drawn negative concept has no chunk, their loader item is empty and their loop
    # skips the step; `groups` holds the anchor and the draws, image_ids and texts are empty
    empty: bool = False

    @property
    def anchor(self) -> str:
        return self.groups[0]

    @property
    def used_fallback(self) -> bool:
        """True when any negative group is a flagged fallback."""
        return any(self.fallback)

    @property
    def n_fallback(self) -> int:
        return sum(self.fallback)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.groups), len(self.image_ids[0]) if self.image_ids else 0

    def shard(self, rank: int, world_size: int) -> GroupBatch:
        """The contiguous slice of whole groups that DDP rank `rank` of `world_size` holds."""
        m = len(self.groups)
        if m % world_size:
            raise ValueError(f"train.groups_per_batch ({m}) must be divisible by the number of processes "
                             f"({world_size}) so every rank holds whole groups; change one of them")
        per = m // world_size
        part = slice(rank * per, (rank + 1) * per)
        return GroupBatch(self.epoch, self.index, self.groups[part], self.image_ids[part], self.texts[part],
                          self.fallback[part], self.repeated_images, dict(self.meta, rank=rank), self.empty)


def _cycle(items: list, n: int, rng: np.random.Generator) -> tuple[list, int]:
    """`n` items: a random permutation of `items`, repeated as needed; also the number of repeats."""
    order = [items[i] for i in rng.permutation(len(items))]
    reps = -(-n // len(order))
    return (order * reps)[:n], max(0, n - len(order))


class GroupBatchSampler:
    """Deterministic group batches over the training split of a MAGIC file (see the module docstring)."""

    def __init__(self, magic: MagicFile, groups_per_batch: int, pairs_per_group: int, seed: int = 0,
                 text_source: TextSource = "generalized", available_images: set[str] | None = None,
                 split: str = "train", epoch: EpochKind = "groups") -> None:
        if groups_per_batch < 1 or pairs_per_group < 1:
            raise ValueError(f"train.groups_per_batch ({groups_per_batch}) and train.pairs_per_group "
                             f"({pairs_per_group}) must be at least 1")
        if text_source not in ("generalized", "original"):
            raise ValueError(f"train.text_source must be 'generalized' or 'original', got {text_source!r}")
        if epoch not in ("pairs", "groups", "pairs_as_published"):
            raise ValueError(f"train.epoch must be 'pairs', 'groups' or 'pairs_as_published', got {epoch!r}")
        self.magic = magic
        self.m, self.n, self.seed, self.text_source = groups_per_batch, pairs_per_group, seed, text_source
        self.images: dict[str, list[str]] = {}
        for group in magic.groups(split):
            ids = [i for i in magic.images_of(group, split) if available_images is None or i in available_images]
            if ids:
                self.images[group] = ids
        self.groups = sorted(self.images)
        self.unavailable_images = 0 if available_images is None else sum(
            1 for i in magic.split_ids(split) if i not in available_images)
        if self.m > len(self.groups):
            raise ValueError(f"train.groups_per_batch (M={self.m}) exceeds the number of training groups with "
                             f"usable images ({len(self.groups)}); lower groups_per_batch to at most "
                             f"{len(self.groups)}")
        # texts of each training image, read only through generalized_texts (or the image's own captions)
        self.texts = {i: (magic.generalized_texts(i) if text_source == "generalized" else list(magic.images[i].captions))
                      for ids in self.images.values() for i in ids}
        empty = sorted(i for i, t in self.texts.items() if not t)
        if empty:
            raise ValueError(f"{len(empty)} training images have no generalized captions (first: {empty[0]}); "
                             "rebuild MAGIC with generalized captions or set train.text_source: original")
        # node-level captions (magic.generalize: group) pair with any image of the group: cycled as a group's texts
        self.group_texts = text_source == "generalized" and magic.generalize == "group"
        self.pairs: dict[str, list[Pair]] = {g: [(i, t) for i in ids for t in self.texts[i]]
                                             for g, ids in self.images.items()}
        self._group_set = set(self.groups)
        self._ancestors = {g: self._chain(g) for g in self.groups}
        self._hard = {g: [x for x in magic.negatives(g, include_fallback=False) if x in self._group_set]
                      for g in self.groups}
        if epoch == "pairs_as_published":  # their raw hard-negative lists: the first check counts them unfiltered
            listed = {g: magic.negatives(g, include_fallback=False) for g in self.groups}
            self.plan = PublishedPairsEpoch(self.pairs, self.n, self.m, listed, seed)
            if not len(self.plan):
                raise ValueError(f"the authors' epoch (train.epoch: pairs_as_published) keeps no batch: "
                                 f"{len(self.plan.kept)} concepts have a complete chunk of N={self.n} pairs and M-1="
                                 f"{self.m - 1} such hard negatives; lower pairs_per_group or groups_per_batch")
        else:
            self.plan = PairsEpoch(self.pairs, self.n, seed) if epoch == "pairs" else GroupsEpoch(self.groups, seed)

    # ------------------------------------------------------------------------------------ structure
    def __len__(self) -> int:
        """Batches per epoch: every training pair once in chunks of N (pairs), every group once (groups), or every
        complete chunk of a kept concept once, empty batches included (pairs_as_published)."""
        return len(self.plan)

    @property
    def epoch_kind(self) -> str:
        return self.plan.kind

    @property
    def groups_below_n(self) -> list[str]:
        """Training groups with fewer than N usable images (their images repeat within a batch)."""
        return [g for g in self.groups if len(self.images[g]) < self.n]

    def hard_negatives(self, group: str) -> list[str]:
        """The group's threshold hard negatives that are training groups."""
        return list(self._hard[group])

    def epoch_order(self, epoch: int) -> list[str]:
        """Anchor groups of one epoch's batches, in order."""
        return [self.plan.anchor(epoch, i).group for i in range(len(self))]

    def _fallback_tiers(self, anchor: str, exclude: set[str]) -> list[tuple[list[str], bool]]:
        """Candidate fallbacks in priority tiers; each tier says whether it is shuffled (True) or ordered."""
        node = self.magic.nodes[anchor]
        seen = set(exclude)

        def fresh(ids: list[str]) -> list[str]:
            out = [i for i in ids if i in self._group_set and i not in seen]
            seen.update(out)
            return out

        tiers = [(fresh(list(node.fallback_negatives)), False),
                 (fresh(sorted(node.negative_similarity, key=lambda k: (-node.negative_similarity[k], k))), False)]
        for level, ancestor in self._ancestors[anchor].items():
            tiers.append((fresh([g for g in self.groups if self._ancestors[g].get(level) == ancestor]), True))
        tiers.append((fresh(self.groups), True))
        return tiers

    def _chain(self, group: str) -> dict[int, str]:
        """Ancestors of a group at levels 2..l_max along primary parents (shorter when a chain stops)."""
        chain: dict[int, str] = {}
        for level in range(2, self.magic.l_max + 1):
            try:
                chain[level] = self.magic.ancestor(group, level)
            except ValueError:
                break
        return chain

    # -------------------------------------------------------------------------------------- batches
    def negatives_for(self, anchor: str, rng: np.random.Generator) -> tuple[list[str], list[bool]]:
        """M-1 negative groups of `anchor` and, per group, whether it is a flagged fallback."""
        need = self.m - 1
        hard = self._hard[anchor]
        if len(hard) >= need:
            picked = [hard[i] for i in sorted(rng.choice(len(hard), size=need, replace=False))]
            return picked, [False] * need
        chosen, flags = list(hard), [False] * len(hard)
        for candidates, shuffled in self._fallback_tiers(anchor, exclude={anchor, *hard}):
            if len(chosen) == need:
                break
            if shuffled:
                candidates = [candidates[i] for i in rng.permutation(len(candidates))]
            take = candidates[: need - len(chosen)]
            chosen += take
            flags += [True] * len(take)
        return chosen, flags

    def batch(self, epoch: int, index: int) -> GroupBatch:
        """Batch `index` of `epoch`: a pure function of (seed, epoch, index)."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for an epoch of {len(self)} batches")
        anchor = self.plan.anchor(epoch, index)
        rng = np.random.default_rng([self.seed, epoch, index, 1])
        if self.epoch_kind == "pairs_as_published":  # with replacement, each negative concept's first chunk
            groups = [anchor.group, *self.plan.negatives(anchor.group, rng)]
            if not all(self.plan.has_item(g) for g in groups[1:]):  # their item comes back empty: a skipped step
                return GroupBatch(epoch, index, groups, [], [], [False] * len(groups), empty=True)
            chunks = [anchor.pairs, *(self.plan.first_chunk[g] for g in groups[1:])]
            return GroupBatch(epoch, index, groups, [[i for i, _ in c] for c in chunks], [[t for _, t in c] for c in chunks],
                              [False] * len(groups))
        negatives, flags = self.negatives_for(anchor.group, rng)
        groups = [anchor.group, *negatives]
        image_ids, texts, repeated = [], [], 0
        for k, group in enumerate(groups):
            if self.epoch_kind == "pairs":
                pairs, reps = (anchor.pairs, anchor.padded) if k == 0 else sample_pairs(self.pairs[group], self.n, rng)
                image_ids.append([i for i, _ in pairs])
                texts.append([t for _, t in pairs])
                repeated += reps
                continue
            ids, reps = _cycle(self.images[group], self.n, rng)
            repeated += reps
            image_ids.append(ids)
            if self.group_texts:  # the node's captions: every image of the group has the same list
                texts.append(_cycle(self.texts[ids[0]], self.n, rng)[0])
            else:
                texts.append([self.texts[i][int(rng.integers(len(self.texts[i])))] for i in ids])
        return GroupBatch(epoch, index, groups, image_ids, texts, [False, *flags], repeated)

    def epoch(self, epoch: int, start: int = 0):
        """Batches of one epoch from position `start` (for resuming mid-epoch)."""
        for index in range(start, len(self)):
            yield self.batch(epoch, index)

    def all_texts(self) -> list[str]:
        """Every text a batch can contain, sorted and unique (what a frozen text tower encodes once)."""
        return sorted({t for texts in self.texts.values() for t in texts})

    def describe(self) -> dict:
        """Counts for the run summary: groups, images, hard-negative coverage, small groups."""
        short = sum(1 for g in self.groups if len(self._hard[g]) < self.m - 1)
        dropped = {"dropped_as_published": self.plan.dropped} if isinstance(self.plan, PublishedPairsEpoch) else {}
        return {**dropped, "groups": len(self.groups), "train_images": sum(len(v) for v in self.images.values()),
                "unavailable_train_images": self.unavailable_images,
                "groups_needing_fallback_negatives": short, "groups_below_pairs_per_group": len(self.groups_below_n),
                "groups_per_batch": self.m, "pairs_per_group": self.n, "text_source": self.text_source,
                "epoch": self.epoch_kind, "training_pairs": sum(len(p) for p in self.pairs.values()),
                "batches_per_epoch": len(self)}


def epoch_sizes(magic: MagicFile, groups_per_batch: int, pairs_per_group: int, text_source: TextSource = "generalized",
                available_images: set[str] | None = None, grad_accum: int = 1) -> dict[str, int]:
    """Optimizer steps per image-text epoch under each `train.epoch` kind, for the same data and batch shape."""
    sizes = {}
    for kind in ("pairs", "groups", "pairs_as_published"):
        try:
            sampler = GroupBatchSampler(magic, groups_per_batch, pairs_per_group, 0, text_source, available_images,
                                        epoch=kind)
        except ValueError:  # the authors' epoch can keep no batch on a small world (the error says why)
            sizes[kind] = 0
            continue
        sizes[kind] = -(-len(sampler) // grad_accum)
    return sizes
