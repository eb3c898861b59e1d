"""The related methods' losses (cglib.related): the centroid loss against a memory of every concept (DCCL), the
CLIP loss with keyword-permuted hard negatives (Rösch et al.) and MCC, under the conventions of cglib.losses."""

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
    full_precision,
    gather_groups,
    identical_pairs,
    run_in_full_precision,
    same_groups,
    unit,
)


def _check_memory(memory_image: Tensor, memory_text: Tensor, group_index: Tensor, image_features: Tensor
                  ) -> Tensor:
    """Raise ValueError naming the problem when the memory or the group index cannot enter the memory loss."""
    check_features(memory_image, memory_text, ndims=(2,), names=("memory_image", "memory_text"))
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
    centroids = F.normalize(features.mean(dim=2), dim=-1, eps=EPS)  # Eq. 5, (2, M, L)
    # the bank of every concept: memory rows (constants) with the batch's groups swapped for their live centroids
    bank = memory.detach().index_copy(1, index, centroids)  # (2, G, L)
    # Eq. 6: image centroids among all G text centroids ([0]), text centroids among all G image centroids ([1])
    outer_logits = torch.bmm(centroids, bank.flip(0).transpose(1, 2)) / tau  # (2, M, G)
    # Eq. 7: each image among all G image centroids, each text among all G text centroids
    inner_logits = torch.bmm(features.reshape(2, m * n, dim), bank.transpose(1, 2)) / tau_inner  # (2, M*N, G)
    if ids is not None:  # batch groups holding the same texts are not each other's negatives (memory rows: no ids)
        mask = torch.zeros(m, g, dtype=torch.bool, device=image.device)
        mask[:, index] = same_groups(ids)
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
    check_features(image_features, text_features, ndims=(3,))
    group_index = _check_memory(memory_image, memory_text, group_index, image_features)
    text_ids = check_text_ids(text_ids, text_features)
    tau, tau_inner = check_temperature(tau, "tau"), check_temperature(tau_inner, "tau_inner")
    check_weighting(alpha, alpha_on)
    index = gather_groups(group_index)

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        memory = unit(torch.stack([memory_image, memory_text]).detach().to(image.dtype))
        return _memory_centroid_parts(image, text, memory, index, tau, tau_inner, ids)

    parts = run_in_full_precision(image_features, text_features, text_ids, body)
    if not return_parts:
        return combine_inner_outer(parts["inner"], parts["outer"], alpha, alpha_on, False)
    return {**combine_inner_outer(parts["inner"], parts["outer"], alpha, alpha_on, True),
            "centroids": parts["centroids"], "group_index": parts["group_index"]}


def clip_hn_loss(image_features: Tensor, text_features: Tensor, hard_text_features: Tensor, hard_columns: Tensor,
                 tau: Temperature = 0.1, *, text_ids: Tensor | None = None) -> Tensor:
    """CLIP loss where each image's keyword-permuted caption replaces one negative of its image->text row.

    Rösch et al.'s hard negatives: `hard_text_features` (shaped like the texts) holds pair b's permuted caption,
    `hard_columns` (shaped like `text_ids`) the column of the flattened (global) batch whose logit in image b's
    row it replaces, -1 for a pair without one (its row stays as in `clip_loss`). The text->image direction is
    `clip_loss`'s. A replaced column is never the row's own and its logit is never masked (the permuted caption
    differs from the row's text); the builder chooses it among the row's unmasked negatives.
    """
    check_features(image_features, text_features, ndims=(2, 3))
    check_features(image_features, hard_text_features, ndims=(2, 3), names=("image_features", "hard_text_features"))
    text_ids = check_text_ids(text_ids, text_features)
    if not isinstance(hard_columns, Tensor) or hard_columns.is_floating_point() or hard_columns.dtype == torch.bool:
        raise ValueError("hard_columns must be an integer tensor (the replaced column of each row, -1 for none)")
    if tuple(hard_columns.shape) != tuple(text_features.shape[:-1]):
        raise ValueError(f"hard_columns has shape {tuple(hard_columns.shape)} but text_features "
                         f"{tuple(text_features.shape)} needs {tuple(text_features.shape[:-1])}: one column per pair")
    hard_columns = hard_columns.to(device=text_features.device, dtype=torch.long)
    tau = check_temperature(tau, "tau")
    dim = image_features.shape[-1]

    def body(image: Tensor, text: Tensor, ids: Tensor | None) -> dict[str, Tensor]:
        image, text = image.reshape(-1, dim), text.reshape(-1, dim)
        hard = unit(gather_groups(full_precision(hard_text_features, image_features))).reshape(-1, dim)
        columns = gather_groups(hard_columns).reshape(-1)
        b = image.shape[0]
        rows = torch.arange(b, device=image.device)
        if bool(((columns < -1) | (columns >= b) | (columns == rows)).any()):
            raise ValueError(f"hard_columns must be -1 or a column in [0, {b}) other than the row's own pair; "
                             "the batch builder chose an invalid negative column")
        logits = image @ text.T / tau
        if ids is not None:
            logits = logits.masked_fill(identical_pairs(ids.reshape(-1)), float("-inf"))
        hard_logits = (image * hard).sum(dim=-1) / tau  # (B,): image b vs its own permuted caption
        replaced = (columns[:, None] == rows[None, :])  # (B, B): one True per row with a hard negative
        image_rows = torch.where(replaced, hard_logits[:, None], logits)
        both_directions = torch.cat([image_rows, logits.T])
        return {"loss": F.cross_entropy(both_directions, rows.repeat(2))}

    return run_in_full_precision(image_features, text_features, text_ids, body)["loss"]


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
    another position. Numerics and the distributed gather follow cglib.losses' conventions (float32 or better,
    autocast off; whole groups gathered from every rank, concept vectors with them).
    """
    check_features(image_features, image_features, ndims=(3,), names=("image_features", "image_features"))
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
    tau = check_temperature(tau, "tau")
    with torch.autocast(device_type=image_features.device.type, enabled=False):
        image = unit(gather_groups(full_precision(image_features, concept_features)))
        concept = gather_groups(full_precision(concept_features, image_features))
        m, n, dim = image.shape
        z = unit(concept[:, None, None, :] * image[None])  # (M concepts, M groups, N, L): every image, every space
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
