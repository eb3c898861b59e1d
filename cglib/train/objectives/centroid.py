"""`loss: centroid`: CLEAR GLASS's centroid group loss (paper Eqs. 5-8; `cglib.losses.centroid_group_loss`)."""

from __future__ import annotations

from torch import Tensor

from cglib import losses
from cglib.config.objectives.group_losses import CentroidOptions, CentroidSpec
from cglib.train.objectives.base import GroupFeatures
from cglib.train.objectives.group_loss import GroupObjective

__all__ = ["Centroid", "CentroidOptions"]


class Centroid(CentroidSpec, GroupObjective):
    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        return losses.centroid_group_loss(batch.image, batch.text, self.tau, self.tau_inner, self.alpha,
                                          alpha_on=self.alpha_on, return_parts=True, text_ids=batch.text_ids)
