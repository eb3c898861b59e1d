"""Comparison figures that scale to a dozen models: Fig. 4 as each model minus the zero-shot model (dot and CI,
sorted, Holm-significant cells filled, zero drawn) and the absolute values as small multiples; at most 4 panels a
row, legends outside the data, tick labels that do not overprint at the saved size."""

from __future__ import annotations

import io
import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cglib.evaluate import report
from cglib.evaluate.multiplicity import holm
from cglib.viz.compare import (
    FAMILY_COLORS,
    PANELS_PER_ROW,
    difference_takeaway,
    differences_from_reference,
    model_families,
    plot_difference_from_reference,
)
from cglib.viz.eval_figures import plot_accuracy_by_level
from cglib.viz.style import apply_style

LEVELS = ["l1", "l2", "l3", "l4"]
SOURCES = ["dag", "ground_truth"]
N_MODELS = 12  # the dozen models the figures must stay readable with


def twelve_models() -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """Metrics and differences of a zero-shot model and 11 trained ones (model k is k points better than the base
    at every cell, with p = 1e-6 for k >= 9 and 0.5 otherwise), stored half as (model, zero-shot) and half reversed."""
    rows, diffs = [], []
    models = ["zero-shot"] + [f"model_{k:02d}" for k in range(1, N_MODELS)]
    for k, model in enumerate(models):
        for source in SOURCES:
            for i, level in enumerate(LEVELS):
                value = 0.8 - 0.05 * i + 0.01 * k
                rows.append({"model": model, "benchmark": "forced_choice", "labels": source, "direction": "t2i",
                             "metric": "accuracy", "level": level, "value": value, "ci_low": value - 0.04,
                             "ci_high": value + 0.04, "n": 200, "n_queries": 200, "n_excluded": 0, "n_seeds": 1,
                             "chance": 0.5, "exposed_to_eval_strings": False, "exposure": ""})
                if k == 0:
                    continue
                d, p = 0.01 * k, 1e-6 if k >= 9 else 0.5
                pair, sign = ((model, "zero-shot"), 1) if k % 2 else (("zero-shot", model), -1)
                diffs.append({"model_a": pair[0], "model_b": pair[1], "benchmark": "forced_choice",
                              "labels": source, "direction": "t2i", "metric": "accuracy", "level": level,
                              "difference": sign * d, "ci_low": sign * (d - 0.03), "ci_high": sign * (d + 0.03),
                              "n": 200, "n_seeds": 1, "significant": d > 0.03, "p_value": p})
    families = {m: ("none" if k == 0 else ("clip", "group", "text")[k % 3]) for k, m in enumerate(models)}
    return (pd.DataFrame(rows, columns=report.METRIC_COLUMNS), pd.DataFrame(diffs, columns=report.DIFF_COLUMNS),
            families)


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _check_layout(fig) -> None:
    """At most PANELS_PER_ROW visible panels a row; every figure legend outside every visible axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    rows = {}
    for ax in axes:
        rows.setdefault(round(ax.get_position().y0, 3), []).append(ax)
    assert max(len(r) for r in rows.values()) <= PANELS_PER_ROW
    assert fig.legends, "the legend is a figure legend, outside the panels"
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert not any(_boxes_overlap(box, ax.get_window_extent(renderer)) for ax in axes)
    assert all(ax.get_legend() is None for ax in axes)


def _png_size(fig, dpi: int = 150) -> tuple[int, int]:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return Image.open(io.BytesIO(buffer.getvalue())).size


def test_difference_figure_is_sorted_marks_holm_and_reads_with_twelve_models():
    """Each model minus zero-shot in points with the pair's sign fixed, models sorted best on top in every panel,
    filled dots exactly where the CI excludes 0 and Holm over the figure's 88 cells keeps the cell, zero drawn,
    2 sources x 4 levels = 8 panels in 2 rows, and 12 model names that never overprint at 150 dpi."""
    apply_style()
    _, diffs, families = twelve_models()
    table = differences_from_reference(diffs, "forced_choice", "accuracy", "t2i")
    assert len(table) == (N_MODELS - 1) * len(SOURCES) * len(LEVELS)
    k3 = table[table["model"] == "model_03"]
    assert np.allclose(k3["difference"], 3.0) and np.allclose(k3["ci_low"], 0.0) and np.allclose(k3["ci_high"], 6.0)
    assert (table[table["model"] == "model_04"]["difference"] > 0).all()  # stored reversed, sign flipped back
    np.testing.assert_allclose(table["p_holm"], holm(table["p_value"]))
    assert set(table.loc[table["significant"], "model"]) == {"model_09", "model_10", "model_11"}

    fig = plot_difference_from_reference(diffs, families=families, exposed=["model_05"])
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [f"{s} · {lv}" for s in ("MAGIC DAG", "ground truth")
                                                 for lv in LEVELS]
    labels = [t.get_text() for t in panels[0].get_yticklabels()]
    assert labels[-1] == "model_11" and labels[0] == "model_01" and "model_05 †" in labels  # best on top
    for ax in panels:
        dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
        assert len(dots) == N_MODELS - 1
        filled = {labels[int(line.get_ydata()[0])] for line in dots 
                  if matplotlib.colors.to_rgba(line.get_markerfacecolor()) != (1, 1, 1, 1)}
        assert filled == {"model_09", "model_10", "model_11"}
        assert any(line.get_xdata()[0] == 0 for line in ax.get_lines() if line.get_linestyle() == "-"), "zero"
        colors = {matplotlib.colors.to_hex(line.get_color()) for line in dots}
        assert colors == {FAMILY_COLORS["clip"].lower(), FAMILY_COLORS["group"].lower(),
                          FAMILY_COLORS["text"].lower()}
    _check_layout(fig)
    ticks = [t.get_window_extent() for t in panels[0].get_yticklabels()]
    assert all(not _boxes_overlap(a, b) for a, b in itertools.pairwise(ticks)), "model names overprint"
    assert min(t.get_fontsize() for t in panels[0].get_yticklabels()) >= 9
    width, height = _png_size(fig)
    assert width <= 1300 and height <= 1800, (width, height)  # read at its own size on a 1,300 px page
    plt.close(fig)
    with pytest.raises(ValueError, match="no paired difference"):
        differences_from_reference(diffs, "gallery", "R@1", "t2i")


def test_absolute_accuracies_are_small_multiples_one_panel_per_model():
    """Fig. 4's absolute values: 12 panels (one per model, titled by it, 3 rows of 4) coloured by objective family,
    the zero-shot line repeated in every other panel, chance drawn, the legend under the panels."""
    apply_style()
    metrics, _, families = twelve_models()
    fig = plot_accuracy_by_level(metrics, families=families)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == list(dict.fromkeys(metrics["model"]))
    assert panels[1].title.get_color() == FAMILY_COLORS[families["model_01"]]
    # zero-shot's panel: 2 sources + chance; the others add the zero-shot reference per source
    assert len(panels[0].get_lines()) == 3 and len(panels[1].get_lines()) == 5
    _check_layout(fig)
    width, _ = _png_size(fig)
    assert width <= 1300
    plt.close(fig)


def test_families_come_from_the_saved_roles():
    """Zoo models get their own colour family; the others their objective's family (old files: by name)."""
    models = [{"name": "zero-shot", "objective": "none", "objective_family": "none"},
              {"name": "c", "objective": "centroid"}, {"name": "openai", "objective": "none", "zoo": True}]
    assert model_families(models) == {"zero-shot": "none", "c": "group", "openai": "zoo"}


