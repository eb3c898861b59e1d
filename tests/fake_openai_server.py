"""A small OpenAI-compatible server on 127.0.0.1 for tests and benchmarks (the real openai client talks to it).

Implements POST /v1/chat/completions, POST /v1/files (multipart), GET /v1/files/{id}/content, POST /v1/batches
and GET /v1/batches/{id}. Replies are deterministic JSON derived from the prompt: a concept reply is
{"concept": "topic <6 hex digits of the hash of the last user message>"}, a generalized-captions reply (the
last user message mentions "generalized captions") has the number of captions asked for.

Faults are scheduled per input (the hash of the request's messages), by markers in the last user message,
so they do not depend on request order: "[[fault:429,500,nonjson*3]]" makes the 1st attempt of that input
a 429, the 2nd a 500, the 3rd-5th non-JSON replies, and later attempts normal. Kinds: 429 (Retry-After:
`retry_after` seconds), 429ms (retry-after-ms: `retry_after_ms`), quota (429 insufficient_quota), 500, 503,
timeout (sleep `timeout_sleep_s` before answering), nonjson, missing (a JSON object without the field),
empty, long (5,000 characters), length (cut reply, finish_reason "length"), refusal, badbody (HTTP 200 whose
JSON body is cut in the middle), html (HTTP 200 with an HTML page, Content-Type text/html). "[[copy]]" answers
with the first few-shot answer of the conversation (a verbatim copy). In batches, "[[batch:expire]]" leaves
the input out of its first batch (batch status "expired") and "[[batch:error]]" puts a 500 for it in the
error file the first time. `latency_s` is added to every chat request; `usage_factor` scales
the token usage reported (a server whose tokens cost more than the chars/4 estimate).

Counters: `counts` (requests per input), `attempt_times`, `max_in_flight`, `auth_headers`, `batch_ids`,
`last_body`; `answered` (per input, HTTP 200 replies written out whole to a client still connected) and
`asked_again` (requests for an input already answered: what a client that lost answers pays twice). `echo_auth_status` (e.g. 401) answers every chat request with that status and an error message
that echoes the request's Authorization header, as some servers do.
Run standalone for benchmarks: `python tests/fake_openai_server.py --latency 0.1` prints the base URL.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import select
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

# what `fault_every` injects, in turn: transient HTTP faults and malformed replies, each recoverable by a retry
FAULT_CYCLE = ("429", "500", "nonjson", "503", "missing", "badbody")
FAULT = re.compile(r"\[\[fault:([^\]]+)\]\]")


def input_key(messages: list[dict]) -> str:
    """The server's identity of a request: hash of its messages."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def _faults(text: str) -> list[str]:
    kinds: list[str] = []
    for spec in FAULT.findall(text):
        for part in spec.split(","):
            name, _, times = part.strip().partition("*")
            kinds += [name] * int(times or 1)
    return kinds


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # many clients connect at once at high concurrency

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionResetError):  # a killed client: expected, not news
            super().handle_error(request, client_address)


