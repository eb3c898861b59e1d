"""Units of the abstraction engine: prompts, reply validation, cache, cost estimates, retry delays."""

from __future__ import annotations

import email.utils
import json
import random
import sqlite3
import time
from pathlib import Path

import pytest

from cglib.config import Params
from cglib.data.taxonomy import load_taxonomy
from cglib.llm import estimate_full_coco
from cglib.llm.base import ConceptTask, GroupRequest, Outcome, request_key
from cglib.llm.cache import ResultCache
from cglib.llm.canonical import canonicalize
from cglib.llm.cost import estimate_concept_requests, estimate_tokens
from cglib.llm.openai_backend import backoff_s, chat_payload, retry_after_s, sample_captions
from cglib.llm.prompts import concept_messages, few_shot_chains, load_prompts
from cglib.llm.replies import Message, ReplyError, check_message

TASK1 = ConceptTask("i", 1, ("a dog on a sofa",), ())
TASK3 = ConceptTask("i", 3, ("a dog on a sofa",), ("dog napping", "pet care"))


def test_unknown_prompt_version_names_the_available_ones() -> None:
    """A missing prompt version fails with the list of shipped versions."""
    with pytest.raises(ValueError, match=r"prompt_version 'v99' not found.*available: v1"):
        load_prompts("v99")


def test_messages_show_few_shot_turns_and_the_chain() -> None:
    """Level k shows each example's level-k answer as an assistant turn and the image's chain so far."""
    prompts = load_prompts("v1")
    msgs = concept_messages(prompts, list(TASK3.captions), list(TASK3.chain), 4)
    assert msgs[0]["role"] == "system" and [m["role"] for m in msgs[1:7]] == ["user", "assistant"] * 3
    assert json.loads(msgs[2]["content"]) == {"concept": prompts.few_shot[0].chain[2]}
    assert "dog napping -> pet care" in msgs[-1]["content"] and "level-3" in msgs[-1]["content"]
    assert "a dog on a sofa" in msgs[-1]["content"]
    level1 = concept_messages(prompts, list(TASK1.captions), [], 4)
    assert "level-1 concept" in level1[-1]["content"] and "->" not in level1[-1]["content"]


def test_few_shot_chains_share_no_name_with_the_taxonomy() -> None:
    """Few-shot concepts are not synthetic-world concepts, so a copy is never mistaken for a right answer."""
    names = {canonicalize(n) for n in load_taxonomy().all_names()}
    assert not {c for chain in few_shot_chains(load_prompts("v1"), 5) for c in chain} & names


def _msg(content: str | None, finish: str = "stop", refusal: str | None = None) -> Message:
    return Message(content, refusal, finish)


def test_reply_validation_accepts_fenced_json_and_canonicalizes() -> None:
    """A code-fenced JSON reply is accepted; the concept comes back canonical."""
    assert check_message(_msg('```json\n{"concept": "The Dog Shows"}\n```'), TASK1, 2000) == "dog show"


@pytest.mark.parametrize(("content", "finish", "reason"), [
    ('{"concept": "x", "extra": 1}', "stop", "missing_fields"),
    ('{"concept": 3}', "stop", "missing_fields"),
    ('["dog"]', "stop", "missing_fields"),
    ('{"concept": "  "}', "stop", "empty"),
    ('{"concept": "a very long concept name that goes on and on"}', "stop", "invalid_concept"),
    ('{"concept": "Pet Care"}', "stop", "repeated_concept"),
    ('{"concept": "dog', "length", "truncated"),
    ("nope", "stop", "invalid_json"),
    ("", "stop", "empty"),
    ('{"concept": "ok"}', "content_filter", "refusal"),
])
def test_reply_validation_reasons(content: str, finish: str, reason: str) -> None:
    """Each kind of bad reply raises ReplyError with its documented reason."""
    with pytest.raises(ReplyError) as err:
        check_message(_msg(content, finish), TASK3, 2000)
    assert err.value.reason == reason


def test_generalized_caption_count_is_checked() -> None:
    """A generalized-captions reply must have exactly n non-empty captions."""
    req = GroupRequest("g", "c", [], ["x"], 2)
    assert check_message(_msg('{"captions": ["a", "b"]}'), req, 2000) == ["a", "b"]
    with pytest.raises(ReplyError, match="wrong_count"):
        check_message(_msg('{"captions": ["a"]}'), req, 2000)


def test_cache_roundtrip_and_wal(tmp_path: Path) -> None:
    """Outcomes survive a reopen (values, failures with raw text, tokens) and the file is in WAL mode."""
    path = tmp_path / "c.sqlite"
    with ResultCache(path) as cache:
        cache.put("k1", "concept", "openai", "m", "v1", Outcome(ok=True, value="dog show", input_tokens=10))
        cache.put("k2", "concept", "openai", "m", "v1", Outcome.failure("invalid_json", "bad", "raw text"))
    with ResultCache(path) as cache:
        got = cache.get_many(["k1", "k2", "k3"])
        assert cache.count(ok=1) == 1
    assert got["k1"].value == "dog show" and got["k1"].input_tokens == 10
    assert not got["k2"].ok and got["k2"].reason == "invalid_json" and got["k2"].raw == "raw text"
    assert "k3" not in got
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cache_key_depends_on_backend_model_version_and_request() -> None:
    """Changing any part of the key material changes the key; the same material gives the same key."""
    base = request_key("openai", "m", "v1", {"a": 1})
    assert base == request_key("openai", "m", "v1", {"a": 1})
    assert len({base, request_key("offline", "m", "v1", {"a": 1}), request_key("openai", "m2", "v1", {"a": 1}),
                request_key("openai", "m", "v2", {"a": 1}), request_key("openai", "m", "v1", {"a": 2})}) == 5


