"""Training checkpoints that load with `torch.load(weights_only=True)`: tensors, numbers, strings, lists, dicts.

A checkpoint holds the trained weights (a tower frozen for the whole run is left out: it is the initial one),
optimizer, scheduler and grad-scaler state, the position in the run (phase, epoch, next batch, optimizer steps,
elapsed wall time), the resolved device type and AMP dtype, and the RNG states as tensors. The sampler needs no
state: a batch is a pure function of (seed, epoch, index). Writes are atomic (temp file, then rename).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from cglib import distributed
from cglib.models import architecture_params, build_model
from cglib.train.faults import check_resume_precision
from cglib.weights import load_weights, save_weights

LAST = "last.pt"


def rng_state() -> dict[str, Any]:
    """Torch CPU and CUDA generator states as tensors (the only RNGs a training step draws from)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` saved."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def spec_hash(spec: dict[str, Any]) -> str:
    """Short hash of everything that determines a run's result (a checkpoint of another spec is not resumed)."""
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """Write a checkpoint dict atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint with `weights_only=True` (no pickled code runs)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------------------- a run's files
INITIAL = "initial.safetensors"
FINAL = "final.safetensors"
CHECKPOINT_VERSION = 3  # 2: records the resolved device and AMP dtype; holds only the trained keys; 3: the objective's
#                         state (a head, a memory) under "objective"


def text_keys(model: torch.nn.Module) -> list[str]:
    """State-dict keys of the text tower: every key outside the image tower and the (frozen) logit scale/bias."""
    return sorted(k for k in model.state_dict() if not k.startswith("visual.") and k not in ("logit_scale",
                                                                                          "logit_bias"))


class RunFiles:
    """Where a run's weights, checkpoint and outputs live, and how they are written and read (rank 0 writes)."""

    def __init__(self, run: Any, name: str, spec: dict[str, Any], info: Any, precision: dict[str, str]) -> None:
        self.run, self.info, self.precision = run, info, precision
        self.hash = spec_hash(spec)
        self.base = run.training_dir  # training/ or training/seed<k>/
        self.out = self.base / name
        self.ckpt_dir = self.out / "checkpoints"
        entry = next(r for r in run.params.train.runs if r.name == name)
        self.re = not entry.trains_images()  # a text objective (re): the text side alone trains, the image tower frozen
        self.text_phase = self.re or entry.pretrain != "none"
        self.freeze_text = run.params.model.freeze_text
        self.projection_only = run.params.train.text_trains == "projection"  # a text phase trains the projection only
        # the starting weights, relative to training/: the initial (zero-shot) ones or the final ones of run `init`
        self.start = Path(INITIAL) if entry.init is None else Path(entry.init) / FINAL

    def fresh_model(self):
        """The run's starting point: params.model with the initial (zero-shot) weights, or run `init`'s final ones."""
        bundle = build_model(architecture_params(self.run.params.model), "cpu")
        start = self.base / self.start
        if not start.is_file():
            raise FileNotFoundError(f"{start} not found: train run {self.start.parts[0]!r} (this run's init) first")
        load_weights(bundle.model, start)
        self.frozen = self._frozen_keys(list(bundle.model.state_dict()), text_keys(bundle.model))
        return bundle

    def _frozen_keys(self, keys: list[str], text: list[str]) -> list[str]:
        """Keys no phase of the run trains: referenced in its weights files, not copied."""
        phase_text = [k for k in text if k.startswith("text.proj.")] if self.projection_only else text
        if self.re:  # the image tower (and the unused logit scale) is frozen
            trained = phase_text
        elif not self.freeze_text:
            trained = keys
        else:  # image-text phase: the image side; textual pretraining: also what it trains of the text side
            trained = [k for k in keys if k not in set(text)] + (phase_text if self.text_phase else [])
        return sorted(set(keys) - set(trained))

    def trained_state(self, bundle: Any) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint holds: every key but those of a tower frozen for the whole run."""
        frozen = set(self.frozen)
        return {k: v.detach().cpu() for k, v in bundle.model.state_dict().items() if k not in frozen}

    def save_weights(self, bundle: Any, path: Path) -> None:
        """Weights of what trains; a frozen tower is referenced (the starting weights file: initial.safetensors or
        run init's final.safetensors) and verified on load."""
        if self.info.is_main:
            source = Path("../" * len(path.parent.relative_to(self.base).parts)) / self.start
            save_weights(bundle.model, path, exclude=self.frozen, source=str(source))

    def save_epoch_weights(self, bundle: Any, epoch: int) -> None:
        """Per-epoch weights, only with train.keep_epoch_weights (resuming needs none of them)."""
        if getattr(self.run.params.train, "keep_epoch_weights", False):
            self.save_weights(bundle, self.ckpt_dir / f"epoch-{epoch:03d}.safetensors")

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The run's last.pt when resuming is allowed and it was written for this spec (warned otherwise)."""
        path = self.ckpt_dir / LAST
        if not self.run.params.train.resume or not path.is_file():
            return None
        state = load_checkpoint(path)
        if state.get("version") != CHECKPOINT_VERSION or state.get("spec_hash") != self.hash:
            warnings.warn(f"{path} was written for other params or data; starting run {self.out.name!r} "
                          "from scratch (its old outputs are replaced)", stacklevel=4)
            return None
        check_resume_precision(path, state.get("precision"), self.precision)
        return state

    def save_checkpoint(self, bundle: Any, progress: dict[str, Any], rng: dict[str, Any], stepper: Any,
                        objective: Any = None) -> None:
        """Write last.pt: the trained weights, optimizer/scheduler/scaler, position, RNG, device and AMP dtype,
        and the objective's state (`Objective.state_dict()`: a concept head's weights, a memory's rows)."""
        if not self.info.is_main:
            return
        state = {"version": CHECKPOINT_VERSION, "spec_hash": self.hash, "precision": self.precision,
                 "progress": progress, "model": self.trained_state(bundle),
                 "stepper": None if stepper is None else stepper.state_dict(), "rng": rng}
        if objective is not None:
            state["objective"] = {k: v.detach().cpu().clone() if torch.is_tensor(v) else v
                                  for k, v in objective.state_dict().items()}
        save_checkpoint(self.ckpt_dir / LAST, state)

    def clear_outputs(self) -> None:
        """Remove a previous attempt's outputs before training from scratch."""
        if self.info.is_main:
            for name in ("log.csv", "summary.json", FINAL):
                (self.out / name).unlink(missing_ok=True)
            for name in ("tensorboard", "checkpoints"):
                shutil.rmtree(self.out / name, ignore_errors=True)
        distributed.barrier(self.info)

    @staticmethod
    def rng() -> dict[str, Any]:
        return rng_state()

    @staticmethod
    def set_rng(state: dict[str, Any]) -> None:
        set_rng_state(state)
