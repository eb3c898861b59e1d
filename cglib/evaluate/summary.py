"""From every model's per-query scores to the tidy tables: bootstrap intervals (hierarchical over training seeds),
paired differences with Holm-adjusted p-values, per-seed values; and the protocol notes of that machinery."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cglib.evaluate.benchmarks import Key
from cglib.evaluate.bootstrap import Scores, intervals_and_differences, repeat_seeds
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.report import DIFF_COLUMNS, METRIC_COLUMNS, SEED_COLUMNS

# results.json `protocol`, after each benchmark's own entry
UNCERTAINTY_PROTOCOL = {
    "uncertainty": (
        "95% (eval.ci) percentile bootstrap over test items with eval.bootstrap resamples; queries of one unit "
        "(an image's captions, one image under several seeds, a group's generalized captions) are resampled "
        "together; with eval.bootstrap_unit = group, whole l1 groups are (intervals that also cover which "
        "concepts happened to be in the test set). With several evaluation seeds the reported value is the mean over seeds (= mean over pooled "
        "(seed, item) queries) and the CI comes from resampling images with their pooled queries. With several "
        "training seeds (train.seeds) the value is the mean over the training seeds and the bootstrap is "
        "hierarchical: training seeds are resampled, then images (the same image draw under every drawn seed: "
        "the items are shared by the seeds); n_seeds says how many seeds a number rests on. Differences "
        "between models use the same resamples for both (paired at both levels: seed k against seed k)."),
    "chance": (
        "The chance column is what a random-scoring model gets on the same items, averaged over the sampling "
        "seeds (its exact expectation): 1/M in the M-way forced choice, the share of same-text images in each "
        "B-way HierarCaps batch, the expected R@k of a random ranking in a gallery."),
    "multiplicity": (
        "Each difference has a two-sided p-value from its bootstrap standard error; a reading of many cells "
        "calls a difference significant only after Holm's correction over the cells it reads (family-wise "
        "error at 1 - eval.ci)."),
}


def paired_seeds(scores: dict[str, Scores]) -> dict[str, Scores]:
    """Every model with the training seeds of the most seeded one: a frozen (zoo) model's one row repeated, so
    differences pair seed k with seed k."""
    n_seeds = max((s.n_seeds for s in scores.values()), default=1)
    return {n: repeat_seeds(s, n_seeds) for n, s in scores.items()}


def seed_values(scores: dict[Key, dict[str, MetricScores]], train_seeds: list[int], frozen: set[str]) -> pd.DataFrame:
    """seeds.csv: each model's value under each training seed, per metric row (a frozen model: one row, seed -)."""
    rows = []
    for (benchmark, labels, direction, metric, level), by_model in scores.items():
        for name, ms in by_model.items():
            values = ms.scores.seed_means()
            for k, value in zip(["-"] if name in frozen else train_seeds, values):
                rows.append({"model": name, "training_seed": k, "benchmark": benchmark, "labels": labels,
                             "direction": direction, "metric": metric, "level": level, "value": float(value)})
    return pd.DataFrame(rows, columns=SEED_COLUMNS)


