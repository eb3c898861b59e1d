r"""Radial Embedding (RE) alignment of HierarCaps (Alper and Averbuch-Elor, ECCV 2024): the Table 3 baseline's loss.

Text embeddings are placed radially around a root `r`, the text embedding of the empty string (computed by the
same text tower, so it carries gradient and moves during fine-tuning). Genericness is the distance from the
root, `d_r(e) = |e - r|`; the exterior angle at `e` towards `e'` is `Xi_r(e, e') = arccos(cos(e - r, e' - e))`:
small when `e'` lies further out along the ray from `r` through `e` (a specialization of `e`), large otherwise.

Items: K >= 2 positives `P_1` (most general) .. `P_K` (most specific; HierarCaps K = 4, its last tier a
caption; MAGIC-derived items K = l_max + 1) and K negatives `N_1..N_K`, `N_i` contradicting `P_i` while
entailing `P_{i-1}`. Triplets `(e, e', e'') = (P_i, P_{i+1}, N_i)` for i = 1..K-1, as in the authors' code
(1-based `(P_k, P_{k+1})` against `(P_k, N_k)`): the child `P_{i+1}` lies inside `P_i`'s cone, the
contradicting `N_i` outside it. `L_RE = Xi_r(P_i, P_{i+1}) - Xi_r(P_i, N_i)`. `N_K` is in no triplet; it only
enters the regularizer.

Per batch: `mean` = mean of L_RE over all B*(K-1) triplets; `minimax` = L_RE of the triplet with the largest
positive angle + L_RE of the triplet with the smallest negative angle (argmax/argmin over the whole batch; the
selection itself carries no gradient). `reg = (1 - mean cos(e_i, e_i*)) / 2` over all 2K texts of every item,
`e_i*` the embedding by the frozen original text tower. Total = `w_mean * mean + w_minimax * minimax +
w_reg * reg` (defaults 1, 1, 10 as in the paper).

Numerics follow `cglib.losses`: float32 (float64 inputs stay float64) with autocast disabled; every embedding,
the root too, is unit-normalized first (exact for any scale). The directions `e - r` and `e' - e` are normalized
with F.normalize's eps, so a zero difference (a text embedded exactly at the root, or two identical texts) has
direction 0, cosine 0 and angle pi/2, with finite gradients. `arccos` gets its argument clamped to
`[-1 + eps, 1 - eps]`, so its derivative stays finite (at most 1 / sqrt(2 eps - eps^2)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from cglib.losses.conventions import EPS, unit

ARCCOS_EPS = 1e-6  # arccos argument clamped to [-1 + eps, 1 - eps]: derivative at most ~707


def _check_embeddings(name: str, x: object, ndim: int, shape_text: str) -> Tensor:
    """Raise TypeError/ValueError naming the argument when it cannot enter the RE loss."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if any(size == 0 for size in x.shape):
        raise ValueError(f"{name} has an empty dimension {tuple(x.shape)}")
    return x


def _check_weight(name: str, w: object) -> float:
    if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
        raise ValueError(f"{name} must be a finite number, got {w!r}")
    return float(w)


def _dtype(*xs: Tensor) -> torch.dtype:
    dtype = torch.float32
    for x in xs:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


def _direction(x: Tensor) -> Tensor:
    """Unit direction of a difference of unit vectors; a zero difference gives 0 (F.normalize's eps floor)."""
    return F.normalize(x, dim=-1, eps=EPS)


def exterior_angle(root: Tensor, e: Tensor, e_prime: Tensor, eps: float = ARCCOS_EPS) -> Tensor:
    """Xi_r(e, e') = arccos(cos(e - r, e' - e)) of unit-normalized inputs, broadcast over leading axes."""
    with torch.autocast(device_type=e.device.type, enabled=False):
        dtype = _dtype(root, e, e_prime)
        r, a, b = (unit(x.to(dtype)) for x in (root, e, e_prime))
        return _angle(r, a, b, eps)


def _angle(r: Tensor, e: Tensor, e_prime: Tensor, eps: float) -> Tensor:
    cos = (_direction(e - r) * _direction(e_prime - e)).sum(dim=-1)
    return torch.arccos(cos.clamp(-1 + eps, 1 - eps))


def genericness(root: Tensor, e: Tensor) -> Tensor:
    """d_r(e) = |e - r| of unit-normalized root (L,) and embeddings (..., L); computed without autocast."""
    _check_embeddings("root", root, 1, "(L,)")
    if not isinstance(e, Tensor) or e.ndim == 0 or not e.is_floating_point():
        raise ValueError(f"e must be a floating-point tensor of shape (..., L), got {e!r:.80}")
    if root.shape[-1] != e.shape[-1]:
        raise ValueError(f"root has {root.shape[-1]} dimensions but e has {e.shape[-1]}; embed both with the "
                         "same text tower")
    with torch.autocast(device_type=e.device.type, enabled=False):
        dtype = _dtype(root, e)
        return (unit(e.to(dtype)) - unit(root.to(dtype))).norm(dim=-1)


