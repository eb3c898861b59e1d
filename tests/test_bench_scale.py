"""benchmarks/bench_scale.py stays runnable: one tiny size in this process, with the options the guide's figures
(book/reproducing.md) used (--truth-chains, and the capped hnsw search of the hard negatives)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_one_size_runs_every_stage_and_reports_the_negative_search(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_scale import STAGES, growth, run_one

    row = run_one(1 / 256, cache_size=16, cache_sample=1.0, work=tmp_path, threads=2, truth_chains=True,
                  magic={"max_hard_negatives": 2, "negative_search": "hnsw"})
    assert set(row["stages"]) == set(STAGES) - {"abstraction"}  # the world's chains stood in for it
    assert row["info"]["images"] == 52 * 9 and row["info"]["abstraction_failures"] is None
    assert row["info"]["negative_search"] == ["hnsw"] * 4 and row["info"]["hard_negative_pairs"] >= 0
    assert row["info"]["nodes_per_level"][0] > 0 and not row["info"]["captions_skipped"]
    bigger = {"info": {**row["info"], "images": 4 * 468},
              "stages": {k: {**v, "wall_s": 16 * v["wall_s"] + 1, "cpu_s": 16 * v["cpu_s"] + 1}
                         for k, v in row["stages"].items()}}
    lines = growth([row, bigger])
    assert lines[0].startswith("growth 468 -> 1872 images (x4.0)")
    assert all("WORSE THAN n log n" in line for line in lines[1:] if line.split()[0] not in ("render", "export"))