def summarize(scores: dict[Key, dict[str, MetricScores]], models: list[dict], resamples: int, ci: float,
              seed: int, excluded: dict[Key, int | dict[str, int]], exposure: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Bootstrap every key's scores for all models at once; tidy metrics and paired differences.

    A model's value is its mean over training seeds (n_seeds, seed_sd: the SD of its per-seed values); a
    difference's p-value is Holm-adjusted over the differences of its metric row (every pair of models).
    """
    names = [m["name"] for m in models]
    exposed = {m["name"]: m["exposed_to_eval_strings"] for m in models}
    pairs = [(names[j], names[i]) for i in range(len(names)) for j in range(i + 1, len(names))]
    metric_rows, diff_rows = [], []
    for key, by_model in scores.items():
        benchmark, labels, direction, metric, level = key
        present = [n for n in names if n in by_model]
        intervals, diffs = _intervals(key, paired_seeds({n: by_model[n].scores for n in present}),
                                      [(a, b) for a, b in pairs if a in by_model and b in by_model],
                                      resamples, ci, seed)
        for n in present:
            iv = intervals[n]
            n_excluded = excluded.get(key, 0)
            n_excluded = n_excluded.get(n, 0) if isinstance(n_excluded, dict) else n_excluded
            per_seed = by_model[n].scores.seed_means()
            metric_rows.append({
                "model": n, "benchmark": benchmark, "labels": labels, "direction": direction, "metric": metric,
                "level": level, "value": iv.value, "ci_low": iv.low, "ci_high": iv.high, "n": iv.n_units,
                "n_queries": iv.n_queries, "n_excluded": n_excluded, "n_seeds": by_model[n].scores.n_seeds,
                "seed_sd": float(np.std(per_seed, ddof=1)) if per_seed.size > 1 else float("nan"),
                "chance": by_model[n].chance,
                "exposed_to_eval_strings": exposed[n], "exposure": _exposure_note(n, benchmark, exposure)})
        for (a, b), iv in diffs.items():
            diff_rows.append({"model_a": a, "model_b": b, "benchmark": benchmark, "labels": labels,
                              "direction": direction, "metric": metric, "level": level, "difference": iv.value,
                              "ci_low": iv.low, "ci_high": iv.high, "n": iv.n_units, "n_seeds": iv.n_seeds,
                              "significant": iv.significant, "p_value": iv.p_value})
    differences = pd.DataFrame(diff_rows, columns=DIFF_COLUMNS)
    # the family of a difference: every pair and level of its benchmark, labels, direction and metric
    family = ["benchmark", "labels", "direction", "metric"]
    differences["p_holm"] = (differences.groupby(family, sort=False)["p_value"].transform(lambda p: holm(p.to_numpy()))
                             if len(differences) else pd.Series(dtype=float))
    differences["significant_holm"] = differences["p_holm"].le(1 - ci)
    return pd.DataFrame(metric_rows, columns=METRIC_COLUMNS), differences


def _intervals(key: Key, scores: dict[str, Scores], pairs: list[tuple[str, str]], resamples: int, ci: float,
               seed: int) -> tuple[dict, dict]:
    """Intervals and paired differences; when models kept different items (Kendall tau: chains whose distances
    all tie are undefined, and that depends on the model) each model gets its own interval and differences use
    the items all models share (one query per item there)."""
    stream = ""  # one set of resamples per number of units, shared by every metric (see resample_weights)
    units = [s.units for s in scores.values()]
    if all(u.shape == units[0].shape and np.array_equal(u, units[0]) for u in units):
        return intervals_and_differences(scores, pairs, resamples, ci, seed, stream)
    if any(np.unique(s.units).size != s.units.size for s in scores.values()):
        raise ValueError(f"{key}: models were scored on different items; score every model on the same items")
    intervals = {n: intervals_and_differences({n: s}, [], resamples, ci, seed, stream)[0][n]
                 for n, s in scores.items()}
    common = np.array(sorted(set.intersection(*(set(s.units.tolist()) for s in scores.values()))), dtype=np.int64)
    shared = {n: Scores(_at_units(s, common), common) for n, s in scores.items()}
    return intervals, intervals_and_differences(shared, pairs, resamples, ci, seed, stream)[1]


def _at_units(scores: Scores, units: np.ndarray) -> np.ndarray:
    """Values of the queries of `units` (one query per unit), in the order of `units` (per training seed: the
    last axis)."""
    position = {int(u): i for i, u in enumerate(scores.units)}
    return scores.values[..., [position[int(u)] for u in units]]


def _exposure_note(model: str, benchmark: str, exposure: dict[str, str]) -> str:
    """Why `model` saw the strings of a `benchmark` row: `exposure` keys 'MODEL|*' (every row) and
    'MODEL|BENCHMARK' (that benchmark's rows)."""
    notes = [exposure.get(f"{model}|*", ""), exposure.get(f"{model}|{benchmark}", "")]
    return "; ".join(n for n in notes if n)
