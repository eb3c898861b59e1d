"""What the evaluation corrections change: Table 3 corrected minus Table 3 as published (the
evaluation side of book/fidelity.md's corrections), per column, with a paired CI, on the same models.

The two protocols score different items (the corrected one redraws or excludes identical-text negatives, draws
distinct groups and random items), so they are paired by test image: each image's mean correctness under each
protocol, over the images both score, for every model; the change is the mean over the models of corrected minus
as published, its CI the paired bootstrap over those images (and the training seeds) that every interval of the
run uses (`set_difference`). Significance is Holm-corrected over the columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cglib.evaluate.bootstrap import Scores, set_difference
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.table3 import table3_columns

CHANGE_COLUMNS = ["column", "models", "images", "corrected", "as_published", "change", "ci_low", "ci_high", "p_value",
                  "p_holm", "significant"]


def image_means(scores: Scores, units: np.ndarray) -> Scores:
    """Each of `units`' mean score (per training seed): one query per unit, in the order of `units`."""
    rows = scores.rows().astype(np.float64)
    index = {u: k for k, u in enumerate(units.tolist())}
    keep = np.array([u in index for u in scores.units.tolist()], dtype=bool)
    slot = np.array([index[u] for u in scores.units[keep].tolist()], dtype=np.int64)
    counts = np.bincount(slot, minlength=units.size)
    sums = np.stack([np.bincount(slot, weights=row[keep], minlength=units.size) for row in rows])
    means = sums / np.maximum(counts, 1)
    return Scores(means if scores.n_seeds > 1 else means[0], units.copy())


def protocol_changes(metrics: pd.DataFrame, scores: dict[tuple[str, ...], dict[str, Scores]], resamples: int,
                     ci: float, seed: int) -> pd.DataFrame:
    """Per Table 3 column: the mean over every model of (corrected - as published) in points, on the test images
    both protocols score, with its paired CI and Holm-corrected significance."""
    if not len(metrics):
        return pd.DataFrame(columns=CHANGE_COLUMNS)
    published = {c.header: c for c in table3_columns(metrics, "as_published")}
    rows = []
    for c in table3_columns(metrics):
        p = published.get(c.header)
        if p is None:
            continue
        ours = scores.get((c.benchmark, c.labels, c.direction, c.metric, c.level), {})
        theirs = scores.get((p.benchmark, p.labels, p.direction, p.metric, p.level), {})
        models = [m for m in ours if m in theirs]
        if not models:
            continue
        common = np.intersect1d(np.unique(ours[models[0]].units), np.unique(theirs[models[0]].units))
        a = [image_means(ours[m], common) for m in models]
        b = [image_means(theirs[m], common) for m in models]
        diff, _ = set_difference(a, b, resamples, ci, seed, stream=f"protocol|{c.header}")
        rows.append({"column": c.header, "models": len(models), "images": int(common.size),
                     "corrected": 100 * float(np.mean([s.mean() for s in a])),
                     "as_published": 100 * float(np.mean([s.mean() for s in b])), "change": 100 * diff.value,
                     "ci_low": 100 * diff.low, "ci_high": 100 * diff.high, "p_value": diff.p_value})
    out = pd.DataFrame(rows, columns=[c for c in CHANGE_COLUMNS if c not in ("p_holm", "significant")])
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    out["significant"] = ((out["ci_low"] > 0) | (out["ci_high"] < 0)) & (out["p_holm"] <= 1 - ci)
    return out


def protocol_changes_markdown(changes: pd.DataFrame) -> list[str]:
    """The section of table3_as_published.md that says what the evaluation corrections change."""
    if changes.empty:
        return []
    lines = ["## What the evaluation corrections change (corrected minus as published, points)", "",
             "| column | change [95% CI] | corrected | as published | images | models |", "|---|---|---|---|---|---|"]
    for _, r in changes.iterrows():
        mark = " *" if r["significant"] else ""
        lines.append(f"| {r['column']} | {r['change']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]{mark} | "
                     f"{r['corrected']:.1f} | {r['as_published']:.1f} | {r['images']} | {r['models']} |")
    lines += ["", (f"- Mean over the {int(changes['models'].max())} models of each test image's accuracy under each "
              "protocol, on the images both score (the corrected protocol excludes items with no valid negative); "
              "paired bootstrap over those images; * marks a CI that excludes 0 and survives Holm's correction over "
              f"the {len(changes)} columns. All four evaluation fixes act together here (first texts, negatives "
              "with replacement and first items, identical texts allowed, ties to the anchor).")]
    return lines
