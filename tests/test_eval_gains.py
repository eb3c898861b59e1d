"""Our gain rows under Table 3 (the paper's "Avg Accuracy Gain w.r.t.", by our definition): roles from saved model info, set differences with
paired bootstrap CIs on synthetic per-item scores with known effects, notes for absent gains."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cglib.evaluate import report
from cglib.evaluate.bootstrap import Scores, confidence_intervals, set_difference
from cglib.evaluate.gains import (
    GAIN_COLUMNS,
    GAINS,
    ModelRole,
    best_model,
    gain_rows,
    gain_sets,
    gains_display,
    model_roles,
)
from cglib.evaluate.table3 import table3, table3_markdown

LEVELS = ["generalized", "l1", "l2"]
HEADERS = {"generalized": "MAGIC captions", "l1": "MAGIC l1", "l2": "MAGIC l2"}
PAPER_MODELS = [  # results.json's `models` as evaluate_run writes them for params/paper.yaml
    {"name": "zero-shot", "loss": None, "pretrain": "none", "exposed_to_eval_strings": False,
     "fine_tuned_on_magic": False, "objective": "none", "init": None},
    {"name": "clip", "loss": "clip", "pretrain": "none", "exposed_to_eval_strings": False,
     "fine_tuned_on_magic": True, "objective": "clip", "init": "zero-shot"},
    {"name": "centroid", "loss": "centroid", "pretrain": "none", "exposed_to_eval_strings": False,
     "fine_tuned_on_magic": True, "objective": "centroid", "init": "zero-shot"},
    {"name": "pairwise", "loss": "pairwise", "pretrain": "none", "exposed_to_eval_strings": False,
     "fine_tuned_on_magic": True, "objective": "pairwise", "init": "zero-shot"},
    {"name": "pairwise_pretrain", "loss": "pairwise", "pretrain": "with_concepts", "exposed_to_eval_strings": True,
     "fine_tuned_on_magic": True, "objective": "pairwise", "init": "zero-shot"},
]


def synthetic(p: dict[str, float], n_images: int = 400, seeds: int = 2, rng_seed: int = 0
              ) -> tuple[pd.DataFrame, dict[tuple[str, ...], dict[str, Scores]]]:
    """0/1 forced-choice scores per (seed, image) query, images as units, model m correct with probability
    p[m] (the same at every level); metrics rows as summarize writes them (values only, CIs unused here)."""
    rng = np.random.default_rng(rng_seed)
    units = np.tile(np.arange(n_images), seeds)
    scores, rows = {}, []
    for level in LEVELS:
        key = ("forced_choice", "dag", "t2i", "accuracy", level)
        # a shared per-image difficulty: the models' errors are correlated, as on real items
        difficulty = rng.uniform(-0.1, 0.1, n_images)[units]
        scores[key] = {}
        for model, prob in p.items():
            values = (rng.random(units.size) < np.clip(prob + difficulty, 0, 1)).astype(np.float64)
            scores[key][model] = Scores(values, units)
            rows.append({"model": model, "benchmark": "forced_choice", "labels": "dag", "direction": "t2i",
                         "metric": "accuracy", "level": level, "value": values.mean(), "ci_low": np.nan,
                         "ci_high": np.nan, "n": n_images, "n_queries": units.size, "n_excluded": 0, "chance": 0.5,
                         "exposed_to_eval_strings": False, "exposure": ""})
    return pd.DataFrame(rows, columns=report.METRIC_COLUMNS), scores


def test_roles_from_saved_model_info_and_older_files():
    """Roles come from results.json's models; files without the role fields get them from loss/pretrain; the
    future HierarCaps rows fit the scheme; any objective is accepted and the gain sets read its family (a user's
    group-family objective counts as a group loss); an unknown family is an error naming the model."""
    roles = model_roles(PAPER_MODELS)
    assert roles["zero-shot"].is_base and not roles["clip"].is_base
    assert roles["pairwise_pretrain"] == ModelRole("pairwise_pretrain", True, "pairwise", "with_concepts",
                                                          "zero-shot", True, family="group")
    old = [{k: m[k] for k in ("name", "loss", "pretrain", "exposed_to_eval_strings")} for m in PAPER_MODELS]
    assert model_roles(old) == roles

    future = PAPER_MODELS + [
        {"name": "hierarcaps", "fine_tuned_on_magic": False, "objective": "re", "pretrain": "none",
         "init": "zero-shot"},
        {"name": "hierarcaps_ft", "fine_tuned_on_magic": True, "objective": "clip", "pretrain": "none",
         "init": "hierarcaps"}]
    sets = gain_sets(model_roles(future), best="pairwise")
    assert sets["MAGIC"][:2] == (["clip", "centroid", "pairwise", "pairwise_pretrain", "hierarcaps_ft"],
                                 ["zero-shot", "hierarcaps"])
    assert sets["Loss Function"][:2] == (["centroid", "pairwise", "pairwise_pretrain"], ["clip", "hierarcaps_ft"])
    assert sets["Pretraining"][:2] == (["pairwise_pretrain"], ["pairwise"])
    assert sets["Best Model"][:2] == (["pairwise"], ["zero-shot"])  # the HierarCaps model is not the base
    own = model_roles(PAPER_MODELS + [{"name": "triplet", "objective": "triplet", "objective_family": "group",
                                              "fine_tuned_on_magic": True}])
    assert "triplet" in gain_sets(own, best="pairwise")["Loss Function"][0]
    with pytest.raises(ValueError, match="'odd'.*objective 'triplet' has family 'pairs'"):
        model_roles([{"name": "odd", "objective": "triplet", "objective_family": "pairs",
                             "fine_tuned_on_magic": True}])


def test_set_difference_is_the_difference_of_set_means_with_a_paired_interval():
    """Difference of set means = mean over A's models minus mean over B's; relative = that / mean(B); the
    difference interval is the one confidence_intervals gives the per-query difference (same resamples)."""
    _, scores = synthetic({"a1": 0.8, "a2": 0.7, "b1": 0.6, "b2": 0.55, "b3": 0.5})
    s = scores[("forced_choice", "dag", "t2i", "accuracy", "l1")]
    diff, rel = set_difference([s["a1"], s["a2"]], [s["b1"], s["b2"], s["b3"]], 300, 0.95, seed=3)
    mean_a = (s["a1"].mean() + s["a2"].mean()) / 2
    mean_b = (s["b1"].mean() + s["b2"].mean() + s["b3"].mean()) / 3
    assert diff.value == pytest.approx(mean_a - mean_b)
    assert rel.value == pytest.approx((mean_a - mean_b) / mean_b)
    per_query = Scores((s["a1"].values + s["a2"].values) / 2
                       - (s["b1"].values + s["b2"].values + s["b3"].values) / 3, s["a1"].units)
    same = confidence_intervals([per_query], 300, 0.95, seed=3)[0]
    assert (diff.low, diff.high) == pytest.approx((same.low, same.high))
    assert rel.low <= rel.value <= rel.high and diff.n_units == 400 and diff.n_queries == 800
    with pytest.raises(ValueError, match="identical items"):
        set_difference([s["a1"]], [Scores(s["b1"].values, s["b1"].units[::-1].copy())], 10, 0.95, seed=0)


def test_gain_rows_recover_known_effects_and_state_significance():
    """Four gains per column on synthetic scores with known effects: the value equals the difference of the set
    means (points) and relative % of the reference mean; a large effect's CI covers the truth and excludes 0;
    a null effect's CI contains 0 and the note says it is not significant; the block lands in table3.md."""
    true = {"zero-shot": 0.55, "clip": 0.70, "centroid": 0.70, "pairwise": 0.70, "pairwise_pretrain": 0.70}
    # one seeded draw: each null CI contains 0 with probability 0.95 (the coverage test below checks the rate)
    metrics, scores = synthetic(true, n_images=600, rng_seed=1)
    roles = model_roles(PAPER_MODELS)
    gains, notes = gain_rows(metrics, scores, roles, resamples=400, ci=0.95, seed=0)
    assert list(gains.columns) == GAIN_COLUMNS
    assert set(gains["gain"]) == set(GAINS) and set(gains["column"]) == set(HEADERS.values())
    for _, r in gains.iterrows():
        by_model = scores[("forced_choice", "dag", "t2i", "accuracy", r["level"])]
        a, b = r["models_a"].split(";"), r["models_b"].split(";")
        mean_a = 100 * np.mean([by_model[m].mean() for m in a])
        mean_b = 100 * np.mean([by_model[m].mean() for m in b])
        assert r["difference"] == pytest.approx(mean_a - mean_b)
        assert r["relative"] == pytest.approx(100 * (mean_a - mean_b) / mean_b)
        truth = 100 * (np.mean([true[m] for m in a]) - np.mean([true[m] for m in b]))
        assert r["ci_low"] <= truth <= r["ci_high"], (r["gain"], r["column"])
        assert r["significant"] == (r["gain"] == "MAGIC" or r["gain"] == "Best Model"), (r["gain"], r["column"])
    magic = gains[gains["gain"] == "MAGIC"].iloc[0]
    assert magic["models_a"] == "clip;centroid;pairwise;pairwise_pretrain" and magic["models_b"] == "zero-shot"
    assert magic["ci_low"] > 0
    loss = gains[gains["gain"] == "Loss Function"].iloc[0]
    assert loss["models_a"] == "centroid;pairwise;pairwise_pretrain" and loss["ci_low"] < 0 < loss["ci_high"]
    text = "\n".join(notes)
    assert "Loss Function (group losses" in text and "mean of centroid, pairwise, pairwise_pretrain † minus" in text
    assert "Not significant (the CI contains 0) at MAGIC captions, MAGIC l1, MAGIC l2" in text
    assert "MAGIC (fine-tuned on MAGIC minus not" in text and "Significant at every scored column" in text

    shown = gains_display(gains)
    assert list(shown.index) == [f"Avg Accuracy Gain w.r.t. {g} (ours)" for g in GAINS]
    assert shown.loc["Avg Accuracy Gain w.r.t. MAGIC (ours)", "MAGIC l1"].endswith("%) *")
    assert report.signed(-0.04) == "+0.0" and report.signed(-0.06) == "-0.1"
    md = table3_markdown(table3(metrics), ["a note"], gains_display(gains), notes)
    lines = md.splitlines()
    model_row = next(i for i, line in enumerate(lines) if line.startswith("| pairwise_pretrain |"))
    gain_row = next(i for i, line in enumerate(lines) if line.startswith("| Avg Accuracy Gain w.r.t. MAGIC (ours) |"))
    assert gain_row == model_row + 1 and "- a note" in md and "- Loss Function (group" in md
    assert "## Gain rows, our definition" in md and "- Our gain rows (our definition, not the paper's rule" in md


