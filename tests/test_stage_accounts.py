"""Every stage that keeps state says what it kept, did now and repeated (issue 35 item 4), and notebook 03's
generalized captions give the same LLM account as the chains.

Training: `python -m cglib.train` (the real CLI, a subprocess) on tiny_magic under two training seeds is killed
(SIGKILL) in seed 1's second epoch, then run again: each run's account (steps and epochs kept from the
checkpoint + trained now, steps repeated after the kill) adds up and matches the steps in its log.csv, and the
image cache says it was built by the first attempt and reused by the second. The summary lines `cglib status`
prints (`stage_summaries`, `summary_lines`) show the interrupted run, then each run's account; a third attempt,
started after both finished, reuses them and says so. Generalized
captions: capped, then resumed against the loopback OpenAI-compatible server; each account adds up and its
requests are the server's own count.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from factories import tiny_magic

from cglib.accounts import stage_summaries, summary_lines
from cglib.config import Params
from cglib.llm import GroupRequest, generalize_groups
from cglib.llm.base import BudgetExceededError
from cglib.magic.files import save_magic
from cglib.pipeline import resume_command

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parent.parent
EPOCHS = 3


def _train(params: Path, run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "cglib.train", str(params), "--run-dir", str(run_dir),
                             "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _log_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="", encoding="utf-8") as f:
        return sum(1 for _ in csv.DictReader(f))


@pytest.fixture(scope="module")
def training(tmp_path_factory) -> dict:
    """Seed 0 trained, seed 1 killed in its second epoch; then the same command again (about 30 s)."""
    root = tmp_path_factory.mktemp("stage_accounts")
    run_dir = root / "run"
    magic, dataset = tiny_magic()
    save_magic(magic, run_dir / "magic" / "magic.json")
    dataset.save(run_dir / "captions")
    raw = {"run": {"name": "t", "device": "cpu", "threads": 1},
           "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True},
           "train": {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": EPOCHS, "lr": 1e-3, "warmup_steps": 2,
                     "weight_decay": 0.01, "log_every": 2, "epoch": "groups", "seeds": [0, 1],
                     "runs": [{"name": "clip", "loss": "clip"}]}}
    params = root / "params" / "t.yaml"
    params.parent.mkdir()
    params.write_text(yaml.safe_dump(raw))
    Params.model_validate(raw)  # a typo fails here, not in the child

    first = _train(params, run_dir)
    seed0 = run_dir / "training" / "clip" / "summary.json"
    log1 = run_dir / "training" / "seed1" / "clip" / "log.csv"
    deadline = time.monotonic() + 300
    per_epoch = None
    while first.poll() is None and time.monotonic() < deadline:
        if per_epoch is None and seed0.is_file():
            per_epoch = json.loads(seed0.read_text())["steps_per_epoch"]
        if per_epoch is not None and _log_rows(log1) > per_epoch:  # into seed 1's second epoch
            first.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, f"not killed in seed 1's second epoch: {first.stdout.read()[-2000:]}"
    out = {"run_dir": run_dir, "per_epoch": per_epoch, "logged_before_resume": _log_rows(log1),
           "interrupted": stage_summaries(run_dir, resume=resume_command(params, run_dir)),
           "prepare_first": json.loads((run_dir / "training" / "prepare.json").read_text())}
    second = _train(params, run_dir)
    text = second.communicate(timeout=300)[0]
    assert second.returncode == 0, text[-3000:]
    out["seed0"] = json.loads(seed0.read_text())
    out["seed1"] = json.loads((run_dir / "training" / "seed1" / "clip" / "summary.json").read_text())
    out["log1"] = _log_rows(log1)
    out["stages"] = stage_summaries(run_dir)
    out["prepare_second"] = json.loads((run_dir / "training" / "prepare.json").read_text())
    # a third attempt, as a later `cglib run` starts it (run.json's `started`, written before notebook 05 trains):
    # both runs are finished for these params and reused
    time.sleep(1.1)  # the times have whole seconds
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (run_dir / "run.json").write_text(json.dumps({"started": started, "status": "running"}))
    third = _train(params, run_dir)
    text = third.communicate(timeout=300)[0]
    assert third.returncode == 0, text[-3000:]
    out["reused"] = stage_summaries(run_dir)
    return out


def test_a_killed_training_resumes_with_an_account_of_kept_trained_and_repeated_steps(training):
    """Seed 0 trained in one go; seed 1 resumed from the checkpoint of its last finished epoch: kept + trained now
    = total, the steps the killed attempt logged past its checkpoint are counted as repeated, and the final log
    holds every step once."""
    per_epoch, total = training["per_epoch"], EPOCHS * training["per_epoch"]
    a0 = training["seed0"]["account"]
    assert a0 == {"steps": {"total": total, "kept": 0, "trained_now": total, "repeated": 0},
                  "epochs": {"total": EPOCHS, "kept": 0, "trained_now": EPOCHS}, "adds_up": True}
    a1 = training["seed1"]["account"]
    steps, epochs = a1["steps"], a1["epochs"]
    assert a1["adds_up"] and steps["total"] == total == steps["kept"] + steps["trained_now"] == training["log1"]
    assert 1 <= epochs["kept"] < EPOCHS and steps["kept"] == epochs["kept"] * per_epoch
    assert epochs["total"] == EPOCHS == epochs["kept"] + epochs["trained_now"]
    assert steps["repeated"] == training["logged_before_resume"] - steps["kept"] >= 1
    assert training["seed1"]["resumed_from_step"] == steps["kept"]


def test_the_image_cache_says_built_then_reused(training):
    """The first attempt built the image cache (seed 0's summary), the second opened that build (seed 1's): every
    image of the dataset is a row or a skip."""
    built, reused = training["seed0"]["image_cache"]["account"], training["seed1"]["image_cache"]["account"]
    n = built["images"]
    assert built["adds_up"] and built["built_now"] == n - built["skipped"] > 0 and built["from_earlier_build"] == 0
    assert reused["adds_up"] and reused["from_earlier_build"] == built["built_now"] and reused["built_now"] == 0


def test_status_lines_show_the_interrupted_run_then_each_runs_account(training):
    """Between the attempts the training stage names the run whose checkpoint waits and the command that resumes
    it; after the resume it prints each run and seed's account and the image cache's."""
    waiting = training["interrupted"]["training"]
    assert waiting["interrupted"] == ["seed1/clip"] and waiting["failed"] == {"interrupted, a checkpoint waits": 1}
    lines = "\n".join(summary_lines(training["interrupted"]))
    assert "seed1/clip: interrupted, its checkpoint waits; resume with: cglib run " in lines and "--from 05" in lines
    lines = "\n".join(summary_lines(training["stages"]))
    s1, total = training["seed1"]["account"]["steps"], EPOCHS * training["per_epoch"]
    assert f"clip: {total} steps = 0 kept from a checkpoint + {total} trained now (0 of them repeated" in lines
    assert (f"clip@seed1: {total} steps = {s1['kept']} kept from a checkpoint + {s1['trained_now']} trained now "
            f"({s1['repeated']} of them repeated after an interruption)") in lines
    cache = training["seed1"]["image_cache"]["account"]
    assert (f"image cache {cache['size']}px: {cache['images']} images = {cache['images']} from an earlier build + 0 "
            "built now + 0 skipped") in lines
    assert training["stages"]["training"]["kept"] == 2 and "interrupted" not in training["stages"]["training"]


def test_the_preparation_is_a_stage_of_its_own_built_then_reused(training):
    """`python -m cglib.train` prepares the inputs before training (training/prepare.json): the first attempt
    built the image cache of every MAGIC image, the second found it built; `cglib status` shows the stage line
    "prepare" before training's, with what it built and found built and its seconds, and no run of training is
    dated by it."""
    first, second = training["prepare_first"], training["prepare_second"]
    n = len(tiny_magic()[0].images)
    assert first["runs"] == ["clip"] and first["training_seeds"] == [0, 1]
    assert "image cache of the MAGIC images" in first["built"] and first["image_cache"]["built_now"] == n
    assert "image cache of the MAGIC images" in second["reused"] and second["image_cache"]["from_earlier_build"] == n
    assert first["groups"]["magic"]["images"] == n and first["base"] == {"needed_for_seeds": []}
    assert first["wall_s"] > 0 and first["cpu_s"] >= 0
    stages = training["stages"]
    assert list(stages) == ["prepare", "training"] and stages["prepare"]["kept"] == n
    assert "earlier_run" not in stages["training"]
    lines = summary_lines(stages)
    at = lines.index(next(line for line in lines if line.startswith("  prepare ")))
    assert lines[at] == f"  prepare      kept {n} images cached for training; skipped 0; failed 0"
    assert lines[at + 1].strip() == "built now: nothing"
    assert lines[at + 2].strip() == "found built: image cache of the MAGIC images"
    assert lines[at + 3].strip().startswith(f"groups: magic {len(tiny_magic()[0].nodes_at(1))} l1 groups over {n}")
    assert lines[at + 4].strip() == f"{second['wall_s']} s wall, {second['cpu_s']} s CPU"
    assert next(k for k, line in enumerate(lines) if line.startswith("  training ")) > at + 4


def test_a_reused_run_says_so_instead_of_repeating_the_earlier_attempts_account(training):
    """A later attempt that finds both runs trained for these params reuses them: the account names the attempt
    that trained each (its finish time) and says nothing was trained now."""
    runs = training["reused"]["training"]["runs"]
    assert set(runs) == {"clip", "clip@seed1"}
    for label, seed in (("clip", "seed0"), ("clip@seed1", "seed1")):
        assert runs[label]["reused_from"] == training[seed]["provenance"]["created"]
    lines = "\n".join(summary_lines(training["reused"]))
    total = EPOCHS * training["per_epoch"]
    assert (f"clip@seed1: reused, 0 steps trained now (its {total} steps and {EPOCHS} epochs were trained by an "
            f"earlier attempt, finished {training['seed1']['provenance']['created']})") in lines
    assert "kept from a checkpoint" not in lines  # no run claims steps trained by this attempt
    assert "reused_from" not in training["stages"]["training"]["runs"]["clip"]  # no run.json then: not marked


# ------------------------------------------------------------------------------ generalized captions (notebook 03)
KEY_ENV = "CGLIB_TEST_STAGE_ACCOUNTS_KEY"


def test_generalized_captions_give_the_llm_account_and_its_terminal_line(tmp_path, monkeypatch):
    """Per-image LLM_gen stopped by the cost cap, then resumed: each account adds up to the requests planned, its
    HTTP requests are the server's count, and the summary line says it stopped, how many were never asked and how
    to resume (--from 03); the resume answers the rest and takes the capped run's answers from the cache."""
    monkeypatch.setenv(KEY_ENV, "sk-test-stage-accounts")
    reqs = [GroupRequest(f"img{i:03d}", "dog show", ["animal event", "leisure", "culture"],
                         [f"a dog number {i} on a sofa", f"a brown dog {i} sleeping"], 1, scope="image")
            for i in range(10)]

    def params(server, **llm):
        base = {"backend": "openai", "base_url": server.url, "api_key_env": KEY_ENV, "backoff_base_s": 0.01,
                "backoff_max_s": 0.05, "timeout_s": 5.0, "concurrency": 1}
        return Params.model_validate({"llm": {**base, **llm}})

    resume = f"cglib run p.yaml --out {tmp_path}"  # a run of the whole series: resumed --from its stage
    with FakeOpenAIServer(usage_factor=10) as server:
        one = generalize_groups(reqs[:1], params(server), tmp_path / "probe", progress=False).summary["cost_usd"]
        start = server.total
        with pytest.raises(BudgetExceededError):
            generalize_groups(reqs, params(server, max_cost_usd=4.5 * one), tmp_path, progress=False)
        capped_requests = server.total - start
        capped = stage_summaries(tmp_path, resume=resume_command("p.yaml", tmp_path))["generalize"]
        a = capped["llm"]
        assert a["adds_up"] and a["items"] == 10 and a["status"] == "stopped" and a["stopped_by"] == "llm.max_cost_usd"
        assert a["answered"] + a["failed"] + a["never_asked"] == 10 and a["never_asked"] > 0
        assert a["requests"]["http"] == capped_requests and a["cost_usd"]["spent"] <= 4.5 * one
        lines = "\n".join(summary_lines({"generalize": capped}))
        assert (f"LLM: 10 items = 0 cached + 0 cached failures + {a['answered']} answered + {a['failed']} failed"
                in lines)
        assert (f"stopped (llm.max_cost_usd): {a['answered'] + a['failed']} of 10 asked (0 from the cache), "
                f"{a['never_asked']} never asked, ${a['cost_usd']['spent']:.4f} spent; resume with: {resume} --from 03"
                in lines)
        start = server.total
        generalize_groups(reqs, params(server), tmp_path, progress=False)
        done = stage_summaries(tmp_path)["generalize"]["llm"]
        assert done["adds_up"] and done["status"] == "complete" and done["cached"] == a["answered"]
        assert done["answered"] == 10 - a["answered"] and done["requests"]["http"] == server.total - start
        assert f"; {server.total - start} requests (" in "\n".join(summary_lines(stage_summaries(tmp_path)))


@pytest.mark.slow
def test_cglib_run_prints_the_generalized_captions_account_and_notebook_03_shows_it(small_run):
    """`cglib run --only 01,02,03` (the session's shared run): run.json's summary holds the generalize stage with an
    account that adds up over one request per image; executed notebook 03 prints the same line `cglib status`
    prints."""
    run = json.loads((small_run / "run.json").read_text())
    stage = run["summary"]["generalize"]
    a = stage["llm"]
    magic = json.loads((small_run / "magic" / "stats.json").read_text())["stats"]
    assert a["adds_up"] and a["status"] == "complete" and a["items"] == magic["generalization"]["requested"] > 0
    assert a["answered"] + a["cached"] == a["items"] == stage["kept"]
    line = next(x for x in summary_lines({"generalize": stage}) if "LLM:" in x).strip()
    executed = json.loads((small_run / "notebooks" / "03_magic_dag.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in executed["cells"] if c["cell_type"] == "code"
                      for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert line in printed
