"""The OpenAI Batch API path of the `openai` backend (llm.batch_api): half price, results within 24 h.

Per call (one level of the chains, or the generalized captions): write JSONL request files (at most
llm.batch_max_requests lines, llm.batch_max_bytes bytes and llm.batch_max_enqueued_tokens estimated input
tokens each; one model per file), upload them, create batches (completion_window 24h), keep at most
llm.batch_max_enqueued_tokens enqueued at once (the per-model enqueued-token limit binds first), poll every
llm.batch_poll_s, download output and error files, and validate every reply exactly like a live one.
Items missing from the results (expired or failed batches), 429/5xx items and bad replies go into the next
round, up to llm.max_retries (transport) and llm.max_bad_reply_retries (bad replies); then they are
recorded as failures. Each result is reported (and cached) as its batch is collected.

Resumable: `state.json` beside the request files lists every batch created. A run killed while batches are
in flight re-attaches to them on restart (it polls the same batches instead of paying twice).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cglib.llm.base import Job, Outcome, Report, estimate_tokens
from cglib.llm.replies import ReplyError, check_message, message_of
from cglib.run import write_json


class BatchBackend(Protocol):
    """What a batch job uses of its backend (`cglib.llm.openai_backend.OpenAIBackend`, which imports this module:
    a Protocol instead of that import keeps the two free of a cycle)."""

    client: Any
    llm: Any
    budget: Any


ENDPOINT = "/v1/chat/completions"
FINISHED = ("completed", "failed", "expired", "cancelled")


@dataclass
class RequestFile:
    """One JSONL request file: its path, the custom ids in it and its estimated input tokens."""

    path: Path
    ids: list[str]
    tokens: int


@dataclass
class _Item:
    """Per-job accounting across rounds."""

    acc: Outcome = field(default_factory=lambda: Outcome(ok=False))
    transport: int = 0
    bad: int = 0


class BatchRunner:
    """Runs jobs through the Batch API, round after round, reporting each outcome when its batch is collected."""

    def __init__(self, backend: BatchBackend, work_dir: Path | None) -> None:
        if work_dir is None:
            raise ValueError("the Batch API needs a work directory for its request files")
        self.backend = backend
        self.llm = backend.llm
        self.dir = Path(work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.dir / "state.json"

    # ------------------------------------------------------------------------------------------ state
    def load_state(self) -> list[dict]:
        """Batches created by this run directory so far: batch id, request file, collected or not."""
        if not self.state_path.is_file():
            return []
        return json.loads(self.state_path.read_text(encoding="utf-8"))["batches"]

    def save_state(self, batches: list[dict]) -> None:
        write_json(self.state_path, {"batches": batches})

    # ------------------------------------------------------------------------------------------ files
    def write_files(self, jobs: list[Job]) -> list[RequestFile]:
        """Split jobs into request files within the request, byte and token limits (deterministic names)."""
        files: list[RequestFile] = []
        lines: list[str] = []
        ids: list[str] = []
        size = tokens = 0

        def flush() -> None:
            nonlocal lines, ids, size, tokens
            if not lines:
                return
            blob = "".join(lines).encode("utf-8")
            path = self.dir / f"requests-{hashlib.sha256(blob).hexdigest()[:16]}.jsonl"
            path.write_bytes(blob)
            files.append(RequestFile(path, ids, tokens))
            lines, ids, size, tokens = [], [], 0, 0

        for job in sorted(jobs, key=lambda j: j.key):
            line = json.dumps({"custom_id": job.key, "method": "POST", "url": ENDPOINT, "body": job.payload},
                              ensure_ascii=False) + "\n"
            n_bytes, n_tokens = len(line.encode("utf-8")), estimate_tokens(job.payload)
            if lines and (len(lines) >= self.llm.batch_max_requests or size + n_bytes > self.llm.batch_max_bytes
                          or tokens + n_tokens > self.llm.batch_max_enqueued_tokens):
                flush()
            lines.append(line)
            ids.append(job.key)
            size += n_bytes
            tokens += n_tokens
        flush()
        return files

    @staticmethod
    def file_ids(path: Path) -> list[str]:
        return [json.loads(line)["custom_id"] for line in path.read_text(encoding="utf-8").splitlines() if line]

    # ------------------------------------------------------------------------------------------ running
    async def run(self, jobs: list[Job], report: Report) -> None:
        """Answer every job through batches, in rounds, until done or out of retries."""
        client = self.backend.client()
        pending = {j.key: j for j in jobs}
        items = {j.key: _Item() for j in jobs}
        rounds = self.llm.max_retries + self.llm.max_bad_reply_retries + 1
        budget = self.backend.budget
        try:
            for round_no in range(rounds):
                if not pending:
                    break
                attached = self._attachable(set(pending)) if round_no == 0 else []
                covered = {i for entry in attached for i in self.file_ids(self.dir / entry["file"])}
                files = self.write_files([j for k, j in pending.items() if k not in covered])
                results = await self._submit_and_collect(client, files, attached)
                stopped = budget is not None and budget.stopped
                for key in list(pending):
                    if stopped and key not in results:
                        continue  # never submitted: llm.max_cost_usd stopped the run (the engine says so)
                    outcome = self._judge(pending[key], items[key], results.get(key))
                    if outcome is not None:
                        report(pending.pop(key), outcome)
                if stopped:
                    return
        finally:
            await client.close()
        for key, job in pending.items():  # out of rounds
            acc = items[key].acc
            report(job, _final(acc, Outcome.failure(acc.reason or "batch_expired", acc.detail, acc.raw,
                                                    cacheable=acc.cacheable)))

    def _attachable(self, pending: set[str]) -> list[dict]:
        """Uncollected batches of an earlier, interrupted run that hold pending items."""
        out = []
        for entry in self.load_state():
            path = self.dir / entry["file"]
            if not entry.get("collected") and path.is_file() and pending & set(self.file_ids(path)):
                out.append(entry)
        return out

    async def _submit_and_collect(self, client: Any, files: list[RequestFile], attached: list[dict]) -> dict:
        """Submit files (within the enqueued-token limit), poll, and return custom_id -> result line."""
        queue = list(files)
        in_flight: dict[str, RequestFile] = {}
        for entry in attached:
            path = self.dir / entry["file"]
            ids = self.file_ids(path)
            in_flight[entry["batch_id"]] = RequestFile(path, ids, 0)
        results: dict[str, dict] = {}
        budget = self.backend.budget
        reserved: dict[str, int] = {}
        while queue or in_flight:
            enqueued = sum(f.tokens for f in in_flight.values())
            while queue and (not in_flight or enqueued + queue[0].tokens <= self.llm.batch_max_enqueued_tokens):
                if budget is not None and not budget.reserve(len(queue[0].ids)):
                    queue.clear()  # llm.max_cost_usd: submit nothing more, collect what is in flight
                    break
                rf = queue.pop(0)
                batch_id = await self._submit(client, rf)
                in_flight[batch_id] = rf
                reserved[batch_id] = len(rf.ids) if budget is not None else 0
                enqueued += rf.tokens
            if not in_flight:
                break
            await asyncio.sleep(self.llm.batch_poll_s)
            for batch_id in list(in_flight):
                batch = await client.batches.retrieve(batch_id)
                if batch.status in FINISHED:
                    results.update(await self._collect(client, batch, in_flight.pop(batch_id)))
                    self._mark_collected(batch_id)
                    if budget is not None:
                        budget.release(reserved.pop(batch_id, 0))
        return results

    async def _submit(self, client: Any, rf: RequestFile) -> str:
        uploaded = await client.files.create(file=(rf.path.name, rf.path.read_bytes(), "application/jsonl"),
                                             purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h",
                                            metadata={"source": "cglib", "file": rf.path.name})
        state = self.load_state()
        state.append({"batch_id": batch.id, "file": rf.path.name, "input_file_id": uploaded.id, "collected": False})
        self.save_state(state)  # at once: a run killed now re-attaches instead of paying again
        return batch.id

    def _mark_collected(self, batch_id: str) -> None:
        state = self.load_state()
        for entry in state:
            if entry["batch_id"] == batch_id:
                entry["collected"] = True
        self.save_state(state)

    async def _collect(self, client: Any, batch: Any, rf: RequestFile) -> dict[str, dict]:
        """Result lines of a finished batch; items without a line are marked expired or failed."""
        lines: dict[str, dict] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            content = await client.files.content(file_id)
            for text in content.text.splitlines():
                if text.strip():
                    row = json.loads(text)
                    lines[row["custom_id"]] = row
        missing_reason = "batch_failed" if batch.status == "failed" else "batch_expired"
        errors = getattr(batch, "errors", None)
        detail = f"batch {batch.id} {batch.status}" + (f": {errors}" if errors else "")
        for i in rf.ids:
            lines.setdefault(i, {"custom_id": i, "cglib_missing": missing_reason, "detail": detail})
        return lines

    def _judge(self, job: Job, item: _Item, line: dict | None) -> Outcome | None:
        """The final outcome of a job after this round, or None to try it again next round."""
        acc = item.acc
        if line is None or "cglib_missing" in line:
            reason = line["cglib_missing"] if line else "batch_expired"
            return self._transport(item, reason, (line or {}).get("detail", ""))
        acc.requests += 1
        response = line.get("response") or {}
        status = int(response.get("status_code") or 0)
        body = response.get("body") or {}
        if status == 200:
            msg = message_of(body)
            acc.input_tokens += msg.input_tokens
            acc.output_tokens += msg.output_tokens
            if self.backend.budget is not None:
                self.backend.budget.add(msg.input_tokens, msg.output_tokens)
            try:
                value = check_message(msg, job.task, self.llm.max_reply_chars)
            except ReplyError as err:
                item.bad += 1
                acc.reason, acc.detail, acc.raw, acc.cacheable = err.reason, err.detail, err.raw, True
                if item.bad > self.llm.max_bad_reply_retries:
                    return _final(acc, Outcome.failure(err.reason, err.detail, err.raw))
                acc.retries[err.reason] += 1
                return None
            return _final(acc, Outcome(ok=True, value=value, raw=msg.content, meta={"batch": True}))
        error = body.get("error") if isinstance(body, dict) else None
        detail = json.dumps(error or line.get("error") or {})[:300]
        if status == 429 or status >= 500 or status in (408, 409) or status == 0:
            return self._transport(item, "rate_limited" if status == 429 else "server_error", detail)
        return _final(acc, Outcome.failure("bad_request", f"HTTP {status}: {detail}"))

    def _transport(self, item: _Item, reason: str, detail: str) -> Outcome | None:
        acc = item.acc
        acc.reason, acc.detail, acc.cacheable = reason, detail, False
        if item.transport >= self.llm.max_retries:
            return _final(acc, Outcome.failure(reason, detail, cacheable=False))
        item.transport += 1
        acc.retries[reason] += 1
        return None


def _final(acc: Outcome, final: Outcome) -> Outcome:
    final.requests, final.input_tokens, final.output_tokens = acc.requests, acc.input_tokens, acc.output_tokens
    final.retries = +acc.retries
    return final
