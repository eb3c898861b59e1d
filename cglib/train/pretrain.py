"""Textual alignment pretraining (paper Sec. 3.2.4): a text-text contrastive phase before the image-text phase.

Pairs are (source, target): the source is an original caption of a training image, the target a text that
describes the image's group. Two variants (`train.runs[i].pretrain`):
  - "leakage_free" (default): targets are the group's generalized captions only.
  - "with_concepts" (the authors' code): targets also include the l1..l_max concept names of the group's chain.
    Those names are the evaluation queries of the l1-l4 columns, so the run is marked
    `exposed_to_eval_strings: true` in its summary and the results say so.
Only training images' captions are sources (test captions are evaluation strings too).

Batches hold DISTINCT targets: an epoch visits every target once in a seeded random order, each paired with a
random caption from under it, so no pair in a batch is another pair's false negative (many captions share one
concept name). The last incomplete batch of an epoch is dropped (the next epoch's order differs).

The phase trains the text tower only (the image tower is frozen for it), whatever `model.freeze_text` says;
the image-text phase then follows `model.freeze_text`: frozen means the pretrained text tower is frozen and its
embeddings are computed once, as for a run without pretraining.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from cglib.magic.schema import MagicFile

PretrainMode = Literal["leakage_free", "with_concepts"]


def exposed_to_eval_strings(mode: str) -> bool:
    """True when a pretraining variant trains on strings that evaluation later uses as queries."""
    return mode == "with_concepts"


class TextPairSampler:
    """(caption, target) batches with distinct targets; a pure function of (seed, epoch, index)."""

    def __init__(self, magic: MagicFile, mode: PretrainMode, batch_size: int, seed: int = 0,
                 split: str = "train") -> None:
        if mode not in ("leakage_free", "with_concepts"):
            raise ValueError(f"pretraining mode must be leakage_free or with_concepts, got {mode!r}")
        sources: dict[str, set[str]] = {}
        for group in magic.groups(split):
            captions = {c for i in magic.images_of(group, split) for c in magic.images[i].captions}
            targets = list(magic.nodes[group].generalized_captions)
            if mode == "with_concepts":
                targets += [magic.nodes[node].name for node in _chain(magic, group)]
            for target in targets:
                sources.setdefault(target, set()).update(captions)
        if len(sources) < 2:
            raise ValueError(f"textual pretraining needs at least 2 distinct target texts, found {len(sources)}; "
                             "check that MAGIC has generalized captions or set the run's pretrain: none")
        self.mode, self.seed = mode, seed
        self.targets = sorted(sources)
        self.sources = {t: sorted(sources[t]) for t in self.targets}
        self.batch_size = min(batch_size, len(self.targets))

    def __len__(self) -> int:
        """Batches per epoch (the incomplete last batch is dropped)."""
        return len(self.targets) // self.batch_size

    def batch(self, epoch: int, index: int) -> tuple[list[str], list[str]]:
        """(captions, targets) of batch `index` of `epoch`; targets are distinct."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for an epoch of {len(self)} batches")
        order = np.random.default_rng([self.seed, epoch, 2]).permutation(len(self.targets))
        targets = [self.targets[i] for i in order[index * self.batch_size:(index + 1) * self.batch_size]]
        rng = np.random.default_rng([self.seed, epoch, index, 3])
        captions = [self.sources[t][int(rng.integers(len(self.sources[t])))] for t in targets]
        return captions, targets

    def describe(self) -> dict:
        """Counts for the run summary."""
        return {"mode": self.mode, "targets": len(self.targets), "batch_size": self.batch_size,
                "batches_per_epoch": len(self),
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
