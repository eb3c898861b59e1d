"""A concept-memory run under DDP: 2 CPU processes on gloo, each holding whole groups, against one process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from float_tolerance import ADAM_EPS, trained_tolerance
from test_train import make_run
from test_train_distributed import free_port

from cglib.distributed import DistInfo
from cglib.encoding import encode_texts
from cglib.models import build_model
from cglib.prepare import load_inputs
from cglib.train import ensure_initial
from cglib.train.loop import GroupBatchData, GroupTask, Stepper, set_trainable, wrap
from cglib.train.objectives import MemoryCentroid
from cglib.train.objectives.concept_memory import initial_memory
from cglib.train.sampler import GroupBatchSampler
from cglib.weights import load_weights

WORLD_SIZE = 2
STEPS = 2
LR = 0.1  # with ADAM_EPS (float_tolerance.py) the gradient, not the weight decay, moves the weights


def memory_steps(run_dir: Path, info: DistInfo) -> dict:
    """Two optimizer steps (batches 0 and 1, M=4 groups, N=3) with a momentum-0.5 memory; losses, parameters, rows."""
    run = make_run(run_dir)
    bundle = build_model(run.params.model)
    load_weights(bundle.model, run_dir / "training" / "initial.safetensors")
    inputs = load_inputs(run, bundle.image_size, progress=False, info=info)
    sampler = GroupBatchSampler(inputs.magic, 4, 3, seed=0)
    set_trainable(bundle, image=True, text=False)
    texts = sampler.all_texts()
    rows, table = {t: k for k, t in enumerate(texts)}, torch.from_numpy(encode_texts(bundle, texts))
    memory = initial_memory(bundle, sampler, inputs.cache, 0.5).broadcast()
    initial = memory.state_dict()
    objective = MemoryCentroid({"tau": 0.1, "options": {"tau_inner": 0.1, "alpha": 0.7, "alpha_on": "inner",
                                                        "memory_momentum": 0.5}})
    objective.memory = memory
    module = wrap(GroupTask(bundle, objective, table), info)
    stepper = Stepper(bundle.model, module, lr=LR, weight_decay=0.1, warmup_steps=0, total_steps=10, amp=None,
                      grad_clip=1.0, device=torch.device("cpu"), eps=ADAM_EPS)
    data = GroupBatchData(sampler, inputs.cache, 0, 0, info, rows, None)
    losses = []
    for b in range(STEPS):
        result = stepper.step([data[b]], module, lambda result: objective.after_step(bool(result["skipped"])))
        losses.append(result["loss"])
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in bundle.model.state_dict().items()},
            "memory": memory.state_dict(), "initial": initial}


def worker(rank: int, port: int, run_dir: str) -> None:
    """One rank: the memory steps, saved for the parent to compare."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.set_num_threads(1)
        result = memory_steps(Path(run_dir), DistInfo(rank, WORLD_SIZE, 0, torch.device("cpu")))
        torch.save(result, Path(run_dir) / f"memory-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_memory_steps_equal_single_process_steps(tmp_path):
    """2 gloo ranks with 2 groups each apply the same memory update as one process holding all 4 groups: the
    ranks' memory rows are identical to each other and equal the single process's, and so are the losses and
    the parameters after both steps (and the rows have moved)."""
    run = make_run(tmp_path)
    ensure_initial(run)
    torch.set_num_threads(1)
    single = memory_steps(tmp_path, DistInfo())
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"memory-rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    assert not torch.equal(single["memory"]["image"], single["initial"]["image"])  # the steps moved rows
    assert torch.equal(ranks[0]["memory"]["image"], ranks[1]["memory"]["image"])
    assert torch.equal(ranks[0]["memory"]["text"], ranks[1]["memory"]["text"])
    for got in ranks:
        assert got["losses"] == pytest.approx(single["losses"], rel=1e-5)
        for side in ("image", "text"):
            torch.testing.assert_close(got["memory"][side], single["memory"][side], atol=2e-6, rtol=1e-5)
        # measured 37% (AVX2) and 35% (AVX-512) of the tolerance (tests/float_tolerance.py)
        for name, value in single["params"].items():
            torch.testing.assert_close(got["params"][name], value, **trained_tolerance(STEPS, LR), msg=name)