class FakeOpenAIServer:
    """Threaded fake server; use as a context manager; `url` is the base URL for the openai client."""

    def __init__(self, latency_s: float = 0.0, retry_after: str = "0.05", retry_after_ms: str = "300",
                 timeout_sleep_s: float = 3.0, batch_delay_s: float = 0.0, port: int = 0,
                 usage_factor: float = 1.0, answer: Callable[[str], dict | None] | None = None,
                 fault_every: int = 0) -> None:
        self.answer = answer  # last user message -> reply object (None: the default hash reply)
        # every `fault_every`-th input (by hash) meets one fault on its first attempt, kinds in FAULT_CYCLE
        self.fault_every = fault_every
        self.latency_s, self.retry_after, self.retry_after_ms = latency_s, retry_after, retry_after_ms
        self.usage_factor = usage_factor  # reported tokens = this x (characters / 4): a pricier tokenizer
        self.timeout_sleep_s, self.batch_delay_s = timeout_sleep_s, batch_delay_s
        self.echo_auth_status: int | None = None
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.answered: Counter = Counter()
        self.asked_again = 0
        self.batch_counts: Counter = Counter()
        self.attempt_times: dict[str, list[float]] = defaultdict(list)
        self.auth_headers: set[str] = set()
        self.last_body: dict | None = None
        self.in_flight = self.max_in_flight = self.total = 0
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.batch_ids: dict[str, list[str]] = {}  # batch id -> custom ids submitted
        self.httpd = _HTTPServer(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # --------------------------------------------------------------------------------------- replies
    def chat(self, body: dict, in_batch: bool = False) -> tuple[int, dict, dict]:
        """(status, headers, JSON body) of one chat completion, applying the input's fault schedule."""
        messages = body["messages"]
        key = input_key(messages)
        self.last_body = body
        last = messages[-1]["content"]
        with self.lock:
            self.asked_again += 1 if self.answered[key] else 0
            self.counts[key] += 1
            attempt = self.counts[key] - 1
            self.attempt_times[key].append(time.monotonic())
        faults = _faults(last) or self._scheduled_faults(key)
        fault = faults[attempt] if attempt < len(faults) else None
        if fault == "429":
            return 429, {"Retry-After": self.retry_after}, _error("Rate limit reached", "requests",
                                                                  "rate_limit_exceeded")
        if fault == "429ms":
            return 429, {"retry-after-ms": self.retry_after_ms}, _error("Rate limit reached", "requests",
                                                                        "rate_limit_exceeded")
        if fault == "quota":
            return 429, {}, _error("You exceeded your current quota", "insufficient_quota", "insufficient_quota")
        if fault in ("500", "503"):
            return int(fault), {}, _error("The server had an error", "server_error", None)
        if fault == "timeout" and not in_batch:
            time.sleep(self.timeout_sleep_s)
        if fault == "badbody" and not in_batch:
            return 200, {"Content-Type": "application/json"}, b'{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [{"index'
        if fault == "html" and not in_batch:
            return 200, {"Content-Type": "text/html"}, b"<html><body>502 Bad Gateway</body></html>"
        digest = hashlib.sha256(last.encode()).hexdigest()[:6]
        answered = self.answer(last) if self.answer is not None else None
        if answered is not None:
            content: str | None = json.dumps(answered)
        elif "generalized captions" in last:
            found = re.search(r"Write (\d+) generalized captions", last)
            n = int(found.group(1)) if found else 3
            content = json.dumps({"captions": [f"generalized caption {i} of group {digest}"
                                                           for i in range(n)]})
        else:
            content = json.dumps({"concept": f"topic {digest}"})
        refusal, finish = None, "stop"
        if "[[copy]]" in last:
            content = next((m["content"] for m in messages if m["role"] == "assistant"), content)
        if fault == "nonjson":
            content = "I think the concept here is a birthday party."
        elif fault == "missing":
            content = json.dumps({"idea": "party"})
        elif fault == "empty":
            content = ""
        elif fault == "long":
            content = json.dumps({"concept": "x" * 5000})
        elif fault == "length":
            content, finish = content[: len(content) // 2], "length"
        elif fault == "refusal":
            content, refusal = None, "I can't help with that."
        prompt_chars = sum(len(m["content"] or "") for m in messages)
        usage = {"prompt_tokens": int(self.usage_factor * prompt_chars // 4),
                 "completion_tokens": int(self.usage_factor * (len(content or "") // 4 + 1))}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return 200, {}, {"id": f"chatcmpl-{key}-{attempt}", "object": "chat.completion", "created": int(time.time()),
                         "model": body.get("model", "fake"), "usage": usage,
                         "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                                      "message": {"role": "assistant", "content": content, "refusal": refusal}}]}

    def _scheduled_faults(self, key: str) -> list[str]:
        """One fault on the first attempt of every `fault_every`-th input (chosen by hash, so order-free)."""
        if not self.fault_every:
            return []
        value = int(key, 16)
        if value % self.fault_every:
            return []
        return [FAULT_CYCLE[(value // self.fault_every) % len(FAULT_CYCLE)]]

    # --------------------------------------------------------------------------------------- batches
    def create_batch(self, body: dict) -> dict:
        batch_id = f"batch_{len(self.batches) + 1}"
        lines = [json.loads(x) for x in self.files[body["input_file_id"]].decode().splitlines() if x.strip()]
        batch = {"id": batch_id, "object": "batch", "endpoint": body["endpoint"],
                 "input_file_id": body["input_file_id"], "completion_window": body["completion_window"],
                 "status": "in_progress", "created_at": int(time.time()), "output_file_id": None,
                 "error_file_id": None, "errors": None, "metadata": body.get("metadata"),
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0}}
        with self.lock:
            self.batches[batch_id] = batch
            self.batch_ids[batch_id] = [x["custom_id"] for x in lines]
        threading.Thread(target=self._process_batch, args=(batch, lines), daemon=True).start()
        return batch

    def _process_batch(self, batch: dict, lines: list[dict]) -> None:
        time.sleep(self.batch_delay_s)
        out, err, expired = [], [], False
        for line in lines:
            last = line["body"]["messages"][-1]["content"]
            key = input_key(line["body"]["messages"])
            with self.lock:
                self.batch_counts[key] += 1
                first = self.batch_counts[key] == 1
            if first and "[[batch:expire]]" in last:
                expired = True
                continue
            if first and "[[batch:error]]" in last:
                status, reply = 500, _error("batch item failed", "server_error", None)
            else:
                status, _, reply = self.chat(line["body"], in_batch=True)
            row = {"id": f"resp-{key}", "custom_id": line["custom_id"], "error": None,
                   "response": {"status_code": status, "request_id": key, "body": reply}}
            (out if status == 200 else err).append(json.dumps(row))
        with self.lock:
            for name, rows in (("output_file_id", out), ("error_file_id", err)):
                if rows:
                    file_id = f"file-{len(self.files) + 1}"
                    self.files[file_id] = ("\n".join(rows) + "\n").encode()
                    batch[name] = file_id
            batch["request_counts"] = {"total": len(lines), "completed": len(out), "failed": len(err)}
            batch["status"] = "expired" if expired else "completed"

    # --------------------------------------------------------------------------------------- HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client reuses connections

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: Any, headers: dict | None = None, raw: bytes | None = None) -> bool:
                """Write the response; False when the client had gone."""
                data = raw if raw is not None else json.dumps(payload).encode()
                headers = dict(headers or {})
                kind = headers.pop("Content-Type", "application/json" if raw is None else "application/octet-stream")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    return False
                return True

            def _client_gone(self) -> bool:
                """Whether the client closed the connection while its request was served (a killed process):
                a reply written now is never read."""
                if not select.select([self.connection], [], [], 0)[0]:
                    return False
                try:
                    return self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:
                raw = self._body()
                with server.lock:
                    server.auth_headers.add(self.headers.get("Authorization", ""))
                if self.path == "/v1/chat/completions":
                    with server.lock:
                        server.in_flight += 1
                        server.total += 1
                        server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    key = None
                    try:
                        if server.latency_s:
                            time.sleep(server.latency_s)
                        if server.echo_auth_status is not None:
                            auth = self.headers.get("Authorization", "")
                            status, headers, payload = server.echo_auth_status, {}, _error(
                                f"Incorrect API key provided: {auth}. You can find your API key at "
                                "https://platform.openai.com/account/api-keys.", "invalid_request_error",
                                "invalid_api_key")
                        else:
                            body = json.loads(raw)
                            key = input_key(body["messages"])
                            status, headers, payload = server.chat(body)
                    finally:
                        with server.lock:
                            server.in_flight -= 1
                    gone = self._client_gone()
                    if isinstance(payload, bytes):
                        sent = self._send(status, None, headers, raw=payload)
                    else:
                        sent = self._send(status, payload, headers)
                    if sent and not gone and status == 200 and key is not None:
                        with server.lock:
                            server.answered[key] += 1
                elif self.path == "/v1/files":
                    msg = email.parser.BytesParser().parsebytes(
                        b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + raw)
                    parts = {p.get_param("name", header="content-disposition"): p for p in msg.get_payload()}
                    file_part = parts["file"]
                    with server.lock:
                        file_id = f"file-{len(server.files) + 1}"
                        server.files[file_id] = file_part.get_payload(decode=True)
                    self._send(200, {"id": file_id, "object": "file", "bytes": len(server.files[file_id]),
                                     "created_at": int(time.time()), "filename": file_part.get_filename(),
                                     "purpose": parts["purpose"].get_payload(), "status": "processed"})
                elif self.path == "/v1/batches":
                    self._send(200, server.create_batch(json.loads(raw)))
                else:
                    self._send(404, _error(f"no route {self.path}", "invalid_request_error", None))

            def do_GET(self) -> None:
                found = re.fullmatch(r"/v1/files/([\w-]+)/content", self.path)
                if found and found.group(1) in server.files:
                    self._send(200, None, raw=server.files[found.group(1)])
                    return
                found = re.fullmatch(r"/v1/batches/([\w-]+)", self.path)
                if found and found.group(1) in server.batches:
                    with server.lock:
                        payload = dict(server.batches[found.group(1)])
                    self._send(200, payload)
                    return
                self._send(404, _error(f"no route {self.path}", "invalid_request_error", None))

        return Handler


def _error(message: str, kind: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every chat request")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    parser.add_argument("--rehearsal", action="store_true", help="answer like tests/rehearsal_llm.py (concept "
                        "chains shared by many images) and inject a fault into every 7th input")
    args = parser.parse_args()
    answer, fault_every = None, 0
    if args.rehearsal:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from rehearsal_llm import answer

        fault_every = 7
    with FakeOpenAIServer(latency_s=args.latency, port=args.port, answer=answer, fault_every=fault_every) as server:
        print(server.url, flush=True)
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
