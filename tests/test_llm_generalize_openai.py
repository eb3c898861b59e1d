"""Per-image LLM_gen through the `openai` backend and a loopback fake server (127.0.0.1): the request's
content, its own prompt version, structured output, and resume with zero repeated requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cglib.config import Params
from cglib.llm import GroupRequest, generalize_groups

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer

KEY_ENV = "CGLIB_TEST_OPENAI_KEY"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-generalize")


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def params(server: FakeOpenAIServer, **llm) -> Params:
    base = {"backend": "openai", "base_url": server.url, "api_key_env": KEY_ENV, "backoff_base_s": 0.01,
            "backoff_max_s": 0.05, "timeout_s": 5.0, "concurrency": 4}
    return Params.model_validate({"llm": {**base, **llm}, "magic": {"l_max": 4}})


def image_requests(n_images: int, n: int = 1) -> list[GroupRequest]:
    return [GroupRequest(f"img{i:03d}", "birthday party", ["celebration", "tradition", "culture"],
                         [f"a cake with {i} candles", f"children {i} around a table"], n, scope="image")
            for i in range(n_images)]


def test_image_request_holds_only_its_captions_and_chain_with_structured_output(server, tmp_path):
    """The body sent for one image contains its own captions and its chain's names, the per-image prompt's
    wording, a strict JSON schema and temperature 0; rows and summary carry the per-image prompt version."""
    reqs = image_requests(3)
    result = generalize_groups(reqs[:1], params(server), tmp_path, progress=False)
    body = server.last_body
    text = "\n".join(m["content"] for m in body["messages"])
    assert "a cake with 0 candles" in text and "children 0 around a table" in text
    assert "candles" not in text.replace("a cake with 0 candles", "")  # no other image's caption
    assert all(name in text for name in ("birthday party", "celebration", "tradition", "culture"))
    assert "Write 1 generalized captions for this photograph" in text
    assert body["temperature"] == 0 and body["response_format"]["json_schema"]["strict"] is True
    assert result.summary["scope"] == "image" and result.summary["prompt_version"] == "gi-v1"
    assert result.summary["captions_mentioning_level"] == {"l1": 0, "l2": 0, "l3": 0, "l4": 0}
    row = json.loads((tmp_path / "abstraction" / "generalized.jsonl").read_text().splitlines()[0])
    assert (row["scope"], row["prompt_version"], len(row["captions"])) == ("image", "gi-v1", 1)


def test_resume_of_per_image_generalization_repeats_no_request(server, tmp_path):
    """A run that asked for some images, then a full run: only the new images are requested; a third run asks
    nothing (all cache hits)."""
    reqs = image_requests(10, n=2)
    first = generalize_groups(reqs[:4], params(server), tmp_path, progress=False)
    assert server.total == 4 and all(len(v) == 2 for v in first.captions.values())
    full = generalize_groups(reqs, params(server), tmp_path, progress=False)
    assert server.total == 10 and full.summary["cache"]["hits"] == 4
    again = generalize_groups(reqs, params(server), tmp_path, progress=False)
    assert server.total == 10 and again.captions == full.captions and again.summary["requests"] == 0


def test_per_image_and_group_requests_cannot_mix(server, tmp_path):
    """One call holds one scope: mixing them is an error naming the fix."""
    mixed = [*image_requests(1), GroupRequest("l1:x", "x", [], ["a"], 1)]
    with pytest.raises(ValueError, match="its own call"):
        generalize_groups(mixed, params(server), tmp_path, progress=False)


def test_unknown_image_prompt_version_fails_before_any_request(server, tmp_path):
    """A misspelt llm.generalize_image_prompt_version is an error listing the shipped versions."""
    with pytest.raises(ValueError, match="gi-v1"):
        generalize_groups(image_requests(2), params(server, generalize_image_prompt_version="gi-v9"), tmp_path,
                          progress=False)
    assert server.total == 0
