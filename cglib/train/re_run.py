"""The HierarCaps baseline as a `train.runs` entry (`loss: re`): Radial Embedding alignment of the text tower.

A run with `loss: re` trains the text side only (the image tower and the logit scale are frozen and referenced
in its weights file): the text tower and its projection, or with `train.text_trains: projection` the projection
alone on precomputed outputs of the frozen tower (`text_phase.py`; the demo) with `cglib.radial.radial_embedding_loss` on RE items
(prepared with the run's inputs, `cglib.prepare.re_items`): the run's `options.data: magic` builds them from this run's MAGIC train split (an image's
concept chain l_max..l1 then one of its captions, `cglib.magic.re_items.re_items_from_magic(magic, "train", run.seed)`; a single
top-level node, having no negative, is left out of the chain: K = l_max), `hierarcaps_train` reads the authors'
hierarchies (`data.hierarcaps_train_csv`). Each step embeds the batch's 2K texts per item and the empty string (the root r, recomputed by the trainable tower every step, so gradients
reach it); the regularizer compares them with the embeddings of the ORIGINAL text tower (the run's starting
weights), computed once for every text before the first update. The tower runs in eval mode throughout (no
dropout, as HierarCaps' CLIP has none), so the regularizer is 0 before the first update. The options `epochs`,
`batch_size`, `lr` and the weights `w_mean`, `w_minimax`, `w_reg` (paper: 1, 1, 10; `REOptions`) are part of
the run's spec. A batch is a pure function of (seed, epoch, index): `REBatchSampler`.

Items from MAGIC name the l1-l4 concepts (the evaluation queries): such a run is `exposed_to_eval_strings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cglib.data.hierarcaps_train import REItem
from cglib.radial import radial_embedding_loss

LOSS_PARTS = ("mean", "minimax", "reg", "angle_pos", "angle_neg")  # logged as re_<part> in log.csv


class REBatchSampler:
    """Batches of RE items: each epoch a seeded permutation cut into batches (the last may be smaller)."""

    def __init__(self, items: list[REItem], batch_size: int, seed: int = 0) -> None:
        if not items:
            raise ValueError("no RE items to train on")
        tiers = {len(item.positives) for item in items}
        if len(tiers) != 1:
            raise ValueError(f"RE items with different numbers of tiers {sorted(tiers)} cannot share a batch")
        self.items, self.seed = items, seed
        self.batch_size = min(batch_size, len(items))
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return math.ceil(len(self.items) / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, np.random.default_rng([self.seed, epoch, 5]).permutation(len(self.items)))
        return self._cached[1]

    def batch(self, epoch: int, index: int) -> list[REItem]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for an epoch of {len(self)} batches")
        rows = self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        return [self.items[int(r)] for r in rows]

    def all_texts(self) -> list[str]:
        """Every text a batch can hold (the frozen tower embeds each once)."""
        return sorted({t for item in self.items for t in (*item.positives, *item.negatives)})

    def describe(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "batches_per_epoch": len(self), "distinct_texts": len(self.all_texts())}


def re_texts(batch: list[REItem]) -> list[str]:
    """The texts one step embeds: every positive, then every negative, then "" (the root r)."""
    return [t for item in batch for t in item.positives] + [t for item in batch for t in item.negatives] + [""]


def re_step_loss(embed: Callable[[list[str]], torch.Tensor], batch: list[REItem], frozen: torch.Tensor,
                 rows: dict[str, int], weights: dict[str, float]) -> dict[str, torch.Tensor]:
    """The RE loss of one batch and its parts (mean, minimax, reg, angle_pos, angle_neg).

    `embed` maps texts to unit-norm embeddings by the trainable text side (the tower, or the projection of
    precomputed tower outputs); `frozen[rows[text]]` is the starting tower's embedding of a text.
    """
    b, k = len(batch), len(batch[0].positives)
    text = embed(re_texts(batch))
    root, positives, negatives = text[-1], text[:b * k].reshape(b, k, -1), text[b * k:2 * b * k].reshape(b, k, -1)
    index = torch.tensor([[rows[t] for t in item.positives] for item in batch] +
                         [[rows[t] for t in item.negatives] for item in batch], device=frozen.device)
    star = frozen[index]
    return radial_embedding_loss(root, positives, negatives, star[:b], star[b:], return_parts=True, **weights)
