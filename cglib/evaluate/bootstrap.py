"""Bootstrap confidence intervals over training seeds and test items, and paired differences between models.

Every metric is a mean of per-query scores (0/1 hits, precisions, average precisions). Queries that are not
independent (the captions of one image, the same image under several forced-choice seeds) share a resampling
unit, and the bootstrap resamples units, not queries (a cluster bootstrap): a resample's estimate is
sum(scores of the drawn units) / count(queries of the drawn units), which equals the plain mean over queries
on the original sample. The resample weights depend only on the number of units and the seed, so two models
scored on the same items are resampled identically: that is the paired bootstrap of their difference.

Training seeds (`train.seeds`). A model trained with S seeds has one row of per-query scores per seed, on the same
items (`Scores.values` of shape (S, Q)); its value is the mean over seeds. The bootstrap is hierarchical: each
resample draws S training seeds with replacement, then the units; the units are the same under every seed (the
items are fixed by run.seed, crossed with the training seeds), so one draw of units applies to every drawn seed
(drawing them anew per seed would count the image variance S times too small). With one seed this is exactly
the image bootstrap above. Two models are paired at both levels: the same seed draws (seed k of one with seed k of
the other) and the same unit draws. With few seeds (3) the seed level of an interval is a bootstrap over 3 values
and is too narrow when the seed-to-seed spread dominates: every number states the seeds it rests on.

p-values (`Interval.p_value`, for multiplicity corrections): two-sided, from the bootstrap standard error
(z = value / SD of the resampled values): the tail counts of 1,000 resamples cannot resolve the p < 0.05/m that
Holm's correction asks of the smallest of m p-values.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

RESAMPLE_CHUNK = 250  # resamples drawn at once: bounds memory at 250 x n_units weights


@dataclass(frozen=True)
class Scores:
    """Per-query scores and the resampling unit of each query (an int label; any labels, compacted on use).

    `values` is (Q,) for one model, or (S, Q) for a model trained with S training seeds: row s holds seed s's
    scores on the same Q queries (`units` (Q,) is shared by the seeds).
    """

    values: np.ndarray
    units: np.ndarray

    def __post_init__(self) -> None:
        if self.units.ndim != 1 or self.values.ndim not in (1, 2) or self.values.shape[-1] != self.units.size:
            raise ValueError(f"values {self.values.shape} must be (Q,) or (seeds, Q) and units {self.units.shape} "
                             "(Q,) with the same Q")

    @property
    def n_queries(self) -> int:
        return int(self.units.size)

    @property
    def n_units(self) -> int:
        return int(np.unique(self.units).size)

    @property
    def n_seeds(self) -> int:
        return 1 if self.values.ndim == 1 else int(self.values.shape[0])

    def rows(self) -> np.ndarray:
        """The values as (S, Q), one row per training seed."""
        return np.atleast_2d(self.values)

    def mean(self) -> float:
        """The metric on the full sample: the mean over seeds of each seed's mean (NaN when there is no query)."""
        return float(self.values.mean()) if self.values.size else float("nan")

    def seed_means(self) -> np.ndarray:
        """Each training seed's metric (S,)."""
        rows = self.rows()
        return rows.mean(axis=1) if rows.shape[1] else np.full(rows.shape[0], np.nan)


def stack_seeds(per_seed: list[Scores]) -> Scores:
    """One model's scores under each training seed as one (S, Q) Scores.

    The seeds must share their queries; a metric whose queries depend on the model (Kendall tau drops chains
    whose distances all tie; one query per unit) keeps the units every seed scored.
    """
    if not per_seed:
        raise ValueError("stack_seeds needs the scores of at least one seed")
    first = per_seed[0].units
    if all(s.units.shape == first.shape and np.array_equal(s.units, first) for s in per_seed):
        return Scores(np.stack([s.values for s in per_seed]), first)
    if any(np.unique(s.units).size != s.units.size for s in per_seed):
        raise ValueError("the training seeds of a model were scored on different items; score every seed on the "
                         "same items")
    common = np.array(sorted(set.intersection(*(set(s.units.tolist()) for s in per_seed))), dtype=first.dtype)
    rows = []
    for s in per_seed:
        position = {int(u): i for i, u in enumerate(s.units)}
        rows.append(s.values[[position[int(u)] for u in common]])
    return Scores(np.stack(rows) if common.size else np.zeros((len(per_seed), 0)), common)


