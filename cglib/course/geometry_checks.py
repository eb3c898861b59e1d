"""Checks of notebook 07's exercises: the within-group cosine and the margin of every image (against
`cglib.evaluate.geometry.group_geometry`) and attention rollout (against `cglib.viz.attention`'s maps of a seeded
small ViT)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from cglib.config import ModelParams
from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, difference, passed
from cglib.evaluate.geometry import GEOMETRY_METRICS, group_geometry
from cglib.models import build_model
from cglib.viz.attention import AttentionMaps, attention_rollout, extract_attention


def geometry_case(seed: int) -> tuple[np.ndarray, list[str]]:
    """Seeded embeddings of uneven length in a few groups, one of them a single image (its within is NaN)."""
    rng = np.random.default_rng(seed)
    n_groups, dim = int(rng.integers(3, 6)), int(rng.integers(4, 12))
    centres = rng.normal(size=(n_groups, dim))
    sizes = [1, *rng.integers(2, 6, size=n_groups - 1)]
    groups = [f"group {g}" for g, size in enumerate(sizes) for _ in range(size)]
    rows = np.array([int(g.split()[1]) for g in groups])
    x = centres[rows] + 0.8 * rng.normal(size=(len(rows), dim))
    x *= rng.uniform(0.5, 3.0, size=(len(rows), 1))  # uneven lengths: a missing normalization shows
    order = rng.permutation(len(rows))  # groups interleaved, not in blocks
    return x[order], [groups[k] for k in order]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _with_itself(x: np.ndarray, groups: list[str]) -> np.ndarray:
    """The classic slip: each image's cosine to its group's centroid *including* the image."""
    u = _unit(x)
    names = sorted(set(groups))
    centroids = _unit(np.stack([u[[g == n for g in groups]].mean(0) for n in names]))
    own = np.array([centroids[names.index(g)] @ u[k] for k, g in enumerate(groups)])
    return own


def _geometry_hints(metric: str, yours: np.ndarray, expected: np.ndarray, x: np.ndarray, groups: list[str]
                    ) -> list[str]:
    hints = []
    defined = ~np.isnan(expected)
    if metric == "within":
        sizes = {g: groups.count(g) for g in groups}
        single = np.array([sizes[g] == 1 for g in groups])
        if not np.isnan(yours[single]).all():
            hints.append("an image alone in its group has no centroid to compare with once it is left out: its "
                         "within is NaN (np.nan), not a number")
        if np.allclose(yours[~single], _with_itself(x, groups)[~single], atol=1e-6):
            hints.append("it equals the cosine to the centroid *with* the image itself: leave the image out (its "
                         "group's sum minus the image) so a small group does not look tighter than it is")
    if metric == "margin" and np.allclose(yours[defined], -expected[defined], atol=1e-6):
        hints.append("the sign is flipped: margin = within - (cosine to the nearest other group's centroid), "
                     "positive when the image is closer to its own group")
    if not hints:
        hints.append("normalize every embedding first, then the centroids (a mean of unit vectors is shorter than "
                     "one); the nearest other group uses the full centroids of the other groups")
    return hints


def check_group_geometry(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(embeddings, groups)` -> {"within": (n,), "margin": (n,)} per image must match `group_geometry(embeddings,
    groups)` (every other group counts as a negative) on every seeded case."""
    for seed in seeds:
        x, groups = geometry_case(seed)
        answer = fn(x.copy(), list(groups))
        if not isinstance(answer, dict) or set(GEOMETRY_METRICS) - set(answer):
            got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
            raise CheckFailed(f"return a dict with the keys within and margin (one value per image); got {got}")
        expected = group_geometry(x, groups)
        for metric in GEOMETRY_METRICS:
            yours = np.asarray(answer[metric], dtype=np.float64)
            if yours.shape != expected[metric].shape:
                raise CheckFailed(f"{metric!r} has shape {yours.shape}; return one value per image, shape "
                                  f"{expected[metric].shape} (the case has {len(groups)} images)")
            if np.allclose(yours, expected[metric], rtol=1e-6, atol=1e-8, equal_nan=True):
                continue
            wrong = np.flatnonzero(~np.isclose(yours, expected[metric], rtol=1e-6, atol=1e-8, equal_nan=True))
            k = int(wrong[0])
            lines = [(f"{metric}: {len(wrong)} of {len(groups)} images differ on seed {seed} ({len(set(groups))} "
                     f"groups); image {k} of {groups[k]!r} (a group of {groups.count(groups[k])}): "
                     f"{difference(float(yours[k]), float(expected[metric][k]))}")]
            lines += [f"  hint: {h}" for h in _geometry_hints(metric, yours, expected[metric], x, groups)]
            raise CheckFailed("\n".join(lines))
    passed("your within-group cosine and margin", seeds)


