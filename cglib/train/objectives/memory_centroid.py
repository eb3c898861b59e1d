"""`loss: centroid` with `options.memory_momentum` (or `loss: memory_centroid`): the centroid loss against a momentum
memory of every training group's centroids (DCCL, Pu et al. CVPR 2023; `cglib.train.objectives.concept_memory`).

The objective owns the memory: built at the phase's starting weights (or restored from the checkpoint, so a
resumed run continues from the same rows), staged by every micro-batch's centroids and committed after the
optimizer step (discarded on a skipped one, which changes no weight either). Under torchrun every rank starts
from rank 0's rows and applies the same update from the gathered batch, so the memories stay identical.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cglib import losses
from cglib.config.objectives.group_losses import MemoryCentroidOptions, MemoryCentroidSpec
from cglib.train.objectives.base import GroupFeatures, Setup
from cglib.train.objectives.concept_memory import ConceptMemory, initial_memory
from cglib.train.objectives.group_loss import GroupObjective

__all__ = ["MemoryCentroid", "MemoryCentroidOptions"]


class MemoryCentroid(MemoryCentroidSpec, GroupObjective):

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        self.momentum = self.options.memory_momentum
        self.memory: ConceptMemory | None = None

    def setup(self, setup: Setup) -> None:
        saved = (setup.resumed or {}).get("_extra_state")
        if saved is not None:
            self.memory = ConceptMemory.from_state_dict(saved)
            if len(self.memory) != len(setup.sampler.groups):
                raise ValueError(f"the checkpoint holds a memory of {len(self.memory)} groups but run "
                                 f"{setup.entry.name!r} trains {len(setup.sampler.groups)}; delete its last.pt (or "
                                 "set train.resume: false) to start over")
        elif setup.step > 0:
            raise ValueError(f"the checkpoint of run {setup.entry.name!r} holds no concept memory; delete its "
                             "last.pt (or set train.resume: false) to start over")
        else:  # a fresh image-text phase: the rows of the starting (or textually pretrained) weights
            self.memory = initial_memory(setup.bundle, setup.sampler, setup.inputs.cache, self.momentum)
        self.memory.to(setup.device).broadcast()  # DDP: every rank starts from rank 0's rows

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        if self.memory is None or batch.group_index is None:
            raise ValueError("the memory centroid loss needs its memory (Objective.setup) and the batch's "
                             "group_index")
        parts = losses.memory_centroid_loss(batch.image, batch.text, self.memory.image, self.memory.text,
                                            batch.group_index, self.tau, self.tau_inner, self.alpha,
                                            alpha_on=self.alpha_on, return_parts=True, text_ids=batch.text_ids)
        self.memory.stage(parts.pop("group_index"), parts.pop("centroids"))
        return parts

    def after_step(self, skipped: bool) -> None:
        # the memory moves with the weights: a skipped step changes neither
        self.memory.discard() if skipped else self.memory.commit()

    def describe(self) -> dict[str, Any] | None:
        return None if self.memory is None else {"memory": {"groups": len(self.memory), "momentum": self.momentum}}

    # the memory is not a tensor attribute of the module: it enters state_dict() through torch's extra-state hook
    def get_extra_state(self) -> Any:
        return None if self.memory is None else self.memory.state_dict()

    def set_extra_state(self, state: Any) -> None:
        self.memory = None if state is None else ConceptMemory.from_state_dict(state)
