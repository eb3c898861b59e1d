"""`loss: clip`: CLIP's symmetric InfoNCE over the M*N pairs of a group batch (the fine-tuned-CLIP baseline).

Its temperature (`options.logit_scale`): `fixed` (corrected, the default) uses the run's tau, as every loss here
does; `learned` (as published: the authors fine-tune with open_clip's `ClipLoss` and the model's learned logit
scale) trains a logit scale s, starting from the model's own (OpenAI's CLIP: ln 100), with logits = exp(s) * cos,
clamped to [0, ln 100] after every step as their train.py does. The scale is the objective's parameter: DDP
synchronizes it with the towers (GroupTask), the checkpoint keeps it, and it is saved beside the final weights
(`logit_scale.safetensors`); the evaluated model's cosines do not depend on it.

Its features (`options.hierarcaps_features`): a run that fine-tunes the HierarCaps model (its init chain reaches a
`loss: re` run: Table 3's "HierarCaps fine-tuned" row) takes the towers' unnormalized outputs under `raw` (as
published: the authors' HierarCaps model is a transformers CLIPModel, and their train.py hands its
`get_image_features` / `get_text_features` straight to open_clip's ClipLoss), unit-norm ones under `normalized`
(corrected). Every other run, and every other loss, sees unit-norm features: the authors' open_clip models
normalize in their forward. Only the features of the loss change; evaluation normalizes every model's embeddings.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from cglib import losses
from cglib.config.objectives.clip import ClipOptions, ClipSpec
from cglib.train.objectives.base import GroupFeatures, Objective, Setup

__all__ = ["MAX_LOGIT_SCALE", "Clip", "ClipOptions", "starts_from_hierarcaps"]

MAX_LOGIT_SCALE = math.log(100)  # open_clip's and the authors' clamp


def starts_from_hierarcaps(params: Any, entry: Any) -> bool:
    """Whether the run fine-tunes the HierarCaps model: its chain of `init` runs reaches a text-phase (loss: re) run."""
    runs = {r.name: r for r in params.train.runs}
    seen = {entry.name}
    while entry.init is not None and entry.init not in seen:
        entry = runs[entry.init]
        if entry.objective_spec().phase == "re":
            return True
        seen.add(entry.name)
    return False


class Clip(ClipSpec, Objective):

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        self.learned = self.options.logit_scale == "learned"
        # a learned scale starts at 1/tau until setup reads the model's own
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / self.tau))) if self.learned else None

    def setup(self, setup: Setup) -> None:
        self.unit_features = not (self.options.hierarcaps_features == "raw"
                                  and starts_from_hierarcaps(setup.params, setup.entry))
        if self.learned and not setup.resumed:
            with torch.no_grad():
                self.logit_scale.copy_(setup.bundle.model.logit_scale.detach().float().clamp(0, MAX_LOGIT_SCALE))
        super().setup(setup)

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        tau = 1.0 / self.logit_scale.exp() if self.learned else self.tau
        parts = {"loss": losses.clip_loss(batch.image, batch.text, tau=tau, text_ids=batch.text_ids,
                                          normalize=self.unit_features)}
        if self.learned:
            parts["logit_scale"] = self.logit_scale.detach().exp()
        return parts

    def after_step(self, skipped: bool) -> None:
        if self.learned:
            with torch.no_grad():
                self.logit_scale.clamp_(0, MAX_LOGIT_SCALE)

    def describe(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.learned:
            out["logit_scale"] = {"mode": "learned", "final_exp": float(self.logit_scale.detach().exp())}
        if not self.unit_features:
            out["features"] = "raw: the towers' unnormalized outputs (options.hierarcaps_features)"
        return out or None

    def training_only_weights(self) -> dict[str, dict[str, Tensor]]:
        return {"logit_scale.safetensors": {"logit_scale": self.logit_scale.detach().cpu()}} if self.learned else {}