def test_null_gain_interval_contains_zero_at_about_the_nominal_rate():
    """Two sets of models with the same accuracy, independent errors: the paired 95% interval of their
    difference contains the true 0 in about 95% of 200 simulated test sets (and the difference of a set with
    itself plus 10 points is exactly 10 with a point interval)."""
    rng = np.random.default_rng(7)
    units = np.arange(150)
    covered = 0
    for _ in range(200):
        a = [Scores((rng.random(150) < 0.7).astype(float), units) for _ in range(2)]
        b = [Scores((rng.random(150) < 0.7).astype(float), units) for _ in range(3)]
        diff = set_difference(a, b, 200, 0.95, seed=0)[0]
        covered += diff.low <= 0 <= diff.high
    assert 0.9 <= covered / 200 <= 0.99
    shifted = [Scores(b[0].values + 0.1, units)]
    diff, rel = set_difference(shifted, [b[0]], 50, 0.95, seed=0)
    assert (diff.value, diff.low, diff.high) == pytest.approx((0.1, 0.1, 0.1))
    assert rel.value == pytest.approx(0.1 / b[0].mean())


def test_missing_sets_give_a_note_not_a_crash():
    """No pretraining run: that gain is absent with the reason; zero-shot alone: every gain is absent; an
    unscorable column (no item) is a '-' cell and said so."""
    metrics, scores = synthetic({"zero-shot": 0.5, "clip": 0.6, "pairwise": 0.65}, n_images=50)
    l2 = ("forced_choice", "dag", "t2i", "accuracy", "l2")
    scores[l2] = {m: Scores(np.zeros(0), np.zeros(0, dtype=np.int64)) for m in scores[l2]}
    roles = model_roles(PAPER_MODELS[:2] + PAPER_MODELS[3:4])
    gains, notes = gain_rows(metrics, scores, roles, resamples=50, ci=0.95, seed=0)
    assert set(gains["gain"]) == {"MAGIC", "Loss Function", "Best Model"}
    assert "Pretraining: absent: no model with textual pretraining in this run (train.runs: pretrain)." in notes
    assert any("No scorable item at MAGIC l2" in n for n in notes if n.startswith("MAGIC ("))
    assert gains_display(gains).loc["Avg Accuracy Gain w.r.t. MAGIC (ours)", "MAGIC l2"] == "-"
    best = gains[gains["gain"] == "Best Model"]
    assert set(best["models_a"]) == {"pairwise"}

    alone = model_roles(PAPER_MODELS[:1])
    zs_metrics = metrics[metrics["model"] == "zero-shot"]
    gains, notes = gain_rows(zs_metrics, scores, alone, resamples=50, ci=0.95, seed=0)
    assert gains.empty and sum("absent" in n for n in notes) == 4
    md = table3_markdown(table3(zs_metrics), [], gains_display(gains), notes)
    assert "Avg Accuracy Gain w.r.t. MAGIC (ours) |" not in md and "- MAGIC: absent" in md


