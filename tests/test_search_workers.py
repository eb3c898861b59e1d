"""Two `cglib search` workers on one study, one of them SIGKILLed in the middle of a trial, on a real PostgreSQL
server (tests/postgres_server.py) and on a journal file; two workers racing for the count's last trial; a trial of a worker on another machine that stopped its
heartbeat; storage URLs whose driver is missing or whose server does not answer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from postgres_server import postgres_server, why_no_postgres
from test_search import child_env, make_search_run, study_of

from cglib.cli import main as cli_main
from cglib.config import load_params
from cglib.run import RunContext
from cglib.search.storage import database_url
from cglib.search.study import (
    Objective,
    SurplusTrial,
    TrialSeededTPESampler,
    run_search,
    suggest,
    surplus,
    trial_seed,
)

State = optuna.trial.TrialState
FINISHED = (State.COMPLETE, State.PRUNED)
EPOCHS = 6  # per trial: the kill after epoch 1 lands well before the trial's end (an epoch takes ~0.1 s)
STARTED = re.compile(r"trial (\d+) started \(pid (\d+)\)")


@pytest.fixture(scope="module")
def postgres():
    """One server for the module; each test makes its own database."""
    reason = why_no_postgres()
    if reason:
        pytest.skip(reason)
    with postgres_server() as database:
        yield database


# ------------------------------------------------------------------------------------------ storage errors
def test_a_database_url_without_its_driver_is_one_line_naming_the_package(tmp_path, capsys, monkeypatch):
    """postgresql:// means psycopg 3; with it missing (hidden from import here), or with MySQL's default driver
    missing, `cglib search` exits 2 with one line naming the pip package, before any work."""
    assert database_url("postgresql://u@h:5/db") == "postgresql+psycopg://u@h:5/db"
    for storage, package in [("postgresql://cglib@127.0.0.1:1/optuna", "psycopg[binary]"),
                             ("mysql://cglib@127.0.0.1:1/optuna", "mysqlclient")]:
        path, run_dir = make_search_run(tmp_path / storage.split(":")[0], storage=storage)
        with monkeypatch.context() as hidden:
            hidden.setitem(sys.modules, "psycopg", None)  # as if `pip install` had never brought it
            assert cli_main(["search", str(path), "--run-dir", str(run_dir), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"pip install {package}" in err and "Traceback" not in err, err
        assert not (run_dir / "search").exists()  # nothing prepared


def test_a_server_that_does_not_answer_is_one_line(tmp_path, capsys):
    path, run_dir = make_search_run(tmp_path, storage="postgresql://cglib@127.0.0.1:1/optuna")
    assert cli_main(["search", str(path), "--run-dir", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open search.storage postgresql+psycopg://cglib@127.0.0.1:1/optuna: ")
    assert err.count("\n") == 1 and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------ the count
def test_a_trial_started_beyond_the_count_by_a_racing_worker_is_failed_untrained():
    """Two workers both saw one free slot of --trials 1 and both created a trial: the later number yields (FAIL,
    user attribute `surplus`, no values drawn), the earlier runs; a retry of a dead worker's trial never yields."""
    study = optuna.create_study()
    other, late = study.ask(), study.ask()  # 0: the racing worker's trial, which took the last slot; 1: ours
    assert not surplus(other, 1) and surplus(late, 1) and not surplus(late, 2)
    study.enqueue_trial({}, user_attrs={"retry_of": 7})
    assert not surplus(study.ask(), 1)  # the retry, number 2, runs
    objective = Objective(None, None, False, target=1)  # a surplus trial is failed before the objective needs more
    study.optimize(objective, n_trials=1, catch=(SurplusTrial,))
    yielded = study.trials[-1]
    assert yielded.number == 3 and yielded.state == State.FAIL and yielded.user_attrs["surplus"]
    assert not yielded.params and "worker" not in yielded.user_attrs  # nothing drawn, nothing trained


