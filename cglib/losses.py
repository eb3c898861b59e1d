r"""Contrastive losses of CLEAR GLASS (paper Sec. 3.2, Eqs. 1-8), the CLIP baseline and the textual pretraining loss.

Features come as `(M, N, L)` tensors: M groups (a MAGIC node and its hard negatives), N image-text pairs per
group, L embedding dimensions. Every loss L2-normalizes its inputs, so `s(a, b)` below is the cosine similarity.

- `pairwise_group_loss` (Eqs. 1-4): outer = InfoNCE whose positives are all N texts (images) of the anchor's
  group among all M*N; inner = each combined vector `I[g,i] * T[g,j]` (element-wise) classified among the M
  group centroids `mu_g = mean_ij I[g,i] * T[g,j]` with temperature tau'.
- `centroid_group_loss` (Eqs. 5-8): outer = CLIP InfoNCE between the M image centroids and the M text
  centroids; inner = each image (text) classified among the M image (text) centroids with tau'.
- `memory_centroid_loss`: the same against a memory of all G concepts' centroids (DCCL, Pu et al. CVPR 2023;
  the memory and its momentum update live in cglib/train/objectives/concept_memory.py): the batch's groups are live, the rest
  constant rows.
- `clip_loss`: standard symmetric InfoNCE over all pairs (the baseline); `text_alignment_loss`: the same between
  two sets of texts (textual alignment pretraining, Sec. 3.2.4).

Conventions shared by every loss here:
- Numerics: computed in float32 (float64 inputs stay float64) with autocast disabled, through log-sum-exp /
  cross-entropy, so they are finite for tau in [0.01, 10] and features of any scale. Each vector is divided
  by its largest absolute entry before `F.normalize`, so neither 1e-30 nor 1e30 under- or overflows. A zero
  feature vector is allowed: it normalizes to zero (F.normalize's eps), has similarity 0 to everything and a
  large but finite gradient.
- M = 1 is allowed: there is nothing to contrast, so every group term is exactly 0 (a cross-entropy over one
  class); the pairwise outer term over one group is 0 too.
- alpha: `alpha_on="inner"` weights `alpha * inner + (1 - alpha) * outer` (paper, Eqs. 4 and 8);
  `alpha_on="outer"` weights `alpha * outer + (1 - alpha) * inner` (the authors' code, whose default
  alpha = 1.2233 lies outside [0, 1]; any finite alpha is accepted).
- Identical texts (`text_ids`): every loss takes integer labels of the texts, shaped like the text features
  without their last axis ((M, N) for groups, (B,) for flat inputs); equal ids mean identical strings (or, as a
  caller decides, texts that must not be contrasted, e.g. two targets of one group in textual pretraining). Two
  texts with equal ids are never each other's negatives: their logits are removed from the softmax denominators
  (masked to -inf), positives are unchanged. Unmasked, two pairs sharing a caption put the same logit in the
  numerator and in a negative, so the CLIP loss of those anchors cannot go below ln 2. Term by term:
  * `clip_loss`, `text_alignment_loss`: anchor b and candidate b' != b with ids[b] == ids[b'] (both directions:
    the image of an identical text is not a negative of that text either).
  * pairwise outer (Eq. 2): a candidate (h, j) of another group h != g whose id equals the id of ANY text of the
    anchor's group g is removed from the denominators of every anchor of g (images and texts alike): group g's
    texts are all positives of its anchors, so a copy of one of them elsewhere is a positive in disguise.
  * group-vs-group terms (centroid outer Eq. 6, centroid inner Eq. 7, pairwise inner Eq. 3): they contrast
    centroids, means of whole groups, never an individual text. Two groups are each other's negatives unless
    they hold the same multiset of ids (then their text centroids are identical, the groups are the same group
    twice, and they are removed from each other's denominators). A shared caption between otherwise different
    groups does not mask: their centroids differ and separating those groups is what the loss is for.
  `text_ids=None`, or ids that are all distinct, give exactly the unmasked values (no other op changes).
- Distributed: when `torch.distributed` is initialized with world_size > 1, `gather_groups` concatenates every
  rank's features (and text ids) along the first axis (whole groups; every rank must pass the same shape) and
  each rank returns the loss of the whole global batch, equal to the single-process (masked) loss. Gradients flow back to every
  rank's shard through `torch.distributed.nn.functional.all_gather`, whose backward sums the gradient of all
  ranks' (identical) losses: the gradient w.r.t. a rank's local features is world_size times the
  single-process gradient, so that after DDP averages parameter gradients over ranks they equal the
  single-process gradient exactly (tested with 2 gloo processes in tests/test_losses_distributed.py).
"""

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

