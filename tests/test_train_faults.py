"""Faults during training: non-finite steps are skipped and counted, SIGTERM checkpoints like Ctrl-C, and a
checkpoint is never resumed under another device type or AMP dtype."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from prepared_runs import train_one_prepared
from test_train import _fixed_batch, _interrupt_at, _single, make_run, weights

from cglib.train.checkpoint import load_checkpoint, save_checkpoint
from cglib.train.objectives import Pairwise
from cglib.train.step import GroupTask, Stepper, set_trainable, wrap

SPEC = {"loss": "pairwise", "tau": 0.1,
        "options": {"tau_inner": 0.1, "alpha": 0.7, "alpha_on": "inner", "normalize_products": False}}


def _stepper(bundle, amp, table):
    set_trainable(bundle, image=True, text=False)
    module = wrap(GroupTask(bundle, Pairwise(SPEC), table), _single())
    return module, Stepper(bundle.model, module, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=10,
                           amp=amp, grad_clip=1.0, device=torch.device("cpu"))


@pytest.mark.parametrize("amp", [torch.float16, None])
def test_an_overflowing_step_is_skipped_and_counted_not_taken(tmp_path, amp):
    """fp16 (GradScaler on) and fp32: a step whose gradients overflow changes no weight and reports skipped;
    the next finite step trains; under fp16 the scaler lowers its scale."""
    run = make_run(tmp_path)
    bundle, table, item = _fixed_batch(run)
    module, stepper = _stepper(bundle, amp, table)
    before = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    scale = stepper.scaler.get_scale() if stepper.scaler.is_enabled() else None

    def overflowing(it):
        parts = module(it)
        return {**parts, "loss": parts["loss"] * float("inf")}

    result = stepper.step([item], overflowing)
    assert result["skipped"] == 1.0
    assert all(torch.equal(v, before[k]) for k, v in bundle.model.state_dict().items())
    if scale is not None:
        assert stepper.scaler.get_scale() < scale
    result = stepper.step([item], lambda it: module(it))
    assert result["skipped"] == 0.0
    assert not torch.equal(bundle.model.state_dict()["visual.conv1.weight"], before["visual.conv1.weight"])


def test_a_run_of_non_finite_steps_counts_them_and_finishes(tmp_path):
    """A loss that is infinite at every step (tau 1e-38) does not crash the run: every step is skipped, counted
    in summary.json and in log.csv's skipped column, and no weight moves."""
    run = make_run(tmp_path, epochs=1, runs=[{"name": "clip", "loss": "clip", "tau": 1e-38}])
    summary = train_one_prepared(run, "clip", progress=False)
    assert summary["skipped_steps"] == summary["steps"] == 6
    rows = list(csv.DictReader((run.dir / "training/clip/log.csv").open()))
    assert [int(r["skipped"]) for r in rows] == [1] * 6
    assert summary["weights_moved"]["image"]["fraction_changed"] == 0.0


def test_resuming_under_another_device_or_amp_is_an_error_naming_both(tmp_path):
    """last.pt records the resolved device type and AMP dtype; resuming it elsewhere names both and the fix."""
    run = make_run(tmp_path, epochs=1)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(run, "clip", progress=False, on_step=_interrupt_at(2))
    path = run.dir / "training/clip/checkpoints/last.pt"
    state = load_checkpoint(path)
    assert state["precision"] == {"device": "cpu", "amp": "off"}
    state["precision"] = {"device": "cuda", "amp": "bfloat16"}  # as written by the same params on a GPU
    save_checkpoint(path, state)
    with pytest.raises(ValueError, match="device cuda with amp bfloat16.*device cpu with amp off"):
        train_one_prepared(run, "clip", progress=False)


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from prepared_runs import train_one_prepared
    from test_train import make_run

    from cglib.train.faults import Terminated

    def hook(row):
        if row["global_step"] == 3:
            Path({marker!r}).write_text("3")
            time.sleep(60)  # SIGTERM arrives here, between steps

    try:
        train_one_prepared(make_run(Path({run_dir!r}), epochs=2), "clip", progress=False, on_step=hook)
    except Terminated:
        sys.exit(143)
    sys.exit(0)
""")


@pytest.mark.slow
def test_sigterm_checkpoints_and_resumes_to_the_same_weights(tmp_path):
    """A process training a tiny model gets SIGTERM mid-epoch: it saves a checkpoint and exits 143; resuming
    ends with exactly the weights and log of an uninterrupted run. Bit for bit across processes needs one thread
    count in all of them: one here, in the child and in the resume."""
    torch.set_num_threads(1)
    whole = make_run(tmp_path / "whole", epochs=2)
    train_one_prepared(whole, "clip", progress=False)

    marker = tmp_path / "reached"
    script = CHILD.format(tests=str(Path(__file__).parent), marker=str(marker), run_dir=str(tmp_path / "parts"))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the child did not reach step 3"
        time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=120) == 143
    ckpt = tmp_path / "parts/training/clip/checkpoints/last.pt"
    assert load_checkpoint(ckpt)["progress"]["global_step"] == 3

    summary = train_one_prepared(make_run(tmp_path / "parts", epochs=2), "clip", progress=False)
    assert summary["resumed_from_step"] == 3 and not ckpt.exists()
    a, b = weights(whole.dir / "training/clip/final.safetensors"), weights(tmp_path / "parts/training/clip/final.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    def log(run_dir):
        keys = ("phase", "step", "loss", "lr", "grad_norm", "skipped")
        return [[r[k] for k in keys] for r in csv.DictReader((run_dir / "training/clip/log.csv").open())]

    assert log(tmp_path / "parts") == log(whole.dir) and len(log(whole.dir)) == summary["steps"] == 12
