"""Which models an evaluation scores and how they are loaded: the zero-shot model, the trained runs (through
`cglib.train.load_trained`), and frozen reference models (`eval.zoo`, `evaluate_model`), one at a time."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

from cglib.config import ZERO_SHOT_NAME, ModelParams
from cglib.evaluate.embeddings import file_fingerprints, tower_fingerprints
from cglib.models import ClipModel, build_model
from cglib.run import RunContext, training_dir
from cglib.train import load_trained
from cglib.train.loop import INITIAL

ZERO_SHOT = ZERO_SHOT_NAME  # the untrained initial model's row


class ModelLoadError(RuntimeError):
    """A model to score whose weights could not be loaded (`evaluate_model`; `eval.zoo` entries are skipped)."""


def default_loader(run: RunContext) -> Callable[..., ClipModel]:
    device = run.device()
    return lambda name, seed=0: load_trained(run.params, run.dir, name, device=device, seed=seed)


def seed_loader(load: Callable[..., ClipModel], seed: int) -> Callable[[str], ClipModel]:
    """`load` for one training seed: `load(name)` for seed 0 (a one-argument loader works for one-seed runs),
    `load(name, seed)` otherwise."""
    return (lambda name: load(name)) if seed == 0 else (lambda name: load(name, seed))


def zero_shot_info() -> dict:
    return {"name": ZERO_SHOT, "loss": None, "pretrain": "none", "exposed_to_eval_strings": False,
            "fine_tuned_on_magic": False, "objective": "none", "objective_family": "none", "init": None,
            "weights": "base"}


def zoo_info(name: str, spec: ModelParams) -> dict:
    """A frozen reference model's entry in results.json `models`: never trained here, in no gain set."""
    return {**zero_shot_info(), "name": name, "zoo": True, "weights": "eval.zoo", "spec": spec.model_dump(mode="json")}


def model_fingerprints(run: RunContext, name: str, seed: int = 0) -> tuple[str, str] | None:
    """Tower hashes from the weights file training wrote under training seed `seed` (no model build on a cache
    hit), None when absent.

    The architecture and preprocessing part of the key is `params.model` (what `load_trained` builds from).
    """
    path = training_dir(run.dir, seed) / (INITIAL if name == ZERO_SHOT else f"{name}/final.safetensors")
    if not path.is_file():
        return None
    arch = run.params.model.model_dump(mode="json", exclude={"pretrained", "checkpoint"})
    return file_fingerprints(path, "model:" + json.dumps(arch, sort_keys=True))


def zoo_fingerprints(bundle: ClipModel, spec: ModelParams) -> tuple[str, str]:
    """Tower hashes of a loaded zoo model (it has no weights file of this run) joined with its spec, so a changed
    spec (activation, image size, tag) recomputes and the same spec and weights reuse the cache."""
    key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    image, text = tower_fingerprints(bundle)
    return (hashlib.sha1(f"{image}|zoo:{key}".encode()).hexdigest(),
            hashlib.sha1(f"{text}|zoo:{key}".encode()).hexdigest())


def zoo_loader(spec: ModelParams, device: str, seed: int) -> Callable[[str], ClipModel]:
    """Builds a zoo model in eval mode; what it leaves at random init (no tag, no checkpoint) is seeded (run.seed),
    so such a reference is the same model on every rerun (and its cached embeddings are reused)."""
    import torch

    def load(_name: str) -> ClipModel:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            bundle = build_model(spec, device)
        bundle.model.eval()
        return bundle

    return load


def reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class LazyModel:
    """Loads a model on first call (both item sets share it) and releases it before the next model."""

    def __init__(self, load: Callable[[str], ClipModel], name: str, device: str) -> None:
        self.load, self.name, self.device = load, name, device
        self.bundle: ClipModel | None = None

    def __call__(self) -> ClipModel:
        if self.bundle is None:
            self.bundle = self.load(self.name)
            self.bundle.model.to(self.device)
        return self.bundle

    def image_size(self) -> int:
        """The model's input size (loads the model)."""
        return self().image_size

    def release(self) -> None:
        self.bundle = None


def default_model_name(spec: ModelParams) -> str:
    """A row name for a model spec: the checkpoint's stem, else the name and the pretrained tag."""
    raw = Path(spec.checkpoint).stem if spec.checkpoint else "-".join(p for p in (spec.name, spec.pretrained) if p)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "model"
