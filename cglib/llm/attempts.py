"""Every attempt of the abstraction stage on record (`abstraction/attempts.jsonl`), a killed one included.

An attempt writes its line when it starts (status "running", its process, its cache) and rewrites that line in
place after every answer, failure and cache lookup with what it has so far (`progress`: answered, failed,
cached, requests, tokens, dollars spent), so an attempt killed with SIGKILL is on record with what it got before
the kill: its line still says "running", and `load_attempts` reads it as "interrupted" once its process is gone.
At its end the line is replaced by the attempt's full account (status complete or stopped).

In place: the running line is padded with spaces to a fixed width, and each update is one write of that many bytes
at the line's offset (a single system call, which a killed process never leaves half done), so the file always
holds whole JSON lines (trailing spaces are whitespace to a JSON reader). The answers themselves are in the cache,
committed before they are counted here: a kill between the two leaves one answer cached but not on the killed
attempt's line (the next attempt counts it among its cached answers).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from cglib.run import own_copy, runner_gone, runner_identity, write_text_atomic

ATTEMPTS_FILE = "attempts.jsonl"
RUNNING = "running"
INTERRUPTED = "interrupted"
LINE_WIDTH = 4096  # bytes of a running line (its JSON and the padding); a longer record rewrites the file


class AttemptLog:
    """This attempt's line in `<out_dir>/attempts.jsonl`: appended at the start, updated in place as it goes,
    replaced by the final record at the end."""

    def __init__(self, out_dir: Path, record: dict[str, Any]) -> None:
        self.path = own_copy(Path(out_dir) / ATTEMPTS_FILE)  # a linked run's record: copied, then its own
        self.record = {**record, "status": RUNNING, "process": runner_identity(), "progress": {}}
        self.width = LINE_WIDTH
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as fh:
            if fh.tell() and not self._ends_with_newline():
                fh.write(b"\n")  # a line a crash of an older cglib left unfinished stays a line of its own
            self.offset = fh.tell()
            fh.write(self._padded())

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def _padded(self) -> bytes:
        line = json.dumps(self.record, ensure_ascii=False).encode("utf-8")
        while len(line) + 1 > self.width:
            self.width *= 2
        return line + b" " * (self.width - len(line) - 1) + b"\n"

    def update(self, progress: dict[str, Any]) -> None:
        """Record what the attempt has got so far: one write over its line (the whole file, when it grew)."""
        self.record["progress"] = progress
        width = self.width
        line = self._padded()
        if self.width != width:  # the record outgrew its line: rewrite the file with a wider one
            self._replace(line)
            return
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, line, self.offset)
        finally:
            os.close(fd)

    def finish(self, final: dict[str, Any]) -> None:
        """Replace the running line by the attempt's final record (unpadded, its last progress kept), atomically."""
        self.record = {**self.record, **final}
        self._replace(json.dumps(self.record, ensure_ascii=False).encode("utf-8") + b"\n")

    def _replace(self, line: bytes) -> None:
        data = self.path.read_bytes()
        end = data.index(b"\n", self.offset) + 1
        write_text_atomic(self.path, (data[:self.offset] + line + data[end:]).decode("utf-8"))


def load_attempts(out_dir: Path) -> list[dict[str, Any]]:
    """The stage's attempts, oldest first (attempts.jsonl). A "running" attempt whose process is gone is read as
    "interrupted" (killed, with what it recorded before the kill); an unreadable line is kept as such."""
    path = Path(out_dir) / ATTEMPTS_FILE
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"status": "unreadable line of attempts.jsonl"}
            if row.get("status") == RUNNING and runner_gone(row.get("process") or {}):
                row["status"] = INTERRUPTED
            rows.append(row)
    return rows


def cached_answers(path: str | Path | None) -> int | None:
    """The concept answers in the cache at `path`, counted read-only (nothing is created or repaired); None when
    there is no readable cache there."""
    if path is None or not Path(path).is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        return int(conn.execute("SELECT COUNT(*) FROM results WHERE kind = 'concept' AND ok = 1").fetchone()[0])
    except sqlite3.Error:
        return None
    finally:
        conn.close()
