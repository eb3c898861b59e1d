"""Benchmark: the hard-negative search alone (cglib.magic.negatives) at growing node counts.

The nodes are LLM-like l1 names as benchmarks/bench_scale.py makes them ('<modifier> <modifier> <l1>' over the
synthetic taxonomy's 52 l1 concepts, up to 81,120 distinct names), embedded by the MAGIC concept embedder (MiniLM);
a seeded sample of each size is searched at the paper's threshold 0.85 three ways: `exact` and `hnsw` with every
negative kept (the paper's definition), and `hnsw` with `magic.max_hard_negatives` = --cap. It prints wall times,
the pairs found, hnsw's recall of the exact pairs (the capped run against the exact capped pairs), and each
search's time-growth exponent between consecutive sizes next to n log n's.

Drawing more names from the same 52 themes crowds them together, so the pairs above the threshold (the paper's
output) grow quadratically here: no search that keeps them all can be sub-quadratic, and the cap is what bounds
the work at K pairs per node. `magic.negative_search: auto` switches from exact to hnsw at
cglib.magic.negatives.EXACT_MAX_NODES; this is the measurement behind that number.

    python benchmarks/bench_negatives.py                        # 2,500 ... 80,000 nodes (~10 minutes)
    python benchmarks/bench_negatives.py --sizes 1000,4000      # a minute
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import ADJECTIVES  # the same modifiers as the scale benchmark's l1 variety


def llm_like_names(seed: int = 0) -> list[str]:
    """Every '<a> <b> <l1>' name (a != b) over the taxonomy's l1 concepts, in a seeded random order."""
    from cglib.data.taxonomy import load_taxonomy

    names = [f"{a} {b} {l1}" for l1 in sorted(load_taxonomy().l1) for a in ADJECTIVES for b in ADJECTIVES if a != b]
    return [names[i] for i in np.random.default_rng(seed).permutation(len(names))]


def measure(sizes: list[int], threshold: float, threads: int, cap: int, seed: int = 0) -> list[dict]:
    """At each size (the first `size` names of one seeded order): time and pairs of each search, hnsw's recall."""
    from cglib.config import Params
    from cglib.magic.embedders import embed_names, make_embedder
    from cglib.magic.negatives import hard_negatives

    names = llm_like_names(seed)[:max(sizes)]
    t = time.perf_counter()
    by_name = embed_names(make_embedder(Params()), names)
    print(f"embedded {len(names)} names in {time.perf_counter() - t:.0f} s", flush=True)
    runs = {"exact": ("exact", None), "hnsw": ("hnsw", None), "hnsw_cap": ("hnsw", cap), "exact_cap": ("exact", cap)}
    rows = []
    for size in sorted(sizes):
        ids = names[:size]
        vectors = np.stack([by_name[x] for x in ids])
        row: dict = {"nodes": size}
        pairs = {}
        for run, (search, max_negatives) in runs.items():
            if run == "exact_cap" and size > max(sizes[0], 20_000):
                continue  # only the reference for the capped recall; quadratic, so not at every size
            t = time.perf_counter()
            found = hard_negatives(ids, vectors, threshold, threads=threads, search=search,
                                   max_negatives=max_negatives)
            row[f"{run}_s"] = time.perf_counter() - t
            pairs[run] = {(a, b) for a, hard in found.hard.items() for b in hard}
            row[f"{run}_pairs"] = len(pairs[run]) // 2
        row["recall"] = len(pairs["exact"] & pairs["hnsw"]) / max(1, len(pairs["exact"]))
        row["extra"] = len(pairs["hnsw"] - pairs["exact"])
        if "exact_cap" in pairs:
            row["cap_recall"] = len(pairs["exact_cap"] & pairs["hnsw_cap"]) / max(1, len(pairs["exact_cap"]))
        print(f"  {size:6d} nodes: exact {row['exact_s']:7.3f} s, hnsw {row['hnsw_s']:7.3f} s, {row['exact_pairs']} "
              f"pairs, hnsw recall {row['recall']:.5f} ({row['extra']} not in exact); cap {cap}: hnsw "
              f"{row['hnsw_cap_s']:7.3f} s, {row['hnsw_cap_pairs']} pairs, recall "
              f"{row.get('cap_recall', float('nan')):.5f}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2500,5000,10000,20000,40000,80000", help="comma-separated node counts")
    parser.add_argument("--threshold", type=float, default=0.85, help="magic.hard_negative_sim (paper: 0.85)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cap", type=int, default=8, help="magic.max_hard_negatives of the capped run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if min(sizes) < 2 or args.cap < 1:
        parser.error("--sizes: every size must be at least 2 nodes; --cap: at least 1")
    rows = measure(sizes, args.threshold, args.threads, args.cap)
    print()
    print(f"| nodes | pairs > threshold | exact s | hnsw s | hnsw recall | pairs kept, cap {args.cap} | hnsw capped s "
          "| capped recall | exponents exact / hnsw / capped | n log n |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    previous = None
    for row in rows:
        growth, bound = "-", "-"
        if previous:
            ratio = row["nodes"] / previous["nodes"]
            growth = " / ".join(f"{math.log(row[k] / previous[k]) / math.log(ratio):.2f}"
                                for k in ("exact_s", "hnsw_s", "hnsw_cap_s"))
            bound = f"{1 + math.log(math.log(row['nodes']) / math.log(previous['nodes'])) / math.log(ratio):.2f}"
        cap_recall = f"{row['cap_recall']:.5f}" if "cap_recall" in row else "-"
        print(f"| {row['nodes']:,} | {row['exact_pairs']:,} | {row['exact_s']:.3f} | {row['hnsw_s']:.3f} | "
              f"{row['recall']:.5f} | {row['hnsw_cap_pairs']:,} | {row['hnsw_cap_s']:.3f} | {cap_recall} | {growth} | "
              f"{bound} |")
        previous = row


if __name__ == "__main__":
    main()
