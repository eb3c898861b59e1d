"""Results over training seeds: the hierarchical bootstrap's coverage, paired differences across seeds, Holm's
correction, the chance and protocol of every Table 3 column, and an evaluation of a two-seed run (n_seeds, seeds.csv,
Fig. 4's per-seed lines)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from prepared_runs import train_all_prepared

from cglib.evaluate import report
from cglib.evaluate.bootstrap import (
    Scores,
    confidence_intervals,
    paired_difference,
    repeat_seeds,
    stack_seeds,
)
from cglib.evaluate.multiplicity import holm, holm_significant
from cglib.evaluate.reading import read_results
from cglib.evaluate.table3 import table3, table3_markdown, table3_notes, table3_protocols, zero_shot_section


# ----------------------------------------------------------------------------------- hierarchical bootstrap
def crossed(rng: np.random.Generator, effect: float, n_seeds: int, n_images: int, seed_sd: float,
            image_sd: float, noise_sd: float) -> np.ndarray:
    """(seeds, images) scores: a known mean, a random effect per training seed, one per image shared by every seed
    (the items are fixed by run.seed), and noise per (seed, image)."""
    return (effect + rng.normal(0, seed_sd, n_seeds)[:, None] + rng.normal(0, image_sd, n_images)[None, :]
            + rng.normal(0, noise_sd, (n_seeds, n_images)))


def test_hierarchical_bootstrap_covers_a_known_effect_with_random_seeds_and_images():
    """200 simulated datasets (6 seeds x 150 images, seeds and images both random, both contributing): the 95%
    interval covers the true effect in [90%, 99%] of them; resampling images alone over the pooled seeds ignores
    the seed-to-seed spread and covers clearly less."""
    rng = np.random.default_rng(0)
    units = np.arange(150)
    covered = naive = 0
    for sim in range(200):
        values = crossed(rng, 0.05, 6, 150, seed_sd=0.025, image_sd=0.1, noise_sd=0.2)
        iv = confidence_intervals([Scores(values, units)], 1000, 0.95, seed=sim)[0]
        assert iv.n_seeds == 6 and iv.n_units == 150
        covered += iv.low <= 0.05 <= iv.high
        pooled = confidence_intervals([Scores(values.ravel(), np.tile(units, 6))], 1000, 0.95, seed=sim)[0]
        naive += pooled.low <= 0.05 <= pooled.high
    assert 0.90 <= covered / 200 <= 0.99
    assert naive / 200 < covered / 200 - 0.05


def test_one_seed_is_the_image_bootstrap_and_the_value_is_the_mean_over_seeds():
    """(1, Q) scores give exactly the 1-D interval; with seeds the value is the mean of the per-seed means."""
    rng = np.random.default_rng(1)
    values, units = (rng.random(80) < 0.6).astype(float), np.arange(80)
    flat = confidence_intervals([Scores(values, units)], 500, 0.95, seed=3)[0]
    one = confidence_intervals([Scores(values[None, :], units)], 500, 0.95, seed=3)[0]
    assert (one.value, one.low, one.high) == pytest.approx((flat.value, flat.low, flat.high))
    three = Scores(rng.random((3, 80)), units)
    iv = confidence_intervals([three], 500, 0.95, seed=3)[0]
    assert iv.value == pytest.approx(three.seed_means().mean()) and iv.n_seeds == 3


def test_differences_pair_seed_k_with_seed_k():
    """b = a + a seed-specific shift: the paired difference is exact and its interval has no width at all,
    although the seeds themselves differ a lot (resampling seeds and images together for both models)."""
    rng = np.random.default_rng(2)
    a = rng.random((4, 60)) + np.array([0.0, 0.3, -0.2, 0.5])[:, None]
    b = a + 0.1
    d = paired_difference(Scores(b, np.arange(60)), Scores(a, np.arange(60)), 500, 0.95, seed=0)
    assert d.value == pytest.approx(0.1) and d.high - d.low < 1e-6  # float32 resample sums: not exactly 0
    assert d.n_seeds == 4 and d.p_value < 1e-12
    alone = confidence_intervals([Scores(a, np.arange(60))], 500, 0.95, seed=0)[0]
    assert alone.high - alone.low > 0.2  # the seeds' spread, which pairing removes
    with pytest.raises(ValueError, match="same training seeds"):
        paired_difference(Scores(a, np.arange(60)), Scores(a[:2], np.arange(60)), 10, 0.95, seed=0)


def test_stacking_seeds_and_repeating_a_frozen_model():
    """Seeds scored on the same items stack; a per-model item set (Kendall tau) keeps the shared items; a frozen
    model repeats its one row so it pairs with every seed."""
    s0 = Scores(np.array([1.0, 0.0, 1.0]), np.array([0, 1, 2]))
    s1 = Scores(np.array([0.0, 0.0, 1.0]), np.array([0, 1, 2]))
    assert stack_seeds([s0, s1]).values.shape == (2, 3)
    partial = stack_seeds([s0, Scores(np.array([0.5, 0.25]), np.array([0, 2]))])
    assert partial.units.tolist() == [0, 2] and partial.values.tolist() == [[1.0, 1.0], [0.5, 0.25]]
    assert repeat_seeds(s0, 3).values.tolist() == [[1.0, 0.0, 1.0]] * 3
    with pytest.raises(ValueError, match="same train.seeds"):
        repeat_seeds(stack_seeds([s0, s1]), 3)


# ---------------------------------------------------------------------------------------------------- Holm
def test_holm_matches_a_hand_computed_case():
    """p = (0.01, -, 0.04, 0.03, 0.005), m = 4 finite: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 gives
    0.02, 0.03, 0.06, 0.04, made monotone 0.02, 0.03, 0.06, 0.06. At 5%, two survive where all four would
    unadjusted."""
    adjusted = holm([0.01, np.nan, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, np.nan, 0.06, 0.06, 0.02])
    assert holm_significant([0.01, np.nan, 0.04, 0.03, 0.005], 0.05).tolist() == [True, False, False, False, True]
    assert holm([]).size == 0 and holm([0.7]).tolist() == [0.7]
    assert holm([0.5, 0.6]).tolist() == [1.0, 1.0]


def toy(p_values: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three models on MAGIC l1-l2 forced choice and HierarCaps l1 in-batch; differences vs the zero-shot model
    with CIs that all exclude 0 and the given p-values."""
    rows, diffs = [], []
    for model, base in (("zero-shot", 0.6), ("clip", 0.65), ("pairwise", 0.7)):
        for benchmark, labels, metric, level, chance in (("forced_choice", "dag", "accuracy", "l1", 0.5),
                                                         ("forced_choice", "dag", "accuracy", "l2", 0.5),
                                                         ("hierarcaps_batch", "hierarcaps", "R@1", "l1", 0.014)):
            rows.append({"model": model, "benchmark": benchmark, "labels": labels, "direction": "t2i",
                         "metric": metric, "level": level, "value": base, "ci_low": base - 0.02,
                         "ci_high": base + 0.02, "n": 100, "n_queries": 100, "n_excluded": 0, "n_seeds": 3,
                         "seed_sd": 0.01, "chance": chance, "exposed_to_eval_strings": False, "exposure": ""})
            if model != "zero-shot":
                diffs.append({"model_a": model, "model_b": "zero-shot", "benchmark": benchmark, "labels": labels,
                              "direction": "t2i", "metric": metric, "level": level, "difference": base - 0.6,
                              "ci_low": 0.005, "ci_high": 2 * (base - 0.6), "n": 100, "n_seeds": 3,
                              "significant": True, "p_value": p_values[f"{model} {level} {benchmark}"]})
    return pd.DataFrame(rows, columns=report.METRIC_COLUMNS), pd.DataFrame(diffs).reindex(
        columns=report.DIFF_COLUMNS)


