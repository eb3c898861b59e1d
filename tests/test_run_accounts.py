"""What `cglib run` tells about its LLM stage (issue 35): one account per attempt, counted as it happened.

One shrunken world (104 images, l_max 4: 416 items) through the real CLI (`cglib run --only 02`, papermill)
against the loopback OpenAI-compatible server, attempt after attempt in one run folder: stopped by the cost
cap, resumed on a faulty server, a truncated cache rebuilt, a damaged cache whose repeat would pass the cap,
and a server that refuses the key over an earlier complete result. Each attempt's printed account is compared
with the server's own request count and must add up to images x levels. The cache salvage itself is checked
row for row on a truncated file and on a file with a corrupted page.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from cglib.cli import main as cli_main
from cglib.config import deep_merge, load_params
from cglib.data.dataset import CaptionDataset
from cglib.llm.base import Outcome
from cglib.llm.budget_check import check_budget
from cglib.llm.cache import CacheRebuiltWarning, ResultCache
from cglib.llm.engine import make_backend
from cglib.pipeline import resume_command

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "CGLIB_TEST_ACCOUNTS_KEY"
ITEMS = 104 * 4  # images x l_max
SMALL = {"run": {"name": "accounts"}, "data": {"synthetic": {"images_per_concept": 2}},
         "llm": {"backend": "openai", "api_key_env": KEY_ENV, "backoff_base_s": 0.01, "backoff_max_s": 0.05,
                 "timeout_s": 5.0, "concurrency": 4}}


def _cli(args: list[str]) -> tuple[int, str]:
    """Run the real CLI in this process; its exit code and everything it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(args)
    return code, out.getvalue()


class World:
    """The run folder and a params file rewritten for each attempt (the server's URL, the cost cap)."""

    def __init__(self, root: Path) -> None:
        self.root, self.out = root, root / "run"
        self.params = root / "params" / "accounts.yaml"
        self.params.parent.mkdir(parents=True)

    def write(self, **llm) -> Path:
        raw = deep_merge(yaml.safe_load((REPO / "params/demo.yaml").read_text()), SMALL)
        raw["llm"].update(llm)
        self.params.write_text(yaml.safe_dump(raw))
        return self.params

    def attempt(self, server: FakeOpenAIServer, **llm) -> dict:
        """Notebook 02 once against `server`: exit code, printed text, the stage's summary and the server count."""
        before = server.total
        code, text = _cli(["run", str(self.write(base_url=server.url, **llm)), "--out", str(self.out), "--only", "02"])
        stage = json.loads((self.out / "run.json").read_text())["summary"]["abstraction"]
        return {"code": code, "text": text, "stage": stage, "account": stage["llm"], "requests": server.total - before}


@pytest.fixture(scope="module")
def attempts(tmp_path_factory) -> dict[str, dict]:
    """Five attempts of the LLM stage in one run folder (about 40 s), shared by this module's tests."""
    world = World(tmp_path_factory.mktemp("accounts"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "sk-test-accounts-0123456789")
        with FakeOpenAIServer() as plain:
            code, text = _cli(["run", str(world.write(base_url=plain.url)), "--out", str(world.out), "--only", "01"])
            assert code == 0, text
            # a cap above the estimate of everything (so the run starts) that a server whose tokens cost 20x the
            # chars/4 estimate passes after a few dozen requests
            params = load_params(world.params)
            dataset = CaptionDataset.load(world.out / "captions")
            estimate = check_budget(params, make_backend(params, world.out), None, dataset, world.out)
        done: dict[str, dict] = {}
        done["cap"] = round(1.5 * estimate["cost_usd"], 6)
        with FakeOpenAIServer(usage_factor=20) as dear:
            done["capped"] = world.attempt(dear, max_cost_usd=done["cap"])
        with FakeOpenAIServer(fault_every=3) as faulty:
            done["resumed"] = world.attempt(faulty)
        cache = world.out / "abstraction" / "cache.sqlite"
        done["rows_before_damage"] = _rows(cache)
        cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])  # a copy cut in the middle
        with FakeOpenAIServer() as plain:
            done["rebuilt"] = world.attempt(plain)
        done["rebuilt_notebook"] = (world.out / "notebooks" / "02_abstraction.ipynb").read_text()
        _overwrite_page(cache, page=_table_page(cache))
        with FakeOpenAIServer() as plain:
            done["refused"] = world.attempt(plain, max_cost_usd=1e-9)
        with FakeOpenAIServer() as refusing:
            refusing.echo_auth_status = 401
            done["fatal"] = world.attempt(refusing)
        done["run_dir"] = world.out
        done["params"] = world.params
    return done


