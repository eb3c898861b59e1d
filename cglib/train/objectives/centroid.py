"""`loss: centroid`: CLEAR GLASS's centroid group loss (paper Eqs. 5-8; `cglib.losses.centroid_group_loss`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cglib import losses
from cglib.train.objectives.base import GroupFeatures, Objective
from cglib.train.objectives.memory_centroid import MemoryCentroid


class Centroid(Objective):
    name, label, family = "centroid", "centroid group loss (Eqs. 5-8)", "group"
    min_groups = 2
    run_keys = ("memory_momentum",)  # read by its memory variant (for_entry)

    @classmethod
    def for_entry(cls, entry: Any) -> type[Objective]:
        """With memory_momentum the run contrasts against a memory of every group's centroids."""
        return MemoryCentroid if entry.memory_momentum is not None else cls

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        s = self.spec
        return losses.centroid_group_loss(batch.image, batch.text, s["tau"], s["tau_inner"], s["alpha"],
                                          alpha_on=s["alpha_on"], return_parts=True, text_ids=batch.text_ids)
