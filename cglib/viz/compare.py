"""Figures that compare a dozen models: one colour per objective family, and each model's paired difference from
the zero-shot model per column (a dot and its CI per model, sorted, Holm-significant cells filled, zero drawn).

Pure functions of the saved tables (`differences.csv`, `results.json`'s `models`), so `cglib figures` redraws them
without any model. Overlaid bands stop being readable beyond about five models (DESIGN, "Figures compare"): the
difference from the base says what training changed, and the absolute accuracies go to small multiples
(`eval_figures.plot_accuracy_by_level`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Collection, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from cglib.evaluate.multiplicity import holm
from cglib.evaluate.report import is_percent, model_label, objective_family
from cglib.figure_data import replottable
from cglib.viz.style import PAGE_WIDTH, fit_title

# Okabe-Ito colours (distinct under the common colour-vision deficiencies), one hue per objective family.
FAMILY_COLORS = {"none": "#000000", "clip": "#0072B2", "group": "#D55E00", "text": "#009E73", "zoo": "#CC79A7"}
FAMILY_NAMES = {"none": "zero-shot base", "clip": "CLIP loss", "group": "group losses (pairwise, centroid)",
                "text": "text-side objectives (RE)", "zoo": "frozen reference (eval.zoo)"}
OTHER_COLOR = "#999999"
DIRECTION_TITLES = {"t2i": "text → image", "i2t": "image → text"}
PANELS_PER_ROW = 4
SOURCE_TITLES = {"dag": "MAGIC DAG", "ground_truth": "ground truth", "hierarcaps": "HierarCaps",
                 "captions": "captions"}


def model_families(models: Sequence[dict]) -> dict[str, str]:
    """Each results.json model's colour family: `zoo` for frozen reference models, else its objective family."""
    return {m["name"]: "zoo" if m.get("zoo") else objective_family(m) for m in models}


def family_color(family: str) -> str:
    """The family's colour (grey for a family this palette does not know)."""
    return FAMILY_COLORS.get(family, OTHER_COLOR)


def family_handles(families: Collection[str]) -> list[Line2D]:
    """Legend entries, one per family present, in the palette's order."""
    present = [f for f in FAMILY_COLORS if f in set(families)] + sorted(set(families) - set(FAMILY_COLORS))
    return [Line2D([], [], color=family_color(f), marker="o", linestyle="-", label=FAMILY_NAMES.get(f, f))
            for f in present]


def level_order(levels: Sequence[str]) -> list[str]:
    """Captions first, then l1, l2, ... (concrete to abstract)."""
    def key(level: str) -> tuple[int, int]:
        if level in ("caption", "generalized"):
            return (0, 0 if level == "caption" else 1)
        return (1, int(level[1:])) if level[1:].isdigit() else (2, 0)
    return sorted(set(levels), key=key)


def concept_levels(levels: Sequence[str]) -> list[str]:
    """The concept levels l1..lL among `levels`, in order."""
    return [lv for lv in level_order(levels) if lv.startswith("l") and lv[1:].isdigit()]


def differences_from_reference(differences: pd.DataFrame, benchmark: str, metric: str, direction: str,
                               labels: Sequence[str] | None = None, levels: Sequence[str] | None = None,
                               reference: str = "zero-shot", ci: float = 0.95) -> pd.DataFrame:
    """Every model minus `reference` per (label source, level) of one metric, from differences.csv (either order
    of the pair), in points for percent metrics; Holm's correction over exactly these cells.

    Columns: model, labels, level, difference, ci_low, ci_high, p_value, p_holm, significant (the CI excludes 0
    and the cell survives Holm at 1 - ci).
    """
    rows = differences[(differences["benchmark"] == benchmark) & (differences["metric"] == metric)
                       & (differences["direction"] == direction)
                       & ((differences["model_a"] == reference) | (differences["model_b"] == reference))]
    if labels is not None:
        rows = rows[rows["labels"].isin(list(labels))]
    level_list = list(levels) if levels is not None else concept_levels(rows["level"].astype(str))
    rows = rows[rows["level"].astype(str).isin(level_list)]
    if rows.empty:
        raise ValueError(f"no paired difference with {reference!r} for benchmark={benchmark!r}, metric={metric!r}, "
                         f"direction={direction!r}, levels={level_list}; differences.csv has benchmarks "
                         f"{sorted(differences['benchmark'].unique())} (rerun evaluate_run if it predates them)")
    sign = np.where(rows["model_b"] == reference, 1.0, -1.0)  # reference - model flips to model - reference
    scale = 100.0 if is_percent(metric) else 1.0
    low, high = sign * scale * rows["ci_low"].to_numpy(float), sign * scale * rows["ci_high"].to_numpy(float)
    out = pd.DataFrame({"model": np.where(sign > 0, rows["model_a"], rows["model_b"]),
                        "labels": rows["labels"].to_numpy(), "level": rows["level"].astype(str).to_numpy(),
                        "difference": sign * scale * rows["difference"].to_numpy(float),
                        "ci_low": np.minimum(low, high), "ci_high": np.maximum(low, high),
                        "p_value": rows["p_value"].to_numpy(float) if "p_value" in rows else np.nan})
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    excludes_0 = (out["ci_low"] > 0) | (out["ci_high"] < 0)
    out["significant"] = excludes_0 & (out["p_holm"] <= 1 - ci)
    return out.reset_index(drop=True)


