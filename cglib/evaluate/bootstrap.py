"""Bootstrap confidence intervals over test items, and paired differences between models.

Every metric is a mean of per-query scores (0/1 hits, precisions, average precisions). Queries that are not
independent (the captions of one image, the same image under several forced-choice seeds) share a resampling
unit, and the bootstrap resamples units, not queries (a cluster bootstrap): a resample's estimate is
sum(scores of the drawn units) / count(queries of the drawn units), which equals the plain mean over queries
on the original sample. The resample weights depend only on the number of units and the seed, so two models
scored on the same items are resampled identically: that is the paired bootstrap of their difference.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

RESAMPLE_CHUNK = 250  # resamples drawn at once: bounds memory at 250 x n_units weights


@dataclass(frozen=True)
class Scores:
    """Per-query scores and the resampling unit of each query (an int label; any labels, compacted on use)."""

    values: np.ndarray
    units: np.ndarray

    def __post_init__(self) -> None:
        if self.values.shape != self.units.shape or self.values.ndim != 1:
            raise ValueError(f"values {self.values.shape} and units {self.units.shape} must be 1-D of one length")

    @property
    def n_queries(self) -> int:
        return int(self.values.size)

    @property
    def n_units(self) -> int:
        return int(np.unique(self.units).size)

    def mean(self) -> float:
        """The metric on the full sample (NaN when there is no query)."""
        return float(self.values.mean()) if self.values.size else float("nan")


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval and the sample size behind it."""

    value: float
    low: float
    high: float
    n_units: int
    n_queries: int

    @property
    def significant(self) -> bool:
        """True when the interval excludes 0 (for a difference: the sign is resolved at this level)."""
        return bool(self.low > 0 or self.high < 0)


def unit_sums(scores: Scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compact unit labels to 0..U-1: per-unit score sums, per-unit query counts, and the sorted unit labels."""
    labels, inverse = np.unique(scores.units, return_inverse=True)
    sums = np.bincount(inverse, weights=scores.values.astype(np.float64), minlength=labels.size)
    counts = np.bincount(inverse, minlength=labels.size).astype(np.float64)
    return sums, counts, labels


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


def _check_same_units(scores: list[Scores]) -> np.ndarray:
    first = scores[0].units
    for s in scores[1:]:
        if s.units.shape != first.shape or not np.array_equal(s.units, first):
            raise ValueError("paired comparison needs scores on identical items in the same order; "
                             "score every model on the same item set")
    return first


def confidence_intervals(scores: list[Scores], resamples: int, ci: float, seed: int,
                         stream: str = "") -> list[Interval]:
    """Percentile intervals of several metrics (or models) scored on the same items, from one set of resamples."""
    if not scores:
        return []
    _check_same_units(scores)
    n_queries = scores[0].n_queries
    if n_queries == 0:
        return [Interval(float("nan"), float("nan"), float("nan"), 0, 0) for _ in scores]
    sums = np.stack([unit_sums(s)[0] for s in scores])
    counts = unit_sums(scores[0])[1]
    values = sums.sum(axis=1) / counts.sum()
    if resamples == 0:
        lows = highs = np.full(len(scores), np.nan)
    else:
        estimates = bootstrap_means(sums, counts, resample_weights(counts.size, resamples, seed, stream))
        lows, highs = _percentiles(estimates, ci)
    return [Interval(float(v), float(lo), float(hi), int(counts.size), n_queries)
            for v, lo, hi in zip(values, lows, highs)]


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
             for a, b in pairs]
    intervals = confidence_intervals([scores[n] for n in names] + diffs, resamples, ci, seed, stream)
    return dict(zip(names, intervals[: len(names)])), dict(zip(pairs, intervals[len(names):]))


def set_difference(a: list[Scores], b: list[Scores], resamples: int, ci: float, seed: int,
                   stream: str = "") -> tuple[Interval, Interval]:
    """Mean over the models of `a` minus mean over the models of `b`, all scored on the same items, and that
    difference relative to `b`'s mean (a fraction), each with its paired percentile interval.

    The mean of a set of models is their per-query mean (= the mean of their metrics, since every model has the
    same queries); both sets are resampled with the same draws (`resample_weights`, as every other interval),
    and the relative interval is the percentile interval of the resampled difference / resampled mean of `b`.
    """
    if not a or not b:
        raise ValueError("set_difference needs at least one model on each side")
    units = _check_same_units(list(a) + list(b))
    mean_a = np.mean([s.values.astype(np.float64) for s in a], axis=0)
    mean_b = np.mean([s.values.astype(np.float64) for s in b], axis=0)
    if units.size == 0:
        nan = Interval(float("nan"), float("nan"), float("nan"), 0, 0)
        return nan, nan
    diff_sums, counts, _ = unit_sums(Scores(mean_a - mean_b, units))
    ref_sums = unit_sums(Scores(mean_b, units))[0]
    diff, ref = diff_sums.sum() / counts.sum(), ref_sums.sum() / counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = diff / ref if ref != 0 else float("nan")
        if resamples == 0:
            lows = highs = np.full(2, np.nan)
        else:
            est = bootstrap_means(np.stack([diff_sums, ref_sums]), counts,
                                  resample_weights(counts.size, resamples, seed, stream))
            lows, highs = _percentiles(np.stack([est[0], est[0] / est[1]]), ci)
    n_units, n_queries = int(counts.size), int(units.size)
    return (Interval(float(diff), float(lows[0]), float(highs[0]), n_units, n_queries),
            Interval(float(relative), float(lows[1]), float(highs[1]), n_units, n_queries))
