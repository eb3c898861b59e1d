"""benchmarks/bench_full_run.py: the projection of a full paper run at COCO's size adds up from its inputs (the data
stages scaled by n log n, the LLM requests of the cost estimate, the training steps of every row and seed, the
evaluation's embeddings), names the stage that bounds the run, and its CPU measurement runs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from cglib.config import load_params
from cglib.llm import estimate_full_coco

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_full_run as bench


@pytest.fixture(scope="module")
def paper():
    return load_params(REPO / "params" / "paper.yaml", check_paths=False)


def test_the_projection_adds_up_and_names_the_bound(paper):
    row = {"info": {"images": 1000}, "stages": {k: {"wall_s": 10.0, "peak_rss_mb": 500} for k in bench.DATA_STAGES}}
    data = bench.data_stages([row])
    expected = 10.0 * (118_287 * math.log(118_287)) / (1000 * math.log(1000)) / 3600
    assert [s.here_h for s in data] == pytest.approx([expected] * 3) and data[0].paper_h == data[0].here_h
    assert "scaled by n log n" in data[0].here_basis and data[0].peak_mb == 500

    llm = bench.llm_stage(paper, seconds_per_request=2.0)
    live = [r for r in estimate_full_coco(paper) if "(live)" in r["step"]]
    requests = sum(r["requests"] for r in live)
    assert llm[0].paper_h == pytest.approx(requests * 2.0 / paper.llm.concurrency / 3600)
    assert f"{requests:,} requests" in llm[1].work and llm[1].paper_h == 24.0

    rows = sum(r.loss != "re" for r in paper.train.runs) * len(paper.train.seeds)  # image-text rows
    assert rows == 6 * len(paper.train.seeds)
    pairs = rows * paper.train.epochs * 65_000
    train = bench.training_stage(paper, step_s_here=4.0, gpu_pairs_per_s=None, gpus=8)
    steps = math.ceil(pairs / (paper.train.groups_per_batch * paper.train.pairs_per_group))
    assert train.here_h == pytest.approx(steps * 4.0 / 3600)
    paper_rate = 5 * 65_000 / (3 * 3600)  # the paper's 3 h for 5 epochs on one A5000
    assert train.paper_h == pytest.approx(pairs / paper_rate / 8 / 3600)
    measured = bench.training_stage(paper, 4.0, gpu_pairs_per_s=300.0, gpus=1)
    assert measured.paper_h == pytest.approx(pairs / 300.0 / 3600) and "gpu_check" in measured.paper_basis

    evaluation = bench.evaluation_stage(paper, images_per_s_here=10.0, gpu_pairs_per_s=None, gpus=1)
    models = (len(paper.train.runs) + 1) * len(paper.train.seeds) + len(paper.eval.zoo)
    assert evaluation.here_h == pytest.approx(models * round(118_287 * 0.2) / 10.0 / 3600)

    lines = bench.table([*data, *llm, train, evaluation])
    assert len(lines) == 2 + 7 + 1  # header, the seven stages, the bound
    one_gpu = bench.training_stage(paper, 4.0, None, gpus=1)
    assert bench.table([*data, *llm, one_gpu, evaluation])[-1].startswith("\nbounded by: training")
    # on 8 GPUs the Batch API's 24-hour window is the longest wait unless the live API is quicker
    assert bench.table([*data, *llm, train, evaluation])[-1].startswith(
        "\nbounded by: " + max([*data, min(llm, key=lambda s: s.paper_h), train, evaluation],
                               key=lambda s: s.paper_h).name)


def test_the_forward_measurement_runs_on_a_small_model():
    params = load_params(REPO / "params" / "demo.yaml", check_paths=False)
    assert bench.measure_forward_images_per_s(params, threads=1, batch=4, batches=1) > 0
