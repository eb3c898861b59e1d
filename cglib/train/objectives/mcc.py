"""`loss: mcc` (C3): CLIP's InfoNCE + options.weight x a supervised contrastive term between the images of each
group, seen through a trainable head of the group's concept-name embedding (`cglib.losses.mcc_loss`).

The objective owns the concept head (a submodule: optimized, clipped, checkpointed and, under torchrun,
gradient-synchronized with the model, since DDP wraps the towers and the objective together) and the frozen
concept bank: the training groups' node names encoded once by the run's STARTING text tower, so the head's
input never depends on where a run was interrupted. The head is training-only: written beside the final
weights as mcc_head.safetensors, never part of the evaluated model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cglib import losses
from cglib.config.objectives.mcc import MCCOptions, MCCSpec
from cglib.encoding import encode_texts
from cglib.train.objectives.base import GroupFeatures, Objective, Setup
from cglib.train.objectives.concept_head import ConceptBank, ConceptHead, build_head

__all__ = ["MCC", "MCCOptions"]


class MCC(MCCSpec, Objective):

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        self.weight, self.hidden = self.options.weight, self.options.hidden
        self.head: ConceptHead | None = None
        self.bank: ConceptBank | None = None
        self.info: dict[str, Any] | None = None

    def setup(self, setup: Setup) -> None:
        groups = list(setup.sampler.groups)
        start = setup.start_model()
        names = [setup.inputs.magic.nodes[g].name for g in groups]
        table = torch.from_numpy(encode_texts(start, names)).to(setup.device)
        self.bank = ConceptBank({g: k for k, g in enumerate(groups)}, table)
        self.head = build_head(table.shape[1], self.hidden, setup.seed).to(setup.device)
        self.head.train()
        if setup.resumed:
            self.load_state_dict(setup.resumed)
        self.info = {"concepts": len(groups), "weight": self.weight, "hidden": self.hidden or table.shape[1],
                     "tau": self.tau, "concept_source": "node names, the run's starting text tower"}

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        if self.head is None:
            raise ValueError("loss mcc needs its concept head and concept bank: call Objective.setup first")
        concepts = self.head(self.bank(batch.groups))
        clip = losses.clip_loss(batch.image, batch.text, tau=self.tau, text_ids=batch.text_ids)
        mcc = losses.mcc_loss(batch.image, concepts, tau=self.tau)
        return {"loss": clip + self.weight * mcc, "clip": clip, "mcc": mcc}

    def describe(self) -> dict[str, Any] | None:
        return None if self.info is None else {"mcc": self.info}

    def training_only_weights(self) -> dict[str, dict[str, Tensor]]:
        return {} if self.head is None else {"mcc_head.safetensors": self.head.state_dict()}
