"""`loss: clip`: CLIP's symmetric InfoNCE over the M*N pairs of a group batch (the fine-tuned-CLIP baseline)."""

from __future__ import annotations

from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import GroupFeatures, Objective


class Clip(Objective):
    name, label, family = "clip", "CLIP InfoNCE", "clip"

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        return {"loss": losses.clip_loss(batch.image, batch.text, tau=self.tau, text_ids=batch.text_ids)}
