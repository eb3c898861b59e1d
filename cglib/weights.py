"""Model weights on disk: safetensors (or a torch state dict) loaded with every key verified, and saved with a
frozen tower referenced instead of copied (its content hash and source in the file's metadata)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from cglib.run import output_path


def tensors_sha1(tensors: dict[str, torch.Tensor]) -> str:
    """Content hash of named tensors (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha1()
    for key in sorted(tensors):
        t = tensors[key].detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{key}|{t.dtype}|{tuple(tensors[key].shape)}".encode())
        if t.numel():
            digest.update(t.view(torch.uint8).numpy())
    return digest.hexdigest()


def save_weights(model: torch.nn.Module, path: str | Path, *, exclude: Sequence[str] = (),
                 source: str | None = None) -> Path:
    """Save a state dict as safetensors; keys in `exclude` (a frozen tower) are referenced, not copied.

    The excluded keys are named in the file's metadata with their content hash and `source`, where they come
    from (another weights file relative to this one, or "package" for a tower built from its own package, such
    as the pretrained MiniLM); `load_weights` checks both. Tied or shared tensors are cloned so the file loads
    anywhere.
    """
    from safetensors.torch import save_file

    path = output_path(path)  # a link there (a folder over another run's files) is replaced, never written through
    full = model.state_dict()
    missing = sorted(set(exclude) - set(full))
    if missing:
        raise ValueError(f"cannot reference keys the model does not have: {missing[:5]}")
    if exclude and not source:
        raise ValueError("referenced (excluded) keys need a source: a weights file or 'package'")
    state = {k: v.detach().cpu().contiguous().clone() for k, v in full.items() if k not in set(exclude)}
    meta = None
    if exclude:
        frozen = {k: full[k] for k in exclude}
        meta = {"cglib_referenced": json.dumps({"source": source, "keys": sorted(exclude),
                                                "sha1": tensors_sha1(frozen)})}
    save_file(state, str(path), metadata=meta)
    return path


def referenced_weights(path: str | Path) -> dict | None:
    """The frozen-tower reference of a weights file ({source, keys, sha1}), or None when it holds every key."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta["cglib_referenced"]) if "cglib_referenced" in meta else None


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load safetensors or a torch state dict (weights_only=True); every key is verified.

    A missing or unexpected key is an error naming the file. Keys a file references instead of holding (see
    `save_weights`) are first loaded from the weights file it names, or kept as built ("package"), and must
    match the recorded hash.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    reference = None
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
        reference = referenced_weights(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state
        state = {k.removeprefix("module."): v for k, v in state.items()}
    if reference is not None:
        if reference["source"] != "package":
            load_weights(model, path.parent / reference["source"])
        current = model.state_dict()
        absent = [k for k in reference["keys"] if k not in current]
        if absent or tensors_sha1({k: current[k] for k in reference["keys"]}) != reference["sha1"]:
            raise ValueError(f"{path} references frozen weights from {reference['source']} that do not match the "
                             f"model's (hash differs{'; missing ' + str(absent[:5]) if absent else ''}); rebuild the "
                             "model from the same params, or retrain the run")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even with strict=False
        raise ValueError(f"checkpoint {path} does not fit the model ({str(exc).splitlines()[-1].strip()}); "
                         "check model.name matches the checkpoint's architecture") from None
    if reference is not None:
        missing = [k for k in missing if k not in set(reference["keys"])]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}; check model.name matches the checkpoint's architecture")