def difference_takeaway(cells: pd.DataFrame, what: str, reference: str = "zero-shot", top: int = 4,
                        digits: int = 2) -> str:
    """One sentence read off `differences_from_reference` cells: the changes that survive Holm (the largest `top`,
    with CIs), or, when none does, that none does and which cell moved most; the numbers are the table's."""
    def cell(r) -> str:
        return (f"{r['model']} at {r['labels']} {r['level']} {r['difference']:+.{digits}f} "
                f"[{r['ci_low']:.{digits}f}, {r['ci_high']:.{digits}f}]")

    n = len(cells)
    significant = cells[cells["significant"]]
    if significant.empty:
        largest = cells.loc[cells["difference"].abs().idxmax()]
        return (f"{what}: no change from the {reference} model survives Holm's correction over the {n} cells; "
                f"the largest is {cell(largest)}.")
    order = significant.reindex(significant["difference"].abs().sort_values(ascending=False).index)
    shown = "; ".join(cell(r) for _, r in order.head(top).iterrows())
    rises, falls = int((significant["difference"] > 0).sum()), int((significant["difference"] < 0).sum())
    more = f" (and {len(order) - top} more)" if len(order) > top else ""
    return (f"{what}: {len(order)} of {n} changes from the {reference} model survive Holm's correction ({rises} up, "
            f"{falls} down): {shown}{more}.")


def _grid(n_panels: int, per_row: int = PANELS_PER_ROW) -> tuple[int, int]:
    """(rows, columns) for `n_panels` with at most `per_row` a row and rows as evenly filled as can be (4 panels
    at 3 a row: 2 x 2, not 3 + 1)."""
    nrows = math.ceil(n_panels / per_row)
    return nrows, math.ceil(n_panels / nrows)


def legend_below(fig: Figure, handles: list, ncol: int) -> None:
    """A figure legend under the panels, outside every axes (never over data), in at most `ncol` columns and as
    many as fit the figure's width (a wider legend would widen the saved image)."""
    renderer = fig.canvas.get_renderer()
    for n in range(max(1, min(ncol, len(handles))), 0, -1):
        legend = fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=n, frameon=False)
        if n == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
            return
        fig.legends.remove(legend)


