"""Generalized captions as published (issue #32 item 9, `magic.generalize: level`): the authors'
generate_new_caption.py asks once per image and level with that level's concept, and the image's captions are its
level captions. Checked against a literal re-implementation of their loop, through the offline backend, and
through the openai backend on a loopback server (the level prompt, its temperature, its own cache key)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cglib.config import Params
from cglib.llm import generalize_groups
from cglib.llm.base import image_caption_requests
from cglib.llm.cost import estimate_image_generalize_requests
from cglib.llm.generalizers import offline_generalize

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer
from test_magic_generalize import built

KEY_ENV = "CGLIB_TEST_OPENAI_KEY"
CAPTIONS = ["a boy blows out candles on a cake", "children around a birthday cake with candles",
            "a cake with candles on a table with balloons"]
CHAIN = ["birthday party", "celebration", "tradition", "culture"]


def authors_level_requests(captions: list[str], concept_levels: dict[str, str]) -> list[tuple[list[str], str]]:
    """Their generate_level_captions, literally: for each level in order, caption_generator(captions, concept)."""
    calls = []
    for concept in concept_levels.values():  # their loop: `for level, concept in concept_levels.items()`
        calls.append((captions, concept))
    return calls


def test_level_requests_are_the_authors_calls_one_caption_each():
    levels = {f"level{k}": name for k, name in enumerate(CHAIN, start=1)}
    ours = image_caption_requests("img7", CAPTIONS, CHAIN, "level", n=5)
    assert [(r.captions, r.concept) for r in ours] == authors_level_requests(CAPTIONS, levels)
    assert [(r.group_id, r.scope, r.level, r.n, r.parents) for r in ours] == [
        (f"img7:l{k}", "level", k, 1, []) for k in range(1, 5)]
    with pytest.raises(ValueError, match="per image or per level"):
        image_caption_requests("img7", CAPTIONS, CHAIN, "group", 1)


def test_an_image_pairs_with_its_level_captions_in_level_order():
    """Built with generalize: level, every image (both splits) was asked once per level with that level's concept
    only, and its generalized captions are the answers l1..l_max; the counts say one caption per level."""
    magic, gen = built(generalize="level")
    assert magic.generalize == "level" and magic.per_image
    assert len(gen.seen) == 2 * len(magic.images)  # l_max = 2
    for image_id in magic.images:
        names = magic.chain_names(image_id)
        assert magic.generalized_texts(image_id) == [f"a scene of {name} (0)" for name in names]
    g = magic.stats["generalization"]
    assert (g["mode"], g["requested"], g["generalized"], g["levels_failed_in_generalized_images"]) == (
        "level", 24, 12, {})


def test_a_failed_level_is_left_out_and_counted_and_an_image_with_none_falls_back():
    magic, _ = built(generalize="level", fail={"img0000:l2", "img0001:l1", "img0001:l2"})
    assert magic.generalized_texts("img0000") == ["a scene of tennis (0)"]
    assert not magic.images["img0000"].generalized_fallback
    record = magic.images["img0001"]
    assert record.generalized_fallback and record.generalized_captions == record.captions[:1]
    g = magic.stats["generalization"]
    assert (g["generalized"], g["fallback_to_original"]) == (11, 1)
    assert g["failure_reasons"] == {"invalid_json": 1}
    assert g["levels_failed_in_generalized_images"] == {"invalid_json": 1}


def test_offline_backend_gives_level_k_its_kth_phrasing(tmp_path):
    """The offline generalizer never sees a concept: level k gets the k-th of the image's phrasings, so the four
    level captions differ, and no concept name reaches them."""
    requests = image_caption_requests("img7", CAPTIONS, CHAIN, "level", 1)
    result = generalize_groups(requests, Params.model_validate({"llm": {"backend": "offline"}}), tmp_path,
                               progress=False)
    got = [result.captions[f"img7:l{k}"] for k in range(1, 5)]
    assert [c for (c,) in got] == offline_generalize(CAPTIONS, 4)[0]
    assert len({c for (c,) in got}) == 4
    assert result.summary["scope"] == "level"
    assert result.summary["captions_mentioning_level"] == {"l1": 0, "l2": 0, "l3": 0, "l4": 0}


def test_openai_level_request_shows_one_concept_at_temperature_07_with_its_own_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-level")
    with FakeOpenAIServer() as server:
        params = Params.model_validate({"llm": {"backend": "openai", "base_url": server.url, "api_key_env": KEY_ENV,
                                                "timeout_s": 5.0, "backoff_base_s": 0.01},
                                        "magic": {"l_max": 4}})
        requests = image_caption_requests("img7", CAPTIONS, CHAIN, "level", 1)
        result = generalize_groups(requests[2:3], params, tmp_path, progress=False)
        body = server.last_body
        text = "\n".join(m["content"] for m in body["messages"])
        assert 'Concept: "tradition"' in text and all(c in text for c in CAPTIONS)
        assert not any(name in text for name in ("birthday party", "celebration", "culture"))
        assert body["temperature"] == 0.7 and body["response_format"]["json_schema"]["strict"] is True
        assert result.summary["prompt_version"] == "gl-v1" and result.summary["scope"] == "level"
        generalize_groups(requests, params, tmp_path, progress=False)
        assert server.total == 4  # the level asked first came from the cache
        image_scope = image_caption_requests("img7", CAPTIONS, CHAIN, "image", 1)
        generalize_groups(image_scope, params, tmp_path, progress=False)
        assert server.total == 5 and server.last_body["temperature"] == 0


def test_the_estimate_counts_one_request_per_level():
    items = [(CAPTIONS, CHAIN)] * 10 + [(CAPTIONS, [])] * 2  # two images whose chains are not known yet
    level = Params.model_validate({"llm": {"backend": "openai"}, "magic": {"l_max": 4, "generalize": "level"}})
    image = Params.model_validate({"llm": {"backend": "openai"}, "magic": {"l_max": 4, "generalize": "image"}})
    est_level, est_image = (estimate_image_generalize_requests(p, items) for p in (level, image))
    assert (est_level["requests"], est_image["requests"]) == (48, 12)
    assert est_level["output_tokens"] == 4 * est_image["output_tokens"]
