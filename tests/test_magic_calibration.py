"""The hard-negative calibration of notebook 03 (issue #32 item 5): nearest-neighbour cosines per level against the
threshold, the share of nodes with a real hard negative, and the warning that names the fix."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from cglib.magic.calibration import (
    COVERAGE_FLOOR,
    coverage_warnings,
    hard_negative_coverage,
    nearest_neighbour_cosines,
)
from cglib.magic.plots import plot_nearest_neighbour_cosines
from tests.factories import tiny_magic


def calibrated_magic(l1_sims: list[float], threshold: float = 0.85):
    """tiny_magic whose six l1 nodes have the given nearest-neighbour cosines: a hard negative when above
    `threshold`, else a fallback at that cosine."""
    magic, _ = tiny_magic()
    l1 = [n.id for n in magic.nodes_at(1)]
    for k, (nid, sim) in enumerate(zip(l1, l1_sims, strict=True)):
        other = l1[(k + 1) % len(l1)]
        node = magic.nodes[nid]
        node.hard_negatives, node.fallback_negatives = ([other], []) if sim > threshold else ([], [other])
        node.negative_similarity = {other: sim}
    return magic


def test_nearest_neighbours_and_the_share_per_level():
    magic = calibrated_magic([0.9, 0.86, 0.5, 0.6, 0.7, 0.8])
    table = nearest_neighbour_cosines(magic)
    l1 = table[table["level"] == 1]
    assert sorted(l1["nn_cosine"]) == [0.5, 0.6, 0.7, 0.8, 0.86, 0.9] and l1["has_hard_negative"].sum() == 2
    coverage = hard_negative_coverage(magic, 0.85)
    row = coverage.loc["l1"]
    assert (row["nodes"], row["with_hard_negative"]) == (6, 2) and row["share"] == pytest.approx(1 / 3)
    assert row["nn_median"] == pytest.approx(0.75)
    # a threshold at the 2/3 quantile leaves a third of the nearest neighbours above it
    cos = l1["nn_cosine"].to_numpy()
    assert (cos > row["threshold_for_a_third"]).mean() == pytest.approx(1 / 3, abs=1 / 6)
    assert row["threshold_for_a_third"] == pytest.approx(np.quantile(cos, 1 - COVERAGE_FLOOR))
    assert not coverage_warnings(coverage.loc[["l1"]], "minilm")  # exactly a third: no warning


def test_too_few_hard_negatives_warn_with_the_fix():
    magic = calibrated_magic([0.9, 0.4, 0.5, 0.6, 0.7, 0.8])
    coverage = hard_negative_coverage(magic, 0.85)
    warnings = coverage_warnings(coverage, "minilm")
    l1 = [w for w in warnings if w.startswith("l1:")]
    assert len(l1) == 1
    assert "only 1 of 6 nodes (17%)" in l1[0] and "magic.hard_negative_sim" in l1[0] and "magic.embedder" in l1[0]
    assert f"about {coverage.loc['l1', 'threshold_for_a_third']:.2f}" in l1[0]


def test_the_figure_draws_the_threshold_on_every_level():
    magic = calibrated_magic([0.9, 0.4, 0.5, 0.6, 0.7, 0.8])
    fig = plot_nearest_neighbour_cosines(magic, 0.85)
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == magic.l_max
    for ax in axes:
        lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(lines) == 1 and math.isclose(lines[0].get_xdata()[0], 0.85)
    assert axes[0].get_title() == "l1: 17% of 6 above 0.85"
