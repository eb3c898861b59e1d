"""Fig. 4: accuracy against abstraction level, one line per model with its 95% CI band, from `metrics.csv`.

A pure function of the saved metrics table (`cglib.evaluate.load_results(run_dir).metrics` or
`pd.read_csv("evaluation/metrics.csv")`), so `cglib figures` can redraw it without any model.
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


def plot_accuracy_by_level(metrics: pd.DataFrame, benchmark: str = "forced_choice", metric: str = "accuracy",
                           direction: str = "t2i", labels: Sequence[str] | None = None,
                           levels: Sequence[str] | None = None, models: Sequence[str] | None = None,
                           percent: bool = True, figsize_per_panel: tuple[float, float] = (5.0, 3.8)) -> Figure:
    """One panel per label source (DAG, ground truth, ...): the metric by level, one line per model, CI bands.

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
        chance = panel.groupby("level")["chance"].mean().reindex(level_list).to_numpy(float)
        if np.isfinite(chance).any():
            ax.plot(x, scale * chance, color="0.5", linestyle=":", linewidth=1.5, label="chance")
        ax.set_xticks(x, [LEVEL_TICKS.get(lv, lv) for lv in level_list])
        ax.set_xlabel("abstraction level (concrete → abstract)")
        ax.set_title(LABEL_TITLES.get(source, source), fontsize=10)
    unit = " (%)" if percent else ""
    axes[0][0].set_ylabel(f"{metric}{unit}, {DIRECTION_TITLES.get(direction, direction)}")
    axes[0][-1].legend(loc="best", frameon=True)
    fig.suptitle(f"{benchmark.replace('_', ' ')}: {metric} by abstraction level (95% CI bands)")
    fig.tight_layout()
    return fig