P_VALUES = {"clip l1 forced_choice": 0.02, "clip l2 forced_choice": 0.03, "clip l1 hierarcaps_batch": 0.04,
            "pairwise l1 forced_choice": 0.001, "pairwise l2 forced_choice": 0.2, "pairwise l1 hierarcaps_batch": 0.5}


def test_reading_says_how_many_cells_and_adjusts_before_calling_a_difference_significant():
    """Four forced-choice cells read (clip and pairwise vs zero-shot at l1, l2), every CI excluding 0: only
    pairwise at l1 (p 0.001 -> Holm 0.004) stays significant; clip's l1 (0.02 -> 0.06) is called nominal."""
    metrics, diffs = toy(P_VALUES)
    text = read_results(metrics, diffs, [("clip", "zero-shot"), ("pairwise", "zero-shot")])
    assert text[0].startswith("4 paired differences are read below") and "Holm's correction over all 4" in text[0]
    assert "accuracy; means over 3 training seeds)" in text[0]
    clip, pairwise = text[1], text[2]
    assert "beats" not in clip and "nominal only" in clip and "l1 (+5.0 [0.5, 10.0], Holm p = 0.06)" in clip
    assert "pairwise beats zero-shot at l1 by 10.0 points" in pairwise and "nominal only" in pairwise


