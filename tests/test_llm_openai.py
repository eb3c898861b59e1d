"""The `openai` backend with the real openai client against a local OpenAI-compatible server (127.0.0.1).

Covers: chains end to end, the cache (reruns cost nothing, reply failures cached, transport failures not),
retries with Retry-After, bad replies recorded by reason with their raw text, quota stops the run, requests
really overlap, the sync entry point inside a running event loop, secret hygiene, few-shot copy counting,
deduplication, the cost guard, generalized captions, the Batch API, and resume after SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import (
    FatalBackendError,
    GroupRequest,
    QuotaExhaustedError,
    generalize_groups,
    load_chains,
    run_abstraction,
)

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

FAKE_KEY = "sk-cglib-test-DO-NOT-LEAK-7f3a9c51"
KEY_ENV = "CGLIB_TEST_OPENAI_KEY"


def dataset(captions: dict[str, list[str]]) -> CaptionDataset:
    ids = list(captions)
    return CaptionDataset(source="test", image_ids=ids, captions=captions,
                          pixels=np.zeros((len(ids), 2, 2, 3), dtype=np.uint8))


def plain(n: int, prefix: str = "img") -> dict[str, list[str]]:
    return {f"{prefix}{i:03d}": [f"a dog number {i} on a sofa", f"a brown dog {i} sleeping in a living room"]
            for i in range(n)}


def params(server: FakeOpenAIServer, l_max: int = 4, **llm) -> Params:
    base = {"backend": "openai", "base_url": server.url, "api_key_env": KEY_ENV, "backoff_base_s": 0.01,
            "backoff_max_s": 0.05, "timeout_s": 5.0, "concurrency": 8}
    return Params.model_validate({"llm": {**base, **llm}, "magic": {"l_max": l_max}})


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, FAKE_KEY)


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def test_chains_end_to_end(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Every image gets l_max distinct canonical concepts; chains.jsonl and summary.json record it with provenance."""
    ds = dataset(plain(6))
    result = run_abstraction(ds, params(server), tmp_path, progress=False)
    assert set(result.chains) == set(ds.image_ids) and result.failures == []
    assert all(len(c) == 4 and len(set(c)) == 4 and all(x.startswith("topic ") for x in c)
               for c in result.chains.values())
    rows = [json.loads(x) for x in (tmp_path / "abstraction" / "chains.jsonl").read_text().splitlines()]
    assert [r["image_id"] for r in rows] == ds.image_ids
    assert {(r["status"], r["backend"], r["model"], r["prompt_version"]) for r in rows} == \
        {("ok", "openai", "gpt-4o-mini", "v1")}
    assert load_chains(tmp_path / "abstraction" / "chains.jsonl") == result.chains
    summary = json.loads((tmp_path / "abstraction" / "summary.json").read_text())
    assert summary["requests"] == 24 and summary["cache"]["misses"] == 24 and summary["status"] == "complete"
    assert summary["tokens"]["input"] > 0 and summary["cost_usd"] > 0
    estimate = summary["estimate_before_run"]  # every request to come: 6 images x 4 levels, then 6 per-image LLM_gen
    assert estimate["chains"]["requests"] == 24 and estimate["generalize"]["requests"] == 6
    assert estimate["requests"] == 30
    assert "provenance" in summary and summary["provenance"]["params"]["llm"]["api_key_env"] == KEY_ENV


