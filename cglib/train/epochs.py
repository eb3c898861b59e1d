"""What one image-text epoch covers (`train.epoch`): the anchors of its batches, as a pure function of (seed, epoch).

- "pairs" (the schema default; close to the authors' epoch, which is "pairs_as_published"): every training
  (image, generalized caption) pair once. Each concept's pairs are shuffled (seeded by seed and epoch) and cut
  into chunks of N; each chunk is the anchor group of one batch, and the chunks of all concepts are visited in a
  seeded random order. A concept's last chunk, when shorter than N, is filled up with other pairs of the same
  concept (counted as repeats), so every batch keeps the (M, N) shape. About (number of pairs) / N batches per epoch.
- "groups": one batch per training group, each group the anchor once in a seeded random order; its N pairs are
  drawn when the batch is built (sampler.py). About N times fewer steps than "pairs" at one caption per image.
- "pairs_as_published" (run.protocol: as_published): the authors' TrainConceptDataset, DataLoader and training
  loop (ai-lab-conf/CLEAR_GLASS src/training/data.py, train.py). Each concept's pairs in data order (no shuffle)
  are cut into chunks of N, an incomplete last chunk DROPPED. Their concept lookup holds the concepts with a
  complete chunk and at least M-1 listed hard negatives; a concept whose hard negatives in that lookup number
  fewer than M-1 is DROPPED. Every remaining chunk is one dataset item and one step: `get_dataset` overrides the
  DataLoader's batch size to 1 for training (an item is already a whole batch: the anchor chunk and M-1
  negative chunks, which `train_collate_fn` flattens into M*N rows and the loop slices back into M groups), so
  the chunks are shuffled each epoch and each is the anchor once: steps per epoch = number of chunks. Negatives
  (sampler.py) are drawn WITH replacement from the concept's hard negatives in the lookup, each bringing its
  concept's FIRST chunk. A drawn negative concept that is in the lookup but was itself dropped has no chunk to
  bring: their item comes back empty and their loop skips that step (`continue`, after setting its learning
  rate). Here that step is an EMPTY batch (`GroupBatch.empty`): the step position is kept, no weight changes,
  the schedule advances, and the run counts it (`empty_steps`).
  What cannot be matched: their epoch order is torch's RandomSampler on the global torch RNG and their negative
  draws python `random.choices` inside DataLoader workers seeded from it; ours are seeded numpy streams of (seed,
  epoch) and (seed, epoch, index). The same order and draws give the same batches (tests/test_epoch_as_published).

A pair's text is one of ITS image's generalized captions (`MagicFile.generalized_texts`), or one of its own
original captions with `train.text_source: original`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

EpochKind = Literal["pairs", "groups", "pairs_as_published"]
Pair = tuple[str, str]  # (image id, text)


@dataclass(frozen=True)
class Anchor:
    """The anchor of one batch: its group and, in a pairs epoch, its N pairs (`padded` of them repeats)."""

    group: str
    pairs: list[Pair] | None = None
    padded: int = 0


class EpochOrder:
    """A seeded permutation of `n` items for each epoch, kept for the epoch in progress (a batch asks for its own
    slice of it; drawing the whole permutation per batch would cost O(n) each time)."""

    def __init__(self, n: int, seed: int, stream: int) -> None:
        self.n, self.seed, self.stream = n, seed, stream
        self._cached: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, np.random.default_rng([self.seed, epoch, self.stream]).permutation(self.n))
        return self._cached[1]


class GroupsEpoch:
    """One batch per training group: every group is the anchor once, in a seeded random order."""

    kind = "groups"

    def __init__(self, groups: list[str], seed: int) -> None:
        self.groups, self.seed = list(groups), seed

    def __len__(self) -> int:
        return len(self.groups)

    def order(self, epoch: int) -> list[str]:
        """Anchors of one epoch: every training group once, in a seeded random order."""
        rng = np.random.default_rng([self.seed, epoch])
        return [self.groups[i] for i in rng.permutation(len(self.groups))]

    def anchor(self, epoch: int, index: int) -> Anchor:
        return Anchor(self.order(epoch)[index])


class PairsEpoch:
    """Every training pair once: each group's pairs in seeded chunks of N, chunks of all groups shuffled."""

    kind = "pairs"

    def __init__(self, pairs: dict[str, list[Pair]], n: int, seed: int) -> None:
        self.pairs = {g: sorted(p) for g, p in sorted(pairs.items()) if p}
        self.n, self.seed = n, seed
        self._length = sum(-(-len(p) // n) for p in self.pairs.values())
        self._cached: tuple[int, list[Anchor]] | None = None

    def __len__(self) -> int:
        return self._length

    @property
    def n_pairs(self) -> int:
        return sum(len(p) for p in self.pairs.values())

    def plan(self, epoch: int) -> list[Anchor]:
        """Every anchor chunk of `epoch` in visiting order (cached: a batch asks for its own only)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch, 4])
        chunks: list[Anchor] = []
        for group, pairs in self.pairs.items():
            shuffled = [pairs[i] for i in rng.permutation(len(pairs))]
            for start in range(0, len(shuffled), self.n):
                chunk = shuffled[start:start + self.n]
                padded = self.n - len(chunk)
                if padded:  # fill up with the group's other pairs, a seeded pick, cycling for tiny groups
                    taken = set(chunk)
                    others = [p for p in shuffled if p not in taken] or shuffled
                    fill = [others[i] for i in rng.permutation(len(others))]
                    chunk = chunk + (fill * (-(-padded // len(fill))))[:padded]
                chunks.append(Anchor(group, chunk, padded))
        plan = [chunks[i] for i in rng.permutation(len(chunks))]
        self._cached = (epoch, plan)
        return plan

    def anchor(self, epoch: int, index: int) -> Anchor:
        return self.plan(epoch)[index]


class PublishedPairsEpoch:
    """The authors' epoch (see the module docstring): every complete chunk of a kept concept is an anchor once, in
    a seeded order; a step whose drawn negative concept was dropped is empty."""

    kind = "pairs_as_published"

    def __init__(self, pairs: dict[str, list[Pair]], n: int, m: int, hard: dict[str, list[str]], seed: int) -> None:
        """`pairs` in data order per concept; `hard`: each concept's hard negatives as listed (their JSON's
        `hard_negative`), before any filtering."""
        chunks = {g: [p[s:s + n] for s in range(0, len(p) - n + 1, n)] for g, p in pairs.items()}
        # their concept lookup: concepts with a complete chunk that pass the first check (M-1 listed negatives)
        lookup = [g for g, c in chunks.items() if c and len(hard.get(g, [])) >= m - 1]
        in_lookup = set(lookup)
        self.valid = {g: [h for h in hard.get(g, []) if h in in_lookup] for g in lookup}
        self.kept = [g for g in lookup if len(self.valid[g]) >= m - 1]
        kept = set(self.kept)
        # negatives a kept concept can draw that have no item: drawing one empties the step
        self.empty_candidates = {g: [h for h in self.valid[g] if h not in kept] for g in self.kept}
        self.items = [(g, chunk) for g in self.kept for chunk in chunks[g]]
        self.first_chunk = {g: chunks[g][0] for g in self.kept}
        self.n, self.m, self.seed = n, m, seed
        self.order = EpochOrder(len(self.items), seed, stream=5)
        self.dropped = {"pairs_in_incomplete_chunks": sum(len(p) % n for p in pairs.values()),
                        "concepts_without_m_minus_1_hard_negatives": sum(1 for c in chunks.values() if c) - len(kept),
                        "anchors_that_can_come_back_empty": sum(1 for g, _ in self.items if self.empty_candidates[g]),
                        "expected_empty_steps_per_epoch": round(sum(self.empty_chance(g) for g, _ in self.items), 1)}

    def __len__(self) -> int:
        return len(self.items)  # their DataLoader: batch size 1 (an item is a whole batch), drop_last drops none

    def anchor(self, epoch: int, index: int) -> Anchor:
        group, chunk = self.items[self.order(epoch)[index]]
        return Anchor(group, list(chunk), 0)

    def negatives(self, group: str, rng: np.random.Generator) -> list[str]:
        """M-1 negative concepts of `group`, drawn with replacement from its hard negatives in the lookup."""
        valid = self.valid[group]
        return [valid[i] for i in rng.integers(len(valid), size=self.m - 1)]

    def has_item(self, group: str) -> bool:
        """Whether a drawn negative concept brings a chunk (it was kept); else the step is empty."""
        return group in self.first_chunk

    def empty_chance(self, group: str) -> float:
        """Probability that an anchor of `group` draws at least one negative without a chunk."""
        if not self.empty_candidates[group]:
            return 0.0
        return 1.0 - (1.0 - len(self.empty_candidates[group]) / len(self.valid[group])) ** (self.m - 1)


def sample_pairs(pairs: list[Pair], n: int, rng: np.random.Generator) -> tuple[list[Pair], int]:
    """`n` pairs of a negative group: without replacement when it has enough, else cycled; also the repeats."""
    order = [pairs[i] for i in rng.permutation(len(pairs))]
    if len(order) >= n:
        return order[:n], 0
    return (order * -(-n // len(order)))[:n], n - len(order)
