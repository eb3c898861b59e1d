"""What the objectives did to the geometry: per model and level, the quantities the group losses act on (Eqs. 1-8),
measured on the test images' embeddings.

- within: the cosine of an image to its own group's centroid, the centroid taken without the image (a group of
  one has none: NaN).
- margin: within minus the highest cosine to the centroid of one of its group's hard-negative groups (the DAG's
  `hard_negatives` at that level, those present among the test images); ground-truth labels have no hard
  negatives, so there the nearest other group counts. Positive: the image is closer to its own group.

Each model's per-image values are paired with the zero-shot model's (same images), and the change is bootstrapped
over images; `geometry_differences` writes it in differences.csv's columns, so `compare.plot_difference_from_reference`
draws it like Fig. 4.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from cglib.evaluate.report import DIFF_COLUMNS

GEOMETRY_METRICS = ("within", "margin")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.clip(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12, None)


def group_geometry(embeddings: np.ndarray, groups: Sequence[str],
                   negatives: Mapping[str, Sequence[str]] | None = None) -> dict[str, np.ndarray]:
    """Per row: `within` (cosine to its group's centroid without itself) and `margin` (within minus the highest
    cosine to a negative group's centroid: `negatives[group]`, or every other group when None)."""
    x = _unit(np.asarray(embeddings, dtype=np.float64))
    names = sorted(set(groups))
    index = {g: k for k, g in enumerate(names)}
    rows = np.array([index[g] for g in groups])
    sums = np.zeros((len(names), x.shape[1]))
    np.add.at(sums, rows, x)
    counts = np.bincount(rows, minlength=len(names))
    others = sums[rows] - x  # the group's sum without the row itself
    with np.errstate(invalid="ignore", divide="ignore"):
        within = np.where(counts[rows] > 1, np.sum(x * _unit(others), axis=1), np.nan)
    sims = x @ _unit(sums).T  # (rows, groups): cosine to every full centroid
    if negatives is None:
        allowed = ~np.eye(len(names), dtype=bool)
    else:
        allowed = np.zeros((len(names), len(names)), dtype=bool)
        for g, k in index.items():
            allowed[k, [index[h] for h in negatives.get(g, ()) if h in index and h != g]] = True
    nearest = np.where(allowed[rows], sims, -np.inf).max(axis=1)
    margin = np.where(np.isfinite(nearest), within - nearest, np.nan)
    return {"within": within, "margin": margin}


def paired_change(values: np.ndarray, reference: np.ndarray, resamples: int, ci: float, seed: int
                  ) -> tuple[float, float, float, float, int]:
    """Mean of values - reference over the rows both define, its percentile bootstrap CI over rows, and a two-sided
    bootstrap p-value: (difference, low, high, p, n)."""
    keep = np.isfinite(values) & np.isfinite(reference)
    diff = values[keep] - reference[keep]
    if not diff.size:
        return float("nan"), float("nan"), float("nan"), float("nan"), 0
    draws = np.random.default_rng(seed).integers(0, diff.size, size=(resamples, diff.size))
    means = diff[draws].mean(axis=1)
    low, high = np.quantile(means, [(1 - ci) / 2, (1 + ci) / 2])
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return float(diff.mean()), float(low), float(high), p, int(diff.size)


def geometry_differences(per_image: Mapping[tuple[str, str, str], Mapping[str, np.ndarray]],
                         reference: str = "zero-shot", resamples: int = 1000, ci: float = 0.95, seed: int = 0
                         ) -> pd.DataFrame:
    """`per_image[(model, labels, level)]` = group_geometry's output (same images, same order for every model):
    each model minus `reference` per labels, level and metric, as differences.csv rows (benchmark 'geometry',
    direction 'image'); models without the reference's key are left out."""
    rows = []
    for (model, labels, level), values in per_image.items():
        base = per_image.get((reference, labels, level))
        if model == reference or base is None:
            continue
        for metric in GEOMETRY_METRICS:
            d, low, high, p, n = paired_change(values[metric], base[metric], resamples, ci, seed)
            rows.append({"model_a": model, "model_b": reference, "benchmark": "geometry", "labels": labels,
                         "direction": "image", "metric": metric, "level": level, "difference": d, "ci_low": low,
                         "ci_high": high, "n": n, "n_seeds": 1, "significant": low > 0 or high < 0, "p_value": p})
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)
