"""Training with a concept memory (train.runs[i].options.memory_momentum) on tiny_magic: it trains, saves, resumes exactly."""

from __future__ import annotations

import pytest
import torch
from prepared_runs import train_one_prepared
from test_train import _final_and_log, _interrupt_at, make_run

from cglib.train.checkpoint import load_checkpoint
from cglib.train.inputs import run_spec

SETTINGS = {"grad_accum": 2, "runs": [{"name": "mem", "loss": "centroid", "options": {"memory_momentum": 0.5}}]}


def test_memory_run_trains_and_resumes_bit_exact(tmp_path):
    """A memory run trains (finite losses, the memory recorded in its summary); interrupted mid-epoch, its
    checkpoint holds G unit memory rows, and the resumed run ends with
    exactly the weights and log of an uninterrupted one."""
    whole = make_run(tmp_path / "whole", **SETTINGS)
    summary = train_one_prepared(whole, "mem", progress=False)
    assert summary["memory"]["momentum"] == 0.5
    groups = summary["memory"]["groups"]
    assert groups == summary["sampler"]["groups"]
    expected, expected_log = _final_and_log(whole, "mem")
    assert all(torch.isfinite(torch.tensor(float(row[2]))) for row in expected_log)

    parts = make_run(tmp_path / "parts", **SETTINGS)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "mem", progress=False, on_step=_interrupt_at(3))
    ckpt = load_checkpoint(parts.dir / "training/mem/checkpoints/last.pt")
    memory = ckpt["objective"]["_extra_state"]
    assert memory["image"].shape[0] == groups and memory["momentum"] == 0.5
    torch.testing.assert_close(memory["image"].norm(dim=-1), torch.ones(groups))
    summary = train_one_prepared(parts, "mem", progress=False)
    assert summary["resumed_from_step"] == 3
    got, got_log = _final_and_log(parts, "mem")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert got_log == expected_log


def test_memory_changes_the_spec_and_the_training(tmp_path):
    """memory_momentum enters the run's spec only when set (older specs unchanged), and a memory run's losses
    differ from the plain centroid run's (it contrasts against all groups)."""
    plain = make_run(tmp_path / "plain", runs=[{"name": "c", "loss": "centroid"}])
    assert run_spec(plain.params, plain.params.train.runs[0])["run"]["options"]["memory_momentum"] is None
    mem = make_run(tmp_path / "mem", runs=[{"name": "c", "loss": "centroid", "options": {"memory_momentum": 0.9}}])
    assert run_spec(mem.params, mem.params.train.runs[0])["run"]["options"]["memory_momentum"] == 0.9
    train_one_prepared(plain, "c", progress=False)
    train_one_prepared(mem, "c", progress=False)
    _, plain_log = _final_and_log(plain, "c")
    _, mem_log = _final_and_log(mem, "c")
    assert [r[2] for r in plain_log] != [r[2] for r in mem_log]
