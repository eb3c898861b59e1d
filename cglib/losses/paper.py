"""The paper's losses (Sec. 3.2): the pairwise (Eqs. 1-4) and centroid (Eqs. 5-8) group losses, the CLIP baseline and
the textual pretraining loss, under the conventions of cglib.losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cglib.losses.conventions import (
    EPS,
    AlphaOn,
    Temperature,
    check_features,
    check_temperature,
    check_text_ids,
    check_weighting,
    combine_inner_outer,
    identical_pairs,
    run_in_full_precision,
    same_groups,
    shared_texts,
)


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
    if ids is not None:  # the mask depends on the anchor's group only: row (g, i) uses row g of shared_texts
        shared = shared_texts(ids)[None, :, None, :]  # broadcast over directions and the anchor's i
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
    norms = torch.bmm(image * image, (text * text).transpose(1, 2)).clamp_min(EPS**2).sqrt()  # (M, N, N)
    if normalize_products:  # authors' code: centroid = normalized mean of the normalized combined vectors
        # sum_ij I_i * T_j / ||I_i * T_j|| = sum_i I_i * (sum_j T_j / ||I_i * T_j||): no (M, N, N, L) tensor
        centroids = (image * torch.bmm(1 / norms, text)).sum(dim=1)
    else:  # Eq. 1 as printed: mean of the raw combined vectors = mean_i(I) * mean_j(T)
        centroids = image.mean(dim=1) * text.mean(dim=1)
    centroids = F.normalize(centroids, dim=-1, eps=EPS)
    if m < n:
        scaled = (image.unsqueeze(2) * centroids[None, None]).reshape(m, n * m, dim)  # [g, i*M + h] = I_gi * mu_h
        dots = torch.bmm(scaled, text.transpose(1, 2)).reshape(m, n, m, n).transpose(2, 3).reshape(m * n * n, m)
    else:
        dots = (image.unsqueeze(2) * text.unsqueeze(1)).reshape(m * n * n, dim) @ centroids.T
    logits = dots / norms.reshape(m * n * n, 1) / tau_inner  # cosine similarity: (M*N*N, M), rows (g, i, j)
    if ids is not None:
        logits = logits.masked_fill(same_groups(ids).repeat_interleave(n * n, dim=0), float("-inf"))
    labels = torch.arange(m, device=image.device).repeat_interleave(n * n)
    return F.cross_entropy(logits, labels)


def _centroid_parts(image: Tensor, text: Tensor, tau: Temperature, tau_inner: Temperature,
                    ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eqs. 5-7 on unit vectors: (inner, outer) of the centroid loss; groups with the same texts are not negatives."""
    m, n, dim = image.shape
    twins = same_groups(ids) if ids is not None else None  # groups holding the same texts
    features = torch.stack([image, text])  # (2, M, N, L): both modalities through the same ops
    centroids = F.normalize(features.mean(dim=2), dim=-1, eps=EPS)  # Eq. 5, (2, M, L)
    outer = _symmetric_info_nce(centroids[0], centroids[1], tau, twins)  # Eq. 6
    # Eq. 7: each image among the image centroids, each text among the text centroids
    logits = torch.bmm(features.reshape(2, m * n, dim), centroids.transpose(1, 2)) / tau_inner  # (2, M*N, M)
    if twins is not None:
        logits = logits.masked_fill(twins.repeat_interleave(n, dim=0), float("-inf"))
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
    check_features(image_features, text_features, ndims=(3,))
    text_ids = check_text_ids(text_ids, text_features)
    tau, tau_inner = check_temperature(tau, "tau"), check_temperature(tau_inner, "tau_inner")
    check_weighting(alpha, alpha_on)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        inner = _pairwise_inner(image, text, tau_inner, normalize_products, ids)
        return {"inner": inner, "outer": _pairwise_outer(image, text, tau, ids)}

    parts = run_in_full_precision(image_features, text_features, text_ids, body)
    return combine_inner_outer(parts["inner"], parts["outer"], alpha, alpha_on, return_parts)


def centroid_group_loss(image_features: Tensor, text_features: Tensor, tau: Temperature = 0.1,
                        tau_inner: Temperature = 0.1, alpha: float = 0.7, *, alpha_on: AlphaOn = "inner",
                        return_parts: bool = False, text_ids: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """Centroid group loss (Eqs. 5-8) of (M, N, L) features; `return_parts` gives {loss, inner, outer}.

    `text_ids` (M, N): two groups holding the same multiset of ids are not each other's negatives (module docstring).
    """
    check_features(image_features, text_features, ndims=(3,))
    text_ids = check_text_ids(text_ids, text_features)
    tau, tau_inner = check_temperature(tau, "tau"), check_temperature(tau_inner, "tau_inner")
    check_weighting(alpha, alpha_on)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        inner, outer = _centroid_parts(image, text, tau, tau_inner, ids)
        return {"inner": inner, "outer": outer}

    parts = run_in_full_precision(image_features, text_features, text_ids, body)
    return combine_inner_outer(parts["inner"], parts["outer"], alpha, alpha_on, return_parts)


def clip_loss(image_features: Tensor, text_features: Tensor, tau: Temperature = 0.1, *,
              text_ids: Tensor | None = None, normalize: bool = True) -> Tensor:
    """Standard symmetric InfoNCE over all M*N pairs of (M, N, L) or (B, L) features (the CLIP baseline).

    Equal to open_clip's ClipLoss (logit_scale = 1/tau) when no two texts are identical. `text_ids` ((M, N) or
    (B,)): pairs whose texts have equal ids are removed from each other's denominators, in both directions.
    `normalize` false: the logits are products of the features as given (open_clip's ClipLoss on unnormalized
    features, as the authors trained their transformers CLIP model), not cosines.
    """
    check_features(image_features, text_features, ndims=(2, 3))
    text_ids = check_text_ids(text_ids, text_features)
    tau = check_temperature(tau, "tau")
    dim = image_features.shape[-1]

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        not_negative = identical_pairs(ids.reshape(-1)) if ids is not None else None
        return {"loss": _symmetric_info_nce(image.reshape(-1, dim), text.reshape(-1, dim), tau, not_negative)}

    return run_in_full_precision(image_features, text_features, text_ids, body, normalize)["loss"]


def text_alignment_loss(text_a: Tensor, text_b: Tensor, tau: Temperature = 0.1, *,
                        text_ids: Tensor | None = None, normalize: bool = True) -> Tensor:
    """Text-text symmetric InfoNCE between (B, L) embeddings, row b of each the positive of the other (Sec. 3.2.4).

    `text_ids` (B,): rows with equal ids (identical targets, or targets of one group) are not each other's negatives.
    `normalize` false: the logits are products of the features as given (open_clip's ClipLoss on the text tower's
    raw outputs, as the authors' textual pretraining computes it).
    """
    check_features(text_a, text_b, ndims=(2,), names=("text_a", "text_b"))
    text_ids = check_text_ids(text_ids, text_b, name="text_b")
    tau = check_temperature(tau, "tau")

    def body(a: Tensor, b: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        return {"loss": _symmetric_info_nce(a, b, tau, identical_pairs(ids) if ids is not None else None)}

    return run_in_full_precision(text_a, text_b, text_ids, body, normalize)["loss"]