def radial_embedding_loss(root: Tensor, positives: Tensor, negatives: Tensor,
                          frozen_positives: Tensor | None = None, frozen_negatives: Tensor | None = None, *,
                          w_mean: float = 1.0, w_minimax: float = 1.0, w_reg: float = 10.0,
                          eps: float = ARCCOS_EPS, return_parts: bool = False) -> Tensor | dict[str, Tensor]:
    """HierarCaps RE loss of root (L,), positives and negatives (B, K, L), frozen-tower copies for the regularizer.

    `frozen_positives` / `frozen_negatives` (B, K, L): the same 2K texts embedded by the frozen original text
    tower (detached here); required unless `w_reg == 0`. `return_parts` gives {loss, mean, minimax, reg,
    angle_pos, angle_neg} (the last two: mean positive and negative exterior angles, in radians).
    """
    _check_embeddings("root", root, 1, "(L,): the text embedding of the empty string")
    _check_embeddings("positives", positives, 3, "(B items, K tiers, L)")
    _check_embeddings("negatives", negatives, 3, "(B items, K tiers, L)")
    if positives.shape != negatives.shape:
        raise ValueError(f"positives {tuple(positives.shape)} and negatives {tuple(negatives.shape)} must have "
                         "the same shape: one negative per tier")
    if positives.shape[1] < 2:
        raise ValueError(f"positives have K = {positives.shape[1]} tiers; the RE loss needs K >= 2 (general to "
                         "specific) to form a triplet")
    if root.shape[0] != positives.shape[-1]:
        raise ValueError(f"root has {root.shape[0]} dimensions but the texts have {positives.shape[-1]}; embed "
                         "the empty string with the same text tower")
    w_mean, w_minimax, w_reg = (_check_weight(n, w) for n, w in
                                (("w_mean", w_mean), ("w_minimax", w_minimax), ("w_reg", w_reg)))
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    frozen = (frozen_positives, frozen_negatives)
    if w_reg != 0 and any(f is None for f in frozen):
        raise ValueError("w_reg != 0 needs frozen_positives and frozen_negatives (the texts embedded by the "
                         "frozen original text tower); pass them, or set w_reg=0")
    for name, f in zip(("frozen_positives", "frozen_negatives"), frozen, strict=True):
        if f is not None:
            _check_embeddings(name, f, 3, "(B items, K tiers, L)")
            if f.shape != positives.shape:
                raise ValueError(f"{name} {tuple(f.shape)} must have the shape of positives "
                                 f"{tuple(positives.shape)}: the same texts, embedded by the frozen tower")
    finite = torch.stack([torch.isfinite(x).all() for x in (root, positives, negatives)]).tolist()
    for name, ok in zip(("root", "positives", "negatives"), finite, strict=True):
        if not ok:
            raise ValueError(f"{name} contains NaN or Inf; check the text encoder output (e.g. fp16 overflow)")

    with torch.autocast(device_type=positives.device.type, enabled=False):
        dtype = _dtype(root, positives, negatives)
        r = unit(root.to(dtype))
        texts = unit(torch.stack([positives.to(dtype), negatives.to(dtype)]))  # (2, B, K, L)
        pos, neg = texts.unbind(0)
        e, e_pos, e_neg = pos[:, :-1], pos[:, 1:], neg[:, :-1]  # triplets (P_i, P_{i+1}, N_i), (B, K-1, L)
        outward = _direction(e - r)
        angles = torch.stack([(outward * _direction(e_pos - e)).sum(-1),
                              (outward * _direction(e_neg - e)).sum(-1)])  # (2, B, K-1) cosines
        angle_pos, angle_neg = torch.arccos(angles.clamp(-1 + eps, 1 - eps)).unbind(0)
        l_re = (angle_pos - angle_neg).reshape(-1)
        mean = l_re.mean()
        minimax = l_re[angle_pos.detach().reshape(-1).argmax()] + l_re[angle_neg.detach().reshape(-1).argmin()]
        if frozen_positives is not None and frozen_negatives is not None:
            star = unit(torch.stack([frozen_positives.detach().to(dtype), frozen_negatives.detach().to(dtype)]))
            reg = (1 - (texts * star).sum(-1).mean()) / 2
        else:
            reg = texts.new_zeros(())
        loss = w_mean * mean + w_minimax * minimax + w_reg * reg
    if not return_parts:
        return loss
    return {"loss": loss, "mean": mean, "minimax": minimax, "reg": reg,
            "angle_pos": angle_pos.mean(), "angle_neg": angle_neg.mean()}
