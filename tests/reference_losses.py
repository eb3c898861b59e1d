"""Literal loop implementations of the paper's losses (Eqs. 1-8), written term by term from the equations.

They are the ground truth that tests/test_losses.py compares `cglib.losses` against, and the "loops" baseline
of benchmarks/bench_losses.py. Deliberately naive: Python loops over groups, pairs and anchors, one cosine at a
time, `-log(numerator / denominator)` as printed (use float64 in tests). Features are (M, N, L); each vector is
L2-normalized first, as the library does.

`ids` (optional, nested lists or a tensor of text ids, shaped like the texts) applies the identity rule of
cglib.losses literally, by skipping candidates in the denominators: a candidate whose text is identical to the
anchor's (flat losses), identical to a text of the anchor's group (pairwise outer), or a group holding the same
multiset of texts as the anchor's group (centroid terms and the pairwise inner term). None skips nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor


def cos(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity s(a, b) of two vectors."""
    return torch.dot(a, b) / (a.norm() * b.norm())


def unit(x: Tensor) -> Tensor:
    """One vector divided by its L2 norm."""
    return x / x.norm()


def _units(features: Tensor) -> list[list[Tensor]]:
    return [[unit(features[g, i]) for i in range(features.shape[1])] for g in range(features.shape[0])]


def _as_lists(ids) -> list | None:
    return ids.tolist() if isinstance(ids, Tensor) else ids


def _same_group(ids: list | None, g: int, h: int) -> bool:
    """Groups g != h hold the same multiset of text ids."""
    return ids is not None and g != h and sorted(ids[g]) == sorted(ids[h])


def ref_clip_loss(image: Tensor, text: Tensor, tau: float, ids=None) -> Tensor:
    """CLIP InfoNCE over B pairs, (B, L) each: mean of image->text and text->image -log softmax of the diagonal."""
    ids = _as_lists(ids)
    imgs, txts = [unit(x) for x in image], [unit(x) for x in text]
    b = len(imgs)

    def candidates(k: int) -> list[int]:  # the anchor's own pair, and every pair whose text is not identical
        return [m for m in range(b) if m == k or ids is None or ids[m] != ids[k]]

    total = image.new_zeros(())
    for k in range(b):
        total = total - torch.log(torch.exp(cos(imgs[k], txts[k]) / tau)
                                  / sum(torch.exp(cos(imgs[k], txts[m]) / tau) for m in candidates(k)))
        total = total - torch.log(torch.exp(cos(txts[k], imgs[k]) / tau)
                                  / sum(torch.exp(cos(txts[k], imgs[m]) / tau) for m in candidates(k)))
    return total / (2 * b)



def ref_clip_hn_loss(image: Tensor, text: Tensor, hard: Tensor, columns, tau: float, ids=None) -> Tensor:
    """CLIP InfoNCE over B pairs where image k's row has column columns[k] (if >= 0) replaced by its hard text.

    Image k: denominator over the same candidates as ref_clip_loss, except that candidate columns[k] contributes
    exp(cos(image k, hard k) / tau) instead of its text. Text anchors are exactly ref_clip_loss's.
    """
    ids = _as_lists(ids)
    columns = _as_lists(columns)
    imgs, txts, hards = [unit(x) for x in image], [unit(x) for x in text], [unit(x) for x in hard]
    b = len(imgs)

    def candidates(k: int) -> list[int]:
        return [m for m in range(b) if m == k or ids is None or ids[m] != ids[k]]

    total = image.new_zeros(())
    for k in range(b):
        denominator = image.new_zeros(())
        for m in range(b):
            if m == columns[k]:
                denominator = denominator + torch.exp(cos(imgs[k], hards[k]) / tau)
            elif m in candidates(k):
                denominator = denominator + torch.exp(cos(imgs[k], txts[m]) / tau)
        total = total - torch.log(torch.exp(cos(imgs[k], txts[k]) / tau) / denominator)
        total = total - torch.log(torch.exp(cos(txts[k], imgs[k]) / tau)
                                  / sum(torch.exp(cos(txts[k], imgs[m]) / tau) for m in candidates(k)))
    return total / (2 * b)

def ref_pairwise_outer(image: Tensor, text: Tensor, tau: float, ids=None) -> Tensor:
    """Eq. 2: each image's positives are the N texts of its group, denominator all M*N texts; and vice versa."""
    ids = _as_lists(ids)
    m, n = image.shape[:2]
    imgs, txts = _units(image), _units(text)

    def kept(g: int, h: int, j: int) -> bool:  # candidate (h, j) stays unless its text is one of group g's
        return h == g or ids is None or ids[h][j] not in ids[g]

    total = image.new_zeros(())
    for anchors, others in ((imgs, txts), (txts, imgs)):
        for g in range(m):
            for i in range(n):
                positive = sum(torch.exp(cos(anchors[g][i], others[g][j]) / tau) for j in range(n))
                everything = sum(torch.exp(cos(anchors[g][i], others[h][j]) / tau)
                                 for h in range(m) for j in range(n) if kept(g, h, j))
                total = total - torch.log(positive / everything)
    return total / (2 * m * n)