def test_related_methods_enter_no_gain_set():
    """Models trained with a related method (issue #21: a memory centroid run, MCC) are rows of every table but in
    none of the paper's gain sets, and never the 'best model'; the paper's rows keep their sets."""
    related = PAPER_MODELS + [
        {"name": "centroid_memory", "fine_tuned_on_magic": True, "objective": "centroid", "pretrain": "none",
         "init": "zero-shot", "related": ["momentum concept memory (DCCL, Pu et al. CVPR 2023)"]},
        {"name": "mcc", "fine_tuned_on_magic": True, "objective": "mcc", "pretrain": "none", "init": "zero-shot",
         "related": ["concept-conditioned image contrast, MCC (C3)"]}]
    roles = model_roles(related)
    assert roles["centroid_memory"].related and not roles["centroid"].related
    sets = gain_sets(roles, best="pairwise")
    assert sets == gain_sets(model_roles(PAPER_MODELS), best="pairwise")
    metrics, _ = synthetic({"zero-shot": 0.6, "clip": 0.65, "centroid": 0.7, "pairwise": 0.7,
                            "pairwise_pretrain": 0.72, "centroid_memory": 0.9, "mcc": 0.9})
    assert best_model(metrics, roles) == "pairwise_pretrain"


def test_related_methods_of_a_run_entry():
    """related_methods names each related method a train.runs entry uses; the paper's rows use none."""
    from cglib.config import TrainRunParams
    from cglib.train.inputs import related_methods

    assert related_methods(TrainRunParams(name="c", loss="centroid")) == []
    assert related_methods(TrainRunParams(name="r", loss="re")) == []
    assert len(related_methods(TrainRunParams(name="m", loss="centroid", options={"memory_momentum": 0.9}))) == 1
    both = related_methods(TrainRunParams(name="n", loss="mcc", groups="ngram", text_source="original"))
    assert [m.split(" (")[0] for m in both] == ["concept-conditioned image contrast, MCC", "n-gram concept groups"]
