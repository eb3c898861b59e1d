"""Hard negatives of `loss: clip_hn` runs: each training pair's keyword-permuted caption and the batch column it
replaces in its image's row, a pure function of (seed, epoch, batch index), so a resumed run and every DDP rank
rebuild the same ones.

For pair b of a batch (flattened over the WHOLE batch, groups in order, as the losses see it), from a generator
seeded by (seed, epoch, index, HN_STREAM) and three uniforms per pair (a fixed draw count, so one pair's choice
never shifts another's): the concept type among those with a keyword in the pair's text (cglib.data.permute),
the keyword occurrence of that type, and the replaced column among the batch's pairs whose text differs from
b's (its unmasked negatives). A pair without any keyword, or whose batch holds no other text, has no hard
negative (column -1); both are counted per epoch for the run summary.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cglib.data.permute import KeywordPermuter
from cglib.train.sampler import GroupBatch, GroupBatchSampler

HN_STREAM = 21  # generator stream of the hard negatives: distinct from the sampler's (seed, epoch, index, 1)


@dataclass(frozen=True)
class HardNegative:
    """One pair's hard negative: permuted text, concept type, replaced column; text None and column -1: none (kind
    None: no keyword; else no other text in the batch)."""

    text: str | None
    kind: str | None
    column: int


def batch_hard_negatives(batch: GroupBatch, permuter: KeywordPermuter, seed: int) -> list[HardNegative]:
    """Hard negatives of every pair of a whole (unsharded) batch, in flattened order (see the module docstring)."""
    texts = [t for row in batch.texts for t in row]
    identity = {t: k for k, t in enumerate(dict.fromkeys(texts))}
    ids = np.array([identity[t] for t in texts])
    draws = np.random.default_rng([seed, batch.epoch, batch.index, HN_STREAM]).random((len(texts), 3))
    out = []
    for b, text in enumerate(texts):
        kinds = permuter.kinds_in(text)
        if not kinds:
            out.append(HardNegative(None, None, -1))
            continue
        kind = kinds[int(draws[b, 0] * len(kinds))]
        others = np.flatnonzero(ids != ids[b])
        if not len(others):  # every pair of the batch has this text: no negative column to replace
            out.append(HardNegative(None, kind, -1))
            continue
        pick = int(draws[b, 1] * len(permuter.matches(text, kind)))
        out.append(HardNegative(permuter.permute(text, kind, pick), kind, int(others[int(draws[b, 2] * len(others))])))
    return out


@dataclass
class HardNegativePlan:
    """Every hard negative text of a run's epochs (for a frozen tower's text table) and the counts per epoch."""

    permuter: KeywordPermuter
    seed: int
    texts: set[str] = field(default_factory=set)
    epochs: list[dict] = field(default_factory=list)

    def __getstate__(self) -> dict:
        """Pickled for DataLoader workers without the text set, which only the frozen text table needs."""
        return {**self.__dict__, "texts": set()}

    def __call__(self, batch: GroupBatch) -> list[HardNegative]:
        return batch_hard_negatives(batch, self.permuter, self.seed)

    def describe(self) -> dict:
        """The run summary's `hard_negatives`: per-epoch counts and totals (pairs without a keyword included)."""
        totals: Counter = Counter()
        for e in self.epochs:
            totals.update({k: v for k, v in e.items() if isinstance(v, int)})
        return {"relations": self.permuter.source, "pairs": totals["pairs"],
                "with_hard_negative": totals["with_hard_negative"],
                "pairs_without_keyword": totals["without_keyword"],
                "pairs_without_other_text": totals["without_other_text"],
                "by_type": {k: sum(e["by_type"][k] for e in self.epochs) for k in self.permuter.kinds},
                "per_epoch": self.epochs}


def plan_hard_negatives(sampler: GroupBatchSampler, permuter: KeywordPermuter, seed: int, epochs: int
                        ) -> HardNegativePlan:
    """Scan every batch of `epochs` epochs once: the permuted texts and how many pairs got no hard negative."""
    plan = HardNegativePlan(permuter, seed)
    for epoch in range(epochs):
        counts = {"epoch": epoch, "pairs": 0, "with_hard_negative": 0, "without_keyword": 0, "without_other_text": 0,
                  "by_type": dict.fromkeys(permuter.kinds, 0)}
        for batch in sampler.epoch(epoch):
            for hn in plan(batch):
                counts["pairs"] += 1
                if hn.text is not None:
                    counts["with_hard_negative"] += 1
                    counts["by_type"][hn.kind] += 1
                    plan.texts.add(hn.text)
                elif hn.kind is None:
                    counts["without_keyword"] += 1
                else:
                    counts["without_other_text"] += 1
        plan.epochs.append(counts)
    return plan