def ref_pairwise_centroids(image: Tensor, text: Tensor, normalize_products: bool) -> list[Tensor]:
    """Eq. 1: mu_g = 1/N^2 sum_ij I[g,i] * T[g,j]; authors' code: normalized mean of normalized products."""
    m, n = image.shape[:2]
    imgs, txts = _units(image), _units(text)
    centroids = []
    for g in range(m):
        products = [imgs[g][i] * txts[g][j] for i in range(n) for j in range(n)]
        if normalize_products:
            centroids.append(unit(sum(unit(p) for p in products) / n**2))
        else:
            centroids.append(sum(products) / n**2)
    return centroids


def ref_pairwise_inner(image: Tensor, text: Tensor, tau_inner: float, normalize_products: bool = False,
                       ids=None) -> Tensor:
    """Eq. 3: every combined vector I[g,i] * T[g,j] classified among the M centroids by s(., mu_h) / tau'."""
    ids = _as_lists(ids)
    m, n = image.shape[:2]
    imgs, txts = _units(image), _units(text)
    centroids = ref_pairwise_centroids(image, text, normalize_products)
    total = image.new_zeros(())
    for g in range(m):
        for i in range(n):
            for j in range(n):
                c = imgs[g][i] * txts[g][j]
                if normalize_products:
                    c = unit(c)
                numerator = torch.exp(cos(c, centroids[g]) / tau_inner)
                denominator = sum(torch.exp(cos(c, centroids[h]) / tau_inner) for h in range(m)
                                  if not _same_group(ids, g, h))
                total = total - torch.log(numerator / denominator)
    return total / (m * n * n)


def weighted(inner: Tensor, outer: Tensor, alpha: float, alpha_on: str) -> Tensor:
    """Eqs. 4 and 8 (alpha on inner) or the authors' code (alpha on outer)."""
    if alpha_on == "inner":
        return alpha * inner + (1 - alpha) * outer
    return alpha * outer + (1 - alpha) * inner


def ref_pairwise_loss(image: Tensor, text: Tensor, tau: float, tau_inner: float, alpha: float,
                      alpha_on: str = "inner", normalize_products: bool = False, ids=None) -> Tensor:
    """Eq. 4."""
    return weighted(ref_pairwise_inner(image, text, tau_inner, normalize_products, ids),
                    ref_pairwise_outer(image, text, tau, ids), alpha, alpha_on)


def ref_centroids(features: Tensor) -> list[Tensor]:
    """Eq. 5: mean of the group's (unit) vectors."""
    units = _units(features)
    return [sum(group) / len(group) for group in units]


def ref_centroid_outer(image: Tensor, text: Tensor, tau: float, ids=None) -> Tensor:
    """Eq. 6: CLIP InfoNCE between the M image centroids and the M text centroids."""
    ids = _as_lists(ids)
    m = image.shape[0]
    image_centroids, text_centroids = ref_centroids(image), ref_centroids(text)
    total = image.new_zeros(())
    for anchors, others in ((image_centroids, text_centroids), (text_centroids, image_centroids)):
        for g in range(m):
            total = total - torch.log(torch.exp(cos(anchors[g], others[g]) / tau)
                                      / sum(torch.exp(cos(anchors[g], others[h]) / tau) for h in range(m)
                                            if not _same_group(ids, g, h)))
    return total / (2 * m)


def ref_centroid_inner(image: Tensor, text: Tensor, tau_inner: float, ids=None) -> Tensor:
    """Eq. 7: each image among the M image centroids, each text among the M text centroids, with tau'."""
    ids = _as_lists(ids)
    m, n = image.shape[:2]
    total = image.new_zeros(())
    for features in (image, text):
        units, centroids = _units(features), ref_centroids(features)
        for g in range(m):
            for i in range(n):
                total = total - torch.log(
                    torch.exp(cos(units[g][i], centroids[g]) / tau_inner)
                    / sum(torch.exp(cos(units[g][i], centroids[h]) / tau_inner) for h in range(m)
                          if not _same_group(ids, g, h)))
    return total / (2 * m * n)


def ref_centroid_loss(image: Tensor, text: Tensor, tau: float, tau_inner: float, alpha: float,
                      alpha_on: str = "inner", ids=None) -> Tensor:
    """Eq. 8."""
    return weighted(ref_centroid_inner(image, text, tau_inner, ids), ref_centroid_outer(image, text, tau, ids),
                    alpha, alpha_on)


def ref_exterior_angle(r: Tensor, e: Tensor, e_prime: Tensor, eps: float = 1e-6) -> Tensor:
    """HierarCaps Xi_r(e, e') = arccos(cos(e - r, e' - e)) of three unit vectors (clamped like cglib.radial)."""
    a, b = e - r, e_prime - e
    c = torch.dot(a, b) / (a.norm() * b.norm())
    return torch.arccos(c.clamp(-1 + eps, 1 - eps))