def small_vit_maps(seed: int, images: int = 2) -> AttentionMaps:
    """The attention of a seeded small ViT (two layers, two heads) on seeded random images."""
    torch.manual_seed(seed)
    bundle = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))
    size = bundle.model.visual.image_size[0]
    pixels = np.random.default_rng(seed).integers(0, 256, size=(images, size, size, 3), dtype=np.uint8)
    return extract_attention(bundle, pixels)


def _rollout_hints(yours: torch.Tensor, attentions: torch.Tensor) -> list[str]:
    a = attentions.mean(dim=2)
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    residual = (a + eye) / (a + eye).sum(dim=-1, keepdim=True)
    variants = {
        "without the identity: add I to each layer's head-averaged attention (the residual path carries every "
        "token on) before renormalizing": a,
        "the identity added but the rows not renormalized: divide each row of A + I by its sum (by 2)": a + eye,
        "the layers multiplied in the wrong order: the first layer acts first, so R = A'_L ... A'_2 A'_1 "
        "(each new layer on the left)": residual.flip(0),
    }
    hints = []
    for words, layers in variants.items():
        product = eye.expand_as(layers[0]).clone()
        for layer in layers:
            product = layer @ product
        if torch.allclose(yours, product, atol=1e-5):
            hints.append(f"it equals the rollout {words}")
    if not hints:
        hints.append("average the heads (mean over dim 2), add the identity, renormalize the rows, and multiply "
                     "the layers first to last starting from the identity")
    return hints


def check_rollout(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(attentions)` with attentions (layers, n, heads, L, L) -> the rollout (n, L, L) must match
    `attention_rollout` on the attention of a seeded small ViT."""
    seeds = tuple(seeds)
    for seed in seeds:
        attentions = small_vit_maps(seed).attentions
        yours = fn(attentions.clone())
        if not isinstance(yours, torch.Tensor):
            raise CheckFailed(f"return a tensor of shape (n, L, L); got a {type(yours).__name__}")
        expected = attention_rollout(attentions)
        if yours.shape != expected.shape:
            hint = (" (that is one map per layer: multiply the layers together)" if yours.ndim == 4 else
                    " (that is the class-token row only: return the whole matrix, whose row 0 is the map)"
                    if yours.ndim == 2 else "")
            raise CheckFailed(f"your rollout has shape {tuple(yours.shape)}; the library's is "
                              f"{tuple(expected.shape)}: one (L, L) matrix per image{hint}")
        yours = yours.to(expected.dtype)
        if torch.allclose(yours, expected, atol=1e-5):
            continue
        row_sums = yours.sum(dim=-1)
        worst = (yours - expected).abs().max().item()
        lines = [(f"rollout differs on seed {seed} ({attentions.shape[0]} layers, {attentions.shape[2]} heads, "
                 f"{attentions.shape[-1]} tokens): largest difference {worst:.3g}; your rows sum to "
                 f"{row_sums.min().item():.4g} ... {row_sums.max().item():.4g} (the library's to 1)")]
        lines += [f"  hint: {h}" for h in _rollout_hints(yours, attentions)]
        raise CheckFailed("\n".join(lines))
    passed("your attention rollout (on a seeded small ViT)", seeds)