# ------------------------------------------------------------------------------------------ a worker killed
def started(log: Path) -> list[tuple[int, int]]:
    """(trial number, pid) of each 'trial N started (pid P)' line a worker wrote."""
    return [(int(n), int(p)) for n, p in STARTED.findall(log.read_text())]


# Two workers released at the same instant: each has imported torch, Optuna and the CLI, then waits for `go`.
TOGETHER = """
import sys, time
from pathlib import Path
import cglib.search.study  # the slow imports, before the start line
from cglib.cli import main
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.001)
sys.exit(main(sys.argv[3:]))
"""


def start_together(args: list[str], logs: list[Path], folder: Path) -> list[subprocess.Popen]:
    """One `cglib ARGS` process per log, all released together once every one has imported its libraries."""
    go = folder / "go"
    ready = [folder / f"ready-{k}" for k in range(len(logs))]
    workers = [subprocess.Popen([sys.executable, "-c", TOGETHER, str(flag), str(go), *args], env=child_env(),
                                stdout=log.open("w"), stderr=subprocess.STDOUT) for flag, log in zip(ready, logs)]
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready):
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), [
            log.read_text()[-2000:] for log in logs]
        time.sleep(0.02)
    go.touch()
    return workers


def assert_distinct_values(trials: list[optuna.trial.FrozenTrial]) -> None:
    """No two trials that drew values drew the same ones, except a retry (`retry_of`) of the trial it repeats."""
    first: dict[tuple, int] = {}
    for t in trials:
        if not t.params:  # a surplus trial yields before drawing
            continue
        values = tuple(sorted(t.params.items()))
        if values in first:
            assert t.user_attrs.get("retry_of") == first[values], (
                f"trials {first[values]} and {t.number} ran the same values {dict(values)}")
        else:
            first[values] = t.number


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["postgresql", "journal"])
def test_two_workers_one_killed_mid_trial_end_with_exactly_the_trials_asked(tmp_path, storage, request):
    """Workers A and B, released at the same instant, run `cglib search --trials 5` on one study; no two trials
    ran the same values except the retry of A's killed trial (with one seed for every worker, their random
    startup trials were identical); A is SIGKILLed after epoch 1 (of 6) of its second trial. B fails A's trial, runs its values again, and exits once the study holds exactly 5
    finished trials and nothing RUNNING or WAITING; no trial number was started twice; search.json's counts are
    the database's; the best params file validates."""
    url = request.getfixturevalue("postgres")("killed") if storage == "postgresql" else "journal:search/tiny.journal"
    path, run_dir = make_search_run(tmp_path, storage=url, trials=5, epochs=EPOCHS, pruner_startup_trials=10,
                                    heartbeat_s=1)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a, b = start_together(["search", str(path), "--run-dir", str(run_dir), "--quiet"], logs, tmp_path)
    deadline, victim = time.monotonic() + 300, None
    while victim is None and time.monotonic() < deadline and a.poll() is None:
        time.sleep(0.05)
        mine = [n for n, pid in started(logs[0]) if pid == a.pid]
        if len(mine) == 2 and f"trial {mine[1]} epoch 1:" in logs[0].read_text():
            a.send_signal(signal.SIGKILL)
            victim = mine[1]
    assert victim is not None, f"A never reached epoch 1 of a second trial: {logs[0].read_text()[-3000:]}"
    a.wait(timeout=30)
    killed = study_of(path, run_dir).trials[victim]
    # killed mid-trial; B may have failed it already (its process is gone, seen at B's next poll)
    assert killed.state in (State.RUNNING, State.FAIL) and len(killed.intermediate_values) < EPOCHS
    assert b.wait(timeout=300) == 0, logs[1].read_text()[-3000:]

    trials = study_of(path, run_dir).trials
    assert_distinct_values(trials)
    runs = started(logs[0]) + started(logs[1])
    assert sorted(n for n, _ in runs) == sorted({n for n, _ in runs})  # no trial number started twice
    assert trials[victim].state == State.FAIL
    retries = [t for t in trials if t.user_attrs.get("retry_of") == victim]
    assert len(retries) == 1 and retries[0].params == killed.params and retries[0].state in FINISHED
    assert retries[0].user_attrs["worker"]["pid"] == b.pid  # run again by the surviving worker
    assert len([t for t in trials if t.state in FINISHED]) == 5
    assert {t.user_attrs["worker"]["pid"] for t in trials if t.state in FINISHED} == {a.pid, b.pid}  # both worked
    assert not [t for t in trials if t.state in (State.RUNNING, State.WAITING)]

    summary = json.loads((run_dir / "search" / "tiny-pairwise" / "search.json").read_text())["trials"]
    assert {s: summary[s] for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")} == {
        s.name: sum(t.state == s for t in trials) for s in (State.COMPLETE, State.PRUNED, State.FAIL, State.RUNNING,
                                                            State.WAITING)}
    assert summary["total"] == len(trials) and summary["retried"] == [victim]
    assert (f"{len(trials)} trials = 5 complete + 0 pruned + 1 failed (worker died (values re-queued): 1) + 0 left "
            "running + 0 waiting; 1 re-queued") in logs[1].read_text()
    tuned = load_params(run_dir / "search" / "tiny-pairwise" / "best_params.yaml")
    assert tuned.run.name == "tiny-tuned"


