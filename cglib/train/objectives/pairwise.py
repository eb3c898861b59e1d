"""`loss: pairwise`: CLEAR GLASS's pairwise group loss (paper Eqs. 1-4; `cglib.losses.pairwise_group_loss`)."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import GroupFeatures
from cglib.train.objectives.group_loss import GroupLossOptions, GroupObjective


class PairwiseOptions(GroupLossOptions):
    """train.runs[i].options of a loss: pairwise run."""

    normalize_products: bool | None = Field(
        None, description="The authors' inner term (their loss.py): each group's centroid is the normalized mean "
        "of the normalized combined vectors I_i * T_j, not Eq. 1's mean of the raw ones; null = run.protocol's "
        "(corrected: false, as_published: true).")


class Pairwise(GroupObjective):
    name, label = "pairwise", "pairwise group loss (Eqs. 1-4)"
    Options = PairwiseOptions

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        return losses.pairwise_group_loss(batch.image, batch.text, self.tau, self.tau_inner, self.alpha,
                                          alpha_on=self.alpha_on, normalize_products=self.options.normalize_products,
                                          return_parts=True, text_ids=batch.text_ids)
