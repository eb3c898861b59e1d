"""benchmarks/gpu_check.py runs on CPU with tiny settings and prints every figure, parseable and positive."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
KEYS = ("pairs_per_s", "step_ms", "peak_mem_mb", "data_wait", "forward", "loss_share", "backward", "optimizer",
        "projected_h", "vs_clip_loss")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


def test_cpu_run_prints_positive_figures_for_every_loss() -> None:
    """Each loss and ClipLoss: pairs/s, memory, wait, phase shares (at most 1), projection, ratio all > 0."""
    done = run("--device", "cpu", "--steps", "2", "--warmup", "1", "--cache-images", "64")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            name = fields.pop("loss")
            rows[name] = {k: float(v) for k, v in fields.items()}
    assert set(rows) == {"clip", "pairwise", "centroid", "openclip"}
    for loss, figures in rows.items():
        assert set(figures) == set(KEYS), loss
        assert all(math.isfinite(v) and v > 0 for v in figures.values()), (loss, figures)
        shares = figures["forward"] + figures["loss_share"] + figures["backward"] + figures["optimizer"]
        assert 0.5 < shares <= 1.0 + 1e-5 and figures["data_wait"] < 1  # the rest of a step: waiting for data
        # the projection is 5 epochs of ceil(65,000 / N=10) steps at the measured step time
        assert figures["projected_h"] == pytest.approx(5 * 6500 * figures["step_ms"] / 1e3 / 3600, rel=1e-3)
    assert rows["openclip"]["vs_clip_loss"] == 1.0
    assert re.search(r"device: CPU .* 7\.\dM parameters, 64 px", done.stdout)
    assert "amp off (fp32) (train.amp: auto_fp16 of paper.yaml)" in done.stdout  # the authors' fp16 is GPU-only


def gpu_check_main():
    """benchmarks/gpu_check.py's main, imported in this process: an argument error needs no subprocess (each one
    imports torch and open_clip again, about 30 s on a busy 2-core machine)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_bad_arguments_exit_2(capsys) -> None:
    """Unknown losses are refused; without CUDA, --device cuda says to use --device cpu."""
    main = gpu_check_main()
    with pytest.raises(SystemExit) as refused:
        main(["--device", "cpu", "--losses", "clip,nope"])
    assert refused.value.code == 2 and "--losses must be a subset" in capsys.readouterr().err
    threads = torch.get_num_threads()
    try:
        assert main(["--device", "cpu", "--amp", "fp16"]) == 2 and "needs CUDA" in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)  # main sets one thread on CPU before it refuses fp16
    if not torch.cuda.is_available():
        assert main(["--device", "cuda"]) == 2 and "--device cpu" in capsys.readouterr().err
