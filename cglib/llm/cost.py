"""Token and cost accounting: estimates before a run (about 4 characters per token) and prices from params.

The estimate builds the exact requests the run will send (the real prompt templates and few-shot turns) and
counts their characters; output tokens are a small fixed allowance per reply. tiktoken is not needed: at
this scale the chars/4 rule is within about 10-20% for English prompts, which is enough to decide whether a
run is affordable. Real runs report the usage the server returns.
"""

from __future__ import annotations

import json
from typing import Any

from cglib.config import LLMParams, Params
from cglib.llm.base import ConceptTask, GroupRequest

CHARS_PER_TOKEN = 4.0
TOKENS_PER_MESSAGE = 4  # chat formatting overhead per message
CONCEPT_REPLY_TOKENS = 12  # {"concept": "birthday party"}
CAPTION_REPLY_TOKENS = 25  # one generalized caption
COCO_TRAIN_IMAGES = 118_287  # captions_train2017.json
COCO_CAPTION_CHARS = 53  # mean length of COCO captions (measured on the HierarCaps 1K images' 4,746 captions)
PAPER_L1_NODES = 1_071  # paper Table 1


def estimate_tokens(payload: dict) -> int:
    """Approximate input tokens of a chat-completions body: message characters / 4, plus the schema."""
    chars = sum(len(m.get("content") or "") for m in payload.get("messages", []))
    chars += len(json.dumps(payload.get("response_format", ""))) if "response_format" in payload else 0
    return int(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(payload.get("messages", []))


def cost_usd(input_tokens: float, output_tokens: float, llm: LLMParams, price_factor: float = 1.0) -> float:
    """USD for the given tokens at llm.price_* (times price_factor: 0.5 with the Batch API)."""
    return price_factor * (input_tokens * llm.price_input_per_1m + output_tokens * llm.price_output_per_1m) / 1e6


def _filler(chars: int) -> str:
    return ("word " * (chars // 5 + 1))[:chars]


def estimate_concept_requests(params: Params, captions: list[list[str]], sample: int = 200) -> dict[str, Any]:
    """Estimated tokens and cost of asking all l_max levels for these images (levels 2.. with a stand-in chain)."""
    from cglib.llm.openai_backend import chat_payload

    n = len(captions)
    step = max(1, n // sample)
    shown = captions[::step][:sample]
    per_level = []
    for level in range(1, params.magic.l_max + 1):
        chain = tuple(_filler(14) for _ in range(level - 1))
        tokens = [estimate_tokens(chat_payload(params, ConceptTask("x", level, tuple(c), chain))) for c in shown]
        per_level.append(sum(tokens) / max(1, len(tokens)))
    input_tokens = n * sum(per_level)
    output_tokens = n * params.magic.l_max * CONCEPT_REPLY_TOKENS
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    return {"images": n, "requests": n * params.magic.l_max, "input_tokens": int(input_tokens),
            "output_tokens": int(output_tokens), "input_tokens_per_level": [round(t, 1) for t in per_level],
            "cost_usd": round(cost_usd(input_tokens, output_tokens, params.llm, factor), 4),
            "batch_api": params.llm.batch_api}


def estimate_generalize_requests(params: Params, groups: int, captions_per_group: int,
                                 caption_chars: int = COCO_CAPTION_CHARS) -> dict[str, Any]:
    """Estimated tokens and cost of generalized captions for `groups` nodes."""
    from cglib.llm.openai_backend import chat_payload

    n = params.llm.generalized_captions_per_node
    req = GroupRequest("g", _filler(14), [_filler(12)] * (params.magic.l_max - 1),
                       [_filler(caption_chars)] * captions_per_group, n)
    input_tokens = groups * estimate_tokens(chat_payload(params, req))
    output_tokens = groups * n * CAPTION_REPLY_TOKENS
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    return {"groups": groups, "requests": groups, "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "cost_usd": round(cost_usd(input_tokens, output_tokens, params.llm, factor), 4)}


def estimate_full_coco(params: Params, images: int = COCO_TRAIN_IMAGES, captions_per_image: int = 5,
                       caption_chars: int = COCO_CAPTION_CHARS, l1_nodes: int = PAPER_L1_NODES) -> list[dict[str, Any]]:
    """Rows of the cost estimate of the paper's full run (COCO train2017, l_max levels + LLM_gen per l1 node),
    live and with the Batch API, at the prices in params."""
    caps = [[_filler(caption_chars)] * captions_per_image]
    rows = []
    for batch in (False, True):
        p = params.model_copy(update={"llm": params.llm.model_copy(update={"batch_api": batch})})
        factor = params.llm.batch_price_factor if batch else 1.0
        per_image = estimate_concept_requests(p, caps)  # every image has the same stand-in captions: scale one
        tin = images * sum(per_image["input_tokens_per_level"])
        tout = images * params.magic.l_max * CONCEPT_REPLY_TOKENS
        gen = estimate_generalize_requests(p, l1_nodes, params.llm.generalize_max_captions, caption_chars)
        mode = "Batch API" if batch else "live"
        rows.append({"step": f"chains l1..l{params.magic.l_max} ({mode})", "requests": images * params.magic.l_max,
                     "input_tokens": int(tin), "output_tokens": int(tout),
                     "cost_usd": round(cost_usd(tin, tout, params.llm, factor), 2)})
        rows.append({"step": f"generalized captions ({mode})", "requests": gen["requests"],
                     "input_tokens": gen["input_tokens"], "output_tokens": gen["output_tokens"],
                     "cost_usd": round(gen["cost_usd"], 2)})
    return rows