@pytest.mark.slow
def test_a_silent_worker_on_another_machine_is_waited_for_then_its_trial_runs_here(tmp_path, postgres):
    """A trial RUNNING for a worker on another host (its pid cannot be checked from here) whose heartbeat stopped:
    a worker asked for 1 trial waits for it, fails it after the grace (2 x search.heartbeat_s) and runs its values
    itself."""
    path, run_dir = make_search_run(tmp_path, storage=postgres("silent"), trials=1, epochs=1, heartbeat_s=1)
    params = load_params(path, check_paths=False)
    study = study_of(path, run_dir)
    with pytest.warns(UserWarning, match="Heartbeat"):  # Optuna: a heartbeat is meant for optimize(); here we
        remote = study.ask()  # do by hand what the other machine's worker did before it went silent
    values = suggest(remote, params)
    remote.set_user_attr("worker", {"host": "another-machine", "pid": os.getpid(), "process_start": None})
    study._storage.record_heartbeat(remote._trial_id)
    silent_since = time.monotonic()

    result = run_search(RunContext(params=params, dir=run_dir, params_path=path), progress=False)
    trials = result.study.trials
    assert time.monotonic() - silent_since >= 2  # the grace: a live worker's trial is never taken from it
    assert [t.state for t in trials] == [State.FAIL, State.COMPLETE]
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == values
    assert trials[1].user_attrs["worker"]["pid"] == os.getpid()
    assert result.summary["trials"]["COMPLETE"] == 1 and result.summary["trials"]["RUNNING"] == 0


# ------------------------------------------------------------------------------------------ the draws
def test_each_trial_draws_from_its_own_seed_and_the_same_trial_repeats_its_values():
    """Two trials asked before either draws (two workers started together, both in the random startup phase)
    draw different values; another study with the same search.sampler_seed draws the same values for the same
    trial numbers (a study stays reproducible), and another seed draws others."""
    def draws(seed: int, trials: int = 4) -> list[dict]:
        study = optuna.create_study(sampler=TrialSeededTPESampler(seed, n_startup_trials=10))
        asked = [study.ask() for _ in range(trials)]  # every trial RUNNING before any draws, as racing workers
        return [{"lr": t.suggest_float("lr", 1e-10, 1e-4, log=True), "tau": t.suggest_float("tau", 0.1, 1.0),
                 "groups": t.suggest_int("groups", 2, 10)} for t in asked]

    first = draws(0)
    assert len({tuple(d.values()) for d in first}) == 4
    assert draws(0) == first and draws(1) != first
    assert trial_seed(0, 0) != trial_seed(0, 1) != trial_seed(1, 0)