def test_request_uses_temperature_zero_and_strict_schema(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """The request asks for temperature 0 and a strict JSON schema (all fields required, no extra keys)."""
    run_abstraction(dataset(plain(1)), params(server), tmp_path, progress=False)
    body = server.last_body
    assert body["temperature"] == 0.0
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    assert fmt["json_schema"]["schema"]["required"] == ["concept"]
    run_abstraction(dataset(plain(1, "x")), params(server, structured_output=False), tmp_path, progress=False)
    assert "response_format" not in server.last_body


def test_rerun_is_all_cache_hits(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """A second run of the same items makes zero requests and reports every item as a cache hit."""
    ds = dataset(plain(5))
    first = run_abstraction(ds, params(server), tmp_path, progress=False)
    total = server.total
    second = run_abstraction(ds, params(server), tmp_path, progress=False)
    assert server.total == total
    assert second.chains == first.chains
    assert second.summary["requests"] == 0 and second.summary["cache"]["hits"] == 20
    assert second.summary["cost_saved_by_cache_usd"] > 0


def test_identical_requests_are_sent_once(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Two images with identical captions share every request (deduplicated, same chain)."""
    caps = {"a": ["a cat on a mat"], "b": ["a cat on a mat"], "c": ["a bird"]}
    result = run_abstraction(dataset(caps), params(server), tmp_path, progress=False)
    assert result.chains["a"] == result.chains["b"] != result.chains["c"]
    assert result.summary["cache"]["deduplicated"] == 4 and server.total == 8
    assert max(server.counts.values()) == 1


def test_transport_errors_are_retried(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """429, 500, 503 and a timeout are retried with backoff; the chain still completes and retries are counted."""
    caps = {"x": ["[[fault:429,500,503,timeout]] a dog"], "y": ["a cat"]}
    server.timeout_sleep_s = 1.5
    result = run_abstraction(dataset(caps), params(server, timeout_s=0.5), tmp_path, progress=False)
    assert set(result.chains) == {"x", "y"}
    retries = result.summary["retries_by_reason"]
    assert retries["rate_limited"] == 4 and retries["server_error"] == 8 and retries["timeout"] == 4
    assert sorted(server.counts.values()) == [1] * 4 + [5] * 4  # y: once per level; x: 4 faults + success


def test_retry_after_headers_are_honoured(tmp_path: Path) -> None:
    """The client waits at least Retry-After (seconds) or retry-after-ms before the next attempt."""
    with FakeOpenAIServer(retry_after="0.4", retry_after_ms="300") as srv:
        caps = {"s": ["[[fault:429]] seconds"], "m": ["[[fault:429ms]] milliseconds"]}
        run_abstraction(dataset(caps), params(srv, l_max=2), tmp_path, progress=False)
        gaps = {}
        for key, times in srv.attempt_times.items():
            if len(times) == 2:
                gaps[key] = times[1] - times[0]
    assert len(gaps) == 4  # both images, both levels retried once
    assert min(gaps.values()) >= 0.3 and sum(g >= 0.4 for g in gaps.values()) >= 2


def test_transport_failure_gives_up_and_is_not_cached(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """After max_retries a 5xx item is a failure (reason server_error), and a later run asks again."""
    caps = {"bad": ["[[fault:500*50]] a dog"], "good": ["a cat"]}
    p = params(server, max_retries=2)
    result = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert set(result.chains) == {"good"}
    assert [(f.item_id, f.level, f.reason) for f in result.failures] == [("bad", 1, "server_error")]
    before = server.total
    again = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert server.total - before == 3 and again.summary["cache"]["misses"] == 1


BAD_REPLIES = {"nonjson": "invalid_json", "missing": "missing_fields", "empty": "empty", "long": "too_long",
               "length": "truncated", "refusal": "refusal"}


def test_bad_replies_are_recorded_by_reason(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Malformed replies are retried, then recorded with their reason and raw text; the run completes."""
    caps = {kind: [f"[[fault:{kind}*9]] a dog"] for kind in BAD_REPLIES}
    caps["fine"] = ["a cat on a sofa"]
    caps["recovers"] = ["[[fault:nonjson]] a bird"]
    result = run_abstraction(dataset(caps), params(server, max_bad_reply_retries=1), tmp_path, progress=False)
    assert set(result.chains) == {"fine", "recovers"}
    reasons = {f.item_id: f.reason for f in result.failures}
    assert reasons == BAD_REPLIES
    raws = {f.item_id: f.raw for f in result.failures}
    assert "birthday party" in raws["nonjson"] and "idea" in raws["missing"] and "cut: 5015 characters" in raws["long"]
    assert result.summary["failed_images_by_reason"] == {r: 1 for r in BAD_REPLIES.values()}
    assert result.summary["retries_by_reason"]["invalid_json"] == 1 + 4  # nonjson's one retry + recovers' 4 levels
    rows = {json.loads(x)["image_id"]: json.loads(x) for x in
            (tmp_path / "abstraction" / "chains.jsonl").read_text().splitlines()}
    assert rows["length"]["status"] == "failed" and rows["length"]["failure_reason"] == "truncated"
    assert rows["length"]["chain"] is None and rows["length"]["failed_level"] == 1
    # reply failures are cached: a rerun asks nothing, unless llm.retry_failed
    before = server.total
    again = run_abstraction(dataset(caps), params(server, max_bad_reply_retries=1), tmp_path, progress=False)
    assert server.total == before and again.summary["cache"]["failure_hits"] == 6
    run_abstraction(dataset(caps), params(server, max_bad_reply_retries=1, retry_failed=True), tmp_path,
                    progress=False)
    assert server.total == before + 6 * 2


def test_quota_exhausted_stops_the_run(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """A 429 insufficient_quota is not retried: the run stops with a clear message and a 'stopped' summary."""
    caps = {"q": ["[[fault:quota]] a dog"]}
    with pytest.raises(QuotaExhaustedError, match="insufficient_quota"):
        run_abstraction(dataset(caps), params(server), tmp_path, progress=False)
    summary = json.loads((tmp_path / "abstraction" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "quota" in summary["error"]
    assert server.total == 1


def test_missing_key_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without base_url and without the key variable, the error names the variable to export."""
    monkeypatch.delenv(KEY_ENV)
    p = Params.model_validate({"llm": {"backend": "openai", "api_key_env": KEY_ENV}})
    with pytest.raises(FatalBackendError, match=KEY_ENV):
        run_abstraction(dataset(plain(1)), p, tmp_path, progress=False)


def test_unreachable_server_stops_the_run(tmp_path: Path) -> None:
    """When requests keep getting no answer (server gone), the run stops with a message naming the URL."""
    with FakeOpenAIServer() as srv:
        url = srv.url
    p = Params.model_validate({"llm": {"backend": "openai", "base_url": url, "api_key_env": KEY_ENV,
                                       "max_retries": 0, "concurrency": 2}, "magic": {"l_max": 2}})
    with pytest.raises(FatalBackendError, match=f"in a row got no answer from {url}"):
        run_abstraction(dataset(plain(20)), p, tmp_path, progress=False)


def test_cost_guard_refuses_before_any_request(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """llm.max_cost_usd below the estimate stops the run before a single request is sent."""
    with pytest.raises(ValueError, match="max_cost_usd"):
        run_abstraction(dataset(plain(20)), params(server, max_cost_usd=1e-6), tmp_path, progress=False)
    assert server.total == 0


def test_requests_overlap(tmp_path: Path) -> None:
    """With latency, concurrency really overlaps requests: wall time far below the serial time."""
    with FakeOpenAIServer(latency_s=0.2) as srv:
        start = time.perf_counter()
        run_abstraction(dataset(plain(32)), params(srv, l_max=2, concurrency=16), tmp_path, progress=False)
        wall = time.perf_counter() - start
    serial = 64 * 0.2
    assert srv.max_in_flight >= 8
    assert wall < serial / 4, f"{wall:.1f}s for 64 requests of 0.2s at concurrency 16"


def test_sync_entry_point_inside_running_event_loop(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """run_abstraction works where an event loop is already running (Jupyter)."""
    async def notebook_cell():
        return run_abstraction(dataset(plain(2)), params(server), tmp_path, progress=False)

    result = asyncio.run(notebook_cell())
    assert len(result.chains) == 2


def test_few_shot_copies_are_counted(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Chains that copy a few-shot example verbatim are counted in the summary."""
    caps = plain(7)
    caps.update({f"copy{i}": [f"[[copy]] kites {i}"] for i in range(3)})
    result = run_abstraction(dataset(caps), params(server), tmp_path, progress=False)
    copies = result.summary["few_shot_copies"]
    assert copies["full_chain"] == 3 and copies["by_level"] == {1: 3, 2: 3, 3: 3, 4: 3}
    assert result.chains["copy0"] == ["kite flying", "outdoor play", "pastime", "leisure"]
    assert copies["full_chain_rate"] == pytest.approx(0.3)


def test_secret_never_reaches_files(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """The API key is sent to the server but appears in no file of the run directory or the cache."""
    caps = plain(3)
    caps["bad"] = ["[[fault:nonjson*9]] a dog"]
    p = params(server, max_bad_reply_retries=0)
    run_abstraction(dataset(caps), p, tmp_path, progress=False)
    generalize_groups([GroupRequest("g", "dog", ["animal"], ["a dog", "a dog on a sofa"], 2)], p, tmp_path,
                      progress=False)
    assert f"Bearer {FAKE_KEY}" in server.auth_headers  # the key was really used
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert any(f.name.startswith("cache.sqlite") for f in files)
    leaks = [str(f) for f in files if FAKE_KEY.encode() in f.read_bytes()]
    assert leaks == []


def test_generalized_captions(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """LLM_gen: n captions per group, bad replies retried, results cached, failures reported."""
    reqs = [GroupRequest("n1", "birthday party", ["celebration"], ["a cake", "balloons"], 4),
            GroupRequest("n2", "wedding", ["celebration"], ["[[fault:nonjson]] a ring", "a veil"], 3),
            GroupRequest("n3", "ski trip", ["winter sport"], ["[[fault:refusal*9]] skis"], 2)]
    p = params(server, max_bad_reply_retries=1)
    result = generalize_groups(reqs, p, tmp_path, progress=False)
    assert {k: len(v) for k, v in result.captions.items()} == {"n1": 4, "n2": 3}
    assert [(f.item_id, f.reason) for f in result.failures] == [("n3", "refusal")]
    assert result.summary["retries_by_reason"] == {"invalid_json": 1, "refusal": 1}
    rows = (tmp_path / "abstraction" / "generalized.jsonl").read_text().splitlines()
    assert len(rows) == 3
    before = server.total
    again = generalize_groups(reqs, p, tmp_path, progress=False)
    assert server.total == before and again.captions == result.captions


def test_batch_api_level_by_level(tmp_path: Path) -> None:
    """Batch API: files within the request limit, expired and failed items resubmitted, bad replies retried."""
    with FakeOpenAIServer() as srv:
        caps = plain(9)
        caps.update({"exp": ["[[batch:expire]] a dog"], "err": ["[[batch:error]] a cat"],
                     "bad": ["[[fault:nonjson]] a bird"]})
        p = params(srv, l_max=2, batch_api=True, batch_poll_s=0.05, batch_max_requests=5)
        result = run_abstraction(dataset(caps), p, tmp_path, progress=False)
        assert len(result.chains) == 12 and result.failures == []
        sizes = [len(v) for v in srv.batch_ids.values()]
        assert max(sizes) <= 5 and len(sizes) >= 6  # 12 requests per level in files of <= 5, two levels
        retries = result.summary["retries_by_reason"]
        assert retries["batch_expired"] >= 1 and retries["server_error"] == 2 and retries["invalid_json"] == 2
        assert result.summary["requests"] >= 24
        files = list((tmp_path / "abstraction" / "batches").glob("requests-*.jsonl"))
        models = {json.loads(line)["body"]["model"] for f in files for line in f.read_text().splitlines()}
        assert models == {"gpt-4o-mini"}
        live_cost = result.summary["tokens"]["input"] * 0.15 / 1e6 + result.summary["tokens"]["output"] * 0.6 / 1e6
        assert result.summary["cost_usd"] == pytest.approx(live_cost / 2, rel=1e-3)
        total = srv.total
        again = run_abstraction(dataset(caps), p, tmp_path, progress=False)
        assert again.summary["requests"] == 0 and srv.total == total and len(srv.batch_ids) == len(sizes)


RUNNER = """
import sys, json
from pathlib import Path
from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import run_abstraction
data_dir, run_dir, params_json = sys.argv[1:4]
run_abstraction(CaptionDataset.load(data_dir), Params.model_validate(json.loads(params_json)), Path(run_dir),
                progress=False)
"""


def _start_runner(tmp_path: Path, ds: CaptionDataset, p: Params) -> subprocess.Popen:
    ds.save(tmp_path / "data")
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = {**os.environ, KEY_ENV: FAKE_KEY}
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "data"), str(tmp_path / "run"),
                             p.model_dump_json()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _cached_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    try:
        with sqlite3.connect(path, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:  # table not created yet
        return 0


@pytest.mark.slow
def test_resume_after_sigkill_repeats_no_finished_request(tmp_path: Path) -> None:
    """A run killed (SIGKILL) mid-way and restarted sends no request for an item cached before the kill."""
    with FakeOpenAIServer(latency_s=0.05) as srv:
        ds = dataset(plain(40))
        p = params(srv, concurrency=4)
        proc = _start_runner(tmp_path, ds, p)
        cache = tmp_path / "run" / "abstraction" / "cache.sqlite"
        deadline = time.monotonic() + 120
        while _cached_rows(cache) < 30 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, f"runner ended before the kill: {proc.stderr.read().decode()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        done = _cached_rows(cache)
        assert 30 <= done < 160
        before = srv.total
        result = run_abstraction(ds, p, tmp_path / "run", progress=False)
        assert len(result.chains) == 40
        assert srv.total - before == 160 - done  # exactly the unfinished requests
        assert result.summary["cache"]["hits"] == done
        repeated = [c for c in srv.counts.values() if c > 1]
        assert len(repeated) <= 4  # at most the requests in flight at the kill were sent twice


@pytest.mark.slow
def test_batch_run_killed_reattaches_instead_of_resubmitting(tmp_path: Path) -> None:
    """A Batch API run killed while batches are in flight polls the same batches on restart (no double pay)."""
    with FakeOpenAIServer(batch_delay_s=2.0) as srv:
        ds = dataset(plain(8))
        p = params(srv, l_max=2, batch_api=True, batch_poll_s=0.05, batch_max_requests=3)
        proc = _start_runner(tmp_path, ds, p)
        deadline = time.monotonic() + 120
        while len(srv.batches) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # let the runner write its state file
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert len(srv.batches) == 3
        result = run_abstraction(ds, p, tmp_path / "run", progress=False)
        assert len(result.chains) == 8
        submitted = [i for ids in srv.batch_ids.values() for i in ids]
        assert len(submitted) == len(set(submitted)) == 16  # every request in exactly one batch


# ------------------------------------------------------------------------ hardening (issue 14)
ECHO_RUNNER = """
import sys, json, logging
from pathlib import Path
from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import GroupRequest, generalize_groups, run_abstraction
logging.basicConfig(level=logging.DEBUG)  # whatever the libraries log goes to stderr too
data_dir, run_dir, params_json, what = sys.argv[1:5]
p = Params.model_validate(json.loads(params_json))
if what == "generalize":
    generalize_groups([GroupRequest("g", "dog", ["animal"], ["a dog"], 2)], p, Path(run_dir), progress=False)
else:
    run_abstraction(CaptionDataset.load(data_dir), p, Path(run_dir), progress=False)
"""


@pytest.mark.parametrize("what", ["abstraction", "generalize"])
def test_key_echoed_by_a_server_is_redacted_everywhere(server: FakeOpenAIServer, tmp_path: Path, what: str) -> None:
    """A 401 whose message echoes the Authorization header: the run stops naming HTTP 401, and the key is in
    no file of the run folder, not in the traceback on stderr, not in the exception, not in the logs."""
    server.echo_auth_status = 401
    ds = dataset(plain(3))
    ds.save(tmp_path / "data")
    script = tmp_path / "runner.py"
    script.write_text(ECHO_RUNNER)
    p = params(server, l_max=2)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "data"), str(tmp_path / "run"),
                           p.model_dump_json(), what], env={**os.environ, KEY_ENV: FAKE_KEY},
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode != 0 and "FatalBackendError" in proc.stderr
    assert f"Bearer {FAKE_KEY}" in server.auth_headers  # the server really received (and echoed) the key
    assert "HTTP 401" in proc.stderr and "Incorrect API key provided: Bearer [REDACTED]" in proc.stderr
    assert FAKE_KEY not in proc.stderr and FAKE_KEY not in proc.stdout
    files = [f for f in (tmp_path / "run").rglob("*") if f.is_file()]
    assert any(f.name == "summary.json" for f in files) or what == "generalize"
    assert [str(f) for f in files if FAKE_KEY.encode() in f.read_bytes()] == []


def test_echoed_key_redacted_in_process(server: FakeOpenAIServer, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture) -> None:
    """In a notebook (same process): the exception text, the summary and the captured logs hold no key."""
    server.echo_auth_status = 401
    caplog.set_level("DEBUG")
    with pytest.raises(FatalBackendError) as err:
        run_abstraction(dataset(plain(2)), params(server), tmp_path, progress=False)
    assert "HTTP 401" in str(err.value) and FAKE_KEY not in str(err.value)
    summary = json.loads((tmp_path / "abstraction" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "[REDACTED]" in summary["error"]
    captured = capsys.readouterr()
    assert FAKE_KEY not in caplog.text and FAKE_KEY not in captured.err and FAKE_KEY not in captured.out


def test_key_in_a_bad_request_detail_is_redacted(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """A 400 that echoes the key becomes a recorded failure: detail redacted in the result and the cache."""
    server.echo_auth_status = 400
    result = run_abstraction(dataset(plain(1)), params(server, l_max=2), tmp_path, progress=False)
    [failure] = result.failures
    assert failure.reason == "bad_request" and "[REDACTED]" in failure.detail and FAKE_KEY not in failure.detail
    assert all(FAKE_KEY.encode() not in f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
def test_malformed_response_body_is_retried_in_the_same_run(server: FakeOpenAIServer, tmp_path: Path,
                                                            transport: str) -> None:
    """An HTTP 200 whose body is cut JSON, or an HTML page, is a transient fault: retried, the item succeeds."""
    caps = {"cut": ["[[fault:badbody]] a dog"], "page": ["[[fault:html]] a cat"], "fine": ["a bird"]}
    result = run_abstraction(dataset(caps), params(server, l_max=2, http_transport=transport), tmp_path,
                             progress=False)
    assert set(result.chains) == set(caps) and result.failures == []
    assert result.summary["retries_by_reason"] == {"invalid_json": 4}  # two images, two levels, once each


def test_malformed_body_that_persists_fails_without_being_cached(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """After llm.max_retries the item fails as invalid_json, and is not cached: the next run asks again."""
    caps = {"cut": ["[[fault:badbody*2]] a dog"]}  # two cut bodies per request, then good ones
    p = params(server, l_max=2, max_retries=1)
    first = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert [(f.reason, f.level, "not valid JSON" in f.detail) for f in first.failures] == [("invalid_json", 1, True)]
    again = run_abstraction(dataset(caps), p, tmp_path, progress=False)  # level 1 asked again: answered
    assert again.summary["cache"]["failure_hits"] == 0 and [f.level for f in again.failures] == [2]
    third = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert len(third.chains["cut"]) == 2 and third.summary["cache"]["hits"] == 1


def test_bad_reply_that_changed_is_transient_and_asked_again(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Two different bad replies (not JSON, then a missing field) are a transient fault: recorded as a
    failure, but not cached as final, so the next run asks again without llm.retry_failed."""
    caps = {"flaky": ["[[fault:nonjson,missing]] a dog"], "stuck": ["[[fault:nonjson*9]] a cat"]}
    p = params(server, l_max=2, max_bad_reply_retries=1)  # each request: two different bad replies, then good
    first = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert {f.item_id: (f.reason, f.level) for f in first.failures} == {"flaky": ("missing_fields", 1),
                                                                         "stuck": ("invalid_json", 1)}
    again = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    # flaky's level 1 was asked again (and answered); stuck's bad reply reproduced, so it stayed final
    assert again.summary["cache"]["failure_hits"] == 1 and again.summary["cache"]["misses"] == 2
    assert {f.item_id: f.level for f in again.failures} == {"flaky": 2, "stuck": 1}
    third = run_abstraction(dataset(caps), p, tmp_path, progress=False)
    assert set(third.chains) == {"flaky"}


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
def test_refused_connection_is_a_connection_error_naming_the_url(tmp_path: Path, transport: str) -> None:
    """A closed port is a connection error naming the URL under both transports (aiohttp said "timeout")."""
    with FakeOpenAIServer() as srv:
        url = srv.url
    p = Params.model_validate({"llm": {"backend": "openai", "base_url": url, "api_key_env": KEY_ENV,
                                       "max_retries": 0, "concurrency": 2, "http_transport": transport},
                               "magic": {"l_max": 2}})
    with pytest.raises(FatalBackendError) as err:
        run_abstraction(dataset(plain(20)), p, tmp_path, progress=False)
    message = str(err.value)
    assert f"got no answer from {url} (connection_error: " in message
    assert f"cannot connect to {url}: " in message and "(timeout" not in message
