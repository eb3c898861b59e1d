"""train.processes (issue 34): notebook 05's training on several processes, on one node or several, resumed.

`train_runs` (what notebook 05 calls) with `train.processes: 2` on CPU starts `torchrun` with 2 gloo processes as
a child; two torchrun agents joined by a c10d rendezvous on loopback stand for 2 nodes x 1 process (the guide's
multi-node command, book/gpus.md). Both must train the weights of one process; a 2-process run stopped by Ctrl-C in the
calling process (its ranks get SIGTERM) and resumed must end bit-identical to an uninterrupted 2-process run, as a
single-process run does (test_train_faults). 4 epochs of 6 steps leave seconds to stop the run in the middle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from float_tolerance import ADAM_EPS, trained_tolerance
from prepared_runs import train_one_prepared
from safetensors.torch import load_file
from test_train import make_run
from test_train_distributed import free_port

import cglib
from cglib.config import load_params
from cglib.distributed import DistInfo
from cglib.prepare import prepare_inputs
from cglib.run import RunContext
from cglib.train import train_all, train_runs
from cglib.train.checkpoint import load_checkpoint
from cglib.train.inputs import run_spec
from cglib.train.processes import child_env, resolved_processes, split_runs

PARAMS = {"run": {"name": "processes", "device": "cpu", "threads": 1},
          "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": False},
          # ADAM_EPS keeps AdamW from amplifying rounding (float_tolerance.py); at lr 0.1 the gradients move the weights
          "train": {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 4, "lr": 0.1, "warmup_steps": 1,
                    "adam_eps": ADAM_EPS, "epoch": "groups", "log_every": 1, "runs": [{"name": "pw", "loss": "pairwise"}]}}
FINAL = "training/pw/final.safetensors"
STEPS_PER_EPOCH = 6  # tiny_magic's 6 training groups, one batch each (epoch: groups)
RE_ROWS = [{"name": "hc", "loss": "re", "options": {"lr": 1e-3, "batch_size": 8}},
           {"name": "hc_ft", "loss": "clip", "init": "hc"}]


def run_folder(directory: Path, **train) -> RunContext:
    """A run folder with tiny_magic's inputs and its params file (PARAMS, `train` overriding train keys)."""
    make_run(directory)  # writes tiny_magic's captions and magic.json
    params_path = directory / "params.yaml"
    params_path.write_text(yaml.safe_dump({**PARAMS, "train": {**PARAMS["train"], **train}}), encoding="utf-8")
    return RunContext(params=load_params(params_path), dir=directory, params_path=params_path)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / FINAL))


def assert_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """gloo sums the ranks' gradients: one process's weights up to float rounding (float_tolerance.py); measured,
    the largest difference used 11% (AVX2) and 15% (AVX-512) of the tolerance after 24 steps."""
    assert got.keys() == expected.keys()
    tolerance = trained_tolerance(PARAMS["train"]["epochs"] * STEPS_PER_EPOCH, PARAMS["train"]["lr"])
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, **tolerance, msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of PARAMS trained in this process."""
    run = run_folder(tmp_path_factory.mktemp("one"))
    torch.set_num_threads(1)
    train_one_prepared(run, "pw", progress=False)
    return weights(run.dir)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of PARAMS trained by 2 torchrun agents (2 "nodes" x 1 process) meeting at a c10d rendezvous on
    loopback, each started with the guide's multi-node command (book/gpus.md)."""
    run = run_folder(tmp_path_factory.mktemp("nodes"))
    endpoint = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "test-two-nodes",
               "-m", "cglib.train", str(run.params_path), "--run-dir", str(run.dir), "--no-progress"]
    nodes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**child_env(), "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]
    assert sum('"run": "pw"' in output for output in outputs) == 1  # rank 0, on one of the nodes, reports
    return weights(run.dir)


def test_processes_stay_out_of_the_spec_and_refusals_come_from_the_objectives(tmp_path):
    """train.processes leaves every run's spec (trained runs stay valid); auto is 1 on a CPU run; a run whose
    objective declares it cannot run distributed (loss: re) trains in one process, and so does such an init of a
    run that can; torchrun's own entry refuses a run whose refused init is not trained yet before any work."""
    runs = [*PARAMS["train"]["runs"], *RE_ROWS]
    folders = {n: run_folder(tmp_path / str(n), processes=n, runs=runs) for n in (1, 2, "auto")}
    specs = {n: [run_spec(run.params, entry) for entry in run.params.train.runs] for n, run in folders.items()}
    assert specs[1] == specs[2] == specs["auto"]
    run = folders["auto"]
    assert resolved_processes(run) == 1
    assert split_runs(run, ["pw", "hc", "hc_ft"]) == (["pw", "hc_ft"],
                                                      {"hc": "loss re: its text phase trains on one process"})
    assert split_runs(run, ["hc_ft"]) == (["hc_ft"], {"hc": "loss re: its text phase trains on one process; the "
                                                            "init of 'hc_ft', which then trains under torchrun"})
    with pytest.raises(ValueError, match=r"cannot run under torchrun: hc \(loss re: .*\)\. Train them in one process"):
        train_all(run, prepare_inputs(run, ["pw", "hc_ft"], progress=False), ["pw", "hc_ft"],
                  info=DistInfo(0, 2))  # hc, the init of hc_ft, is not trained yet
    with pytest.raises(ValueError, match="train.processes must be a positive int or auto"):
        run_folder(tmp_path / "zero", processes=0)
    in_memory = RunContext(params=folders[2].params, dir=folders[2].dir)  # the child reads a params file
    with pytest.raises(ValueError, match=r"open the run with cglib.run.open_run\(PARAMS\)"):
        train_runs(in_memory, prepare_inputs(in_memory, ["pw"], progress=False), ["pw"])


