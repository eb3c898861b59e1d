"""Fig. 4: accuracy against abstraction level, one line per model with its 95% CI band, from `metrics.csv`.

A pure function of the saved metrics table (`cglib.evaluate.load_results(run_dir).metrics` or
`pd.read_csv("evaluation/metrics.csv")`), so `cglib figures` can redraw it without any model. With several
training seeds, `seeds` (`evaluation/seeds.csv`) adds one thin line per seed behind each model's mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

LABEL_TITLES = {"dag": "scored against the MAGIC DAG (magic.json)",
                "ground_truth": "scored against the world's ground truth",
                "hierarcaps": "HierarCaps", "captions": "captions"}
DIRECTION_TITLES = {"t2i": "text → image", "i2t": "image → text"}
LEVEL_TICKS = {"caption": "caption", "generalized": "gen. caption"}


def _level_order(levels: Sequence[str]) -> list[str]:
    """Captions first, then l1, l2, ... (concrete to abstract)."""
    def key(level: str) -> tuple[int, int]:
        if level in ("caption", "generalized"):
            return (0, 0 if level == "caption" else 1)
        return (1, int(level[1:])) if level[1:].isdigit() else (2, 0)
    return sorted(set(levels), key=key)


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


def plot_accuracy_by_level(metrics: pd.DataFrame, benchmark: str = "forced_choice", metric: str = "accuracy",
                           direction: str = "t2i", labels: Sequence[str] | None = None,
                           levels: Sequence[str] | None = None, models: Sequence[str] | None = None,
                           percent: bool = True, figsize_per_panel: tuple[float, float] = (5.0, 3.8),
                           seeds: pd.DataFrame | None = None) -> Figure:
    """One panel per label source (DAG, ground truth, ...): the metric by level, one line per model (the mean over
    training seeds), CI bands, and with `seeds` (seeds.csv) one thin line per training seed behind the mean.

    `levels` defaults to the concept levels l1..lL found in the table; models whose training saw the evaluation
    strings are drawn dashed and marked with a dagger; the chance level is a grey dotted line.
    """
    rows = metrics[(metrics["benchmark"] == benchmark) & (metrics["metric"] == metric)
                   & (metrics["direction"] == direction)]
    if rows.empty:
        raise ValueError(f"no rows for benchmark={benchmark!r}, metric={metric!r}, direction={direction!r} in the "
                         f"metrics table; available benchmarks: {sorted(metrics['benchmark'].unique())}")
    sources = [s for s in (labels or list(dict.fromkeys(rows["labels"]))) if s in set(rows["labels"])]
    if not sources:
        raise ValueError(f"none of the label sources {list(labels or [])} has rows; have {sorted(rows['labels'].unique())}")
    level_list = list(levels) if levels is not None else [lv for lv in _level_order(rows["level"])
                                                          if lv.startswith("l") and lv[1:].isdigit()]
    model_list = list(models) if models is not None else list(dict.fromkeys(rows["model"]))
    scale = 100.0 if percent else 1.0
    fig, axes = plt.subplots(1, len(sources), figsize=(figsize_per_panel[0] * len(sources), figsize_per_panel[1]),
                             sharey=True, squeeze=False)
    x = np.arange(len(level_list))
    for ax, source in zip(axes[0], sources):
        panel = rows[rows["labels"] == source]
        for i, model in enumerate(model_list):
            m = panel[panel["model"] == model].set_index("level").reindex(level_list)
            if m["value"].isna().all():
                continue
            exposed = bool(m["exposed_to_eval_strings"].fillna(False).astype(bool).any())
            color = f"C{i % 10}"
            ax.plot(x, scale * m["value"].to_numpy(float), marker="o", color=color,
                    linestyle="--" if exposed else "-", label=f"{model} †" if exposed else model)
            ax.fill_between(x, scale * m["ci_low"].to_numpy(float), scale * m["ci_high"].to_numpy(float),
                            color=color, alpha=0.15, linewidth=0)
            for line in seed_lines(seeds, benchmark, metric, direction, source, model, level_list):
                ax.plot(x, scale * line, color=color, linewidth=0.7, alpha=0.45, zorder=1)
        chance = panel.groupby("level")["chance"].mean().reindex(level_list).to_numpy(float)
        if np.isfinite(chance).any():
            ax.plot(x, scale * chance, color="0.5", linestyle=":", linewidth=1.5, label="chance")
        ax.set_xticks(x, [LEVEL_TICKS.get(lv, lv) for lv in level_list])
        ax.set_xlabel("abstraction level (concrete → abstract)")
        ax.set_title(LABEL_TITLES.get(source, source), fontsize=10)
    unit = " (%)" if percent else ""
    axes[0][0].set_ylabel(f"{metric}{unit}, {DIRECTION_TITLES.get(direction, direction)}")
    axes[0][-1].legend(loc="best", frameon=True)
    n_seeds = int(rows["n_seeds"].max()) if "n_seeds" in rows.columns and rows["n_seeds"].notna().any() else 1
    fig.suptitle(f"{benchmark.replace('_', ' ')}: {metric} by abstraction level (95% CI bands"
                 + (f"; mean of {n_seeds} training seeds, thin lines: each seed)" if n_seeds > 1 else ")"))
    fig.tight_layout()
    return fig
