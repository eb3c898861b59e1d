"""The automatic reading of one metric: each comparison's significant paired differences by level (Holm's correction
over the cells read), and where a model is indistinguishable from chance."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cglib.evaluate.multiplicity import holm
from cglib.evaluate.report import (
    BENCHMARK_NAMES,
    DIRECTION_NAMES,
    LABEL_NAMES,
    is_percent,
    model_order,
    select,
)


def read_results(metrics: pd.DataFrame, differences: pd.DataFrame, comparisons: Sequence[tuple[str, str]],
                 benchmark: str = "forced_choice", labels: str = "dag", direction: str = "t2i",
                 metric: str = "accuracy") -> list[str]:
    """A short automatic reading: each comparison's significant differences by level, and chance checks.

    The cells read (every comparison at every level) are one family: a difference is called significant only
    when its paired 95% bootstrap CI excludes 0 and its p-value stays below 5% after Holm's correction over
    the family; the first sentence says how many cells that is. A CI that excludes 0 without surviving the
    correction is called nominal. Files without p-values (written before them) fall back to the CI alone.
    """
    unit = "points" if is_percent(metric) else ""
    scale = 100.0 if is_percent(metric) else 1.0
    where = f"{BENCHMARK_NAMES.get(benchmark, benchmark)}, {DIRECTION_NAMES[direction]}, " \
            f"{LABEL_NAMES.get(labels, labels)}, {metric}"
    diffs = differences[(differences["benchmark"] == benchmark) & (differences["labels"] == labels)
                        & (differences["direction"] == direction) & (differences["metric"] == metric)]
    n_seeds = int(diffs["n_seeds"].max()) if "n_seeds" in diffs.columns and diffs["n_seeds"].notna().any() else 1
    if n_seeds > 1:  # every number says how many training seeds it rests on
        where += f"; means over {n_seeds} training seeds"
    cells = []  # (a, b, level, difference, low, high, p) in a's favour
    for a, b in comparisons:
        rows = diffs[(diffs["model_a"] == a) & (diffs["model_b"] == b)]
        sign = 1.0
        if rows.empty:
            rows = diffs[(diffs["model_a"] == b) & (diffs["model_b"] == a)]
            sign = -1.0
        for _, r in rows.iterrows():
            lo, hi = sorted((sign * scale * r["ci_low"], sign * scale * r["ci_high"]))
            cells.append((a, b, r["level"], sign * scale * r["difference"], lo, hi, r.get("p_value", np.nan)))
    p_values = np.array([c[6] for c in cells], dtype=float)
    with_p = np.isfinite(p_values)
    adjusted = holm(p_values)
    alpha = 0.05
    sentences = []
    if with_p.sum() > 1:
        sentences.append(f"{int(with_p.sum())} paired differences are read below ({where}); a difference is called "
                         f"significant only when its 95% CI excludes 0 and it survives Holm's correction over all "
                         f"{int(with_p.sum())} (family-wise error 5%).")
    for a, b in dict.fromkeys((c[0], c[1]) for c in cells):
        wins, losses, nominal, ties, unscored = [], [], [], [], []
        for i, (ca, cb, level, d, lo, hi, _) in enumerate(cells):
            if (ca, cb) != (a, b):
                continue
            if not np.isfinite(d):
                unscored.append(level)
                continue
            text = f"{level} by {abs(d):.1f} {unit} (95% CI [{lo:.1f}, {hi:.1f}])".replace("  ", " ")
            excludes_0 = lo > 0 or hi < 0
            survives = not with_p[i] or adjusted[i] <= alpha
            if excludes_0 and survives:
                (wins if lo > 0 else losses).append(text)
            elif excludes_0:
                nominal.append(f"{level} ({d:+.1f} [{lo:.1f}, {hi:.1f}], Holm p = {adjusted[i]:.2g})")
            else:
                ties.append(f"{level} ({d:+.1f} [{lo:.1f}, {hi:.1f}])")
        parts = []
        if wins:
            parts.append(f"{a} beats {b} at " + "; ".join(wins))
        if losses:
            parts.append(f"{a} is worse than {b} at " + "; ".join(losses))
        if nominal:
            parts.append("nominal only (the CI excludes 0, not significant after Holm's correction) at "
                         + ", ".join(nominal))
        if ties:
            parts.append("no significant difference (paired CI includes 0) at " + ", ".join(ties))
        if unscored:
            parts.append("no scorable item at " + ", ".join(unscored))
        sentences.append(f"{a} vs {b} ({where}): " + "; ".join(parts) + ".")
    rows = select(metrics, benchmark, labels, direction, metric)
    for model in model_order(rows):
        m = rows[(rows["model"] == model) & rows["chance"].notna() & rows["value"].notna()]
        at_chance = [r["level"] for _, r in m.iterrows() if r["ci_low"] <= r["chance"] <= r["ci_high"]]
        if len(m) and at_chance:
            sentences.append(f"{model}: indistinguishable from chance (CI covers it) at {len(at_chance)} of {len(m)} "
                             f"text types ({', '.join(at_chance)}).")
    return sentences

