"""`loss: pairwise`: CLEAR GLASS's pairwise group loss (paper Eqs. 1-4; `cglib.losses.pairwise_group_loss`)."""

from __future__ import annotations

from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import GroupFeatures, Objective


class Pairwise(Objective):
    name, label, family = "pairwise", "pairwise group loss (Eqs. 1-4)", "group"
    min_groups = 2

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        s = self.spec
        return losses.pairwise_group_loss(batch.image, batch.text, s["tau"], s["tau_inner"], s["alpha"],
                                          alpha_on=s["alpha_on"], normalize_products=s["normalize_products"],
                                          return_parts=True, text_ids=batch.text_ids)
