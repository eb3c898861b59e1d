"""Accounts about the params that ran: a run folder holding two models of earlier params, then `cglib run` of a
params file asking for one run whose callback raises in its first hook. The training account names the failed run
with its reason, counts no model as kept, and lists the earlier models apart ("also in this folder, not in these
params"), in the summary `cglib run` prints, in `cglib status` and in run.json."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from factories import tiny_magic
from test_kill_mid_stage import one_notebook_series

from cglib.cli import main as cli_main
from cglib.config import Params
from cglib.magic.files import save_magic

REPO = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).parent / "plugins"
TRAIN = """from cglib.train.__main__ import main
assert main([params_path, "--run-dir", run_dir, "--no-progress"]) == 0"""


def _params(root: Path, name: str, runs: list[dict], callbacks: list[str]) -> Path:
    raw = {"run": {"name": "failed_run", "device": "cpu", "threads": 1},
           "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True},
           "train": {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 1, "lr": 1e-3, "warmup_steps": 1,
                     "epoch": "groups", "runs": runs, "callbacks": callbacks}}
    Params.model_validate(raw)  # a typo fails here, not in the child
    path = root / "params" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_a_failed_run_is_named_and_the_folders_other_models_are_listed_apart(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))  # params validation imports the callback a params file names
    run_dir = tmp_path / "run"
    magic, dataset = tiny_magic()
    save_magic(magic, run_dir / "magic" / "magic.json")
    dataset.save(run_dir / "captions")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS)]), "OMP_NUM_THREADS": "1"}
    earlier = _params(tmp_path, "earlier", [{"name": "clip", "loss": "clip"}, {"name": "pairwise", "loss": "pairwise"}],
                      [])
    done = subprocess.run([sys.executable, "-m", "cglib.train", str(earlier), "--run-dir", str(run_dir),
                           "--no-progress"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    failing = _params(tmp_path, "failing", [{"name": "broken", "loss": "clip"}], ["my_callbacks:FailsAtTrainBegin"])
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the kernel imports the callback from tests/plugins
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = cli_main(["run", str(failing), "--out", str(run_dir), "--notebooks", str(one_notebook_series(tmp_path / "nbs", "05_train.ipynb", TRAIN))])
    assert code == 1, printed.getvalue()[-3000:]
    why = "broken: RuntimeError: this callback refuses to start"
    stage = json.loads((run_dir / "run.json").read_text())["summary"]["training"]
    assert stage["kept"] == 0 and stage["runs"] == {}
    assert stage["failed"] == {why: 1} and stage["failed_runs"] == {"broken": why.split(": ", 1)[1]}
    assert stage["not_in_params"] == ["clip", "pairwise"]
    status = io.StringIO()
    with contextlib.redirect_stdout(status):
        assert cli_main(["status", str(run_dir)]) == 1
    for text in (printed.getvalue(), status.getvalue()):
        line = next(x for x in text.splitlines() if x.startswith("  training "))
        assert line.startswith("  training     kept 0 models trained (every training seed)"), line
        assert line.endswith(f"failed 1 ({why}: 1)"), line
        assert f"broken: FAILED, no model: {why.split(': ', 1)[1]}" in text
        assert "also in this folder, not in these params: 2 (clip, pairwise); not counted above" in text
