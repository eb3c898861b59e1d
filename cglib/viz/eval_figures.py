"""Fig. 4's absolute accuracies against abstraction level as small multiples (one panel per model), from
`metrics.csv`; the comparison itself (each model minus the zero-shot model) is `compare.plot_difference_from_reference`.

A pure function of the saved metrics table (`cglib.evaluate.load_results(run_dir).metrics` or
`pd.read_csv("evaluation/metrics.csv")`), so `cglib figures` can redraw it without any model. With several
training seeds, `seeds` (`evaluation/seeds.csv`) adds one thin line per seed behind each model's mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cglib.figure_data import replottable
from cglib.viz.compare import (
    DIRECTION_TITLES,
    PANELS_PER_ROW,
    concept_levels,
    family_color,
    family_handles,
    legend_below,
)
from cglib.viz.style import PAGE_WIDTH, fit_title

LABEL_TITLES = {"dag": "scored against the MAGIC DAG (magic.json)",
                "ground_truth": "scored against the world's ground truth",
                "hierarcaps": "HierarCaps", "captions": "captions"}
LEVEL_TICKS = {"caption": "caption", "generalized": "gen. caption"}


def seed_lines(seeds: pd.DataFrame | None, benchmark: str, metric: str, direction: str, labels: str, model: str,
               levels: Sequence[str]) -> list[np.ndarray]:
    """One model's per-training-seed values over `levels` (one array per seed; none for one seed or no table)."""
    if seeds is None or seeds.empty:
        return []
    rows = seeds[(seeds["benchmark"] == benchmark) & (seeds["metric"] == metric) & (seeds["direction"] == direction)
                 & (seeds["labels"] == labels) & (seeds["model"] == model)]
    if rows["training_seed"].nunique() < 2:
        return []
    return [group.set_index("level")["value"].reindex(list(levels)).to_numpy(float)
            for _, group in rows.groupby("training_seed", sort=False)]


SOURCE_STYLES = {"dag": ("-", "o"), "ground_truth": ("--", "s"), "hierarcaps": ("-.", "^"), "captions": ("-.", "D")}


@replottable
def plot_accuracy_by_level(metrics: pd.DataFrame, benchmark: str = "forced_choice", metric: str = "accuracy",
                           direction: str = "t2i", labels: Sequence[str] | None = None,
                           levels: Sequence[str] | None = None, models: Sequence[str] | None = None,
                           percent: bool = True, figsize_per_panel: tuple[float, float] = (1.9, 2.2),
                           seeds: pd.DataFrame | None = None, families: Mapping[str, str] | None = None,
                           reference: str = "zero-shot") -> Figure:
    """Small multiples: one panel per model (at most 4 a row, shared axes), the metric by level for each label
    source (DAG solid, ground truth dashed) with its CI band, `reference`'s mean as a grey line in every other
    panel, chance dotted, and with `seeds` (seeds.csv) and a single label source, one thin line per training seed.

    `levels` defaults to the concept levels l1..lL found in the table; `families` (model -> objective family,
    `compare.model_families`) colours each panel; a dagger marks a model whose training saw the evaluation strings.
    The legend sits under the panels, never over data.
    """
    rows = metrics[(metrics["benchmark"] == benchmark) & (metrics["metric"] == metric)
                   & (metrics["direction"] == direction)]
    if rows.empty:
        raise ValueError(f"no rows for benchmark={benchmark!r}, metric={metric!r}, direction={direction!r} in the "
                         f"metrics table; available benchmarks: {sorted(metrics['benchmark'].unique())}")
    sources = [s for s in (labels or list(dict.fromkeys(rows["labels"]))) if s in set(rows["labels"])]
    if not sources:
        raise ValueError(f"none of the label sources {list(labels or [])} has rows; have {sorted(rows['labels'].unique())}")
    rows = rows[rows["labels"].isin(sources)]
    level_list = list(levels) if levels is not None else concept_levels(rows["level"].astype(str))
    model_list = [m for m in (models or list(dict.fromkeys(rows["model"]))) if m in set(rows["model"])]
    families = dict(families or {})
    scale = 100.0 if percent else 1.0
    x = np.arange(len(level_list))
    nrows, ncols = math.ceil(len(model_list) / PANELS_PER_ROW), min(PANELS_PER_ROW, len(model_list))
    width = min(PAGE_WIDTH, figsize_per_panel[0] * ncols + 0.8)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, figsize_per_panel[1] * nrows + 0.9),
                             sharex=True, sharey=True, squeeze=False)

    def values(model: str, source: str, column: str = "value") -> np.ndarray:
        m = rows[(rows["model"] == model) & (rows["labels"] == source)].set_index("level").reindex(level_list)
        return scale * m[column].to_numpy(float)

    for ax, model in zip(axes.flat, model_list):
        color = family_color(families.get(model, ""))
        exposed = bool(rows.loc[rows["model"] == model, "exposed_to_eval_strings"].fillna(False).astype(bool).any())
        for source in sources:
            style, marker = SOURCE_STYLES.get(source, (":", "v"))
            if model != reference and reference in set(rows["model"]):
                ax.plot(x, values(reference, source), color="0.6", linestyle=style, linewidth=1.2, zorder=1)
            # per-seed lines on top of two sources' bands would blur into one: drawn for a single source only
            for line in seed_lines(seeds if len(sources) == 1 else None, benchmark, metric, direction, source, model,
                                   level_list):
                ax.plot(x, scale * line, color=color, linewidth=0.7, alpha=0.45, zorder=1)
            ax.fill_between(x, values(model, source, "ci_low"), values(model, source, "ci_high"), color=color,
                            alpha=0.12, linewidth=0)
            ax.plot(x, values(model, source), color=color, linestyle=style, marker=marker, markersize=4, zorder=3)
        chance = rows.groupby("level")["chance"].mean().reindex(level_list).to_numpy(float)
        if np.isfinite(chance).any():
            ax.plot(x, scale * chance, color="0.4", linestyle=":", linewidth=1.2)
        ax.set_title(f"{model} †" if exposed else model, fontsize=10, color=color)
        ax.set_xticks(x, [LEVEL_TICKS.get(lv, lv) for lv in level_list])
    for ax in axes.flat[len(model_list):]:
        ax.set_visible(False)
    unit = " (%)" if percent else ""
    for row in axes:
        row[0].set_ylabel(f"{metric}{unit}")
    handles = [Line2D([], [], color="0.2", linestyle=SOURCE_STYLES.get(s, (":", "v"))[0],
                      marker=SOURCE_STYLES.get(s, (":", "v"))[1], label=LABEL_TITLES.get(s, s)) for s in sources]
    handles.append(Line2D([], [], color="0.6", label=f"{reference} (reference, in every panel)"))
    handles.append(Line2D([], [], color="0.4", linestyle=":", label="chance"))
    handles += family_handles([families.get(m, "") for m in model_list]) if families else []
    legend_below(fig, handles, ncol=2)
    n_seeds = int(rows["n_seeds"].max()) if "n_seeds" in rows.columns and rows["n_seeds"].notna().any() else 1
    fig.suptitle(fit_title(f"{benchmark.replace('_', ' ')} {metric}, {DIRECTION_TITLES.get(direction, direction)}, by "
                 "abstraction level (concrete → abstract; 95% CI bands"
                 + (f"; mean of {n_seeds} training seeds" + (", thin lines: each seed)" if len(sources) == 1 else ")")
                    if n_seeds > 1 else ")"), fig, 12),
                 fontsize=12)
    fig.tight_layout()
    return fig