def test_table3_headers_state_protocol_and_chance_and_the_zero_shot_section_adjusts():
    """Every Table 3 header names its protocol (2-way forced choice, 100-way in-batch) and its chance; the rows
    say how many seeds they rest on; the zero-shot section counts its cells and marks only Holm survivors."""
    metrics, diffs = toy(P_VALUES)
    table = table3(metrics)
    assert table.loc["clip", "HierarCaps l1 chance"] == pytest.approx(1.4) and table.loc["clip", "seeds"] == 3
    info = {"settings": {"choices": 2, "hierarcaps_batch": 100, "seeds": [0], "bootstrap": 100,
                         "training_seeds": [0, 1, 2]}, "hierarcaps": {"n_items": 1000}}
    protocols = table3_protocols(table, info)
    assert protocols == {"MAGIC l1": "2-way forced choice, chance 50.0%", "MAGIC l2": "2-way forced choice, chance 50.0%",
                         "HierarCaps l1": "100-way in-batch, chance 1.4%"}
    section = zero_shot_section(diffs, metrics)
    md = table3_markdown(table, ["note"], protocols=protocols, zero_shot=section)
    assert "| model | MAGIC l1 (2-way forced choice, chance 50.0%) |" in md
    assert "HierarCaps l1 (100-way in-batch, chance 1.4%) | seeds |" in md and "| clip | 65.0 [63.0, 67.0]" in md
    assert "6 cells compared with the zero-shot model" in md and "Holm's correction over the 6 cells" in md
    assert "| pairwise | +10.0 [0.5, 20.0] * |" in md  # 0.001 * 6 = 0.006: survives
    assert "| clip | +5.0 [0.5, 10.0] |" in md  # 0.02 * 5 = 0.1: does not
    assert report.seeds_phrase(info["settings"]) == "3 training seeds [0, 1, 2]"
    notes = table3_notes({**info, "hierarcaps": None, "models": [],
                                 "items": {"n_test_images": 10, "n_groups": 2, "ground_truth": False}})
    assert notes[0].startswith("Cells: text->image accuracy in %, the mean over 3 training seeds [0, 1, 2]; 95%")
    assert "resamples of the training seeds, then the test images, one draw shared" in notes[0]
    assert "M = 2 (chance 50%)" not in notes[0] and "states its protocol" in notes[0]


