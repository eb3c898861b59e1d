"""Declaration of `loss: mcc` (C3's concept-conditioned image contrast; cglib/train/objectives/mcc.py)."""

from __future__ import annotations

from pydantic import Field

from cglib.config.base import Section
from cglib.config.objectives.base import ObjectiveSpec, RunEntry, RunParams


class MCCOptions(Section):
    """train.runs[i].options of a loss: mcc run."""

    weight: float = Field(1.0, ge=0, description="Weight of the MCC term added to CLIP's InfoNCE.")
    hidden: int | None = Field(None, ge=1, description="Hidden width of the concept head's 2-layer MLP (null = the "
                               "joint embedding size).")


class MCCSpec(ObjectiveSpec):
    name, label, family = "mcc", "CLIP + concept-conditioned image contrast (MCC, C3)", "clip"
    related = "concept-conditioned image contrast, MCC (C3)"
    min_pairs = 2
    Options = MCCOptions

    @classmethod
    def exposure(cls, params: RunParams, entry: RunEntry) -> list[str]:
        if entry.groups != "magic":
            return []
        return [("MCC conditions the image space on the l1 concept names (the l1 evaluation queries) through its "
                 "concept head (loss: mcc on MAGIC groups)")]
