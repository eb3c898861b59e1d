"""Token and cost accounting: estimates before a run (about 4 characters per token), prices from params, and
the spend limit `llm.max_cost_usd` while a run is going.

The estimate builds the exact requests the run will send (the real prompt templates and few-shot turns) and
counts their characters; output tokens are a small fixed allowance per reply. tiktoken is not needed: at
this scale the chars/4 rule is within about 10-20% for English prompts, which is enough to decide whether a
run is affordable. Real runs report the usage the server returns.

The limit holds twice: before a run, against the estimate of EVERY request still to be made (on a resume: the
levels of each chain not yet cached, and the generalized captions to come); and while it runs, against the
actual spend (`Budget`): a request is only sent when the spend so far plus an estimate for it and for every
request in flight stays under the limit, so a run stops cleanly, with everything answered so far cached, before
its spend would pass the limit (by at most what the requests in flight cost beyond their estimate; the
estimate of one request rises to the dearest reply seen, so a tokenizer dearer than chars/4 is caught early).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cglib.config import LLMParams, Params
from cglib.llm.base import ConceptTask, GroupRequest, estimate_tokens, image_caption_requests
from cglib.llm.openai_backend import chat_payload

CONCEPT_REPLY_TOKENS = 12  # {"concept": "birthday party"}
CAPTION_REPLY_TOKENS = 25  # one generalized caption
COCO_TRAIN_IMAGES = 118_287  # captions_train2017.json
COCO_CAPTION_CHARS = 53  # mean length of COCO captions (measured on the HierarCaps 1K images' 4,746 captions)
PAPER_L1_NODES = 1_071  # paper Table 1


def cost_usd(input_tokens: float, output_tokens: float, llm: LLMParams, price_factor: float = 1.0) -> float:
    """USD for the given tokens at llm.price_* (times price_factor: 0.5 with the Batch API)."""
    return price_factor * (input_tokens * llm.price_input_per_1m + output_tokens * llm.price_output_per_1m) / 1e6


def stand_in_text(chars: int) -> str:
    """A text of exactly `chars` characters ("word word wo"): a stand-in for a caption or concept name of that
    length, whose tokens the chars/4 estimate counts like a real one's."""
    return ("word " * (chars // 5 + 1))[:chars]


def _stand_in_names(names: list[str], l_max: int) -> list[str]:
    """A chain's names l1..l_max, the levels not known yet filled with stand-ins of a concept name's length."""
    return list(names[:l_max]) + [stand_in_text(14 if k == 0 else 12) for k in range(len(names), l_max)]


def estimate_concept_requests(params: Params, captions: list[list[str]], sample: int = 200) -> dict[str, Any]:
    """Estimated tokens and cost of asking all l_max levels for these images (levels 2.. with a stand-in chain)."""
    return estimate_chain_requests(params, [(c, 1) for c in captions], sample)


def estimate_chain_requests(params: Params, todo: list[tuple[list[str], int]], sample: int = 200) -> dict[str, Any]:
    """Estimated tokens and cost of the chain requests still to be made: per image (captions, first level not yet
    answered), every level from that one to l_max (levels 2.. with a stand-in chain)."""
    n = len(todo)
    l_max = params.magic.l_max
    step = max(1, n // sample)
    shown = [c for c, _ in todo[::step][:sample]]
    per_level = []
    for level in range(1, l_max + 1):
        chain = tuple(stand_in_text(14) for _ in range(level - 1))
        tokens = [estimate_tokens(chat_payload(params, ConceptTask("x", level, tuple(c), chain))) for c in shown]
        per_level.append(sum(tokens) / max(1, len(tokens)))
    requests_per_level = [sum(1 for _, first in todo if first <= level) for level in range(1, l_max + 1)]
    input_tokens = sum(r * t for r, t in zip(requests_per_level, per_level))
    requests = sum(requests_per_level)
    output_tokens = requests * CONCEPT_REPLY_TOKENS
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    return {"images": n, "requests": requests, "requests_per_level": requests_per_level,
            "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "input_tokens_per_level": [round(t, 1) for t in per_level],
            "cost_usd": round(cost_usd(input_tokens, output_tokens, params.llm, factor), 4),
            "max_request_usd": cost_usd(max(per_level, default=0.0), CONCEPT_REPLY_TOKENS, params.llm, factor),
            "batch_api": params.llm.batch_api}


def estimate_payloads(params: Params, payloads: list[dict], reply_tokens: list[int]) -> dict[str, Any]:
    """Estimated tokens and cost of exact request bodies (known before sending, as for generalized captions)."""
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    tokens = [estimate_tokens(p) for p in payloads]
    per_request = [cost_usd(t, r, params.llm, factor) for t, r in zip(tokens, reply_tokens)]
    return {"requests": len(payloads), "input_tokens": sum(tokens), "output_tokens": sum(reply_tokens),
            "cost_usd": round(sum(per_request), 6), "max_request_usd": max(per_request, default=0.0),
            "batch_api": params.llm.batch_api}


def estimate_image_generalize_requests(params: Params, items: list[tuple[list[str], list[str]]],
                                       sample: int = 200) -> dict[str, Any]:
    """Estimated tokens and cost of per-image generalized captions (magic.generalize: image, or level: one
    request per level) for (captions, chain names) items; unknown names are stand-ins of a concept's length."""
    n_items = len(items)
    if not n_items:
        return {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "max_request_usd": 0.0}
    step = max(1, n_items // sample)
    shown = items[::step][:sample]
    l_max = params.magic.l_max
    requests = [r for caps, names in shown
                for r in image_caption_requests("i", list(caps), _stand_in_names(names, l_max),
                                                params.magic.generalize, params.llm.generalized_captions_per_image)]
    est = estimate_payloads(params, [chat_payload(params, r) for r in requests],
                            [r.n * CAPTION_REPLY_TOKENS for r in requests])
    scale = n_items / len(shown)
    tin, tout = est["input_tokens"] * scale, est["output_tokens"] * scale
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    return {"requests": round(len(requests) * scale), "input_tokens": int(tin), "output_tokens": int(tout),
            "cost_usd": round(cost_usd(tin, tout, params.llm, factor), 4), "max_request_usd": est["max_request_usd"]}


def estimate_generalize_requests(params: Params, groups: int, captions_per_group: int,
                                 caption_chars: int = COCO_CAPTION_CHARS) -> dict[str, Any]:
    """Estimated tokens and cost of generalized captions for `groups` nodes."""
    n = params.llm.generalized_captions_per_node
    req = GroupRequest("g", stand_in_text(14), [stand_in_text(12)] * (params.magic.l_max - 1),
                       [stand_in_text(caption_chars)] * captions_per_group, n)
    input_tokens = groups * estimate_tokens(chat_payload(params, req))
    output_tokens = groups * n * CAPTION_REPLY_TOKENS
    factor = params.llm.batch_price_factor if params.llm.batch_api else 1.0
    return {"groups": groups, "requests": groups, "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "cost_usd": round(cost_usd(input_tokens, output_tokens, params.llm, factor), 4)}


def estimate_full_coco(params: Params, images: int = COCO_TRAIN_IMAGES, captions_per_image: int = 5,
                       caption_chars: int = COCO_CAPTION_CHARS, l1_nodes: int = PAPER_L1_NODES) -> list[dict[str, Any]]:
    """Rows of the cost estimate of the paper's full run (COCO train2017, l_max levels + LLM_gen per image, or per
    l1 node with magic.generalize: group), live and with the Batch API, at the prices in params."""
    caps = [[stand_in_text(caption_chars)] * captions_per_image]
    rows = []
    for batch in (False, True):
        p = params.model_copy(update={"llm": params.llm.model_copy(update={"batch_api": batch})})
        factor = params.llm.batch_price_factor if batch else 1.0
        per_image = estimate_concept_requests(p, caps)  # every image has the same stand-in captions: scale one
        tin = images * sum(per_image["input_tokens_per_level"])
        tout = images * params.magic.l_max * CONCEPT_REPLY_TOKENS
        if params.magic.generalize != "group":
            one = estimate_image_generalize_requests(p, [(caps[0], [])])  # scale one (rounded costs would not)
            gen = {key: one[key] * images for key in ("requests", "input_tokens", "output_tokens")}
            gen["cost_usd"] = cost_usd(gen["input_tokens"], gen["output_tokens"], params.llm, factor)
        else:
            gen = estimate_generalize_requests(p, l1_nodes, params.llm.generalize_max_captions, caption_chars)
        mode = "Batch API" if batch else "live"
        rows.append({"step": f"chains l1..l{params.magic.l_max} ({mode})", "requests": images * params.magic.l_max,
                     "input_tokens": int(tin), "output_tokens": int(tout),
                     "cost_usd": round(cost_usd(tin, tout, params.llm, factor), 2)})
        rows.append({"step": f"generalized captions per {params.magic.generalize} ({mode})", "requests": gen["requests"],
                     "input_tokens": gen["input_tokens"], "output_tokens": gen["output_tokens"],
                     "cost_usd": round(gen["cost_usd"], 2)})
    return rows


@dataclass
class Budget:
    """`llm.max_cost_usd` while requests are being made: actual spend so far, requests in flight, and the estimated
    cost of one request. Backends call `reserve` before sending a job, `add` with the usage of every reply and
    `release` when the job is done; a refused reservation stops the run (see the module docstring)."""

    limit_usd: float | None
    price: Callable[[int, int], float]  # USD of (input tokens, output tokens) at this run's prices
    request_usd: float  # estimated cost of one request not yet answered
    spent_usd: float = 0.0
    in_flight: int = 0
    stopped: bool = False

    def fits(self, jobs: int = 1) -> bool:
        """Whether `jobs` more requests fit under the limit beside the spend and the requests in flight."""
        if self.limit_usd is None:
            return True
        return self.spent_usd + (self.in_flight + jobs) * self.request_usd <= self.limit_usd + 1e-12

    def reserve(self, jobs: int = 1) -> bool:
        """Count `jobs` requests in flight if they fit; otherwise mark the run stopped and return False."""
        if not self.fits(jobs):
            self.stopped = True
            return False
        self.in_flight += jobs
        return True

    def add(self, input_tokens: int, output_tokens: int) -> None:
        """Add the usage of one reply to the spend; a reply dearer than the estimate raises the estimate."""
        cost = self.price(input_tokens, output_tokens)
        self.spent_usd += cost
        self.request_usd = max(self.request_usd, cost)  # the server's real tokens beat the chars/4 rule

    def release(self, jobs: int = 1) -> None:
        """`jobs` requests are no longer in flight."""
        self.in_flight = max(0, self.in_flight - jobs)

    def message(self, answered: int, unanswered: int) -> str:
        """Why the run stopped and what to do."""
        return (f"stopped before the spend passes llm.max_cost_usd (${self.limit_usd:.4f}): ${self.spent_usd:.4f} "
                f"spent in this run, about ${self.request_usd:.4f} per further request; {answered} answers of this "
                f"step are cached (a rerun does not pay for them again), {unanswered} were not asked. Raise "
                "llm.max_cost_usd (or use llm.batch_api at half price) and run again to continue")


def make_budget(params: Params, price_factor: float, request_usd: float) -> Budget:
    """The running budget of one step at this run's prices (no limit when llm.max_cost_usd is null)."""
    return Budget(limit_usd=params.llm.max_cost_usd,
                  price=lambda tin, tout: cost_usd(tin, tout, params.llm, price_factor),
                  request_usd=max(request_usd, 0.0) if not math.isnan(request_usd) else 0.0)