def repeat_seeds(scores: Scores, n_seeds: int) -> Scores:
    """A model with no training seed (frozen: the zoo) as the same scores under each of `n_seeds` seeds, so it
    pairs with trained models seed by seed (its seed level has no spread)."""
    if scores.n_seeds == n_seeds:
        return scores
    if scores.n_seeds != 1:
        raise ValueError(f"cannot pair scores of {scores.n_seeds} training seeds with {n_seeds}; train every model "
                         "with the same train.seeds")
    return Scores(np.repeat(scores.rows(), n_seeds, axis=0), scores.units)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval and the sample size behind it."""

    value: float
    low: float
    high: float
    n_units: int
    n_queries: int
    n_seeds: int = 1
    p_value: float = float("nan")  # two-sided, value = 0, from the bootstrap standard error

    @property
    def significant(self) -> bool:
        """True when the interval excludes 0 (for a difference: the sign is resolved at this level)."""
        return bool(self.low > 0 or self.high < 0)


def unit_sums(scores: Scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compact unit labels to 0..U-1: per-unit score sums ((U,), or (S, U) with training seeds), per-unit query
    counts (U,), and the sorted unit labels."""
    labels, inverse = np.unique(scores.units, return_inverse=True)
    rows = scores.rows().astype(np.float64)
    # one bincount for every seed: seed s's units offset into bins s*U .. s*U+U-1
    offsets = (np.arange(rows.shape[0]) * labels.size)[:, None]
    sums = np.bincount((inverse[None, :] + offsets).ravel(), weights=rows.ravel(),
                       minlength=rows.shape[0] * labels.size).reshape(rows.shape[0], labels.size)
    counts = np.bincount(inverse, minlength=labels.size).astype(np.float64)
    return (sums[0] if scores.values.ndim == 1 else sums), counts, labels


_WEIGHTS: dict[tuple[int, int, int, str], np.ndarray] = {}
_WEIGHTS_KEPT = 4  # weight matrices kept in memory (16K units x 1000 resamples = 64 MB each)


def resample_weights(n_units: int, resamples: int, seed: int, stream: str = "") -> np.ndarray:
    """(resamples, n_units) multiplicities of each unit in each bootstrap resample (deterministic per seed).

    Memoised: every metric on the same number of units reuses one matrix (each metric's interval is still an
    ordinary bootstrap; they just share the draws), which makes thousands of intervals cheap.
    """
    key = (n_units, resamples, seed, stream)
    if key not in _WEIGHTS:
        if len(_WEIGHTS) >= _WEIGHTS_KEPT:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        _WEIGHTS[key] = _draw_weights(n_units, resamples, seed, stream)
    return _WEIGHTS[key]


def _draw_weights(n_units: int, resamples: int, seed: int, stream: str) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(stream.encode()), n_units])
    # float32 holds the counts exactly and halves memory and matmul time.
    weights = np.empty((resamples, n_units), dtype=np.float32)
    for start in range(0, resamples, RESAMPLE_CHUNK):
        stop = min(resamples, start + RESAMPLE_CHUNK)
        draws = rng.integers(0, n_units, size=(stop - start, n_units))
        # Row-wise bincount by offsetting each row into its own block of bins.
        offsets = (np.arange(stop - start) * n_units)[:, None]
        weights[start:stop] = np.bincount((draws + offsets).ravel(),
                                          minlength=(stop - start) * n_units).reshape(stop - start, n_units)
    return weights


