"""Hyper-parameter search (`cglib search`, Optuna) on tiny_magic: the validation split, resuming after SIGKILL,
the best params file, median pruning (several workers on one study: test_search_workers.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from factories import tiny_magic

from cglib.accounts import stage_summaries, summary_lines
from cglib.cli import main as cli_main
from cglib.config import Params, ParamsError, load_params, parse_params
from cglib.magic.files import save_magic
from cglib.run import RunContext
from cglib.search.study import account_line, open_study, run_search
from cglib.search.validation import search_view
from cglib.train.sampler import GroupBatchSampler

REPO = Path(__file__).resolve().parent.parent
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
SEARCH = {"trials": 3, "epochs": 2, "objective": "table3", "startup_trials": 2, "pruner_startup_trials": 2, "validation_fraction": 0.25,
          "space": {"groups_per_batch": {"low": 2, "high": 3}, "pairs_per_group": {"low": 2, "high": 3},
                    "lr": {"low": 1e-10, "high": 1e-2, "log": True}, "tau": {"low": 0.1, "high": 1.0},
                    "alpha": {"low": 0.0, "high": 1.0}}}


def make_search_run(root: Path, **search) -> tuple[Path, Path]:
    """A run folder with tiny_magic (12 images per group: 3 test, 9 train of which 2 validation) and a params
    file for the tiny model; returns (params file, run folder)."""
    magic, dataset = tiny_magic(per_group=12)
    run_dir = root / "run"
    save_magic(magic, run_dir / "magic" / "magic.json")
    dataset.save(run_dir / "captions")
    params = {"run": {"name": "tiny", "device": "cpu", "threads": 1},
              "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True},
              "train": {"runs": [{"name": "clip", "loss": "clip"}, {"name": "pairwise", "loss": "pairwise"}],
                        "groups_per_batch": 2, "pairs_per_group": 3, "epochs": 2, "lr": 1e-3, "warmup_steps": 2,
                        "weight_decay": 0.01, "epoch": "groups"},
              "eval": {"seeds": [0, 1]},
              "search": {**SEARCH, "run": "pairwise", **search}}
    path = root / "params" / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params))
    return path, run_dir


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cglib.cli", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def study_of(params_path: Path, run_dir: Path) -> optuna.Study:
    return open_study(load_params(params_path, check_paths=False), run_dir)


# ------------------------------------------------------------------------------------------ the data roles
def test_validation_split_is_carved_from_train_disjoint_from_test_and_training_pairs():
    """The search view holds no MAGIC-test image; its validation images are MAGIC-train images, seeded by run.seed,
    and never appear in a training batch of the search."""
    magic, _ = tiny_magic(per_group=12)
    test = set(magic.split_ids("test"))
    view, record = search_view(magic, 0.25, seed=0)
    validation, train = set(view.split_ids("test")), set(view.split_ids("train"))
    assert not (set(view.images) & test) and record["test_images_left_out"] == len(test) == 18
    assert validation and validation <= set(magic.split_ids("train")) and not validation & train
    assert record["validation_images"] == len(validation) == 12  # round(9 * 0.25) = 2 per group, 6 groups
    assert search_view(magic, 0.25, seed=0)[1]["validation_ids"] == record["validation_ids"]
    assert search_view(magic, 0.25, seed=1)[1]["validation_ids"] != record["validation_ids"]

    shrunk, small = search_view(magic, 0.25, seed=0, groups=4)  # the demo's shrunken world
    kept = set(shrunk.groups())
    assert small["groups"] == len(kept) == 4 and small["groups_in_magic"] == 6
    assert all(set(magic.negatives(g)) & kept for g in kept)  # a group comes with its hard negative
    assert set(shrunk.split_ids("test")) <= validation and not set(shrunk.images) & test

    sampler = GroupBatchSampler(view, 3, 3, seed=0, epoch="groups")
    used = {i for epoch in range(3) for b in range(len(sampler)) for g in sampler.batch(epoch, b).image_ids
            for i in g}
    assert used and used <= train


def test_search_params_are_validated_with_the_fix_named(tmp_path):
    """search.run must name an image-text run without its own tau/alpha; ranges must be ordered."""
    base = {"train": {"runs": [{"name": "a", "loss": "pairwise", "tau": 0.2}, {"name": "r", "loss": "re"}]}}
    with pytest.raises(ParamsError, match="not a train.runs entry"):
        parse_params({**base, "search": {"run": "nope"}}, tmp_path)
    with pytest.raises(ParamsError, match="loss re"):
        parse_params({**base, "search": {"run": "r"}}, tmp_path)
    with pytest.raises(ParamsError, match="overrides tau"):
        parse_params({**base, "search": {"run": "a"}}, tmp_path)
    assert parse_params({**base, "search": {"run": "a", "space": {"tau": None}}}, tmp_path).search_run() == "a"
    with pytest.raises(ParamsError, match="low"):
        parse_params({"search": {"space": {"lr": {"low": 1e-3, "high": 1e-5}}}}, tmp_path)
    with pytest.raises(ParamsError, match="journal:PATH"):
        parse_params({"search": {"storage": "study.db"}}, tmp_path)
    assert Params().search_run() == "clip"


def test_search_refuses_a_run_without_magic(tmp_path, capsys):
    path, _ = make_search_run(tmp_path)
    assert cli_main(["search", str(path), "--run-dir", str(tmp_path / "empty")]) == 2
    assert "run the pipeline up to 03 first" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ resuming
@pytest.mark.slow
def test_search_resumes_after_sigkill_without_losing_a_trial(tmp_path):
    """Kill `cglib search` (SIGKILL) once a trial is stored; the rerun keeps it, fails the trial the dead worker
    left RUNNING and queues its values again, and tops the study up to --trials; then best_params.yaml loads."""
    path, run_dir = make_search_run(tmp_path, epochs=4)
    worker = subprocess.Popen(cli("search", str(path), "--run-dir", str(run_dir), "--trials", "4", "--quiet"),
                              env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    storage = run_dir / "search" / "tiny-pairwise.sqlite3"
    deadline = time.monotonic() + 300
    first: list[optuna.trial.FrozenTrial] = []
    while not first and time.monotonic() < deadline and worker.poll() is None:
        time.sleep(0.2)
        if storage.is_file():
            try:
                first = [t for t in study_of(path, run_dir).get_trials() if t.state in FINISHED]
            except Exception:  # noqa: BLE001 - the study's tables may not exist yet
                first = []
    assert worker.poll() is None, f"the search ended before it could be killed: {worker.stderr.read()[-2000:]}"
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    before = study_of(path, run_dir).get_trials()
    done_before = [t for t in before if t.state in FINISHED]
    assert 1 <= len(done_before) < 4
    left_running = [t for t in before if t.state == optuna.trial.TrialState.RUNNING]

    rerun = subprocess.run(cli("search", str(path), "--run-dir", str(run_dir), "--trials", "4", "--quiet"),
                           check=False, env=child_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = study_of(path, run_dir).get_trials()
    finished = [t for t in after if t.state in FINISHED]
    assert len(finished) == 4 and not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]
    kept = {t.number: (t.params, t.value) for t in finished}
    assert all(kept[t.number] == (t.params, t.value) for t in done_before)  # nothing stored was lost or redone
    assert [t.number for t in after] == list(range(len(after)))
    for dead in left_running:  # Optuna's bookkeeping: FAIL, and its values tried again
        assert after[dead.number].state == optuna.trial.TrialState.FAIL
        retries = [t for t in after if t.user_attrs.get("retry_of") == dead.number]
        assert len(retries) == 1 and all(retries[0].params[k] == v for k, v in dead.params.items())
    assert len(after) == 4 + len(left_running)
    # the study's account, read from the database: printed by the rerun, in search.json and in the run's stages
    account = json.loads((run_dir / "search" / "tiny-pairwise" / "search.json").read_text())["account"]
    requeued = len(left_running)
    assert account["adds_up"] and account["trials"] == len(after) and account["finished"] == 4
    assert account["requeued"] == requeued and account["left_running"] == 0 == account["waiting"]
    assert account["failed_by_reason"] == ({"worker died (values re-queued)": requeued} if requeued else {})
    line = account_line(account)
    assert f"{len(after)} trials = {account['complete']} complete + {account['pruned']} pruned + {requeued} failed" \
        in line and line in rerun.stdout
    assert line in "\n".join(summary_lines(stage_summaries(run_dir)))

    best = run_dir / "search" / "tiny-pairwise" / "best_params.yaml"
    loaded = load_params(best)
    study = study_of(path, run_dir)
    assert loaded.run.name == "tiny-tuned" and loaded.search.run == "pairwise"
    assert loaded.run_dir() == path.parent.parent / "outputs" / "tiny-tuned"  # beside the input's own run folder
    for key, value in study.best_trial.params.items():
        assert getattr(loaded.train, key) == pytest.approx(value)
    assert "validation" in best.read_text().splitlines()[0] and "never read" in best.read_text().splitlines()[0]


# ------------------------------------------------------------------------------------------ pruning
def test_median_pruner_stops_a_trial_whose_lr_cannot_learn(tmp_path):
    """Two trials at a working learning rate, then one at lr 1e-10 (the bottom of Table 2's range): after its
    first epoch it is below their median and pruned; the study's best is a complete trial."""
    path, run_dir = make_search_run(tmp_path, trials=3)
    params = load_params(path, check_paths=False)
    study = open_study(params, run_dir)
    good = {"groups_per_batch": 3, "pairs_per_group": 3, "lr": 1e-2, "tau": 0.1, "alpha": 0.5}
    for values in (good, good, {**good, "lr": 1e-10}):
        study.enqueue_trial(values)
    result = run_search(RunContext(params=params, dir=run_dir, params_path=path), progress=False)
    trials = result.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert list(trials[2].intermediate_values) == [1]  # stopped after epoch 1 of 2
    assert trials[2].intermediate_values[1] < trials[0].intermediate_values[1]
    assert result.summary["best"]["trial"] in (0, 1) and result.summary["trials"]["PRUNED"] == 1
    assert result.summary["validation"]["test_images_left_out"] == 18
    saved = json.loads((result.dir / "validation.json").read_text())  # the slice notebook 08 reads back
    assert len(saved["validation_ids"]) == result.summary["validation"]["validation_images"]
    assert not list((result.dir / "training").glob("trial-*"))  # trial weights are scratch
    rows = {r["parameter"]: r for r in result.summary["table2"]}
    assert rows["lr"]["paper_value"] == 1e-8 and rows["lr"]["chosen"] == pytest.approx(1e-2)

    # `cglib figures` redraws notebook 08's two figures from the stored study
    from cglib.viz.figures import STEMS, build_figures
    from cglib.viz.search_figures import NO_IMPORTANCES

    (run_dir / "params.yaml").write_text(path.read_text())
    report = build_figures(run_dir, formats=["png"], progress=False)
    assert f"{STEMS['search_history']}.png" in {p.name for p in report.written}
    assert STEMS["search_history"] not in report.failed
    # the two complete trials are the same trial twice: the same accuracy, no importance to explain, no figure
    assert report.skipped[STEMS["search_importances"]] == NO_IMPORTANCES