def test_retry_after_parsing() -> None:
    """retry-after-ms wins over retry-after; seconds and HTTP dates are understood; junk is ignored."""
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == pytest.approx(0.25)
    assert retry_after_s({"retry-after": "1.5"}) == pytest.approx(1.5)
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s({"retry-after": date}) <= 31
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


def test_backoff_grows_with_jitter_and_cap() -> None:
    """Backoff doubles per retry within [d/2, d], capped."""
    rng = random.Random(0)
    for retry in range(8):
        d = min(4.0, 0.5 * 2 ** retry)
        assert d / 2 <= backoff_s(retry, 0.5, 4.0, rng) <= d


def test_generalize_prompt_samples_captions_deterministically() -> None:
    """A node with many captions shows a seeded sample of llm.generalize_max_captions, the same every time."""
    caps = [f"caption {i}" for i in range(100)]
    a, b = sample_captions(caps, 10, 0, "n1"), sample_captions(caps, 10, 0, "n1")
    assert a == b and len(a) == 10 and a != sample_captions(caps, 10, 0, "n2")
    p = Params.model_validate({"llm": {"generalize_max_captions": 10}})
    body = chat_payload(p, GroupRequest("n1", "dog", ["animal"], caps, 3))
    shown = [line[2:] for line in body["messages"][-1]["content"].splitlines() if line.startswith("- caption")]
    assert shown == a
    assert body["max_tokens"] == 3 * p.llm.max_output_tokens


def test_cost_estimates() -> None:
    """Estimates grow with images and levels; the Batch API halves the price; the full COCO run is listed."""
    p = Params()
    one = estimate_concept_requests(p, [["a dog on a sofa"] * 5])
    ten = estimate_concept_requests(p, [["a dog on a sofa"] * 5] * 10)
    assert ten["input_tokens"] == pytest.approx(10 * one["input_tokens"], rel=0.01) and ten["requests"] == 40
    assert one["input_tokens_per_level"][3] > one["input_tokens_per_level"][0]
    rows = {r["step"]: r for r in estimate_full_coco(p)}
    live, batch = rows["chains l1..l4 (live)"], rows["chains l1..l4 (Batch API)"]
    assert live["requests"] == 118_287 * 4 and batch["cost_usd"] == pytest.approx(live["cost_usd"] / 2, rel=0.01)
    assert 5 < live["cost_usd"] < 500  # hundreds of millions of tokens at gpt-4o-mini prices
    gen_live, gen_batch = rows["generalized captions per image (live)"], rows["generalized captions per image (Batch API)"]
    assert gen_live["requests"] == 118_287 and gen_batch["cost_usd"] == pytest.approx(gen_live["cost_usd"] / 2, rel=0.02)
    expected = (gen_live["input_tokens"] * 0.15 + gen_live["output_tokens"] * 0.60) / 1e6  # the default prices
    assert gen_live["cost_usd"] == pytest.approx(expected, rel=0.01)
    assert estimate_tokens({"messages": [{"content": "x" * 400}]}) == 104


def test_redact_removes_keys_and_bearer_tokens() -> None:
    """Registered secrets, bearer tokens, `sk-...` keys and `api_key=...` values become [REDACTED]; the
    rest of the message, ordinary words included, is kept."""
    from cglib.llm.base import FatalBackendError, redact, register_secret

    register_secret("local-server-secret-42")
    assert redact("Incorrect API key provided: Bearer sk-proj-abcdefgh12345678.") == \
        "Incorrect API key provided: Bearer [REDACTED]"
    assert redact("header authorization: Bearer abc.def.ghi-jkl") == "header authorization: Bearer [REDACTED]"
    assert redact('{"api_key": "zzzzzzzzzzzz", "x": 1}') == '{"api_key": "[REDACTED]", "x": 1}'
    assert redact("key sk-abcdefghijklmnop was refused") == "key [REDACTED] was refused"
    assert redact("token local-server-secret-42 echoed") == "token [REDACTED] echoed"
    assert redact("a bearer bond, a sk-i trip, HTTP 401") == "a bearer bond, a sk-i trip, HTTP 401"
    assert redact(None) is None
    assert "sk-" not in str(FatalBackendError("refused: sk-abcdefghijklmnop"))
    failed = Outcome.failure("bad_request", "HTTP 400: Bearer sk-abcdefghijklmnop", raw="sk-abcdefghijklmnop")
    assert failed.detail == "HTTP 400: Bearer [REDACTED]" and failed.raw == "[REDACTED]"