def _percentiles(estimates: np.ndarray, ci: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - ci) / 2.0
    return np.quantile(estimates, alpha, axis=-1), np.quantile(estimates, 1.0 - alpha, axis=-1)


def bootstrap_means(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Resampled means: `sums` (m, U) for m metrics on the same units, `counts` (U,) -> (m, resamples)."""
    sums = np.atleast_2d(sums)
    # One (resamples x U) @ (U x m+1) product: every metric's resampled sum and the resampled query count.
    stacked = weights @ np.column_stack([sums.T, counts]).astype(np.float32)
    return (stacked[:, :-1].astype(np.float64) / stacked[:, -1:].astype(np.float64)).T


def seed_weights(n_seeds: int, resamples: int, seed: int, stream: str = "") -> np.ndarray:
    """(resamples, n_seeds) multiplicities of each training seed per resample; one seed is always drawn once."""
    if n_seeds == 1:
        return np.ones((resamples, 1), dtype=np.float32)
    return resample_weights(n_seeds, resamples, seed, stream + "|training seeds")


def hierarchical_means(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Resampled means over seeds and units: `sums` (m, S, U) for m metrics, `counts` (U,), unit `weights`
    (R, U) shared by every seed, seed multiplicities `seeds` (R, S) -> (m, R).

    A resample's value = sum_s v_s * (sum_u w_u sums_su) / (sum_u w_u counts_u) / S: the mean over the drawn seeds
    of each drawn seed's mean over the drawn units.
    """
    m, n_seeds, n_units = sums.shape
    per_seed = weights @ sums.reshape(m * n_seeds, n_units).T.astype(np.float32)  # (R, m*S)
    per_seed = per_seed.astype(np.float64).reshape(-1, m, n_seeds)
    total = np.einsum("rms,rs->mr", per_seed, seeds.astype(np.float64))
    return total / (n_seeds * (weights.astype(np.float64) @ counts))[None, :]


def _p_values(values: np.ndarray, estimates: np.ndarray) -> np.ndarray:
    """Two-sided p-values of value = 0 from the bootstrap standard error (normal approximation)."""
    se = estimates.std(axis=-1, ddof=1)
    out = np.full(values.shape, np.nan)
    for i, (v, e) in enumerate(zip(values, se)):
        if not np.isfinite(v):
            continue
        out[i] = 1.0 if v == 0 else 0.0 if e == 0 else math.erfc(abs(v) / e / math.sqrt(2.0))
    return out


def _check_same_units(scores: list[Scores]) -> np.ndarray:
    first = scores[0].units
    for s in scores[1:]:
        if s.units.shape != first.shape or not np.array_equal(s.units, first):
            raise ValueError("paired comparison needs scores on identical items in the same order; "
                             "score every model on the same item set")
        if s.n_seeds != scores[0].n_seeds:
            raise ValueError(f"paired comparison needs the same training seeds ({s.n_seeds} vs "
                             f"{scores[0].n_seeds}); train every model with the same train.seeds")
    return first


def confidence_intervals(scores: list[Scores], resamples: int, ci: float, seed: int,
                         stream: str = "") -> list[Interval]:
    """Percentile intervals of several metrics (or models) scored on the same items, from one set of resamples."""
    if not scores:
        return []
    _check_same_units(scores)
    n_queries, n_seeds = scores[0].n_queries, scores[0].n_seeds
    if n_queries == 0:
        return [Interval(float("nan"), float("nan"), float("nan"), 0, 0, n_seeds) for _ in scores]
    sums = np.stack([np.atleast_2d(unit_sums(s)[0]) for s in scores])  # (m, S, U)
    counts = unit_sums(scores[0])[1]
    values = sums.sum(axis=(1, 2)) / (n_seeds * counts.sum())
    if resamples == 0:
        lows = highs = p_values = np.full(len(scores), np.nan)
    else:
        weights = resample_weights(counts.size, resamples, seed, stream)
        if n_seeds == 1:  # the image bootstrap (one matmul; equal to the hierarchical one with one seed)
            estimates = bootstrap_means(sums[:, 0], counts, weights)
        else:
            estimates = hierarchical_means(sums, counts, weights, seed_weights(n_seeds, resamples, seed, stream))
        lows, highs = _percentiles(estimates, ci)
        p_values = _p_values(values, estimates)
    return [Interval(float(v), float(lo), float(hi), int(counts.size), n_queries, n_seeds, float(p))
            for v, lo, hi, p in zip(values, lows, highs, p_values)]


def paired_difference(a: Scores, b: Scores, resamples: int, ci: float, seed: int, stream: str = "") -> Interval:
    """Mean(a) - mean(b) on the same items, with the paired bootstrap interval (both resampled identically)."""
    _check_same_units([a, b])
    diff = Scores(values=a.values.astype(np.float64) - b.values.astype(np.float64), units=a.units)
    return confidence_intervals([diff], resamples, ci, seed, stream)[0]


def intervals_and_differences(scores: dict[str, Scores], pairs: list[tuple[str, str]], resamples: int, ci: float,
                              seed: int, stream: str = "") -> tuple[dict[str, Interval], dict[tuple[str, str], Interval]]:
    """Intervals of every model and paired differences (a - b) for `pairs`, all from the same resamples."""
    names = list(scores)
    diffs = [Scores(scores[a].values.astype(np.float64) - scores[b].values.astype(np.float64), scores[a].units)
             for a, b in pairs]  # (S, Q) - (S, Q): seed k of a minus seed k of b, paired at both levels
    intervals = confidence_intervals([scores[n] for n in names] + diffs, resamples, ci, seed, stream)
    return dict(zip(names, intervals[: len(names)])), dict(zip(pairs, intervals[len(names):]))


def set_difference(a: list[Scores], b: list[Scores], resamples: int, ci: float, seed: int,
                   stream: str = "") -> tuple[Interval, Interval]:
    """Mean over the models of `a` minus mean over the models of `b`, all scored on the same items, and that
    difference relative to `b`'s mean (a fraction), each with its paired percentile interval.

    The mean of a set of models is their per-query mean (= the mean of their metrics, since every model has the
    same queries); both sets are resampled with the same draws (`resample_weights`, as every other interval),
    and the relative interval is the percentile interval of the resampled difference / resampled mean of `b`.
    With training seeds every model's seed k enters seed k of the set means (paired at both levels).
    """
    if not a or not b:
        raise ValueError("set_difference needs at least one model on each side")
    units = _check_same_units(list(a) + list(b))
    n_seeds = a[0].n_seeds
    mean_a = np.mean([s.rows().astype(np.float64) for s in a], axis=0)
    mean_b = np.mean([s.rows().astype(np.float64) for s in b], axis=0)
    if units.size == 0:
        nan = Interval(float("nan"), float("nan"), float("nan"), 0, 0, n_seeds)
        return nan, nan
    diff_sums, counts, _ = unit_sums(Scores(mean_a - mean_b, units))
    ref_sums = unit_sums(Scores(mean_b, units))[0]
    diff, ref = diff_sums.sum() / (n_seeds * counts.sum()), ref_sums.sum() / (n_seeds * counts.sum())
    p_value = float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = diff / ref if ref != 0 else float("nan")
        if resamples == 0:
            lows = highs = np.full(2, np.nan)
        else:
            weights = resample_weights(counts.size, resamples, seed, stream)
            est = hierarchical_means(np.stack([diff_sums, ref_sums]), counts, weights,
                                     seed_weights(n_seeds, resamples, seed, stream))
            lows, highs = _percentiles(np.stack([est[0], est[0] / est[1]]), ci)
            p_value = float(_p_values(np.array([diff]), est[:1])[0])
    n_units, n_queries = int(counts.size), int(units.size)
    return (Interval(float(diff), float(lows[0]), float(highs[0]), n_units, n_queries, n_seeds, p_value),
            Interval(float(relative), float(lows[1]), float(highs[1]), n_units, n_queries, n_seeds))
