"""`loss: re`: the HierarCaps baseline, Radial Embedding alignment of the text tower alone (`cglib.radial`).

A text objective: its runs have no image-text phase. The RE phase (cglib/train/re_run.py: items, batches) embeds
each batch's texts with the trainable text side and calls this objective with them; the regularizer compares
them with the starting tower's embeddings, which the phase computes once and hands over (`reference`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from cglib.config.objectives.radial_embedding import RadialEmbeddingSpec, REOptions
from cglib.train.objectives.base import Objective
from cglib.train.re_run import re_step_loss

__all__ = ["REOptions", "RadialEmbedding"]


class RadialEmbedding(RadialEmbeddingSpec, Objective):

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        o = self.options
        self.weights = {"w_mean": o.w_mean, "w_minimax": o.w_minimax, "w_reg": o.w_reg}
        self.frozen: Tensor | None = None
        self.rows: dict[str, int] = {}

    def reference(self, frozen: Tensor, rows: dict[str, int]) -> None:
        """The starting tower's embedding `frozen[rows[text]]` of every text the phase can meet (the regularizer)."""
        self.frozen, self.rows = frozen, rows

    def forward(self, embed: Callable[[list[str]], torch.Tensor], batch: list) -> dict[str, Tensor]:
        return re_step_loss(embed, batch, self.frozen, self.rows, self.weights)
