"""Training checkpoints that load with `torch.load(weights_only=True)`: tensors, numbers, strings, lists, dicts.

A checkpoint holds the model and optimizer, scheduler and grad-scaler state, the position in the run (phase,
epoch, next batch, optimizer steps, elapsed wall time) and the RNG states as tensors. The sampler needs no
state: a batch is a pure function of (seed, epoch, index). Writes are atomic (temp file, then rename).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

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
