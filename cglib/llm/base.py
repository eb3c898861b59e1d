"""What every abstraction backend shares: tasks, outcomes, failures, the backend interface, cache keys.

A task is one question (a concept at one level for one image, or generalized captions for one group). A
backend turns a task into an exact request payload (hashed into the cache key) and answers a list of jobs,
reporting each outcome as it arrives, so the engine can write it to the cache at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

T = TypeVar("T")

# Failure reasons (the keys of the per-reason counts in every summary).
REPLY_REASONS = ("invalid_json", "missing_fields", "empty", "too_long", "truncated", "refusal", "invalid_concept",
                 "repeated_concept", "wrong_count")
TRANSPORT_REASONS = ("rate_limited", "server_error", "timeout", "connection_error", "batch_expired",
                     "batch_failed")


# Secrets never reach a message that is stored, logged or printed: the API key's value (registered when it is
# read) and anything shaped like a bearer token or an OpenAI-style key, whatever a server echoes back.
REDACTED = "[REDACTED]"
_SECRETS: set[str] = set()
_SECRET_PATTERNS = (
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?)(?!bearer\b)[^\s\"',;}]{8,}"),
)


def register_secret(value: str) -> None:
    """Remember a secret (the API key) so that `redact` removes it from every message."""
    if value and len(value) >= 8:  # shorter strings would blank out ordinary words
        _SECRETS.add(value)


def redact(text: str | None) -> str | None:
    """`text` with registered secrets, bearer tokens and `sk-...` keys replaced by [REDACTED]."""
    if not text:
        return text
    for secret in _SECRETS:
        text = text.replace(secret, REDACTED)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


class FatalBackendError(RuntimeError):
    """An error that every further request would hit too (no quota, bad key, unknown model): stop the run.

    Its message is redacted when it is made: it ends up in summaries, run.json, notebooks and the terminal.
    `outcome`: the failure of the request that met it (its attempts count as spent); `outcomes`: set by the
    engine, the outcome of every task of the step (None: never asked).
    """

    reason = "fatal_error"  # the failure reason of the request that met it
    outcome: Outcome | None = None
    outcomes: list[Outcome | None] | None = None

    def __init__(self, message: str = "") -> None:
        super().__init__(redact(str(message)))


class QuotaExhaustedError(FatalBackendError):
    """HTTP 429 with `insufficient_quota`: the account has no credit left; retrying cannot help."""

    reason = "quota_exhausted"


class BudgetExceededError(FatalBackendError):
    """The next request would take the spend past llm.max_cost_usd: the run stopped with its answers cached."""

    reason = "budget_exceeded"


@dataclass(frozen=True)
class ConceptTask:
    """Ask for concept number `level` (1-based) of one image, given its captions and the chain so far."""

    item_id: str
    level: int
    captions: tuple[str, ...]
    chain: tuple[str, ...]


@dataclass(frozen=True)
class GroupRequest:
    """Ask for `n` generalized captions (LLM_gen, PAPER_NOTES step 5) of one l1 node (scope "group": the
    pooled captions of its images), of one image (scope "image": `group_id` is the image id, `captions` its
    own captions, `concept` its l1 concept and `parents` the concept's ancestors l2..l_max) or of one image at
    one level (scope "level": `concept` is the image's concept at `level`, no parents)."""

    group_id: str
    concept: str
    parents: list[str]
    captions: list[str]
    n: int
    scope: Literal["group", "image", "level"] = "group"
    level: int = 1  # the level `concept` names (parents follow it upwards)

    @property
    def item_id(self) -> str:
        return self.group_id


def image_caption_requests(image_id: str, captions: list[str], names: list[str], mode: str,
                           n: int) -> list[GroupRequest]:
    """The LLM_gen requests of one image whose chain has `names` (l1 first): one with its l1 concept and
    ancestors asking for `n` captions (mode "image"), or one per level asking for one caption given that level's
    concept alone (mode "level", the authors' generate_level_captions; ids `<image id>:l<k>`)."""
    if mode == "image":
        return [GroupRequest(image_id, names[0], list(names[1:]), list(captions), n, scope="image")]
    if mode == "level":
        return [GroupRequest(f"{image_id}:l{k}", name, [], list(captions), 1, scope="level", level=k)
                for k, name in enumerate(names, start=1)]
    raise ValueError(f"per-image generalized captions are asked per image or per level, not {mode!r}")


@dataclass
class Outcome:
    """The answer to one job after all retries: a value, or a failure reason with the raw reply."""

    ok: bool
    value: Any = None  # concept string, or list of captions
    reason: str | None = None
    detail: str = ""
    raw: str | None = None
    cacheable: bool = True  # transport failures are not cached: a later run tries them again
    requests: int = 0  # HTTP requests (or batch lines) spent on this job
    input_tokens: int = 0
    output_tokens: int = 0
    retries: Counter = field(default_factory=Counter)  # reason -> retries
    meta: dict = field(default_factory=dict)

    @classmethod
    def failure(cls, reason: str, detail: str = "", raw: str | None = None, cacheable: bool = True,
                **kw: Any) -> Outcome:
        """A failed outcome; detail and raw reply are redacted here, where every failure enters the system."""
        return cls(ok=False, reason=reason, detail=redact(detail) or "", raw=clip_raw(redact(raw)),
                   cacheable=cacheable, **kw)


@dataclass
class Failure:
    """One item that ended without a result: which item, at which level, why, and the raw reply."""

    item_id: str
    level: int | None
    reason: str
    detail: str = ""
    raw: str | None = None


@dataclass
class Job:
    """A task with its exact request payload and cache key; `tasks` holds every task with the same key."""

    key: str
    payload: dict
    tasks: list = field(default_factory=list)

    @property
    def task(self) -> Any:
        return self.tasks[0]


Report = Callable[[Job, Outcome], None]


class Backend(ABC):
    """One way of answering tasks. Subclasses set `name`, `model`, `prompt_version` and `cacheable`."""

    name: str = ""
    model: str = ""
    prompt_version: str | None = None
    cacheable: bool = True
    streaming: bool = True  # results arrive one by one (commit each at once); False: all at once (commit once)
    price_factor: float = 1.0  # Batch API: half price
    budget: Any = None  # a cglib.llm.cost.Budget while the engine runs a paid step (None: no limit to hold)

    @abstractmethod
    def payload(self, task: Any) -> dict:
        """The exact request for `task` (everything that determines the answer; hashed into the cache key)."""

    @abstractmethod
    async def run(self, jobs: list[Job], report: Report) -> None:
        """Answer every job, calling `report(job, outcome)` once per job as soon as its outcome is known."""

    def key(self, payload: dict) -> str:
        """Cache key: hash of backend, model, prompt version and the exact request."""
        return request_key(self.name, self.model, self.prompt_version, payload)


CHARS_PER_TOKEN = 4.0
TOKENS_PER_MESSAGE = 4  # chat formatting overhead per message


def estimate_tokens(payload: dict) -> int:
    """Approximate input tokens of a chat-completions body: message characters / 4, plus the schema (the cost
    estimate, `cglib.llm.cost`, and the Batch API's enqueued-token limit, `cglib.llm.batch`)."""
    chars = sum(len(m.get("content") or "") for m in payload.get("messages", []))
    chars += len(json.dumps(payload.get("response_format", ""))) if "response_format" in payload else 0
    return int(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(payload.get("messages", []))


def request_key(backend: str, model: str, prompt_version: str | None, payload: dict) -> str:
    """SHA-256 of the canonical JSON of (backend, model, prompt version, request)."""
    blob = json.dumps({"backend": backend, "model": model, "prompt_version": prompt_version, "request": payload},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def clip_raw(raw: str | None, limit: int = 4000) -> str | None:
    """Keep at most `limit` characters of a raw reply (absurdly long replies are stored cut, with their length)."""
    if raw is None or len(raw) <= limit:
        return raw
    return raw[:limit] + f"... [cut: {len(raw)} characters in all]"


def run_sync(make_coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, also inside Jupyter (whose event loop is already running).

    With a running loop the coroutine gets its own loop in a worker thread: everything async (the HTTP client,
    the cache connection) is created inside that coroutine, so nothing is shared between loops.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cglib-llm") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()