_EPS = 1e-12  # same eps as F.normalize: floor of a norm before dividing by it


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
def _check_features(image_features: Tensor, text_features: Tensor, ndims: tuple[int, ...],
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


def _check_text_ids(text_ids: Tensor | None, text_features: Tensor, name: str = "text_features") -> Tensor | None:
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


def _check_temperature(tau: Temperature, name: str) -> Temperature:
    """A positive finite float, or a 0-dim tensor (a learned temperature, not checked to avoid a device sync)."""
    if isinstance(tau, Tensor):
        if tau.ndim != 0:
            raise ValueError(f"{name} must be a float or a 0-dim tensor, got shape {tuple(tau.shape)}")
        return tau.float() if tau.dtype in (torch.float16, torch.bfloat16) else tau
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {tau!r}")
    return float(tau)


def _check_weighting(alpha: float, alpha_on: str) -> None:
    if alpha_on not in ("inner", "outer"):
        raise ValueError(f"alpha_on must be 'inner' (paper: alpha * inner) or 'outer' (authors' code: "
                         f"alpha * outer), got {alpha_on!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")


def _full_precision(x: Tensor, other: Tensor) -> Tensor:
    """Cast to the common dtype of both inputs, at least float32 (float64 stays float64)."""
    dtype = torch.promote_types(torch.promote_types(x.dtype, other.dtype), torch.float32)
    return x.to(dtype)


def _unit(x: Tensor) -> Tensor:
    """L2-normalize the last axis, exact for any scale: divide by the max |entry| first (a constant: detached)."""
    peak = x.detach().abs().amax(dim=-1, keepdim=True)
    peak = torch.where(peak > 0, peak, torch.ones_like(peak))
    return F.normalize(x / peak, dim=-1, eps=_EPS)


def _run_in_full_precision(image_features: Tensor, text_features: Tensor, text_ids: Tensor | None,
                           body: Callable[[Tensor, Tensor, Tensor | None], dict[str, Tensor]],
                           normalize: bool = True) -> dict[str, Tensor]:
    """Cast to full precision, gather groups (and ids) from all ranks, normalize (unless told not to), and call
    `body` with autocast off."""
    with torch.autocast(device_type=image_features.device.type, enabled=False):
        image = gather_groups(_full_precision(image_features, text_features))
        text = gather_groups(_full_precision(text_features, image_features))
        ids = gather_groups(text_ids) if text_ids is not None else None
        if normalize:
            image, text = _unit(torch.stack([image, text])).unbind(0)  # one pass for both: fewer small ops
        return body(image, text, ids)


def _combine(inner: Tensor, outer: Tensor, alpha: float, alpha_on: AlphaOn, return_parts: bool
             ) -> Tensor | dict[str, Tensor]:
    loss = alpha * inner + (1 - alpha) * outer if alpha_on == "inner" else alpha * outer + (1 - alpha) * inner
    return {"loss": loss, "inner": inner, "outer": outer} if return_parts else loss


# ------------------------------------------------------------------------------------------------ masks
def _equal_rows(rows: Tensor) -> Tensor:
    """(K, K) from (K, D): True where two different rows are equal (K x K matrix with a False diagonal)."""
    same = (rows[:, None] == rows[None, :]).all(dim=-1)
    return same & ~torch.eye(len(rows), dtype=torch.bool, device=rows.device)


def _identical_pairs(ids: Tensor) -> Tensor:
    """(B, B) from (B,) ids: True where two different pairs have identical texts (never each other's negatives)."""
    return _equal_rows(ids[:, None])


def _same_groups(ids: Tensor) -> Tensor:
    """(M, M) from (M, N) ids: True where two different groups hold the same multiset of ids (the same texts)."""
    return _equal_rows(ids.sort(dim=1).values)


def _shared_texts(ids: Tensor) -> Tensor:
    """(M, M*N) from (M, N) ids: [g, (h, j)] True where h != g and text (h, j) equals some text of group g."""
    m, n = ids.shape
    shared = (ids[:, :, None, None] == ids[None, None]).any(dim=1)  # (M_g, M_h, N_j)
    shared &= ~torch.eye(m, dtype=torch.bool, device=ids.device)[:, :, None]
    return shared.reshape(m, m * n)


# ------------------------------------------------------------------------------------------ building blocks
def _symmetric_info_nce(image: Tensor, text: Tensor, tau: Temperature, not_negative: Tensor | None = None) -> Tensor:
    """CLIP loss on (B, L) features, unit vectors unless the caller chose raw ones: row b of each side is the positive
    of row b of the other.

    `not_negative` (B, B), symmetric with a False diagonal: candidates removed from each anchor's denominator.
    """
    logits = image @ text.T / tau
    if not_negative is not None:  # symmetric, so the same mask serves logits.T (texts as anchors)
        logits = logits.masked_fill(not_negative, float("-inf"))
    both_directions = torch.cat([logits, logits.T])  # rows: images as anchors, then texts as anchors
    labels = torch.arange(logits.shape[0], device=logits.device).repeat(2)
    return F.cross_entropy(both_directions, labels)  # = mean of the image->text and text->image losses


def _pairwise_outer(image: Tensor, text: Tensor, tau: Temperature, ids: Tensor | None = None) -> Tensor:
    """Eq. 2: -log(sum over the anchor group's N positives / sum over all M*N), both directions, mean 1/(2MN).

    With ids, a candidate of another group identical to a text of the anchor's group leaves the denominator.
    """
    m, n, dim = image.shape
    logits = image.reshape(m * n, dim) @ text.reshape(m * n, dim).T / tau
    both_directions = torch.stack([logits, logits.T])  # [0]: image anchors, [1]: text anchors
    if ids is not None:  # the mask depends on the anchor's group only: row (g, i) uses row g of _shared_texts
        shared = _shared_texts(ids)[None, :, None, :]  # broadcast over directions and the anchor's i
        both_directions = both_directions.view(2, m, n, m * n).masked_fill(shared, float("-inf")).view(2, m * n, m * n)
    log_all = both_directions.logsumexp(dim=-1)  # (2, M*N)
    # positives of anchor (g, i) are the candidates (g, j): the diagonal blocks of the (M, N, M, N) view
    positives = torch.diagonal(both_directions.reshape(2, m, n, m, n), dim1=1, dim2=3)  # (2, N_i, N_j, M)
    log_positive = positives.logsumexp(dim=2).transpose(1, 2).reshape(2, m * n)
    return (log_all - log_positive).mean()


def _pairwise_inner(image: Tensor, text: Tensor, tau_inner: Temperature, normalize_products: bool,
                    ids: Tensor | None = None) -> Tensor:
    """Eq. 3: classify each of the M*N*N combined vectors I[g,i] * T[g,j] among the M centroids, cosine / tau'.

    The dot products <I_i * T_j, mu_h> = sum_l I_il T_jl mu_hl go through whichever intermediate is smaller: the
    (M, N*M, L) vectors I_i * mu_h (one batched matmul with T per group) when M < N, else the (M*N*N, L)
    combined vectors times the centroids; memory O(M*N*L*min(M, N)). This pair was the fastest of the exact
    formulations measured in benchmarks/bench_losses.py (einsum was no faster). The norms factorize too:
    ||I_i * T_j||^2 = (I*I)_i . (T*T)_j. With ids, groups holding the same texts are not each other's negatives.
    """
    m, n, dim = image.shape
    norms = torch.bmm(image * image, (text * text).transpose(1, 2)).clamp_min(_EPS**2).sqrt()  # (M, N, N)
    if normalize_products:  # authors' code: centroid = normalized mean of the normalized combined vectors
        # sum_ij I_i * T_j / ||I_i * T_j|| = sum_i I_i * (sum_j T_j / ||I_i * T_j||): no (M, N, N, L) tensor
        centroids = (image * torch.bmm(1 / norms, text)).sum(dim=1)
    else:  # Eq. 1 as printed: mean of the raw combined vectors = mean_i(I) * mean_j(T)
        centroids = image.mean(dim=1) * text.mean(dim=1)
    centroids = F.normalize(centroids, dim=-1, eps=_EPS)
    if m < n:
        scaled = (image.unsqueeze(2) * centroids[None, None]).reshape(m, n * m, dim)  # [g, i*M + h] = I_gi * mu_h
        dots = torch.bmm(scaled, text.transpose(1, 2)).reshape(m, n, m, n).transpose(2, 3).reshape(m * n * n, m)
    else:
        dots = (image.unsqueeze(2) * text.unsqueeze(1)).reshape(m * n * n, dim) @ centroids.T
    logits = dots / norms.reshape(m * n * n, 1) / tau_inner  # cosine similarity: (M*N*N, M), rows (g, i, j)
    if ids is not None:
        logits = logits.masked_fill(_same_groups(ids).repeat_interleave(n * n, dim=0), float("-inf"))
    labels = torch.arange(m, device=image.device).repeat_interleave(n * n)
    return F.cross_entropy(logits, labels)


def _centroid_parts(image: Tensor, text: Tensor, tau: Temperature, tau_inner: Temperature,
                    ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eqs. 5-7 on unit vectors: (inner, outer) of the centroid loss; groups with the same texts are not negatives."""
    m, n, dim = image.shape
    same_groups = _same_groups(ids) if ids is not None else None
    features = torch.stack([image, text])  # (2, M, N, L): both modalities through the same ops
    centroids = F.normalize(features.mean(dim=2), dim=-1, eps=_EPS)  # Eq. 5, (2, M, L)
    outer = _symmetric_info_nce(centroids[0], centroids[1], tau, same_groups)  # Eq. 6
    # Eq. 7: each image among the image centroids, each text among the text centroids
    logits = torch.bmm(features.reshape(2, m * n, dim), centroids.transpose(1, 2)) / tau_inner  # (2, M*N, M)
    if same_groups is not None:
        logits = logits.masked_fill(same_groups.repeat_interleave(n, dim=0), float("-inf"))
    labels = torch.arange(m, device=image.device).repeat_interleave(n).repeat(2)
    inner = F.cross_entropy(logits.reshape(2 * m * n, m), labels)
    return inner, outer


# --------------------------------------------------------------------------------------------- public
def pairwise_group_loss(image_features: Tensor, text_features: Tensor, tau: Temperature = 0.1,
                        tau_inner: Temperature = 0.1, alpha: float = 0.7, *, alpha_on: AlphaOn = "inner",
                        normalize_products: bool = False, return_parts: bool = False,
                        text_ids: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """Pairwise group loss (Eqs. 1-4) of (M, N, L) features; `return_parts` gives {loss, inner, outer}.

    `text_ids` (M, N): equal ids are identical texts, never each other's negatives (see the module docstring).
    """
    _check_features(image_features, text_features, ndims=(3,))
    text_ids = _check_text_ids(text_ids, text_features)
    tau, tau_inner = _check_temperature(tau, "tau"), _check_temperature(tau_inner, "tau_inner")
    _check_weighting(alpha, alpha_on)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        inner = _pairwise_inner(image, text, tau_inner, normalize_products, ids)
        return {"inner": inner, "outer": _pairwise_outer(image, text, tau, ids)}

    parts = _run_in_full_precision(image_features, text_features, text_ids, body)
    return _combine(parts["inner"], parts["outer"], alpha, alpha_on, return_parts)


def centroid_group_loss(image_features: Tensor, text_features: Tensor, tau: Temperature = 0.1,
                        tau_inner: Temperature = 0.1, alpha: float = 0.7, *, alpha_on: AlphaOn = "inner",
                        return_parts: bool = False, text_ids: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """Centroid group loss (Eqs. 5-8) of (M, N, L) features; `return_parts` gives {loss, inner, outer}.

    `text_ids` (M, N): two groups holding the same multiset of ids are not each other's negatives (module docstring).
    """
    _check_features(image_features, text_features, ndims=(3,))
    text_ids = _check_text_ids(text_ids, text_features)
    tau, tau_inner = _check_temperature(tau, "tau"), _check_temperature(tau_inner, "tau_inner")
    _check_weighting(alpha, alpha_on)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        inner, outer = _centroid_parts(image, text, tau, tau_inner, ids)
        return {"inner": inner, "outer": outer}

    parts = _run_in_full_precision(image_features, text_features, text_ids, body)
    return _combine(parts["inner"], parts["outer"], alpha, alpha_on, return_parts)


def _check_memory(memory_image: Tensor, memory_text: Tensor, group_index: Tensor, image_features: Tensor
                  ) -> Tensor:
    """Raise ValueError naming the problem when the memory or the group index cannot enter the memory loss."""
    _check_features(memory_image, memory_text, ndims=(2,), names=("memory_image", "memory_text"))
    if memory_image.shape[1] != image_features.shape[-1]:
        raise ValueError(f"memory rows have {memory_image.shape[1]} dimensions but the features have "
                         f"{image_features.shape[-1]}; build the memory from the same model")
    if not isinstance(group_index, Tensor) or group_index.is_floating_point() or group_index.dtype == torch.bool:
        raise ValueError("group_index must be an integer tensor: each group's row in the memory")
    if tuple(group_index.shape) != (image_features.shape[0],):
        raise ValueError(f"group_index has shape {tuple(group_index.shape)}; it needs one memory row per group "
                         f"({image_features.shape[0]},)")
    return group_index.to(device=image_features.device, dtype=torch.long)


def _memory_centroid_parts(image: Tensor, text: Tensor, memory: Tensor, index: Tensor, tau: Temperature,
                           tau_inner: Temperature, ids: Tensor | None = None) -> dict[str, Tensor]:
    """Eqs. 5-7 against all G concepts: memory (2, G, L) unit rows, the batch's rows `index` (M,) replaced live."""
    m, n, dim = image.shape
    g = memory.shape[1]
    if bool((index < 0).any()) or bool((index >= g).any()) or len(torch.unique(index)) != m:
        raise ValueError(f"group_index must hold distinct memory rows in [0, {g}), got {index.tolist()}; "
                         "a batch holds each group once")
    features = torch.stack([image, text])  # (2, M, N, L)
    centroids = F.normalize(features.mean(dim=2), dim=-1, eps=_EPS)  # Eq. 5, (2, M, L)
    # the bank of every concept: memory rows (constants) with the batch's groups swapped for their live centroids
    bank = memory.detach().index_copy(1, index, centroids)  # (2, G, L)
    # Eq. 6: image centroids among all G text centroids ([0]), text centroids among all G image centroids ([1])
    outer_logits = torch.bmm(centroids, bank.flip(0).transpose(1, 2)) / tau  # (2, M, G)
    # Eq. 7: each image among all G image centroids, each text among all G text centroids
    inner_logits = torch.bmm(features.reshape(2, m * n, dim), bank.transpose(1, 2)) / tau_inner  # (2, M*N, G)
    if ids is not None:  # batch groups holding the same texts are not each other's negatives (memory rows: no ids)
        mask = torch.zeros(m, g, dtype=torch.bool, device=image.device)
        mask[:, index] = _same_groups(ids)
        outer_logits = outer_logits.masked_fill(mask, float("-inf"))
        inner_logits = inner_logits.masked_fill(mask.repeat_interleave(n, dim=0), float("-inf"))
    outer = F.cross_entropy(outer_logits.reshape(2 * m, g), index.repeat(2))
    inner = F.cross_entropy(inner_logits.reshape(2 * m * n, g), index.repeat_interleave(n).repeat(2))
    return {"inner": inner, "outer": outer, "centroids": centroids.detach(), "group_index": index}


def memory_centroid_loss(image_features: Tensor, text_features: Tensor, memory_image: Tensor, memory_text: Tensor,
                         group_index: Tensor, tau: Temperature = 0.1, tau_inner: Temperature = 0.1,
                         alpha: float = 0.7, *, alpha_on: AlphaOn = "inner", return_parts: bool = False,
                         text_ids: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """Centroid group loss (Eqs. 5-8) of (M, N, L) features against a memory of all G concepts (DCCL, Pu et al.).

    `memory_image`, `memory_text` (G, L): every concept's image and text centroid (normalized here, never
    differentiated); `group_index` (M,): each batch group's memory row, where its live centroid (with gradient)
    replaces the memory's. Outer: each batch image (text) centroid among all G text (image) centroids; inner: each
    image (text) among all G image (text) centroids. With G = M and the memory holding the live centroids this is
    `centroid_group_loss`. `text_ids` mask the batch's groups only (memory rows carry no ids). `return_parts` gives
    {loss, inner, outer, centroids, group_index}: the last two, the detached (2, M, L) image/text centroids and
    the row indices of the whole (rank-gathered) batch, are what `ConceptMemory.stage` takes.
    """
    _check_features(image_features, text_features, ndims=(3,))
    group_index = _check_memory(memory_image, memory_text, group_index, image_features)
    text_ids = _check_text_ids(text_ids, text_features)
    tau, tau_inner = _check_temperature(tau, "tau"), _check_temperature(tau_inner, "tau_inner")
    _check_weighting(alpha, alpha_on)
    index = gather_groups(group_index)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        memory = _unit(torch.stack([memory_image, memory_text]).detach().to(image.dtype))
        return _memory_centroid_parts(image, text, memory, index, tau, tau_inner, ids)

    parts = _run_in_full_precision(image_features, text_features, text_ids, body)
    if not return_parts:
        return _combine(parts["inner"], parts["outer"], alpha, alpha_on, False)
    return {**_combine(parts["inner"], parts["outer"], alpha, alpha_on, True),
            "centroids": parts["centroids"], "group_index": parts["group_index"]}


def clip_loss(image_features: Tensor, text_features: Tensor, tau: Temperature = 0.1, *,
              text_ids: Tensor | None = None, normalize: bool = True) -> Tensor:
    """Standard symmetric InfoNCE over all M*N pairs of (M, N, L) or (B, L) features (the CLIP baseline).

    Equal to open_clip's ClipLoss (logit_scale = 1/tau) when no two texts are identical. `text_ids` ((M, N) or
    (B,)): pairs whose texts have equal ids are removed from each other's denominators, in both directions.
    `normalize` false: the logits are products of the features as given (open_clip's ClipLoss on unnormalized
    features, as the authors trained their transformers CLIP model), not cosines.
    """
    _check_features(image_features, text_features, ndims=(2, 3))
    text_ids = _check_text_ids(text_ids, text_features)
    tau = _check_temperature(tau, "tau")
    dim = image_features.shape[-1]

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        not_negative = _identical_pairs(ids.reshape(-1)) if ids is not None else None
        return {"loss": _symmetric_info_nce(image.reshape(-1, dim), text.reshape(-1, dim), tau, not_negative)}

    return _run_in_full_precision(image_features, text_features, text_ids, body, normalize)["loss"]


def clip_hn_loss(image_features: Tensor, text_features: Tensor, hard_text_features: Tensor, hard_columns: Tensor,
                 tau: Temperature = 0.1, *, text_ids: Tensor | None = None) -> Tensor:
    """CLIP loss where each image's keyword-permuted caption replaces one negative of its image->text row.

    Rösch et al.'s hard negatives: `hard_text_features` (shaped like the texts) holds pair b's permuted caption,
    `hard_columns` (shaped like `text_ids`) the column of the flattened (global) batch whose logit in image b's
    row it replaces, -1 for a pair without one (its row stays as in `clip_loss`). The text->image direction is
    `clip_loss`'s. A replaced column is never the row's own and its logit is never masked (the permuted caption
    differs from the row's text); the builder chooses it among the row's unmasked negatives.
    """
    _check_features(image_features, text_features, ndims=(2, 3))
    _check_features(image_features, hard_text_features, ndims=(2, 3), names=("image_features", "hard_text_features"))
    text_ids = _check_text_ids(text_ids, text_features)
    if not isinstance(hard_columns, Tensor) or hard_columns.is_floating_point() or hard_columns.dtype == torch.bool:
        raise ValueError("hard_columns must be an integer tensor (the replaced column of each row, -1 for none)")
    if tuple(hard_columns.shape) != tuple(text_features.shape[:-1]):
        raise ValueError(f"hard_columns has shape {tuple(hard_columns.shape)} but text_features "
                         f"{tuple(text_features.shape)} needs {tuple(text_features.shape[:-1])}: one column per pair")
    hard_columns = hard_columns.to(device=text_features.device, dtype=torch.long)
    tau = _check_temperature(tau, "tau")
    dim = image_features.shape[-1]

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        image, text = image.reshape(-1, dim), text.reshape(-1, dim)
        hard = _unit(gather_groups(_full_precision(hard_text_features, image_features))).reshape(-1, dim)
        columns = gather_groups(hard_columns).reshape(-1)
        b = image.shape[0]
        rows = torch.arange(b, device=image.device)
        if bool(((columns < -1) | (columns >= b) | (columns == rows)).any()):
            raise ValueError(f"hard_columns must be -1 or a column in [0, {b}) other than the row's own pair; "
                             "the batch builder chose an invalid negative column")
        logits = image @ text.T / tau
        if ids is not None:
            logits = logits.masked_fill(_identical_pairs(ids.reshape(-1)), float("-inf"))
        hard_logits = (image * hard).sum(dim=-1) / tau  # (B,): image b vs its own permuted caption
        replaced = (columns[:, None] == rows[None, :])  # (B, B): one True per row with a hard negative
        image_rows = torch.where(replaced, hard_logits[:, None], logits)
        both_directions = torch.cat([image_rows, logits.T])
        return {"loss": F.cross_entropy(both_directions, rows.repeat(2))}

    return _run_in_full_precision(image_features, text_features, text_ids, body)["loss"]


def text_alignment_loss(text_a: Tensor, text_b: Tensor, tau: Temperature = 0.1, *,
                        text_ids: Tensor | None = None) -> Tensor:
    """Text-text symmetric InfoNCE between (B, L) embeddings, row b of each the positive of the other (Sec. 3.2.4).

    `text_ids` (B,): rows with equal ids (identical targets, or targets of one group) are not each other's negatives.
    """
    _check_features(text_a, text_b, ndims=(2,), names=("text_a", "text_b"))
    text_ids = _check_text_ids(text_ids, text_b, name="text_b")
    tau = _check_temperature(tau, "tau")

    def body(a: Tensor, b: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        return {"loss": _symmetric_info_nce(a, b, tau, _identical_pairs(ids) if ids is not None else None)}

    return _run_in_full_precision(text_a, text_b, text_ids, body)["loss"]


# ------------------------------------------------------------------------------------ MCC (C3, cglib.related)
def mcc_loss(image_features: Tensor, concept_features: Tensor, tau: Temperature = 0.1) -> Tensor:
    r"""MCC ("Capture Concept through Comparison"): images of a group compared in a space conditioned on its concept.

    `image_features` (M, N, L): N images of each of M groups; `concept_features` (M, L): h_g, the vector of group
    g's concept (in training, a trainable MLP of the concept name's frozen text embedding, cglib.train.objectives.concept_head).
    With I the unit image vectors and z^g = normalize(h_g * I) (element-wise: the concept re-weights the joint
    space's dimensions), the images of group g are positives of each other and every image of another group is
    a negative, in g's space (supervised contrastive, SupCon "out" form):

        L = 1/(M N) sum_g sum_i  -1/(N-1) sum_{j != i} log( exp(<z^g_gi, z^g_gj> / tau)
                                                            / sum_{(h,k) != (g,i)} exp(<z^g_gi, z^g_hk> / tau) )

    Needs N >= 2 (positives). A group's repeated image (a group with fewer than N images) is its own positive at
    another position. Numerics and the distributed gather follow the module's conventions (float32 or better,
    autocast off; whole groups gathered from every rank, concept vectors with them).
    """
    _check_features(image_features, image_features, ndims=(3,), names=("image_features", "image_features"))
    if not isinstance(concept_features, Tensor) or concept_features.ndim != 2 or not concept_features.is_floating_point():
        raise ValueError("concept_features must be a floating-point (M groups, L) tensor, one vector per group")
    m, n, dim = image_features.shape
    if tuple(concept_features.shape) != (m, dim):
        raise ValueError(f"concept_features {tuple(concept_features.shape)} must be (M, L) = {(m, dim)}: one vector "
                         "per group, in the image features' space")
    if n < 2:
        raise ValueError("mcc_loss needs at least 2 images per group (its positives); set train.pairs_per_group >= 2")
    if not bool(torch.isfinite(concept_features).all()):
        raise ValueError("concept_features contains NaN or Inf; check the concept head")
    tau = _check_temperature(tau, "tau")
    with torch.autocast(device_type=image_features.device.type, enabled=False):
        image = _unit(gather_groups(_full_precision(image_features, concept_features)))
        concept = gather_groups(_full_precision(concept_features, image_features))
        m, n, dim = image.shape
        z = _unit(concept[:, None, None, :] * image[None])  # (M concepts, M groups, N, L): every image, every space
        rows = torch.arange(m, device=image.device)
        anchors = z[rows, rows]  # (M, N, L): group g's images in g's own space
        logits = torch.bmm(anchors, z.reshape(m, m * n, dim).transpose(1, 2)) / tau  # (M, N, M*N)
        own = torch.arange(n, device=image.device)
        self_column = (rows[:, None] * n + own[None, :])[..., None] == torch.arange(m * n, device=image.device)
        log_all = logits.masked_fill(self_column, float("-inf")).logsumexp(dim=-1)  # (M, N)
        positives = torch.diagonal(logits.reshape(m, n, m, n), dim1=0, dim2=2).permute(2, 0, 1)  # (M, N_i, N_j)
        log_prob = positives - log_all[..., None]
        not_self = ~torch.eye(n, dtype=torch.bool, device=image.device)
        return -(log_prob * not_self).sum(dim=-1).div(n - 1).mean()
