"""Notebook 05 on every GPU: `train.processes` K > 1 trains the runs with `torchrun -m cglib.train` as a child.

`train_runs(run, prepared)` is what notebook 05 calls, after `cglib.prepare.prepare_inputs`. With one process it is `train_all`. With K > 1 it first says which
runs cannot run distributed (their objective's own `distributed_refusal`, `inputs.distributed_refusal`) and
trains those in this process (with any such init of the other runs), then starts `torchrun --standalone
--nproc_per_node K -m cglib.train PARAMS --run-dir DIR --runs NAME ...` for the others: one rank per GPU (NCCL),
or K gloo CPU processes when run.device is cpu. Its output (announcements, rank 0's progress bars, errors) is
copied to this process's stdout as it comes; when it fails, the error ends with its last lines. Then every
summary is read back as `train_all` returns them (the spec-hash check of a finished run). A run interrupted in
the child resumes from its checkpoint on the next call, exactly as a single-process run does.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import torch

import cglib
from cglib.frontend import HEADLESS_ENV, headless
from cglib.prepare import PreparedInputs
from cglib.run import RunContext
from cglib.train.inputs import torchrun_refusals
from cglib.train.loop import train_all

TAIL_LINES = 40  # the child's last lines quoted when it fails


def resolved_processes(run: RunContext) -> int:
    """train.processes as a number: auto is one process per visible GPU, 1 for a CPU run."""
    processes = run.params.train.processes
    if processes != "auto":
        return processes
    return max(1, torch.cuda.device_count()) if run.device() == "cuda" else 1


def split_runs(run: RunContext, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """(runs torchrun trains, {run: why it trains in this process}). A run trains here when its objective cannot
    run distributed; so does a refused init of a run that can (trained here first, the run then under torchrun)."""
    here: dict[str, str] = {}
    for name in names:
        for n, why in torchrun_refusals(run.params, name).items():
            here.setdefault(n, why if n in names else f"{why}; the init of {name!r}, which then trains under torchrun")
    return [n for n in names if n not in here], here


def torchrun_command(run: RunContext, processes: int, names: list[str], progress: bool) -> list[str]:
    """The child's command line: one node, `processes` ranks, the runs `names` of this run's params file (the child
    reads the file, not this process's `run.params`) and folder."""
    if run.params_path is None:
        raise ValueError("train.processes > 1 trains in a child process that reads the params file: open the run "
                         "with cglib.run.open_run(PARAMS) (this RunContext has no params_path)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "cglib.train", str(Path(run.params_path).resolve()), "--run-dir", str(Path(run.dir).resolve()),
            "--runs", *names, *([] if progress else ["--no-progress"])]


def child_env() -> dict[str, str]:
    """This environment, with this process's cglib first on the path (the child trains with the same code, also
    from a checkout that is not installed), unbuffered output (it reaches the notebook as it is written) and, in
    a headless kernel, headless bars."""
    source = str(Path(cglib.__file__).resolve().parents[1])
    path = os.pathsep.join([source, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one node: gloo's processes talk over loopback
    if headless():  # an executed notebook keeps every redraw of the child's bars: redraw as seldom as ours
        env[HEADLESS_ENV] = "1"
    return env


def run_child(command: list[str], env: dict[str, str] | None = None) -> None:
    """Run `command`, copying its output here as it comes; RuntimeError with its last lines when it fails.
    An interrupt (Ctrl-C, the notebook's stop button) is passed on as SIGTERM: the ranks save their checkpoint."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or child_env())
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    decoder, pending = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    try:
        while chunk := os.read(child.stdout.fileno(), 65536):
            text = decoder.decode(chunk)
            sys.stdout.write(text)
            sys.stdout.flush()
            *lines, pending = (pending + text).split("\n")
            tail.extend(line.rsplit("\r", 1)[-1] for line in lines)  # a progress bar's last state, not every redraw
        code = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)  # torchrun passes it to every rank: each run saves its last step
        child.wait()
        raise
    finally:
        child.stdout.close()
    if code != 0:
        if pending.strip():
            tail.append(pending.rsplit("\r", 1)[-1])
        raise RuntimeError(f"training under torchrun failed (exit code {code}): {' '.join(command)}\n"
                           f"its last lines:\n" + "\n".join(tail))


def train_runs(run: RunContext, prepared: PreparedInputs, names: list[str] | None = None,
               progress: bool = True) -> dict[str, dict[str, Any]]:
    """Train the runs of train.runs (or those named) on train.processes processes, on the inputs `prepared` for
    them (cglib.prepare.prepare_inputs); summaries as `train_all`'s. The torchrun child prepares its own (it finds
    them built: `python -m cglib.train`)."""
    names = names or [r.name for r in run.params.train.runs]
    processes = resolved_processes(run)
    if processes == 1:
        return train_all(run, prepared, names, progress=progress)
    distributed, refused = split_runs(run, names)
    for name, why in refused.items():
        print(f"{name}: trains in this process, not under torchrun ({why})")
    if refused:
        train_all(run, prepared, list(refused), progress=progress)
    if distributed:
        command = torchrun_command(run, processes, distributed, progress)
        print(f"training {', '.join(distributed)} on {processes} processes: {' '.join(command)}")
        run_child(command)
    return train_all(run, prepared, names, progress=progress, read_only=True)