# --------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_two_seed_run_reports_means_over_seeds_with_n_seeds(tmp_path):
    """train.seeds [0, 1]: every metric row rests on 2 seeds (zero-shot included: one base per seed) and is the mean
    of seeds.csv's per-seed values; the items are those of the one-seed evaluation (same n_queries), whose numbers
    equal seed 0's here; differences are paired over both seeds; Fig. 4 draws a thin line per seed."""
    from test_eval_pipeline import make_run

    from cglib.evaluate import evaluate_run, load_results
    from cglib.run import open_run
    from cglib.viz.eval_figures import plot_accuracy_by_level

    run = make_run(tmp_path, runs=[{"name": "clip", "loss": "clip"}])
    raw = yaml.safe_load((tmp_path / "params" / "tiny.yaml").read_text())
    raw["train"]["seeds"] = [0, 1]
    (tmp_path / "params" / "tiny.yaml").write_text(yaml.safe_dump(raw))
    run = open_run(tmp_path / "params" / "tiny.yaml", run.dir)
    train_all_prepared(run, progress=False)
    result = evaluate_run(run, progress=False)
    m, seeds = result.metrics, load_results(run.dir).seeds
    assert (m["n_seeds"] == 2).all() and (result.differences["n_seeds"] == 2).all()
    assert result.info["settings"]["training_seeds"] == [0, 1]
    assert {x["name"]: x["n_seeds"] for x in result.info["models"]} == {"zero-shot": 2, "clip": 2}
    saved = json.loads((run.dir / "evaluation" / "results.json").read_text())
    assert all(row["n_seeds"] == 2 for row in saved["metrics"])
    key = ["model", "benchmark", "labels", "direction", "metric", "level"]
    mean = seeds.groupby(key)["value"].mean()
    sd = seeds.groupby(key)["value"].std()
    joined = m.set_index(key)
    np.testing.assert_allclose(joined["value"].to_numpy(float), mean.reindex(joined.index).to_numpy(float))
    np.testing.assert_allclose(joined["seed_sd"].to_numpy(float), sd.reindex(joined.index).to_numpy(float))
    assert "seeds" in (run.dir / "evaluation" / "table3.md").read_text()
    assert "Paired difference from the zero-shot model" in (run.dir / "evaluation" / "table3.md").read_text()
    fig = plot_accuracy_by_level(m, seeds=seeds, labels=["dag"])
    assert len(fig.axes[1].get_lines()) == 1 + (1 + 2) + 1  # zero-shot's line; clip's mean and 2 seeds; chance

    raw["train"]["seeds"] = [0]  # the same run read with one seed: seed 0's models, reused
    (tmp_path / "params" / "tiny.yaml").write_text(yaml.safe_dump(raw))
    one = evaluate_run(open_run(tmp_path / "params" / "tiny.yaml", run.dir), progress=False).metrics
    assert (one["n_seeds"] == 1).all() and one["seed_sd"].isna().all()
    both = one.merge(m, on=key, suffixes=("", "_2"), validate="one_to_one")
    assert len(both) == len(m) and (both["n_queries"] == both["n_queries_2"]).all()
    seed0 = seeds[seeds["training_seed"] == "0"].set_index(key)["value"]
    np.testing.assert_allclose(one.set_index(key)["value"].to_numpy(float),
                               seed0.reindex(one.set_index(key).index).to_numpy(float))


def test_summary_of_per_model_items_keeps_the_seeds_axis():
    """Kendall tau drops, per model, the chains whose distances all tie: each model keeps its own items for its
    interval, and the difference uses the items both kept, under each of the two seeds."""
    from cglib.evaluate.gallery import MetricScores
    from cglib.evaluate.summary import summarize

    key = ("hierarcaps_hierarchy", "hierarcaps", "-", "kendall_tau", "all")
    a = Scores(np.array([[0.5, 0.6, 0.7, 0.8], [0.4, 0.6, 0.7, 0.9]]), np.array([0, 1, 2, 3]))
    b = Scores(np.array([[0.1, 0.2, 0.3], [0.2, 0.2, 0.4]]), np.array([0, 1, 3]))
    models = [{"name": "a", "exposed_to_eval_strings": False}, {"name": "b", "exposed_to_eval_strings": False}]
    metrics, diffs = summarize({key: {"a": MetricScores(a, 0.0), "b": MetricScores(b, 0.0)}}, models, 100, 0.95, 0,
                               {}, {})
    assert metrics.set_index("model")["n"].to_dict() == {"a": 4, "b": 3}
    assert (metrics["n_seeds"] == 2).all()
    row = diffs.iloc[0]
    assert (row["model_a"], row["n"], row["n_seeds"]) == ("b", 3, 2)
    shared_a = a.values[:, [0, 1, 3]].mean()
    assert row["difference"] == pytest.approx(b.values.mean() - shared_a)


def test_chance_column_is_a_random_scoring_models_mean_over_the_sampling_seeds():
    """The in-batch chance (what the Table 3 header prints) equals what random scorers actually get on the same
    items and seeds: 300 random embeddings of 60 items whose level-1 strings repeat (10 distinct), B = 8."""
    from cglib.evaluate.hierarcaps import in_batch_accuracy

    rng = np.random.default_rng(4)
    texts = [f"concept {i % 10}" for i in range(60)]
    vocabulary = sorted(set(texts))
    index = {t: i for i, t in enumerate(vocabulary)}
    got, chance = [], None
    for _ in range(300):
        images = rng.normal(size=(60, 16))
        vectors = rng.normal(size=(len(vocabulary), 16))
        result = in_batch_accuracy(texts, images, vectors, index, batch=8, seeds=[0, 1])
        got.append(result[("t2i", "R@1")].scores.mean())
        chance = result[("t2i", "R@1")].chance
    assert chance > 1 / 8 + 0.02  # repeated strings lift it above 1/B
    assert np.mean(got) == pytest.approx(chance, abs=0.01)
