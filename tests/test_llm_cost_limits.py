"""llm.max_cost_usd on resume and while running (issue 14 item 1), against the loopback fake OpenAI server.

The estimate before a run counts every request still to be made (each chain's levels not yet cached, and the
generalized captions to come); the limit also holds while running: the run stops cleanly, with every answer so
far cached, before its actual spend would pass the limit."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import GroupRequest, generalize_groups, run_abstraction
from cglib.llm.base import BudgetExceededError
from cglib.llm.cost import Budget, estimate_chain_requests
from cglib.llm.report import summary_table

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

KEY_ENV = "CGLIB_TEST_OPENAI_KEY"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-cost-limits")


def dataset(n: int) -> CaptionDataset:
    caps = {f"img{i:03d}": [f"a dog number {i} on a sofa", f"a brown dog {i} sleeping in a living room"]
            for i in range(n)}
    return CaptionDataset(source="test", image_ids=list(caps), captions=caps,
                          pixels=np.zeros((n, 2, 2, 3), dtype=np.uint8))


def params(server: FakeOpenAIServer, l_max: int = 4, **llm) -> Params:
    base = {"backend": "openai", "base_url": server.url, "api_key_env": KEY_ENV, "backoff_base_s": 0.01,
            "backoff_max_s": 0.05, "timeout_s": 5.0, "concurrency": 1}
    return Params.model_validate({"llm": {**base, **llm}, "magic": {"l_max": l_max}})


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "abstraction" / "summary.json").read_text())


def cached_rows(run_dir: Path) -> int:
    with sqlite3.connect(run_dir / "abstraction" / "cache.sqlite") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM results WHERE ok = 1").fetchone()[0])


def test_resumed_run_estimate_counts_every_level_not_yet_cached(tmp_path):
    """With level 1 cached (a run with l_max 2 shares its level-1 requests with l_max 4; its level-2 prompt names
    l_max, so differs), the estimate of the l_max-4 run counts levels 2-4 of every image plus the per-image
    generalized captions, not $0 as when only level 1 was counted; a limit below it refuses before any request."""
    ds = dataset(8)
    with FakeOpenAIServer() as server:
        run_abstraction(ds, params(server, l_max=2), tmp_path, progress=False)
        assert server.total == 16
        fresh = estimate_chain_requests(params(server), [(ds.captions[i], 1) for i in ds.image_ids])
        with pytest.raises(ValueError, match="max_cost_usd") as refused:
            run_abstraction(ds, params(server, max_cost_usd=0.5 * fresh["cost_usd"]), tmp_path, progress=False)
        assert server.total == 16  # refused before sending anything
        assert "24 for chains of 8 images, 8 for generalized captions" in str(refused.value)
        result = run_abstraction(ds, params(server), tmp_path, progress=False)
        estimate = result.summary["estimate_before_run"]
        assert estimate["chains"]["requests_per_level"] == [0, 8, 8, 8]
        assert estimate["generalize"]["requests"] == 8
        assert "32 requests, 8 of them LLM_gen" in summary_table(result).loc["estimate before run (USD)", "value"]
        share = sum(fresh["input_tokens_per_level"][1:]) / sum(fresh["input_tokens_per_level"])
        assert estimate["chains"]["cost_usd"] == pytest.approx(share * fresh["cost_usd"], rel=0.05)
        assert server.total == 16 + 24  # and the resume asked only levels 2-4


def test_limit_stops_a_running_job_cleanly_and_the_rerun_repeats_nothing(tmp_path):
    """A server whose tokens cost 20x the chars/4 estimate: the estimate passes the limit, the running guard
    stops the run before the actual spend passes it, with a message naming the limit; everything answered is
    cached; a rerun with a higher limit asks only the rest, never a finished request again."""
    ds = dataset(8)
    with FakeOpenAIServer(usage_factor=20) as server:
        estimate = estimate_chain_requests(params(server), [(ds.captions[i], 1) for i in ds.image_ids])
        limit = 2 * estimate["cost_usd"]  # passes the estimate check (chains + 8 generalized captions)
        with pytest.raises(BudgetExceededError, match=r"llm\.max_cost_usd") as stopped:
            run_abstraction(ds, params(server, max_cost_usd=limit), tmp_path, progress=False)
        asked = server.total
        assert 0 < asked < 32
        s = summary(tmp_path)
        assert s["status"] == "stopped" and "max_cost_usd" in s["error"] and "cached" in str(stopped.value)
        assert s["cost_usd"] <= limit  # actual spend stayed under the limit
        assert cached_rows(tmp_path) == asked  # every paid answer is kept
        result = run_abstraction(ds, params(server), tmp_path, progress=False)
        assert len(result.chains) == 8
        assert server.total == 32 and max(server.counts.values()) == 1  # no request asked twice


def test_limit_stops_generalized_captions_while_running(tmp_path):
    """Per-image LLM_gen under a limit that its estimate passes but its real spend would not: stopped, the
    summary says so, answers cached; the rerun completes with zero repeated requests."""
    reqs = [GroupRequest(f"img{i:03d}", "dog show", ["animal event", "leisure", "culture"],
                         [f"a dog number {i} on a sofa", f"a brown dog {i} sleeping"], 1, scope="image")
            for i in range(10)]
    with FakeOpenAIServer(usage_factor=10) as server:
        unlimited = tmp_path / "probe"
        first = generalize_groups(reqs[:1], params(server), unlimited, progress=False)
        one = first.summary["cost_usd"]
        start = server.total
        with pytest.raises(BudgetExceededError):
            generalize_groups(reqs, params(server, max_cost_usd=4.5 * one), tmp_path, progress=False)
        asked = server.total - start
        assert 0 < asked <= 4
        gen_summary = json.loads((tmp_path / "abstraction" / "generalize_summary.json").read_text())
        assert gen_summary["status"] == "stopped" and gen_summary["cost_usd"] <= 4.5 * one
        done = generalize_groups(reqs, params(server), tmp_path, progress=False)
        assert len(done.captions) == 10 and server.total - start == 10


def test_budget_counts_requests_in_flight():
    """The guard refuses a request when spend + every reservation in flight + it would pass the limit, and a
    reply dearer than the estimate raises the estimate."""
    budget = Budget(limit_usd=1.0, price=lambda tin, tout: (tin + tout) / 100, request_usd=0.3)
    assert budget.reserve() and budget.reserve() and budget.reserve()
    assert not budget.reserve() and budget.stopped
    budget.add(20, 20)  # one reply cost 0.4 > 0.3
    budget.release()
    assert budget.request_usd == pytest.approx(0.4) and not budget.fits()
    assert Budget(limit_usd=None, price=lambda a, b: 1e9, request_usd=1e9).reserve()


def test_limit_stops_batch_api_submissions(tmp_path):
    """Batch API, one request file in flight at a time: once a collected batch shows the real price, no further
    file is submitted when it would pass the limit; collected answers are cached; the rerun submits the rest."""
    ds = dataset(8)
    with FakeOpenAIServer(usage_factor=20) as server:
        p = params(server, l_max=2, batch_api=True, batch_poll_s=0.02, batch_max_requests=2,
                   batch_max_enqueued_tokens=1000)
        estimate = estimate_chain_requests(p, [(ds.captions[i], 1) for i in ds.image_ids])
        limit = 2 * estimate["cost_usd"]
        with pytest.raises(BudgetExceededError):
            run_abstraction(ds, params(server, l_max=2, batch_api=True, batch_poll_s=0.02, batch_max_requests=2,
                                       batch_max_enqueued_tokens=1000, max_cost_usd=limit), tmp_path, progress=False)
        submitted = sum(len(v) for v in server.batch_ids.values())
        assert 0 < submitted < 16 and cached_rows(tmp_path) == submitted
        assert summary(tmp_path)["status"] == "stopped"
        result = run_abstraction(ds, p, tmp_path, progress=False)
        assert len(result.chains) == 8 and sum(len(v) for v in server.batch_ids.values()) == 16
