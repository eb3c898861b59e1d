"""The `openai` backend: any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp).

Live mode: one AsyncOpenAI client per event loop, `llm.concurrency` requests in flight (a pool of that many
workers, equivalent to a semaphore but without one task object per request at COCO scale), temperature 0, a
strict JSON schema for the reply when `llm.structured_output`, and pydantic validation always. The client's
own retries are off (max_retries=0): this module retries 429, 5xx, timeouts and connection errors with
exponential backoff and jitter, honouring `retry-after-ms` / `retry-after`, so every retry is counted by
reason. A 429 with `insufficient_quota`, and 401/403/404, stop the run (every further request would fail).
A response body that is not JSON (cut or corrupted in transit) is a transient fault too (reason invalid_json,
retried like a 5xx, never cached). Bad replies are retried `llm.max_bad_reply_retries` times, then recorded as
failures with the raw reply; such a failure is cached as final only when it reproduced (the same bad reply on
the last two attempts, i.e. the model's answer at temperature 0): a bad reply that changed between attempts is
a transient fault, and a later run asks again without `llm.retry_failed`.
Batch mode (`llm.batch_api`) lives in `cglib.llm.batch`.

The API key is read from the environment variable named by `llm.api_key_env` when the client is created and
is passed only to the client: it never enters params, payloads, cache keys, cache rows or summaries, and it is
registered for redaction (`cglib.llm.base.redact`), so a server that echoes it in an error message cannot put
it on disk or on the terminal.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.llm.base import (
    Backend,
    ConceptTask,
    FatalBackendError,
    GroupRequest,
    Job,
    Outcome,
    QuotaExhaustedError,
    Report,
    redact,
    register_secret,
)
from cglib.llm.batch import BatchRunner
from cglib.llm.prompts import (
    CONCEPT_SCHEMA,
    GENERALIZE_SCHEMA,
    concept_messages,
    generalize_image_messages,
    generalize_messages,
    load_image_prompt,
    load_level_prompt,
    load_prompts,
)
from cglib.llm.replies import ReplyError, check_message, message_of

NO_KEY_PLACEHOLDER = "no-key-needed"  # local servers (vLLM, Ollama, llama.cpp) accept any key
MAX_RETRY_AFTER_S = 120.0


def api_key(params: Params) -> str:
    """The API key from the environment variable `llm.api_key_env`; a clear error when OpenAI itself needs it."""
    name = params.llm.api_key_env
    key = os.environ.get(name, "").strip()
    if key:
        register_secret(key)
        return key
    if params.llm.base_url:
        return NO_KEY_PLACEHOLDER
    raise FatalBackendError(f"llm.backend 'openai' needs an API key in the environment variable {name} "
                            f"(export {name}=...), or llm.base_url for a local server that needs none")


def http_client(transport: str):
    """The HTTP client for AsyncOpenAI: aiohttp (about 2x the throughput of httpx's async transport at high
    concurrency, openai-python #1596) when chosen or, for 'auto', installed; else the default (None)."""
    if transport == "httpx":
        return None
    try:
        import aiohttp  # noqa: F401  (the openai extra `openai[aiohttp]`)
    except ImportError:
        if transport == "aiohttp":
            raise ImportError("llm.http_transport 'aiohttp' needs the package aiohttp: pip install 'openai[aiohttp]', "
                              "or set llm.http_transport: httpx") from None
        return None
    from openai import DefaultAioHttpClient

    return DefaultAioHttpClient()


def retry_after_s(headers: Any) -> float | None:
    """Delay asked for by a `retry-after-ms` or `retry-after` header (seconds or HTTP date), or None."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            parsed = email.utils.parsedate_tz(value) if name == "retry-after" else None
            if parsed is not None:
                return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


def backoff_s(retry: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with equal jitter: half the capped delay fixed, half uniformly random."""
    delay = min(cap, base * 2.0 ** retry)
    return delay / 2 + rng.uniform(0, delay / 2)


def refused_connection(exc: BaseException) -> BaseException | None:
    """The OS-level connection error behind a client exception, if any (refused, reset, unreachable host).

    The aiohttp transport reports a refused connection as httpx.ConnectTimeout (so openai raises
    APITimeoutError); the chain of causes still holds the ConnectionRefusedError.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and not isinstance(cur, TimeoutError):  # aiohttp's connect timeout is one
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def is_quota_error(exc: Exception) -> bool:
    """A 429 whose error code or type is `insufficient_quota` (billing, not rate): not retryable."""
    return "insufficient_quota" in (str(getattr(exc, "code", "")), str(getattr(exc, "type", "")))


def sample_captions(captions: list[str], k: int, seed: int, group_id: str) -> list[str]:
    """At most `k` of a node's captions: all when few enough, else a sample seeded by run seed and group id."""
    if len(captions) <= k:
        return list(captions)
    rng = random.Random(f"{seed}:{group_id}")  # str seeds hash deterministically across processes
    return [captions[i] for i in sorted(rng.sample(range(len(captions)), k))]


def chat_payload(params: Params, task: ConceptTask | GroupRequest) -> dict:
    """The exact chat-completions body for a task under `params` (also used by the cost estimate)."""
    llm = params.llm
    prompts = load_prompts(llm.prompt_version)
    temperature = llm.temperature
    if isinstance(task, ConceptTask):
        messages = concept_messages(prompts, list(task.captions), list(task.chain), params.magic.l_max)
        schema, name, max_tokens = CONCEPT_SCHEMA, "concept", llm.max_output_tokens
    else:
        shown = sample_captions(task.captions, llm.generalize_max_captions, params.run.seed, task.group_id)
        if task.scope in ("image", "level"):  # own versioned prompts: this image's captions and its names only
            image_prompt = (load_image_prompt(llm.generalize_image_prompt_version) if task.scope == "image" else
                            load_level_prompt(llm.generalize_level_prompt_version))
            messages = generalize_image_messages(image_prompt, task.concept, task.parents, shown, task.n)
            temperature = llm.temperature if image_prompt.temperature is None else image_prompt.temperature
        else:
            messages = generalize_messages(prompts, task.concept, task.parents, shown, task.n)
        schema, name, max_tokens = GENERALIZE_SCHEMA, "generalized_captions", llm.max_output_tokens * task.n
    body: dict[str, Any] = {"model": llm.model, "messages": messages, "temperature": temperature,
                            "max_tokens": max_tokens, "seed": params.run.seed}
    if llm.structured_output:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": name, "strict": True, "schema": schema}}
    return body


class OpenAIBackend(Backend):
    """Chat completions against `llm.base_url` (or OpenAI) with `llm.model`."""

    name = "openai"

    def __init__(self, params: Params, work_dir: Path | None = None) -> None:
        self.params = params
        self.llm = params.llm
        self.model = self.llm.model
        self.prompt_version = self.llm.prompt_version
        load_prompts(self.llm.prompt_version)  # an unknown version fails here, before any work
        self.work_dir = work_dir  # Batch API request files and state
        self.price_factor = self.llm.batch_price_factor if self.llm.batch_api else 1.0
        self._rng = random.Random(params.run.seed)
        api_key(params)  # fail before any work when the key is missing

    def payload(self, task: ConceptTask | GroupRequest) -> dict:
        """The chat-completions request body for one task (no key, no transport settings)."""
        return chat_payload(self.params, task)

    def client(self):
        """A new AsyncOpenAI client for the current event loop (never shared across loops or threads)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(api_key=api_key(self.params), base_url=self.llm.base_url, timeout=self.llm.timeout_s,
                           max_retries=0, http_client=http_client(self.llm.http_transport))

    # ------------------------------------------------------------------------------------------ running
    async def run(self, jobs: list[Job], report: Report) -> None:
        """Answer `jobs` with live calls (or through the Batch API when llm.batch_api)."""
        if not jobs:
            return
        if self.llm.batch_api:
            await BatchRunner(self, self.work_dir).run(jobs, report)
            return
        client = self.client()
        pending = iter(jobs)
        stop = asyncio.Event()
        fatal: list[BaseException] = []
        unreachable = 0  # consecutive jobs that ended without any answer (connection errors, timeouts)
        limit = max(8, self.llm.concurrency)

        budget = self.budget

        async def worker() -> None:
            nonlocal unreachable
            for job in pending:  # one shared iterator: each job is taken by exactly one worker
                if stop.is_set():
                    return
                if budget is not None and not budget.reserve():  # llm.max_cost_usd: the engine says why
                    stop.set()
                    return
                try:
                    outcome = await self.complete(client, job)
                except FatalBackendError as exc:
                    fatal.append(exc)
                    stop.set()
                    if exc.outcome is not None:  # its requests were made: counted as a failure of this job
                        report(job, exc.outcome)
                    return
                finally:
                    if budget is not None:
                        budget.release()
                report(job, outcome)
                unreachable = unreachable + 1 if outcome.reason in ("connection_error", "timeout") else 0
                if unreachable >= limit and not stop.is_set():  # a dead server: stop instead of failing every item
                    fatal.append(FatalBackendError(
                        f"{unreachable} requests in a row got no answer from {self.llm.base_url or 'OpenAI'} "
                        f"({outcome.reason}: {outcome.detail}); check llm.base_url, that the server is running and "
                        "llm.timeout_s, then run again (finished items are cached)"))
                    stop.set()

        try:
            await asyncio.gather(*(worker() for _ in range(min(self.llm.concurrency, len(jobs)))))
        finally:
            await client.close()
        if fatal:
            raise fatal[0]

    async def complete(self, client: Any, job: Job) -> Outcome:
        """One job with retries: transport errors with backoff, bad replies up to max_bad_reply_retries. A
        FatalBackendError leaves with the job's failure as `outcome`, so its requests are still counted."""
        out = Outcome(ok=False)
        try:
            return await self._attempts(client, job, out)
        except FatalBackendError as exc:
            exc.outcome = _finish(out, Outcome.failure(exc.reason, str(exc), cacheable=False))
            raise

    async def _attempts(self, client: Any, job: Job, out: Outcome) -> Outcome:
        import openai

        transport_retries = bad_replies = 0
        last_bad: tuple[str, str | None] | None = None
        while True:
            out.requests += 1
            delay: float | None = None
            completion: Any = None
            try:
                # The client's generic `post` (documented for any endpoint) sends the body as it is: the typed
                # `chat.completions.create` spends ~10 ms of CPU per request transforming it (measured in
                # benchmarks/bench_llm.py), which caps a 2-core machine near 60 requests/s.
                completion = await client.post("/chat/completions", body=job.payload, cast_to=object)
            except openai.RateLimitError as exc:
                if is_quota_error(exc):
                    raise QuotaExhaustedError(
                        "the API account has no quota left (HTTP 429 insufficient_quota): add credit or raise the "
                        "limit, then run again; finished items are cached and will not be requested again") from None
                reason, delay = "rate_limited", retry_after_s(exc.response.headers)
            except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
                raise FatalBackendError(f"the server refused the request (HTTP {exc.status_code}: {_message(exc)}); "
                                        f"check llm.model ('{self.model}'), llm.base_url and the key in "
                                        f"${self.llm.api_key_env}") from None
            except openai.APIConnectionError as exc:  # APITimeoutError is a subclass: refused connections too
                cause = refused_connection(exc)
                if isinstance(exc, openai.APITimeoutError) and cause is None:
                    reason = "timeout"
                else:
                    reason = "connection_error"
                    out.detail = redact(f"cannot connect to {self.llm.base_url or 'the OpenAI API'}: "
                                        f"{cause or exc.__cause__ or exc}")
            except json.JSONDecodeError as exc:  # HTTP 200 whose body is not JSON: cut or corrupted in transit
                reason = "invalid_json"
                out.detail = f"the response body is not valid JSON ({exc})"
            except openai.APIStatusError as exc:
                if exc.status_code >= 500 or exc.status_code in (408, 409):
                    reason, delay = "server_error", retry_after_s(exc.response.headers)
                else:  # 400/422: this request is wrong; asking again cannot help
                    return _finish(out, Outcome.failure("bad_request", f"HTTP {exc.status_code}: {_message(exc)}"))
            else:
                if not isinstance(completion, dict):  # a non-JSON content type (a proxy's HTML error page, ...)
                    reason = "invalid_json"
                    out.detail = redact(f"the response is not a JSON object: {str(completion)[:100]!r}")
                    completion = None
            if completion is not None:
                msg = message_of(completion)
                out.input_tokens += msg.input_tokens
                out.output_tokens += msg.output_tokens
                if self.budget is not None:
                    self.budget.add(msg.input_tokens, msg.output_tokens)
                try:
                    value = check_message(msg, job.task, self.llm.max_reply_chars)
                except ReplyError as err:
                    out.retries[err.reason] += 1
                    bad_replies += 1
                    reproduced, last_bad = last_bad == (err.reason, err.raw), (err.reason, err.raw)
                    if bad_replies > self.llm.max_bad_reply_retries:
                        out.retries[err.reason] -= 1  # the last try is the failure, not a retry
                        # Final (cached) only when the same bad reply came back twice, the model's answer at
                        # temperature 0, or when no retry was allowed; one that changed was a transient fault.
                        final = reproduced or bad_replies == 1
                        return _finish(out, Outcome.failure(err.reason, err.detail, err.raw, cacheable=final))
                    if self.budget is not None and not self.budget.fits(0):  # a retry costs too: not past the limit
                        self.budget.stopped = True
                        out.retries[err.reason] -= 1  # not retried after all
                        return _finish(out, Outcome.failure("budget_exceeded", f"{err.reason}; not retried: "
                                                            "llm.max_cost_usd reached", err.raw, cacheable=False))
                    continue
                return _finish(out, Outcome(ok=True, value=value, raw=msg.content,
                                            meta={"finish_reason": msg.finish_reason}))
            if transport_retries >= self.llm.max_retries:
                detail = f"gave up after {transport_retries} retries" + (f": {out.detail}" if out.detail else "")
                return _finish(out, Outcome.failure(reason, detail, cacheable=False))
            transport_retries += 1
            out.retries[reason] += 1
            if delay is None:
                delay = backoff_s(transport_retries - 1, self.llm.backoff_base_s, self.llm.backoff_max_s, self._rng)
            else:  # the server's delay, plus a little jitter so waiting workers do not return in lockstep
                delay = min(delay, MAX_RETRY_AFTER_S) * (1 + 0.1 * self._rng.random())
            await asyncio.sleep(delay)


def _finish(acc: Outcome, final: Outcome) -> Outcome:
    """`final` with the request, token and retry counts accumulated over all attempts."""
    final.requests, final.input_tokens, final.output_tokens = acc.requests, acc.input_tokens, acc.output_tokens
    final.retries = +acc.retries
    return final


def _message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:300]
    return str(exc)[:300]
