"""Evaluation speed: the vectorized bootstrap and gallery search against plain baselines measured in the same run.

    python benchmarks/bench_eval.py

Prints times and ratios (no asserts): the weight-matrix bootstrap vs a loop of resamples, and faiss exact
search (with the small-search single-thread rule) vs a numpy matmul + argsort.
"""

from __future__ import annotations

import timeit

import numpy as np

from cglib.evaluate.bootstrap import Scores, confidence_intervals
from cglib.evaluate.retrieval import search


def timed(fn, repeat: int = 3) -> float:
    """The best of `repeat` single calls."""
    return min(timeit.repeat(fn, number=1, repeat=repeat))


def loop_bootstrap(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = [values[rng.integers(0, values.size, values.size)].mean() for _ in range(resamples)]
    return tuple(np.quantile(means, [0.025, 0.975]))


def main() -> None:
    rng = np.random.default_rng(0)
    print("bootstrap, 1000 resamples, 8 metrics on the same items")
    for n in (300, 3000, 16000):
        metrics = [Scores((rng.random(n) < 0.6).astype(float), np.arange(n)) for _ in range(8)]
        vec = timed(lambda ms=metrics: confidence_intervals(ms, 1000, 0.95, seed=0))
        loop = timed(lambda ms=metrics: [loop_bootstrap(m.values, 1000, 0) for m in ms], repeat=1)
        print(f"  n={n:6d}: vectorized {vec * 1e3:8.1f} ms, loop {loop * 1e3:8.1f} ms, speed-up x{loop / vec:.1f}")

    print("gallery search, 384-d, top-11")
    for nq, ng in ((50, 300), (1500, 300), (5000, 16000)):
        q = rng.normal(size=(nq, 384)).astype(np.float32)
        g = rng.normal(size=(ng, 384)).astype(np.float32)
        fa = timed(lambda q=q, g=g: search(q, g, 11))
        npy = timed(lambda q=q, g=g: np.argsort(-(q @ g.T), axis=1)[:, :11])
        print(f"  {nq:5d} x {ng:6d}: faiss {fa * 1e3:8.1f} ms, numpy matmul+argsort {npy * 1e3:8.1f} ms, "
              f"ratio numpy/faiss {npy / fa:.1f}")


if __name__ == "__main__":
    main()