@replottable
def plot_difference_from_reference(differences: pd.DataFrame, benchmark: str = "forced_choice",
                                   metric: str = "accuracy", direction: str = "t2i",
                                   labels: Sequence[str] | None = None, levels: Sequence[str] | None = None,
                                   families: Mapping[str, str] | None = None, exposed: Collection[str] = (),
                                   reference: str = "zero-shot", ci: float = 0.95,
                                   panel_size: tuple[float, float] = (1.75, 0.3), title: str | None = None) -> Figure:
    """One panel per (label source, level), at most 4 a row: each model's paired difference from `reference` as a
    dot with its CI, models sorted by their mean difference (best on top, same order in every panel), a filled dot
    where the difference survives Holm's correction over all the figure's cells, an open one elsewhere, and 0 drawn.

    `families` (model -> objective family, `model_families(results.info["models"])`) colours the dots; `exposed`
    models (training saw the evaluation strings) carry a dagger. `panel_size` is (width, height per model) in inches;
    the figure is at most `style.PAGE_WIDTH` wide, narrower panels where a wider one would not fit.
    """
    table = differences_from_reference(differences, benchmark, metric, direction, labels, levels, reference, ci)
    families = dict(families or {})
    sources = [s for s in (labels or list(dict.fromkeys(table["labels"]))) if s in set(table["labels"])]
    level_list = [lv for lv in (list(levels) if levels is not None else level_order(table["level"]))
                  if lv in set(table["level"])]
    order = table.groupby("model")["difference"].mean().sort_values().index.tolist()  # bottom to top: best on top
    per_source_rows, ncols = _grid(len(level_list))
    nrows = per_source_rows * len(sources)
    height = max(1.6, panel_size[1] * len(order) + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(PAGE_WIDTH, panel_size[0] * ncols + 1.4), height * nrows),
                             sharex=True, sharey=True, squeeze=False)
    y = {model: i for i, model in enumerate(order)}
    for s, source in enumerate(sources):
        for j, level in enumerate(level_list):
            ax = axes[s * per_source_rows + j // ncols][j % ncols]
            cells = table[(table["labels"] == source) & (table["level"] == level)]
            ax.axvline(0.0, color="0.25", linewidth=1.0, zorder=1)
            for _, r in cells.iterrows():
                color = family_color(families.get(r["model"], ""))
                ax.hlines(y[r["model"]], r["ci_low"], r["ci_high"], color=color, linewidth=2.0, zorder=2)
                ax.plot(r["difference"], y[r["model"]], marker="o", markersize=7, color=color, zorder=3,
                        markerfacecolor=color if r["significant"] else "white", markeredgewidth=1.5)
            ax.set_title(f"{SOURCE_TITLES.get(source, source)} · {level}", fontsize=10)
            ax.grid(axis="y", color="0.92")
    for ax in axes.flat[len(sources) * per_source_rows * ncols:]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_yticks(range(len(order)), [model_label(m, m in set(exposed)) for m in order])
    for ax in axes.flat:
        ax.set_ylim(-0.6, len(order) - 0.4)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=3))  # more labels would run into the next narrow panel's
        if not ax.get_title():
            ax.set_visible(False)
    unit = "points" if is_percent(metric) else metric
    fig.supxlabel(f"model − {reference} ({unit})", fontsize=11)  # one label: a panel is narrower than its text
    n = int(np.isfinite(table["p_value"]).sum())
    handles = family_handles([families.get(m, "") for m in order]) + [
        Line2D([], [], color="0.3", marker="o", linestyle="", label=f"significant (Holm over {n} cells)"),
        Line2D([], [], color="0.3", marker="o", linestyle="", markerfacecolor="white", label="not significant")]
    legend_below(fig, handles, ncol=min(5, len(handles)))
    title = title or (f"{benchmark.replace('_', ' ')} {metric}, {DIRECTION_TITLES.get(direction, direction)}: each "
                      f"model minus {reference} (paired {100 * ci:.0f}% CI)")
    fig.suptitle(fit_title(title, fig, 12), fontsize=12)
    fig.tight_layout()
    return fig


@replottable
def plot_gains(gains: pd.DataFrame, questions: Mapping[str, str] | None = None,
               panel_size: tuple[float, float] = (3.1, 0.32)) -> Figure:
    """The paper's gain rows as a figure: one panel per gain (at most 3 a row, titled by its question when given),
    one dot and paired CI per Table 3 column (points), filled where Holm's correction over the gain cells keeps it,
    zero drawn; columns top to bottom in Table 3's order."""
    gains = gains[np.isfinite(gains["difference"].astype(float))]
    if gains.empty:
        raise ValueError("no gain row to draw: the run lacks the models on one side of every gain (see the notes)")
    order = list(dict.fromkeys(gains["gain"]))
    columns = list(dict.fromkeys(gains["column"]))
    nrows, ncols = _grid(len(order), per_row=3)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(PAGE_WIDTH, panel_size[0] * ncols + 1.4),
                                                    nrows * (panel_size[1] * len(columns) + 1.2)),
                             sharex=True, sharey=True, squeeze=False)
    y = {c: len(columns) - 1 - i for i, c in enumerate(columns)}
    for ax, gain in zip(axes.flat, order):
        ax.axvline(0.0, color="0.25", linewidth=1.0, zorder=1)
        for _, r in gains[gains["gain"] == gain].iterrows():
            ax.hlines(y[r["column"]], r["ci_low"], r["ci_high"], color="0.3", linewidth=2.0, zorder=2)
            ax.plot(r["difference"], y[r["column"]], marker="o", markersize=7, color="0.1", zorder=3,
                    markerfacecolor="0.1" if r["significant"] else "white", markeredgewidth=1.5)
        ax.set_title(textwrap.fill((questions or {}).get(gain, gain), 26), fontsize=10)
        ax.set_xlabel("gain (points)")
        ax.grid(axis="y", color="0.92")
    for ax in axes.flat[len(order):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_yticks(range(len(columns)), list(reversed(columns)))
    n = int(np.isfinite(gains["p_value"].astype(float)).sum()) if "p_value" in gains else len(gains)
    legend_below(fig, [Line2D([], [], color="0.1", marker="o", linestyle="", label=f"significant (Holm over {n} "
                              "cells)"),
                       Line2D([], [], color="0.1", marker="o", linestyle="", markerfacecolor="white",
                              label="not significant")], ncol=2)
    fig.suptitle(fit_title("What changed what: the gain rows under Table 3 (mean of one set of models minus "
                           "another's, paired 95% CI)", fig, 12), fontsize=12)
    fig.tight_layout()
    return fig
