"""Strict validation of LLM replies: JSON, required fields (pydantic, extra keys forbidden), sane sizes.

A reply that fails any check raises `ReplyError(reason)`; the backend retries it a few times and then records
the failure with the reason and the raw reply. Reasons: truncated (finish_reason "length"), refusal, empty,
too_long, invalid_json, missing_fields, invalid_concept, repeated_concept, wrong_count.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from cglib.llm.base import ConceptTask, GroupRequest
from cglib.llm.canonical import canonicalize

MAX_CONCEPT_WORDS = 6
MAX_CONCEPT_CHARS = 60
MAX_CAPTION_CHARS = 300
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class ReplyError(ValueError):
    """A reply that cannot be used; `reason` is one of the documented failure reasons."""

    def __init__(self, reason: str, detail: str = "", raw: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.raw = reason, detail, raw


class ConceptReply(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    concept: str


class GeneralizeReply(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    captions: list[str]


@dataclass
class Message:
    """The parts of a chat completion the checks need (live replies are objects, batch replies dicts)."""

    content: str | None
    refusal: str | None
    finish_reason: str | None
    input_tokens: int = 0
    output_tokens: int = 0


def message_of(completion: Any) -> Message:
    """Content, refusal, finish reason and usage of a ChatCompletion object or its JSON dict."""
    data = completion if isinstance(completion, dict) else completion.model_dump()
    usage = data.get("usage") or {}
    tokens = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    choices = data.get("choices") or []
    if not choices:
        return Message(None, None, None, *tokens)
    choice = choices[0] or {}
    msg = choice.get("message") or {}
    return Message(msg.get("content"), msg.get("refusal"), choice.get("finish_reason"), *tokens)


def _json(content: str) -> Any:
    fenced = _FENCE.match(content)  # servers without structured output often wrap JSON in a code fence
    text = fenced.group(1) if fenced else content
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplyError("invalid_json", str(exc), content) from None


def check_message(msg: Message, task: ConceptTask | GroupRequest, max_reply_chars: int) -> Any:
    """The validated value of a reply (canonical concept, or list of captions); ReplyError otherwise."""
    if msg.finish_reason == "length":
        raise ReplyError("truncated", "finish_reason is 'length'", msg.content)
    if msg.refusal or msg.finish_reason == "content_filter":
        raise ReplyError("refusal", msg.refusal or "finish_reason is 'content_filter'", msg.content)
    content = msg.content
    if content is None or not content.strip():
        raise ReplyError("empty", "no content", content)
    if len(content) > max_reply_chars:
        raise ReplyError("too_long", f"{len(content)} characters > llm.max_reply_chars ({max_reply_chars})",
                         content)
    data = _json(content)
    if isinstance(task, ConceptTask):
        return check_concept(data, task, content)
    return check_captions(data, task, content)


def check_concept(data: Any, task: ConceptTask, raw: str) -> str:
    """Canonical concept from a parsed reply; rejects empty, long and repeated concepts."""
    try:
        reply = ConceptReply.model_validate(data)
    except ValidationError as exc:
        raise ReplyError("missing_fields", _short(exc), raw) from None
    concept = canonicalize(reply.concept)
    if not concept:
        raise ReplyError("empty", "concept is empty after canonicalization", raw)
    if len(concept) > MAX_CONCEPT_CHARS or len(concept.split()) > MAX_CONCEPT_WORDS:
        raise ReplyError("invalid_concept", f"not a short phrase: {concept[:80]!r}", raw)
    if concept in task.chain:
        raise ReplyError("repeated_concept", f"'{concept}' repeats an earlier level", raw)
    return concept


def check_captions(data: Any, task: GroupRequest, raw: str) -> list[str]:
    """Exactly `task.n` non-empty generalized captions of sane length."""
    try:
        reply = GeneralizeReply.model_validate(data)
    except ValidationError as exc:
        raise ReplyError("missing_fields", _short(exc), raw) from None
    captions = [c.strip() for c in reply.captions]
    if len(captions) != task.n:
        raise ReplyError("wrong_count", f"{len(captions)} captions, asked for {task.n}", raw)
    if any(not c for c in captions):
        raise ReplyError("empty", "an empty caption", raw)
    if any(len(c) > MAX_CAPTION_CHARS for c in captions):
        raise ReplyError("too_long", f"a caption longer than {MAX_CAPTION_CHARS} characters", raw)
    return captions


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()[:3])