@pytest.mark.slow
def test_two_nodes_train_the_weights_of_one_process(one_process, two_nodes):
    """2 nodes x 1 process (c10d rendezvous on loopback, gloo) train the weights of one process."""
    assert_close(two_nodes, one_process)


KERNEL = textwrap.dedent("""
    import signal
    import sys
    from pathlib import Path
    from cglib.config import load_params
    from cglib.prepare import prepare_inputs
    from cglib.run import RunContext
    from cglib.train import train_runs

    # Ctrl-C is KeyboardInterrupt here as in a kernel, even when the tests were started in the background
    # (`make test &`), whose processes inherit SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    params_path, run_dir = sys.argv[1:]
    run = RunContext(params=load_params(params_path), dir=Path(run_dir), params_path=Path(params_path))
    try:
        train_runs(run, prepare_inputs(run, ["pw"], progress=False), ["pw"], progress=False)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.slow
def test_processes_2_resumes_a_stopped_run_exactly(tmp_path, one_process, two_nodes, capfd):
    """Ctrl-C in the process that called `train_runs` (notebook 05's kernel) while its 2-process torchrun child
    trains: the child's ranks get SIGTERM and rank 0 saves a checkpoint; `train_runs` again resumes there and ends
    with exactly the weights of an uninterrupted 2-process run (and those of one process, to rounding), the
    child's output reaching this process. The re run trains here first, said before, and its fine-tune (init:
    hc) then under torchrun."""
    run = run_folder(tmp_path / "parts", processes=2, runs=[*PARAMS["train"]["runs"], *RE_ROWS])
    script, log = tmp_path / "kernel.py", run.dir / "training/pw/log.csv"
    script.write_text(KERNEL, encoding="utf-8")
    kernel = subprocess.Popen([sys.executable, str(script), str(run.params_path), str(run.dir)],
                              env={**child_env(), "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 300
    while not (log.is_file() and len(log.read_text(encoding="utf-8").splitlines()) >= 2):  # a step is logged
        assert kernel.poll() is None and time.monotonic() < deadline, "the ranks did not log a step"
        time.sleep(0.05)
    kernel.send_signal(signal.SIGINT)  # Ctrl-C, or the notebook's stop button
    assert kernel.wait(timeout=120) == 130
    stopped = load_checkpoint(run.dir / "training/pw/checkpoints/last.pt")["progress"]["global_step"]
    assert 1 <= stopped < 24

    summaries = train_runs(run, prepare_inputs(run, progress=False), progress=False)
    assert summaries["pw"]["resumed_from_step"] == stopped and summaries["pw"]["steps"] == 24
    out = capfd.readouterr().out
    assert "hc: trains in this process, not under torchrun (loss re: " in out
    assert "training pw, hc_ft on 2 processes" in out
    assert '"run": "pw"' in out and '"run": "hc_ft"' in out  # rank 0's report, copied from the child
    assert summaries["hc_ft"]["init"] == "hc" and list(summaries) == ["pw", "hc", "hc_ft"]
    got = weights(run.dir)
    assert all(torch.equal(got[k], two_nodes[k]) for k in two_nodes)
    assert_close(got, one_process)


@pytest.mark.slow
def test_a_failing_child_fails_the_call_with_its_last_lines(tmp_path):
    """When the torchrun child fails (here: magic.json is missing when the child prepares its inputs, after this
    process prepared its own), train_runs raises with the child's last lines, which name the error and its fix."""
    run = run_folder(tmp_path, processes=2)
    prepared = prepare_inputs(run, progress=False)
    (run.dir / "magic/magic.json").unlink()
    with pytest.raises(RuntimeError, match=r"(?s)failed \(exit code 1\).*its last lines:.*magic\.json does not "
                                           r"exist: run 03_magic_dag first"):
        train_runs(run, prepared, progress=False)


def test_the_child_imports_this_cglib(tmp_path):
    """The child's PYTHONPATH starts with the folder of the cglib this process runs (a checkout need not be
    installed)."""
    env = child_env()
    done = subprocess.run([sys.executable, "-c", "import cglib; print(cglib.__file__)"], env=env,
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert Path(done.stdout.strip()) == Path(cglib.__file__).resolve()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(cglib.__file__).resolve().parents[1])
