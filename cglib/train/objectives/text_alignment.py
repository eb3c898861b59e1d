"""Textual alignment pretraining (paper Sec. 3.2.4): the objective of the text phase before the image-text one.

Not a `loss` of its own: a run's `pretrain: leakage_free | with_concepts` adds this phase (cglib/train/pretrain.py
draws its batches). Each caption is pulled toward its target text, every other target of the batch is a negative
(`cglib.losses.text_alignment_loss`, tau = the run's tau).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import Objective

MAX_LOGIT_SCALE = math.log(100)


class TextAlignment(Objective):
    name, label, family = "text_alignment", "textual alignment pretraining", "text"
    phase = "pretrain"

    def __init__(self, spec: dict[str, Any], params: Any = None,
                 logit_scale: Callable[[], Tensor] | None = None, normalize: bool = True) -> None:
        """`logit_scale`: the model's learned scale (train.pretrain_pairs: as_published, their pretrain.py), read
        at each step and clamped to [0, ln 100] after it; None: the fixed tau. `normalize` false: the loss takes the
        text tower's raw outputs (train.pretrain_features: raw, their pretrain.py)."""
        super().__init__(spec, params)
        self.logit_scale = logit_scale
        self.normalize = normalize

    def forward(self, captions: Tensor, targets: Tensor) -> dict[str, Tensor]:
        if self.logit_scale is None:
            return {"loss": losses.text_alignment_loss(captions, targets, tau=self.tau, normalize=self.normalize)}
        scale = self.logit_scale()
        return {"loss": losses.text_alignment_loss(captions, targets, tau=1.0 / scale.exp(),
                                                   normalize=self.normalize),
                "logit_scale": scale.detach().exp()}

    def after_step(self, skipped: bool) -> None:
        if self.logit_scale is not None:
            with torch.no_grad():
                self.logit_scale().clamp_(0, MAX_LOGIT_SCALE)
