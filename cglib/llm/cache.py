"""Persistent result cache: SQLite in WAL mode, one row per request key, committed as each result arrives.

The key is the hash of (backend, model, prompt version, exact request), so changing any of them asks again,
and a run killed at any point restarts without repeating a finished request. Rows hold the parsed value or
the failure reason with the raw reply, and the tokens the answer cost. Reply failures (invalid JSON,
refusal, ...) that reproduced within the run are cached, because at temperature 0 asking again gives the same
answer (llm.retry_failed asks again anyway); a bad reply that changed between attempts, and transport
failures (429/5xx/timeouts/cut bodies after all retries), are never cached: a later run asks again.
Durability: WAL with synchronous=NORMAL survives a killed process (not a power cut) at thousands of
commits per second. A cache file that is not a readable SQLite database of this schema (a power cut, a disk
error, another file copied over it) is moved aside as `<name>.corrupt-<timestamp>` (with its -wal/-shm
files) and a new cache is started with every row still readable in the old file (`cglib.llm.salvage`, page by
page), with a CacheRebuiltWarning naming both paths and the rows recovered: the run asks again only for the
answers that were lost, and nothing else in the run folder is touched. `rebuilt` records what happened for the
stage's summary, which adds how many requests the run still has to make and their estimated cost.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any, Self

from cglib.llm.base import Outcome
from cglib.llm.salvage import salvage_rows
from cglib.run import own_copy

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_version TEXT,
    ok INTEGER NOT NULL,
    value TEXT,
    reason TEXT,
    detail TEXT,
    raw TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    meta TEXT,
    created REAL NOT NULL
)
"""


COLUMNS = ("key", "kind", "backend", "model", "prompt_version", "ok", "value", "reason", "detail", "raw",
           "input_tokens", "output_tokens", "meta", "created")


class CacheRebuiltWarning(UserWarning):
    """The cache file was unreadable: it was moved aside and an empty cache started in its place."""


class ResultCache:
    """Results by request key in one SQLite file; use from one thread (the engine's event loop thread)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rebuilt: dict[str, Any] | None = None  # set when a damaged file was replaced (see the module doc)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = _open(self.path)
        except sqlite3.OperationalError:  # locked, read-only, disk full: not corruption; say so as it is
            raise
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            moved = move_aside(self.path)
            self.conn = _open(self.path)
            rows = salvage_rows(moved)
            self.conn.executemany(f"INSERT OR REPLACE INTO results VALUES ({','.join('?' * len(COLUMNS))})", rows)
            self.conn.commit()
            self.rebuilt = {"path": str(self.path), "moved_to": str(moved), "error": str(exc),
                            "recovered": len(rows)}
            warnings.warn(rebuilt_message(self.rebuilt) + " (delete the moved file once you no longer need it)",
                          CacheRebuiltWarning, stacklevel=2)

    def get_many(self, keys: list[str]) -> dict[str, Outcome]:
        """Cached outcomes of the given keys (missing keys are absent)."""
        found: dict[str, Outcome] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):  # SQLite's bound-parameter limit
            chunk = unique[start:start + 500]
            rows = self.conn.execute(
                "SELECT key, ok, value, reason, detail, raw, input_tokens, output_tokens, meta FROM results "
                f"WHERE key IN ({','.join('?' * len(chunk))})", chunk)
            for key, ok, value, reason, detail, raw, tin, tout, meta in rows:
                found[key] = Outcome(ok=bool(ok), value=None if value is None else json.loads(value), reason=reason,
                                     detail=detail or "", raw=raw, input_tokens=tin, output_tokens=tout,
                                     meta=json.loads(meta) if meta else {})
        return found

    def put(self, key: str, kind: str, backend: str, model: str, prompt_version: str | None, outcome: Outcome,
            commit: bool = True) -> None:
        """Store one outcome (replacing an older row for the key) and commit it at once."""
        self.conn.execute(
            "INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (key, kind, backend, model, prompt_version, int(outcome.ok),
             None if outcome.value is None else json.dumps(outcome.value, ensure_ascii=False), outcome.reason,
             outcome.detail, outcome.raw, outcome.input_tokens, outcome.output_tokens,
             json.dumps(outcome.meta, ensure_ascii=False) if outcome.meta else None, time.time()))
        if commit:
            self.conn.commit()

    def commit(self) -> None:
        self.conn.commit()

    def count(self, **where: Any) -> int:
        """Number of rows, optionally filtered by column values (e.g. ok=1, kind='concept')."""
        clause = " AND ".join(f"{k} = ?" for k in where)
        sql = "SELECT COUNT(*) FROM results" + (f" WHERE {clause}" if clause else "")
        return int(self.conn.execute(sql, tuple(where.values())).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path) -> sqlite3.Connection:
    """Connect, set WAL, create the table, and check the file is a sound cache (DatabaseError otherwise)."""
    conn = sqlite3.connect(own_copy(path), timeout=30.0)  # a linked run's cache: answers copied, then its own
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(SCHEMA)
        conn.commit()
        columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(results)"))
        if columns != COLUMNS:
            raise sqlite3.DatabaseError(f"table 'results' has columns {columns}, not a cglib LLM cache")
        # Reads every page once (about 0.1 s per 100 MB): a damaged page fails here, not in the middle of a run.
        problem = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {problem}")
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def rebuilt_message(rebuilt: dict[str, Any]) -> str:
    """One line on a rebuilt cache: the damage, where the old file went, the answers recovered and, once the
    engine has estimated it, what must be asked again."""
    error = " ".join(str(rebuilt["error"]).split())  # SQLite's integrity report spans lines
    text = (f"the LLM cache {rebuilt['path']} is corrupted ({error}); it was moved to "
            f"{rebuilt['moved_to']} and a new cache started with the {rebuilt['recovered']:,} answers still "
            "readable in it")
    if rebuilt.get("to_ask") is not None:
        text += (f"; {rebuilt['to_ask']:,} chain requests must be asked (again), about "
                 f"${rebuilt['to_ask_cost_usd']:.4f}")
        if "max_cost_usd" in rebuilt:  # recorded since the cap is named here
            cap = rebuilt["max_cost_usd"]
            if cap is None:
                text += " (no llm.max_cost_usd is set: nothing caps what they cost)"
            elif rebuilt["run_estimate_usd"] > cap:
                text += (f"; with the rest of the run (about ${rebuilt['run_estimate_usd']:.4f}) that passes "
                         f"llm.max_cost_usd (${cap:.4f}), so nothing was sent")
            else:
                text += f", within llm.max_cost_usd (${cap:.4f})"
    return text


def move_aside(path: Path) -> Path:
    """Rename `path` (and its -wal/-shm files) to `<name>.corrupt-<UTC timestamp>`; returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while moved.exists():
        n += 1
        moved = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.replace(moved)
    for suffix in ("-wal", "-shm"):  # moved beside it, so `sqlite3 <moved>` still sees its journal
        side = Path(f"{path}{suffix}")
        if side.exists():
            side.replace(Path(f"{moved}{suffix}"))
    return moved
