"""Declarations of CLEAR GLASS's group losses: `loss: pairwise`, `centroid`, `memory_centroid`
(cglib/train/objectives/group_loss.py, pairwise.py, centroid.py, memory_centroid.py).

Their options default to the params file's `train.tau_inner` and `train.alpha` (what the search tunes); a run entry
may set its own in `options`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cglib.config.base import Section
from cglib.config.objectives.base import ObjectiveSpec, RunEntry, RunParams, entry_option


class GroupLossOptions(Section):
    """train.runs[i].options of a group-loss run (null = the train section's value)."""

    tau_inner: float | None = Field(None, gt=0, description="Inner temperature tau' (Eqs. 3, 7); null = "
                                    "train.tau_inner.")
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="Weight of the inner term (Eqs. 4, 8); null = "
                                "train.alpha.")
    alpha_on: Literal["inner", "outer"] | None = Field(
        None, description="Which term alpha weighs: inner (the paper's Eqs. 4, 8) or outer (the authors' loss.py); "
        "null = run.protocol's (corrected: inner, as_published: outer).")


class GroupLossSpec(ObjectiveSpec):
    """What the group losses share: two groups at least, tau' and alpha filled from the train section."""

    family = "group"
    min_groups = 2
    Options = GroupLossOptions

    @classmethod
    def resolve_options(cls, options: GroupLossOptions, params: RunParams) -> GroupLossOptions:
        filled = {key: getattr(params.train, key) for key in ("tau_inner", "alpha") if getattr(options, key) is None}
        return super().resolve_options(options, params).model_copy(update=filled)


class PairwiseOptions(GroupLossOptions):
    """train.runs[i].options of a loss: pairwise run."""

    normalize_products: bool | None = Field(
        None, description="The authors' inner term (their loss.py): each group's centroid is the normalized mean "
        "of the normalized combined vectors I_i * T_j, not Eq. 1's mean of the raw ones; null = run.protocol's "
        "(corrected: false, as_published: true).")


class PairwiseSpec(GroupLossSpec):
    name, label = "pairwise", "pairwise group loss (Eqs. 1-4)"
    Options = PairwiseOptions


class MemoryCentroidOptions(GroupLossOptions):
    """train.runs[i].options of a memory-centroid run (loss: memory_centroid, or centroid with a momentum)."""

    memory_momentum: float = Field(
        ..., gt=0.0, lt=1.0, description="m of the memory update mem <- normalize(m * mem + (1 - m) * batch "
        "centroid), strictly between 0 and 1 (e.g. 0.9).")


class MemoryCentroidSpec(GroupLossSpec):
    name, label = "memory_centroid", "centroid loss with a concept memory (DCCL)"
    related = "momentum concept memory (DCCL, Pu et al. CVPR 2023)"
    Options = MemoryCentroidOptions


class CentroidOptions(GroupLossOptions):
    """train.runs[i].options of a loss: centroid run."""

    memory_momentum: float | None = Field(
        None, description="Set (in (0, 1), e.g. 0.9) to contrast against a momentum memory of every training "
        "group's centroids instead of the batch's groups only: the memory_centroid objective (DCCL).")


class CentroidSpec(GroupLossSpec):
    name, label = "centroid", "centroid group loss (Eqs. 5-8)"
    Options = CentroidOptions

    @classmethod
    def for_entry(cls, entry: RunEntry) -> type[ObjectiveSpec]:
        """With options.memory_momentum the run contrasts against a memory of every group's centroids."""
        return MemoryCentroidSpec if entry_option(entry, "memory_momentum") is not None else cls
