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


def test_a_calibrated_threshold_gives_the_asked_share_of_nodes_a_hard_negative():
    """magic.hard_negative_sim: calibrated sets, per level, the threshold below the nearest-neighbour cosines of
    about hard_negative_coverage of the nodes: that share (or the next count up) then has a real hard negative."""
    from cglib.magic.negatives import calibrated_threshold, hard_negatives
    from cglib.magic.negatives import nearest_neighbour_cosines as nn_cosines

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    nearest = nn_cosines(x)
    brute = (x @ x.T) - 3 * np.eye(len(x))
    assert np.allclose(nearest, brute.max(axis=1))
    for coverage in (0.5, 0.9):
        threshold = calibrated_threshold(x, coverage)
        found = hard_negatives([f"l1:{i:03d}" for i in range(len(x))], x, threshold)
        given = sum(bool(v) for v in found.hard.values())
        # mutual nearest neighbours share a cosine: the node tied with the last one counted comes along
        assert math.ceil(coverage * len(x)) <= given <= math.ceil(coverage * len(x)) + 1
    assert calibrated_threshold(x[:1], 0.9) == 1.0  # a lone node: no pair
    with pytest.raises(ValueError, match="records no per-level thresholds"):
        hard_negative_coverage(calibrated_magic([0.9, 0.4, 0.5, 0.6, 0.7, 0.8]), "calibrated")


def test_a_calibrated_build_records_each_levels_threshold_and_notebook_03_reads_it():
    from cglib.config import Params
    from cglib.magic import build_magic
    from tests.test_magic import FixedEmbedder, dataset_for, fake_generalizer, make_chains, unit

    chains = make_chains([(6, ["tennis", "sport"]), (6, ["wedding", "party"]), (6, ["birthday", "party"])])
    embedder = FixedEmbedder({"tennis": unit(1, 0, 0), "wedding": unit(0, 0.3, 1), "birthday": unit(0, 1, 0.6)})
    params = Params.model_validate({"magic": {"size_min": 5, "sim_min": 0.99, "l_max": 2,
                                              "hard_negative_sim": "calibrated", "hard_negative_coverage": 0.6}})
    magic = build_magic(dataset_for(chains), chains, params, generalizer=fake_generalizer(), embedder=embedder,
                        progress=False)
    settings = magic.stats["settings"]
    assert settings["hard_negative_sim"] == "calibrated" and settings["hard_negative_coverage"] == 0.6
    by_level = settings["hard_negative_sim_by_level"]
    assert set(by_level) == {"l1", "l2"}
    coverage = hard_negative_coverage(magic)  # the recorded thresholds
    assert coverage.loc["l1", "threshold"] == pytest.approx(by_level["l1"])
    assert (coverage.loc["l1", "share"], coverage.loc["l2", "share"]) == (2 / 3, 1.0)  # ceil(0.6 * 3), ceil(0.6 * 2)
    fig = plot_nearest_neighbour_cosines(magic)
    assert fig.axes[0].get_title().endswith(f"above {by_level['l1']:.2f}")
