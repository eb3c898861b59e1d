"""A training objective defined outside cglib, as a user would write one (tests/test_objectives.py loads it as
`loss: my_objectives:CentroidTriplet` with this folder on the Python path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cglib.losses import gather_groups
from cglib.train.objectives import Objective


class CentroidTriplet(Objective):
    """Each group's image centroid must be closer to its own text centroid than to the nearest other group's
    text centroid, by a margin (a triplet loss over group centroids)."""

    name, label, family = "centroid_triplet", "triplet loss over group centroids", "group"
    min_groups = 2
    margin = 0.2

    def forward(self, batch):
        # whole groups from every rank: each rank computes the global batch's loss (as cglib's own losses do)
        image = F.normalize(gather_groups(batch.image).mean(dim=1), dim=-1)
        text = F.normalize(gather_groups(batch.text).mean(dim=1), dim=-1)
        similarity = image @ text.T  # (M, M)
        own = similarity.diagonal()
        others = similarity.masked_fill(torch.eye(len(similarity), dtype=torch.bool, device=similarity.device), float("-inf"))
        return {"loss": F.relu(self.margin - own + others.max(dim=1).values).mean()}


class NotAnObjective:
    """Referenced by a test to check the error for a class that does not subclass Objective."""


class OddFamily(CentroidTriplet):
    family = "pairs"
