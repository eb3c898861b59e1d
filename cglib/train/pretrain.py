"""Textual alignment pretraining (paper Sec. 3.2.4): a text-text contrastive phase before the image-text phase.

Pairs are (source, target): the source is an original caption of a training image, the target a text that
describes the image's group. Two variants (`train.runs[i].pretrain`):
  - "leakage_free" (default): targets are the group's generalized captions only.
  - "with_concepts" (the authors' code): targets also include the l1..l_max concept names of the group's chain.
    Those names are the evaluation queries of the l1-l4 columns, so the run is marked
    `exposed_to_eval_strings: true` in its summary and the results say so.
Only training images' captions are sources (test captions are evaluation strings too).

Each target has an owner: the l1 group whose images it was generalized from (read through
`MagicFile.generalized_texts`), or, for a concept name, its node. A batch holds distinct targets and AT MOST ONE
TARGET PER OWNER, so two targets of one group are never each other's negatives: an epoch lays the targets out
owner after owner (owners and targets in a seeded random order) and deals position p to batch p mod K, K the
number of batches, so an owner's targets land in different batches. Each target is paired with a random caption
of the images it belongs to. The last T - K*B targets of the layout are left out of that epoch (the next
epoch's order differs), as are an owner's targets beyond K (none unless a group has more targets than an epoch
has batches; counted in `describe`). What the sampling cannot rule out: in with_concepts, a concept name (say an
l2 name) and a caption of a group below it are different owners and may still meet as negatives.

The phase trains the text tower only (the image tower is frozen for it), whatever `model.freeze_text` says;
the image-text phase then follows `model.freeze_text`: frozen means the pretrained text tower is frozen and its
embeddings are computed once, as for a run without pretraining.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from cglib.magic.schema import MagicFile
from cglib.train.epochs import EpochOrder

PretrainMode = Literal["leakage_free", "with_concepts"]


def exposed_to_eval_strings(mode: str) -> bool:
    """True when a pretraining variant trains on strings that evaluation later uses as queries."""
    return mode == "with_concepts"


class TextPairSampler:
    """(caption, target) batches, at most one target per owner; a pure function of (seed, epoch, index)."""

    def __init__(self, magic: MagicFile, mode: PretrainMode, batch_size: int, seed: int = 0,
                 split: str = "train") -> None:
        if mode not in ("leakage_free", "with_concepts"):
            raise ValueError(f"pretraining mode must be leakage_free or with_concepts, got {mode!r}")
        sources: dict[str, set[str]] = {}
        owner: dict[str, str] = {}
        for group in sorted(magic.groups(split)):
            images = magic.images_of(group, split)
            for image_id in images:
                for target in magic.generalized_texts(image_id):
                    sources.setdefault(target, set()).update(magic.images[image_id].captions)
                    owner.setdefault(target, group)
            if mode == "with_concepts":
                captions = {c for i in images for c in magic.images[i].captions}
                for node in _chain(magic, group):
                    sources.setdefault(magic.nodes[node].name, set()).update(captions)
                    owner.setdefault(magic.nodes[node].name, node)
        if len(sources) < 2:
            raise ValueError(f"textual pretraining needs at least 2 distinct target texts, found {len(sources)}; "
                             "check that MAGIC has generalized captions or set the run's pretrain: none")
        self.mode, self.seed = mode, seed
        self.targets = sorted(sources)
        self.sources = {t: sorted(sources[t]) for t in self.targets}
        self.owner = owner
        self.owners: dict[str, list[str]] = {}
        for t in self.targets:
            self.owners.setdefault(owner[t], []).append(t)
        if len(self.owners) < 2:
            raise ValueError("textual pretraining needs targets of at least 2 groups (one target per group per "
                             "batch); set the run's pretrain: none")
        self.batch_size = min(batch_size, len(self.owners))
        # K batches need K*B targets with at most K per owner: the largest K with sum(min(n_owner, K)) >= K*B
        sizes = [len(t) for t in self.owners.values()]
        k = len(self.targets) // self.batch_size
        while sum(min(n, k) for n in sizes) // self.batch_size < k:
            k = sum(min(n, k) for n in sizes) // self.batch_size
        self.n_batches = k
        self._cached: tuple[int, list[str]] | None = None

    def __len__(self) -> int:
        """Batches per epoch (K): the targets dealt into full batches."""
        return self.n_batches

    def layout(self, epoch: int) -> list[str]:
        """The epoch's targets owner after owner (seeded order), at most K of each owner (cached)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch, 2])
        names = sorted(self.owners)
        layout = []
        for k in rng.permutation(len(names)):
            mine = self.owners[names[k]]
            layout += [mine[i] for i in rng.permutation(len(mine))][: len(self)]
        self._cached = (epoch, layout)
        return layout

    def batch(self, epoch: int, index: int) -> tuple[list[str], list[str]]:
        """(captions, targets) of batch `index` of `epoch`: distinct targets, at most one per owner."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for an epoch of {len(self)} batches")
        layout = self.layout(epoch)
        targets = [layout[p] for p in range(index, len(layout), len(self))][: self.batch_size]
        rng = np.random.default_rng([self.seed, epoch, index, 3])
        captions = [self.sources[t][int(rng.integers(len(self.sources[t])))] for t in targets]
        return captions, targets

    def all_texts(self) -> list[str]:
        """Every text a batch can hold: the targets and their source captions."""
        return sorted({*self.targets, *(c for t in self.targets for c in self.sources[t])})

    def describe(self) -> dict:
        """Counts for the run summary."""
        over = sum(max(0, len(t) - len(self)) for t in self.owners.values())
        return {"mode": self.mode, "targets": len(self.targets), "owners": len(self.owners),
                "batch_size": self.batch_size, "batches_per_epoch": len(self),
                "targets_left_out_per_epoch": len(self.targets) - len(self) * self.batch_size,
                "owner_targets_beyond_batches": over,
                "exposed_to_eval_strings": exposed_to_eval_strings(self.mode)}


def _chain(magic: MagicFile, group: str) -> list[str]:
    """Node ids l1..l_max of a group along primary parents (shorter when the chain stops)."""
    chain = []
    for level in range(1, magic.l_max + 1):
        try:
            chain.append(magic.ancestor(group, level))
        except ValueError:
            break
    return chain


class PublishedTextPairSampler:
    """The authors' pretraining pairs and batches (train.pretrain_pairs: as_published; their PretrainDataset and
    DataLoader): every training image's every original caption paired with each of the image's generalized captions
    and, with pretrain: with_concepts, with each concept name of its chain (their dataset always adds l1-l4);
    shuffled every epoch and cut into batches of `batch_size`, the last incomplete one dropped. No owner rule:
    a batch may hold one target twice, or two targets of one group, as negatives of each other (their loss masks
    nothing). A pure function of (seed, epoch, index)."""

    def __init__(self, magic: MagicFile, mode: PretrainMode, batch_size: int, seed: int = 0,
                 split: str = "train") -> None:
        if mode not in ("leakage_free", "with_concepts"):
            raise ValueError(f"pretraining mode must be leakage_free or with_concepts, got {mode!r}")
        self.pairs: list[tuple[str, str]] = []
        for group in sorted(magic.groups(split)):
            names = [magic.nodes[node].name for node in _chain(magic, group)] if mode == "with_concepts" else []
            for image_id in magic.images_of(group, split):
                targets = [*magic.generalized_texts(image_id), *names]
                self.pairs += [(caption, target) for caption in magic.images[image_id].captions for target in targets]
        if len(self.pairs) < batch_size:
            raise ValueError(f"the authors' pretraining pairs ({len(self.pairs)}) do not fill one batch of "
                             f"train.pretrain_batch_size = {batch_size}; lower it or set the run's pretrain: none")
        self.mode, self.seed, self.batch_size = mode, seed, batch_size
        self.order = EpochOrder(len(self.pairs), seed, stream=6)

    def __len__(self) -> int:
        return len(self.pairs) // self.batch_size  # their DataLoader: shuffle, drop_last

    def batch(self, epoch: int, index: int) -> tuple[list[str], list[str]]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for an epoch of {len(self)} batches")
        picked = [self.pairs[i] for i in self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]]
        return [c for c, _ in picked], [t for _, t in picked]

    def all_texts(self) -> list[str]:
        return sorted({t for pair in self.pairs for t in pair})

    def describe(self) -> dict:
        return {"mode": self.mode, "pairs": "as_published", "pairs_per_epoch": len(self.pairs),
                "targets": len({t for _, t in self.pairs}), "batch_size": self.batch_size,
                "batches_per_epoch": len(self), "pairs_left_out_per_epoch": len(self.pairs) % self.batch_size,
                "exposed_to_eval_strings": exposed_to_eval_strings(self.mode)}
