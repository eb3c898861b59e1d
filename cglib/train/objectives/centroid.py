"""`loss: centroid`: CLEAR GLASS's centroid group loss (paper Eqs. 5-8; `cglib.losses.centroid_group_loss`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import GroupFeatures, Objective, entry_option
from cglib.train.objectives.group_loss import GroupLossOptions, GroupObjective
from cglib.train.objectives.memory_centroid import MemoryCentroid


class CentroidOptions(GroupLossOptions):
    """train.runs[i].options of a loss: centroid run."""

    memory_momentum: float | None = Field(
        None, description="Set (in (0, 1), e.g. 0.9) to contrast against a momentum memory of every training "
        "group's centroids instead of the batch's groups only: the memory_centroid objective (DCCL).")


class Centroid(GroupObjective):
    name, label = "centroid", "centroid group loss (Eqs. 5-8)"
    Options = CentroidOptions

    @classmethod
    def for_entry(cls, entry: Any) -> type[Objective]:
        """With options.memory_momentum the run contrasts against a memory of every group's centroids."""
        return MemoryCentroid if entry_option(entry, "memory_momentum") is not None else cls

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        return losses.centroid_group_loss(batch.image, batch.text, self.tau, self.tau_inner, self.alpha,
                                          alpha_on=self.alpha_on, return_parts=True, text_ids=batch.text_ids)
