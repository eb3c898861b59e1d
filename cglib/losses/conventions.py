"""What every loss of cglib.losses shares (the conventions of the package's docstring): input checks whose errors
name the fix, full precision with autocast off, exact L2 normalization, the masks of identical texts, the alpha
weighting of inner and outer terms, and the gather of whole groups from every rank."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

Temperature = float | Tensor
AlphaOn = Literal["inner", "outer"]

EPS = 1e-12  # same eps as F.normalize: floor of a norm before dividing by it


# ----------------------------------------------------------------------------------------- distributed
def gather_groups(features: Tensor) -> Tensor:
    """Concatenate all ranks' features (or integer text ids) along dim 0, keeping gradients to every rank's shard."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return features
    world_size = dist.get_world_size()
    # all_gather needs identical shapes everywhere; check first so a mismatch is an error, not a hang or garbage
    shape = torch.tensor(features.shape, dtype=torch.long, device=features.device)
    shapes = [torch.empty_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape)
    if any(not torch.equal(s, shape) for s in shapes):
        raise ValueError(f"gather_groups: ranks hold features of different shapes {[s.tolist() for s in shapes]}; "
                         "give every rank the same number of groups and pairs per group (drop the last batch)")
    if not features.is_floating_point():  # text ids: labels, no gradient
        shards = [torch.empty_like(features) for _ in range(world_size)]
        dist.all_gather(shards, features.contiguous())
        return torch.cat(shards, dim=0)
    # torch.distributed.nn's all_gather is differentiable: its backward sums every rank's gradient for a shard.
    # torch 2.x marks it deprecated (a FutureWarning addressed to this code, not to users); printed at every step
    # of every rank it would bury a run's output (notebook 05 under train.processes), so it is silenced here alone
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*all_gather is deprecated", category=FutureWarning)
        shards = torch.distributed.nn.functional.all_gather(features)
    return torch.cat(shards, dim=0)


# -------------------------------------------------------------------------------------------- checks
def check_features(image_features: Tensor, text_features: Tensor, ndims: tuple[int, ...],
                    names: tuple[str, str] = ("image_features", "text_features")) -> None:
    """Raise ValueError naming the problem when the feature tensors cannot enter a loss."""
    pairs = ((names[0], image_features), (names[1], text_features))
    for name, x in pairs:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim not in ndims:
            want = " or ".join({2: "(B, L)", 3: "(M groups, N pairs, L)"}[n] for n in ndims)
            raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if any(size == 0 for size in x.shape):
            raise ValueError(f"{name} has an empty dimension {tuple(x.shape)}; every group needs at least one "
                             "pair and every vector at least one dimension")
    if image_features.shape != text_features.shape:
        raise ValueError(f"{names[0]} {tuple(image_features.shape)} and {names[1]} {tuple(text_features.shape)} "
                         "must have the same shape (row by row, each is the positive of the other)")
    finite = torch.stack([torch.isfinite(x).all() for _, x in pairs]).tolist()  # one device sync for both
    for (name, _), ok in zip(pairs, finite, strict=True):
        if not ok:
            raise ValueError(f"{name} contains NaN or Inf; check the encoder output (e.g. fp16 overflow)")


def check_text_ids(text_ids: Tensor | None, text_features: Tensor, name: str = "text_features") -> Tensor | None:
    """None, or integer ids shaped like the text features without their last axis, on the features' device."""
    if text_ids is None:
        return None
    if not isinstance(text_ids, Tensor):
        raise TypeError(f"text_ids must be a torch.Tensor of integer labels or None, got {type(text_ids).__name__}")
    if text_ids.is_floating_point() or text_ids.is_complex() or text_ids.dtype == torch.bool:
        raise ValueError(f"text_ids must hold integer labels (equal id = identical text), got {text_ids.dtype}")
    if tuple(text_ids.shape) != tuple(text_features.shape[:-1]):
        raise ValueError(f"text_ids has shape {tuple(text_ids.shape)} but {name} {tuple(text_features.shape)} "
                         f"needs {tuple(text_features.shape[:-1])}: one id per text")
    return text_ids.to(device=text_features.device, dtype=torch.long)