def _rows(path: Path) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sound cache: no rebuild here
        with ResultCache(path) as cache:
            return cache.count()


def _table_page(path: Path, page_size: int = 4096) -> int:
    """The number of a page in the middle of the file that holds table rows (a b-tree leaf of a table, type 13),
    not index entries: overwriting it loses answers."""
    data = path.read_bytes()
    pages = len(data) // page_size
    return next(n for n in range(pages // 2, pages + 1) if data[(n - 1) * page_size] == 13)


def _overwrite_page(path: Path, page: int, page_size: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    start = (page - 1) * page_size
    data[start:start + page_size] = os.urandom(page_size)
    path.write_bytes(bytes(data))


def _adds_up(a: dict) -> bool:
    return a["adds_up"] and a["items"] == ITEMS == (a["cached"] + a["cached_failures"] + a["answered"] + a["failed"]
                                                   + a["never_asked"] + a["not_needed"])


def test_every_account_adds_up_and_its_requests_are_the_servers(attempts):
    """Capped, resumed on a faulty server, rebuilt, refused and fatal: each account adds up to images x levels,
    and its request count (retries included) is the server's own count, printed on the terminal."""
    for name in ("capped", "resumed", "rebuilt", "refused", "fatal"):
        a = attempts[name]["account"]
        assert _adds_up(a), (name, a)
        assert a["requests"]["http"] == attempts[name]["requests"], (name, a)
        assert f"; {attempts[name]['requests']} requests (" in attempts[name]["text"], name


def test_capped_run_says_it_stopped_and_how_to_resume(attempts):
    """The cost cap stops the run: the terminal says how many items were asked, how many never, what was spent,
    and the command that resumes; the spend stayed under the cap."""
    capped = attempts["capped"]
    a = capped["account"]
    assert capped["code"] == 1 and a["status"] == "stopped" and a["stopped_by"] == "llm.max_cost_usd"
    assert 0 < a["answered"] < ITEMS and a["never_asked"] > 0 and a["cached"] == 0
    assert (f"stopped (llm.max_cost_usd): {a['answered'] + a['failed']} of {ITEMS} asked (0 from the cache), "
            f"{a['never_asked']} never "
            f"asked, ${a['cost_usd']['spent']:.4f} spent; resume with: cglib run {attempts['params']} --out "
            f"{attempts['run_dir']} --only 02") in capped["text"]  # the run was --only 02
    assert a["cost_usd"]["spent"] <= attempts["cap"]


def test_resumed_run_on_a_faulty_server_counts_its_retries_and_repeats_nothing(attempts):
    """The resume answers the capped run's items from the cache and asks only the rest; the faults the server
    injected are retries by reason on the terminal, and every item ends answered."""
    capped, resumed = attempts["capped"]["account"], attempts["resumed"]["account"]
    assert resumed["status"] == "complete" and resumed["cached"] == capped["answered"]
    assert resumed["answered"] == ITEMS - capped["answered"] and resumed["failed"] == 0
    retries = resumed["requests"]["retries_by_reason"]
    assert resumed["requests"]["retries"] == sum(retries.values()) > 0
    assert {"rate_limited", "server_error", "invalid_json", "missing_fields"} <= set(retries)
    assert resumed["requests"]["http"] == resumed["requests"]["sent"] + resumed["requests"]["retries"]
    assert all(f"{k}: {v}" in attempts["resumed"]["text"] for k, v in retries.items())


def test_the_printed_resume_command_runs_what_was_asked_and_not_yet_done(attempts):
    """The capped attempt ran `--only 02`: its resume command runs notebook 02 again, not 02 onwards."""
    capped = attempts["capped"]
    command = f"cglib run {attempts['params']} --out {attempts['run_dir']} --only 02"
    assert capped["stage"]["resume"] == command and f"resume with: {command}\n" in capped["text"]


def test_resume_command_keeps_the_scope_of_the_run():
    """From the stopped stage's notebook on: the notebooks asked for (`--only`), or `--from` when that is all."""
    available = [f"{n:02d}" for n in range(10)]
    resume = resume_command("p.yaml", "out", ["00", "01", "02"], available)
    assert resume("02") == "cglib run p.yaml --out out --only 02"
    assert resume_command("p.yaml", "out", ["01", "02", "05"], available)("02") == \
        "cglib run p.yaml --out out --only 02,05"
    assert resume_command("p.yaml", "out", ["03", "05"], available)("02") == "cglib run p.yaml --out out --only 02,03,05"
    assert resume_command("p.yaml", "out", available[3:], available)("05") == "cglib run p.yaml --out out --from 05"
    assert resume_command("p.yaml", "out", available, available, "my/nbs")("02") == \
        "cglib run p.yaml --out out --notebooks my/nbs --from 02"
    assert resume_command("p.yaml", "out")("03") == "cglib run p.yaml --out out --from 03"  # scope unknown


def test_truncated_cache_keeps_what_is_readable_and_asks_only_the_rest(attempts):
    """A cache cut in half: the rows still readable are kept (most of them), the terminal and the summary say how
    many and what is left to ask with its estimated cost, and exactly the lost answers are asked again."""
    rebuilt = attempts["rebuilt"]
    a, info = rebuilt["account"], rebuilt["stage"]["cache_rebuilt"]
    assert rebuilt["code"] == 0 and a["status"] == "complete"
    assert attempts["rows_before_damage"] == ITEMS
    assert info["recovered"] >= 0.3 * ITEMS and a["cached"] == info["recovered"]  # every row is a chain item
    assert a["answered"] == ITEMS - info["recovered"] == rebuilt["requests"] <= info["to_ask"]
    assert f"new cache started with the {info['recovered']:,} answers still readable" in rebuilt["text"]
    assert f"{info['to_ask']:,} chain requests must be asked (again), about $" in rebuilt["text"]
    # no cap was set for this attempt: the message says so, and claims none
    assert "(no llm.max_cost_usd is set: nothing caps what they cost)" in rebuilt["text"]
    assert "within llm.max_cost_usd" not in rebuilt["text"]


def test_a_rebuild_that_would_pass_the_cap_stops_before_sending(attempts):
    """A damaged page, and a cap below the cost of asking its lost answers again: nothing is sent, the terminal
    says the cache was rebuilt, what it would ask, and that the stage stopped on llm.max_cost_usd."""
    refused = attempts["refused"]
    a, info = refused["account"], refused["stage"]["cache_rebuilt"]
    assert refused["code"] == 1 and refused["requests"] == 0 and a["stopped_by"] == "llm.max_cost_usd"
    assert 0 < info["to_ask"] < ITEMS / 2 and info["recovered"] > ITEMS / 2  # one page lost, the rest kept
    assert a["never_asked"] == ITEMS and "cache rebuilt:" in refused["text"]
    assert "passes llm.max_cost_usd ($0.0000), so nothing was sent" in refused["text"]


def test_fatal_error_over_an_earlier_result_names_the_other_attempt(attempts):
    """A server refusing the key after a complete attempt: this attempt's account counts its refused requests
    as failures (fatal_error) and the rest as never asked; chains.jsonl on disk is named as the earlier
    attempt's (its time, status and chains), not added to this one."""
    fatal = attempts["fatal"]
    a = fatal["account"]
    assert fatal["code"] == 1 and a["stopped_by"] == "fatal_error"
    assert a["failed_by_reason"] == {"fatal_error": a["failed"]} and 0 < a["failed"] <= 4  # llm.concurrency
    assert a["answered"] == 0 and a["cached"] > 0
    other = fatal["stage"]["other_files"]["chains.jsonl"]
    assert other["status"] == "complete" and other["chains"] == 104
    assert f"chains.jsonl on disk is from another attempt (started {other['started']}, complete, 104 chains)" \
        in fatal["text"]
    assert fatal["stage"]["kept"] == 0
    # the stop's reason is a closed phrase; the server's whole message is a line of its own
    line = next(x for x in fatal["text"].splitlines() if x.strip().startswith("abstraction"))
    assert line.endswith("failed 1 (stopped by fatal_error: 1)"), line
    assert "why: the server refused the request (HTTP 401: " in fatal["text"]


def test_notebook_shows_the_account_and_the_rebuilt_cache(attempts):
    """The executed notebook 02 of the rebuilt attempt says how many answers were recovered and what is left to
    ask, and its summary table shows the account that adds up."""
    notebook, info = attempts["rebuilt_notebook"], attempts["rebuilt"]["stage"]["cache_rebuilt"]
    assert f"new cache started with the {info['recovered']:,} answers still readable" in notebook
    assert f"{info['to_ask']:,} chain requests must be asked (again)" in notebook
    assert f"{info['recovered']:,} / 0" in notebook  # cached answers / cached failures
    assert f"{ITEMS - info['recovered']:,} / 0" in notebook  # answered / failed


def test_salvage_keeps_most_rows_of_a_truncated_file_and_of_a_corrupted_page(tmp_path):
    """Row by row: a cache of 2,000 rows (some longer than a page) cut at 60% keeps the rows before the cut; one
    overwritten page in the middle loses only that page's rows; values come back exactly."""
    def make(path: Path) -> dict[str, str]:
        rows = {}
        with ResultCache(path) as cache:
            for i in range(2000):
                value = f"concept {i}" + ("!" * 6000 if i % 100 == 0 else "")  # every 100th on overflow pages
                cache.put(f"{i:064x}", "concept", "openai", "m", "v1", Outcome(ok=True, value=value, input_tokens=i),
                          commit=False)
                rows[f"{i:064x}"] = value
            cache.commit()
        return rows

    for damage in ("truncate", "page"):
        path = tmp_path / damage / "cache.sqlite"
        path.parent.mkdir()
        rows = make(path)
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[: int(path.stat().st_size * 0.6)])
        else:
            _overwrite_page(path, page=path.stat().st_size // 4096 // 2)
        with pytest.warns(CacheRebuiltWarning, match="answers still readable"):
            cache = ResultCache(path)
        kept = cache.get_many(list(rows))
        cache.close()
        assert len(kept) >= (0.5 if damage == "truncate" else 0.97) * len(rows), (damage, len(kept))
        assert all(out.value == rows[key] and out.input_tokens == int(key, 16) for key, out in kept.items())


def test_status_shows_the_last_attempts_account(attempts):
    """`cglib status RUN_DIR` reads the stages now and prints the same account as the run's last attempt."""
    code, text = _cli(["status", str(attempts["run_dir"])])
    a = attempts["fatal"]["account"]
    assert code == 1 and f"LLM: {ITEMS} items = {a['cached']} cached + " in text  # the run failed: exit 1
    assert (f"stopped (fatal_error): {a['cached'] + a['failed']} of {ITEMS} asked ({a['cached']} from the cache), "
            f"{a['never_asked']} never asked") in text