def test_the_difference_takeaway_is_read_off_the_cells():
    """The sentence names the Holm-significant cells, largest first, with their CIs and the count up and down; when
    none survives it says so and names the largest change."""
    cells = pd.DataFrame({"model": ["pairwise", "centroid", "clip"], "labels": ["dag"] * 3, "level": ["l1", "l1", "l2"],
                          "difference": [0.10, -0.12, 0.01], "ci_low": [0.08, -0.17, -0.02],
                          "ci_high": [0.12, -0.07, 0.04], "significant": [True, True, False]})
    assert difference_takeaway(cells, "Within-group cosine") == (
        "Within-group cosine: 2 of 3 changes from the zero-shot model survive Holm's correction (1 up, 1 down): "
        "centroid at dag l1 -0.12 [-0.17, -0.07]; pairwise at dag l1 +0.10 [0.08, 0.12].")
    assert difference_takeaway(cells, "Margin", top=1).endswith("centroid at dag l1 -0.12 [-0.17, -0.07] (and 1 more).")
    none = cells.assign(significant=False)
    assert difference_takeaway(none, "Margin") == (
        "Margin: no change from the zero-shot model survives Holm's correction over the 3 cells; the largest is "
        "centroid at dag l1 -0.12 [-0.17, -0.07].")