def check_temperature(tau: Temperature, name: str) -> Temperature:
    """A positive finite float, or a 0-dim tensor (a learned temperature, not checked to avoid a device sync)."""
    if isinstance(tau, Tensor):
        if tau.ndim != 0:
            raise ValueError(f"{name} must be a float or a 0-dim tensor, got shape {tuple(tau.shape)}")
        return tau.float() if tau.dtype in (torch.float16, torch.bfloat16) else tau
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {tau!r}")
    return float(tau)


def check_weighting(alpha: float, alpha_on: str) -> None:
    if alpha_on not in ("inner", "outer"):
        raise ValueError(f"alpha_on must be 'inner' (paper: alpha * inner) or 'outer' (authors' code: "
                         f"alpha * outer), got {alpha_on!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")


def full_precision(x: Tensor, other: Tensor) -> Tensor:
    """Cast to the common dtype of both inputs, at least float32 (float64 stays float64)."""
    dtype = torch.promote_types(torch.promote_types(x.dtype, other.dtype), torch.float32)
    return x.to(dtype)


def unit(x: Tensor) -> Tensor:
    """L2-normalize the last axis, exact for any scale: divide by the max |entry| first (a constant: detached)."""
    peak = x.detach().abs().amax(dim=-1, keepdim=True)
    peak = torch.where(peak > 0, peak, torch.ones_like(peak))
    return F.normalize(x / peak, dim=-1, eps=EPS)


def run_in_full_precision(image_features: Tensor, text_features: Tensor, text_ids: Tensor | None,
                           body: Callable[[Tensor, Tensor, Tensor | None], dict[str, Tensor]],
                           normalize: bool = True) -> dict[str, Tensor]:
    """Cast to full precision, gather groups (and ids) from all ranks, normalize (unless told not to), and call
    `body` with autocast off."""
    with torch.autocast(device_type=image_features.device.type, enabled=False):
        image = gather_groups(full_precision(image_features, text_features))
        text = gather_groups(full_precision(text_features, image_features))
        ids = gather_groups(text_ids) if text_ids is not None else None
        if normalize:
            image, text = unit(torch.stack([image, text])).unbind(0)  # one pass for both: fewer small ops
        return body(image, text, ids)


def combine_inner_outer(inner: Tensor, outer: Tensor, alpha: float, alpha_on: AlphaOn, return_parts: bool
             ) -> Tensor | dict[str, Tensor]:
    loss = alpha * inner + (1 - alpha) * outer if alpha_on == "inner" else alpha * outer + (1 - alpha) * inner
    return {"loss": loss, "inner": inner, "outer": outer} if return_parts else loss


# ------------------------------------------------------------------------------------------------ masks
def _equal_rows(rows: Tensor) -> Tensor:
    """(K, K) from (K, D): True where two different rows are equal (K x K matrix with a False diagonal)."""
    same = (rows[:, None] == rows[None, :]).all(dim=-1)
    return same & ~torch.eye(len(rows), dtype=torch.bool, device=rows.device)


def identical_pairs(ids: Tensor) -> Tensor:
    """(B, B) from (B,) ids: True where two different pairs have identical texts (never each other's negatives)."""
    return _equal_rows(ids[:, None])


def same_groups(ids: Tensor) -> Tensor:
    """(M, M) from (M, N) ids: True where two different groups hold the same multiset of ids (the same texts)."""
    return _equal_rows(ids.sort(dim=1).values)


def shared_texts(ids: Tensor) -> Tensor:
    """(M, M*N) from (M, N) ids: [g, (h, j)] True where h != g and text (h, j) equals some text of group g."""
    m, n = ids.shape
    shared = (ids[:, :, None, None] == ids[None, None]).any(dim=1)  # (M_g, M_h, N_j)
    shared &= ~torch.eye(m, dtype=torch.bool, device=ids.device)[:, :, None]
    return shared.reshape(m, m * n)
