"""`cglib run` killed in the middle of its LLM stage, as a scheduler kills a job: SIGKILL to the runner's process
group, five times in a row, then run to the end, against the loopback OpenAI-compatible server. The series is one
notebook that runs the abstraction engine (`run_abstraction`, notebook 02's stage) on 120 images x 4 levels, so a
kill lands within seconds of the start.

papermill starts the notebook's kernel in a session of its own, so the kill reaches the runner only; the kernel
must stop at once by itself (`cglib.kernel_guard`): within 1 s of each kill the server receives nothing more.
Every answer is committed to the cache as it arrives, so a resumed attempt asks again only what the killed one
had in flight: the server counts each request for an input it had already answered, and the total must stay
within the guide's bound (book/stages/02_abstraction.md), llm.concurrency per kill. Every attempt is on record in
attempts.jsonl, each killed one with what it answered and spent before the kill (their answers add up to the
server's distinct prompts), and `cglib status` on the interrupted run shows the answers already cached.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

from cglib.cli import main as cli_main
from cglib.config import deep_merge
from cglib.data.dataset import CaptionDataset
from cglib.llm.attempts import load_attempts

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "CGLIB_TEST_KILL_KEY"
CONCURRENCY = 4
KILLS = 5
IMAGES = 120
ITEMS = IMAGES * 4  # images x l_max
SMALL = {"run": {"name": "killed"}, "magic": {"l_max": 4},
         "llm": {"backend": "openai", "api_key_env": KEY_ENV, "timeout_s": 5.0, "concurrency": CONCURRENCY}}
STAGE = """from pathlib import Path
from cglib.config import load_params
from cglib.data.dataset import CaptionDataset
from cglib.llm import run_abstraction
run_abstraction(CaptionDataset.load(Path(run_dir) / "captions"), load_params(params_path, check_paths=False),
                Path(run_dir), progress=False)"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the kernel's PID from /proc")


def one_notebook_series(folder: Path, file_name: str, code: str) -> Path:
    """A notebook folder whose series is one notebook: the parameters cell, then `code`."""
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('params_path = ""\nrun_dir = ""', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "cglib", "display_name": "Python (cglib)", "language": "python"}
    nbformat.write(nb, folder / file_name)
    return folder


def _llm_series(folder: Path) -> Path:
    """A notebook folder whose series is the LLM stage alone (02_llm.ipynb)."""
    return one_notebook_series(folder, "02_llm.ipynb", STAGE)


def _cached_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return 0


def _children(pid: int) -> list[int]:
    """The PIDs of a process's children (any of its threads may have started them)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie no longer does: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_a_killed_runner_takes_its_kernel_and_a_resume_repeats_at_most_the_answers_in_flight(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-kill-0123456789")
    params, out = tmp_path / "killed.yaml", tmp_path / "run"
    notebooks = _llm_series(tmp_path / "notebooks")
    ids = [f"img{i:03d}" for i in range(IMAGES)]
    CaptionDataset(source="test", image_ids=ids, captions={i: [f"a dog {i} on a sofa", f"a brown dog {i} asleep"]
                                                           for i in ids},
                   pixels=np.zeros((IMAGES, 2, 2, 3), dtype=np.uint8)).save(out / "captions")
    cache = out / "abstraction" / "cache.sqlite"
    run = ["run", str(params), "--out", str(out), "--notebooks", str(notebooks), "--no-check-paths"]
    with FakeOpenAIServer(latency_s=0.05) as server:
        raw = deep_merge(yaml.safe_load((REPO / "params/demo.yaml").read_text()), SMALL)
        raw["llm"]["base_url"] = server.url
        params.write_text(yaml.safe_dump(raw))
        kills = []
        for attempt in range(KILLS):
            rows, again = _cached_rows(cache), server.asked_again
            log = (tmp_path / f"runner-{attempt}.log").open("w")
            runner = subprocess.Popen([sys.executable, "-m", "cglib.cli", *run], start_new_session=True, stdout=log,
                                      stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
            deadline = time.monotonic() + 120
            while _cached_rows(cache) < rows + 15 and runner.poll() is None:  # mid-stage: answers arriving
                assert time.monotonic() < deadline, "the stage sent no request within 120 s"
                time.sleep(0.02)
            assert runner.poll() is None, (tmp_path / f"runner-{attempt}.log").read_text()[-3000:]
            kernels = _children(runner.pid)
            os.killpg(runner.pid, signal.SIGKILL)  # the runner's group: the kernel is not in it
            killed_at = time.monotonic()
            runner.wait()
            time.sleep(2.0)
            late = sorted(t - killed_at for times in server.attempt_times.values() for t in times if t > killed_at)
            assert not [t for t in late if t > 1.0], f"kill {attempt + 1}: requests {late} s after the kill"
            assert kernels and not [k for k in kernels if _alive(k)], f"kill {attempt + 1}: a kernel outlived it"
            kills.append({"cached_before": rows, "cached_after": _cached_rows(cache),
                          "asked_again_by_this_attempt": server.asked_again - again,
                          "last_request_after_kill_s": round(late[-1], 3) if late else None})
        # `cglib status` on the interrupted run: the killed attempt's record and the answers cached in its stage
        status = io.StringIO()
        with contextlib.redirect_stdout(status):
            assert cli_main(["status", str(out)]) == 4
        cached_now = _cached_rows(cache)
        assert ("interrupted (its process is gone): before it stopped " in status.getvalue()
                and f"; {cached_now} answers cached now; resume with: cglib run " in status.getvalue()), \
            status.getvalue()
        again = server.asked_again
        assert cli_main(run) == 0
        kills.append({"final_attempt_asked_again": server.asked_again - again})
        account = json.loads((out / "run.json").read_text())["summary"]["abstraction"]["llm"]
        assert account["status"] == "complete" and account["adds_up"]
        assert _cached_rows(cache) == ITEMS
        print("kills:", json.dumps(kills))
        print(f"answered requests asked again: {server.asked_again} over {KILLS} kills "
              f"({sum(server.answered.values())} answers sent for {ITEMS} items)")
        # each resume asks again at most what its killed predecessor had in flight: llm.concurrency requests
        assert all(k.get("asked_again_by_this_attempt", k.get("final_attempt_asked_again")) <= CONCURRENCY
                   for k in kills)
        assert server.asked_again <= KILLS * CONCURRENCY
        # every attempt on record, the killed ones with what they got before the kill: their answers add up to the
        # server's distinct prompts, each answered (and paid) once in the record
        attempts = load_attempts(out / "abstraction")
        assert [a["status"] for a in attempts] == ["interrupted"] * KILLS + ["complete"]
        assert all(a["progress"]["answered"] > 0 and a["progress"]["spent_usd"] > 0 for a in attempts)
        # an answer is committed to the cache before its attempt's line counts it, so a kill in between leaves
        # at most one answer per kill cached but not on the killed attempt's line
        killed = sum(a["progress"]["answered"] for a in attempts[:-1])
        final = attempts[-1]["progress"]
        assert len(server.counts) == ITEMS == final["cached"] + final["answered"]
        assert killed <= final["cached"] <= killed + KILLS, (killed, final)
