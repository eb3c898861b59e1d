"""The objective protocol: what one training objective is, owns and tells the rest of the library.

The training loop never asks which objective runs. It builds one with `cglib.train.objectives.build_objective`
and then only calls the hooks below; everything an objective needs across steps (a concept head, a memory of
centroids, a plan of hard negatives) lives inside it, as submodules and buffers where it is tensors, so that

- DDP synchronizes it: the loop wraps the towers AND the objective in one module (`GroupTask`), so a head's
  gradients are averaged over ranks like the model's;
- the checkpoint holds it: `state_dict()` / `load_state_dict()` of the objective go into `last.pt`, so a
  resumed run continues from the same head weights and memory rows (bit-exact resume);
- the summary, Table 3's roles, the figures and the reports describe it from its class attributes.

An image-text objective implements `forward(batch)` on a `GroupFeatures` batch (M groups x N pairs x L dims)
and returns a dict of scalar tensors whose "loss" entry is minimized (other entries are logged parts). A text
objective (`phase = "re"`) computes its loss in its own phase (see `re.py`). A minimal objective:

    class MyObjective(Objective):
        name, label, family = "mine", "my contrastive loss", "clip"

        def forward(self, batch):
            return {"loss": cglib.losses.clip_loss(batch.image, batch.text, tau=self.tau, text_ids=batch.text_ids)}

and a run entry `loss: my_package.module:MyObjective` trains it (cglib/train/objectives/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from cglib.config.objectives.base import FAMILIES, NoOptions, ObjectiveSpec, entry_option

if TYPE_CHECKING:
    from cglib.config import Params, TrainRunParams

__all__ = ["FAMILIES", "GroupFeatures", "NoOptions", "Objective", "Setup", "entry_option"]


@dataclass
class GroupFeatures:
    """One micro-batch of the image-text phase as an objective sees it: features (M, N, L), unit norm (the towers'
    raw outputs for an objective whose `unit_features` is false).

    text_ids (M, N): equal ids = identical strings (never each other's negatives). group_index (M,): each group's
    row in `sampler.groups` (a memory's row). groups: the M node ids. hard_text (M, N, L) / hard_columns (M, N):
    a replacement negative per pair and the batch column it replaces (-1: none), for objectives that declare
    `replacement_texts` (clip_hn). Under torchrun M is this rank's groups; the losses gather all ranks'.
    """

    image: Tensor
    text: Tensor
    text_ids: Tensor | None = None
    group_index: Tensor | None = None
    groups: list[str] = field(default_factory=list)
    hard_text: Tensor | None = None
    hard_columns: Tensor | None = None


@dataclass
class Setup:
    """What an objective may read when the image-text phase starts (`Objective.setup`).

    bundle: the model at the phase's starting weights (after any textual pretraining); start_model(): the run's
    STARTING model (built fresh, the global RNG untouched); sampler: the phase's GroupBatchSampler; inputs:
    TrainInputs (magic, image cache, keyword relations: what cglib.prepare prepared); params and entry: the params file and the run entry; seed: the training
    seed's init-and-order seed; epochs: image-text epochs; device; resumed: the checkpoint's saved objective state
    (None: a fresh phase); step: optimizer steps already done in this phase.
    """

    bundle: Any
    start_model: Any
    sampler: Any
    inputs: Any
    params: Params
    entry: TrainRunParams
    seed: int
    epochs: int
    device: torch.device
    resumed: dict[str, Any] | None = None
    step: int = 0


class Objective(ObjectiveSpec, nn.Module):
    """Base class of every training objective (see the module docstring for the contract). What params validation
    reads (name, family, Options, the params checks) is its declaration, `ObjectiveSpec` (cglib/config/objectives)."""

    unit_features: bool = True  # false: its batches carry the towers' unnormalized features (set by `setup`)

    def __init__(self, spec: dict[str, Any], params: Params | None = None) -> None:
        """`spec`: the run entry with its effective tau (`run_spec(...)["run"]`); its `options` (absent: the
        defaults), resolved against the params by `resolve_options`, are validated again by `Options`. `params`, the whole params file, is
        there for a subclass whose construction needs more than its entry (none of the built-in ones)."""
        super().__init__()
        self.spec = dict(spec)
        self.tau = spec.get("tau", 0.1)
        self.options = self.Options.model_validate(spec.get("options") or {})

    def setup(self, setup: Setup) -> None:
        """Build what the objective keeps across steps, or restore it from `setup.resumed` (resume)."""
        if setup.resumed:
            self.load_state_dict(setup.resumed)

    def replacement_texts(self) -> set[str] | None:
        """Extra texts a frozen text tower must embed once (clip_hn's permuted captions); None: none."""
        return None

    def pair_replacements(self) -> Any:
        """A function of a whole GroupBatch -> one replacement negative per pair (clip_hn), or None."""
        return None

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        raise NotImplementedError(f"{type(self).__name__} defines no forward(batch) for the image-text phase")

    def after_step(self, skipped: bool) -> None:
        """Called after every optimizer step, inside its interrupt-proof section (skipped: non-finite gradients,
        no weight changed)."""

    def describe(self) -> dict[str, Any] | None:
        """What the run summary records about this objective's run (None: nothing beyond its name)."""
        return None

    def announce(self) -> str:
        """A note for the line printed when the image-text phase starts ('' : none)."""
        return ""

    def training_only_weights(self) -> dict[str, dict[str, Tensor]]:
        """Trained tensors that are not part of the evaluated model: file name -> tensors, written as safetensors
        beside the run's final weights."""
        return {}
