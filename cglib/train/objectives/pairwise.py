"""`loss: pairwise`: CLEAR GLASS's pairwise group loss (paper Eqs. 1-4; `cglib.losses.pairwise_group_loss`)."""

from __future__ import annotations

from torch import Tensor

from cglib import losses
from cglib.config.objectives.group_losses import PairwiseOptions, PairwiseSpec
from cglib.train.objectives.base import GroupFeatures
from cglib.train.objectives.group_loss import GroupObjective

__all__ = ["Pairwise", "PairwiseOptions"]


class Pairwise(PairwiseSpec, GroupObjective):

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        return losses.pairwise_group_loss(batch.image, batch.text, self.tau, self.tau_inner, self.alpha,
                                          alpha_on=self.alpha_on, normalize_products=self.options.normalize_products,
                                          return_parts=True, text_ids=batch.text_ids)