def ref_radial_embedding_loss(root: Tensor, positives: Tensor, negatives: Tensor, frozen_positives: Tensor,
                              frozen_negatives: Tensor, w_mean: float = 1.0, w_minimax: float = 1.0,
                              w_reg: float = 10.0) -> dict[str, Tensor]:
    """HierarCaps RE loss, literally: triplets (P_i, P_{i+1}, N_i) item by item, then mean, mini-max and L_reg."""
    r = unit(root)
    b, k = positives.shape[:2]
    triplets = []  # (L_RE, positive angle, negative angle)
    for item in range(b):
        p = [unit(positives[item, i]) for i in range(k)]
        n = [unit(negatives[item, i]) for i in range(k)]
        for i in range(k - 1):
            pos, neg = ref_exterior_angle(r, p[i], p[i + 1]), ref_exterior_angle(r, p[i], n[i])
            triplets.append((pos - neg, pos, neg))
    mean = sum(t[0] for t in triplets) / len(triplets)
    largest_pos = max(range(len(triplets)), key=lambda t: triplets[t][1].item())
    smallest_neg = min(range(len(triplets)), key=lambda t: triplets[t][2].item())
    minimax = triplets[largest_pos][0] + triplets[smallest_neg][0]
    cosines = [cos(texts[item, i], frozen[item, i]) for texts, frozen in ((positives, frozen_positives),
                                                                          (negatives, frozen_negatives))
               for item in range(b) for i in range(k)]
    reg = (1 - sum(cosines) / len(cosines)) / 2
    return {"loss": w_mean * mean + w_minimax * minimax + w_reg * reg, "mean": mean, "minimax": minimax,
            "reg": reg, "angle_pos": sum(t[1] for t in triplets) / len(triplets),
            "angle_neg": sum(t[2] for t in triplets) / len(triplets)}


def ref_memory_centroid_loss(image: Tensor, text: Tensor, memory_image: Tensor, memory_text: Tensor,
                             index: list[int], tau: float, tau_inner: float, alpha: float, alpha_on: str = "inner",
                             ids=None) -> Tensor:
    """Eqs. 5-8 against all G concepts: concept c is the live centroid of the batch group g with index[g] == c,
    else memory row c; each batch anchor's positive is its own group's row, its candidates are all G rows except
    the rows of other batch groups holding the same texts."""
    ids = _as_lists(ids)
    m, n = image.shape[:2]
    g_all = memory_image.shape[0]
    live = {index[g]: g for g in range(m)}
    image_centroids, text_centroids = ref_centroids(image), ref_centroids(text)
    bank_image = [image_centroids[live[c]] if c in live else memory_image[c] for c in range(g_all)]
    bank_text = [text_centroids[live[c]] if c in live else memory_text[c] for c in range(g_all)]

    def kept(g: int, c: int) -> bool:  # candidate concept c for an anchor of batch group g
        return c not in live or not _same_group(ids, g, live[c])

    outer = image.new_zeros(())
    for anchors, bank in ((image_centroids, bank_text), (text_centroids, bank_image)):
        for g in range(m):
            outer = outer - torch.log(torch.exp(cos(anchors[g], bank[index[g]]) / tau)
                                      / sum(torch.exp(cos(anchors[g], bank[c]) / tau) for c in range(g_all)
                                            if kept(g, c)))
    outer = outer / (2 * m)
    inner = image.new_zeros(())
    for features, bank in ((image, bank_image), (text, bank_text)):
        units = _units(features)
        for g in range(m):
            for i in range(n):
                inner = inner - torch.log(torch.exp(cos(units[g][i], bank[index[g]]) / tau_inner)
                                          / sum(torch.exp(cos(units[g][i], bank[c]) / tau_inner)
                                                for c in range(g_all) if kept(g, c)))
    inner = inner / (2 * m * n)
    return weighted(inner, outer, alpha, alpha_on)


def ref_mcc_loss(image: Tensor, concept: Tensor, tau: float) -> Tensor:
    """MCC (cglib.losses.mcc_loss) term by term: in group g's space z = unit(h_g * unit(I)), each image of g
    against the other images of g (positives) over every other image of the batch (denominator)."""
    m, n = image.shape[0], image.shape[1]
    total = image.new_zeros(())
    for g in range(m):
        z = [[unit(concept[g] * unit(image[h, k])) for k in range(n)] for h in range(m)]
        for i in range(n):
            denominator = sum(torch.exp(torch.dot(z[g][i], z[h][k]) / tau)
                              for h in range(m) for k in range(n) if (h, k) != (g, i))
            for j in range(n):
                if j != i:
                    total = total - torch.log(torch.exp(torch.dot(z[g][i], z[g][j]) / tau) / denominator) / (n - 1)
    return total / (m * n)
