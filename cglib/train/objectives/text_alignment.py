"""Textual alignment pretraining (paper Sec. 3.2.4): the objective of the text phase before the image-text one.

Not a `loss` of its own: a run's `pretrain: leakage_free | with_concepts` adds this phase (cglib/train/pretrain.py
draws its batches). Each caption is pulled toward its target text, every other target of the batch is a negative
(`cglib.losses.text_alignment_loss`, tau = the run's tau).
"""

from __future__ import annotations

from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import Objective


class TextAlignment(Objective):
    name, label, family = "text_alignment", "textual alignment pretraining", "text"
    phase = "pretrain"

    def forward(self, captions: Tensor, targets: Tensor) -> dict[str, Tensor]:
        return {"loss": losses.text_alignment_loss(captions, targets, tau=self.tau)}
