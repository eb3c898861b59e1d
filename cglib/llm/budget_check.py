"""The cost check before an LLM run spends anything: every request still to be made (the chain levels the cache
does not hold, then the generalized captions notebook 03 will ask), estimated at the run's prices, and refused
above `llm.max_cost_usd` (`BudgetRefusedError`, carrying the estimate)."""

from __future__ import annotations

import math
from pathlib import Path

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm.base import Backend, ConceptTask, image_caption_requests
from cglib.llm.cache import ResultCache
from cglib.llm.cost import (
    estimate_chain_requests,
    estimate_generalize_requests,
    estimate_image_generalize_requests,
)
from cglib.llm.generalizers import make_generalizer


def remaining_chain_work(params: Params, backend: Backend, cache: ResultCache | None, dataset: CaptionDataset
                         ) -> tuple[list[tuple[list[str], int]], dict[str, list[str]]]:
    """What a run still has to ask, read from the cache level by level: per image with work left, (captions, first
    level not answered); and the chains already complete in the cache (a cached failure ends a chain unless
    llm.retry_failed, which asks it again)."""
    l_max = params.magic.l_max
    chains: dict[str, list[str]] = {i: [] for i in dataset.image_ids}
    todo: list[tuple[list[str], int]] = []
    active = list(dataset.image_ids)
    for level in range(1, l_max + 1):
        if not active:
            break
        keys = {i: backend.key(backend.payload(ConceptTask(i, level, tuple(dataset.captions[i]), tuple(chains[i]))))
                for i in active}
        cached = cache.get_many(list(keys.values())) if cache is not None else {}
        still = []
        for i in active:
            hit = cached.get(keys[i])
            if hit is None or (not hit.ok and params.llm.retry_failed):
                todo.append((list(dataset.captions[i]), level))
            elif hit.ok:
                chains[i].append(hit.value)
                still.append(i)
        active = still
    return todo, {i: chains[i] for i in active}


def _generalize_estimate(params: Params, cache: ResultCache | None, dataset: CaptionDataset, run_dir: Path,
                         complete: dict[str, list[str]]) -> dict:
    """The generalized-caption requests still to come after the chains (notebook 03): per image (every image;
    those whose chain is complete are looked up in the cache with their chain's names, which merging rarely
    changes) or, with magic.generalize: group, an upper bound of one request per magic.size_min images."""
    if params.magic.generalize == "group":
        groups = max(1, math.ceil(len(dataset.image_ids) / params.magic.size_min))
        return estimate_generalize_requests(params, groups, params.llm.generalize_max_captions)
    mode, n = params.magic.generalize, params.llm.generalized_captions_per_image
    gen_backend = make_generalizer(params, run_dir, mode)
    keyed = {i: [gen_backend.key(gen_backend.payload(r))
                 for r in image_caption_requests(i, list(dataset.captions[i]), c, mode, n)]
             for i, c in complete.items()}
    cached = cache.get_many([k for keys in keyed.values() for k in keys]) if cache is not None and keyed else {}
    items = [(list(dataset.captions[i]), complete.get(i, [])) for i in dataset.image_ids
             if i not in keyed or any(k not in cached for k in keyed[i])]
    return estimate_image_generalize_requests(params, items)


def check_budget(params: Params, backend: Backend, cache: ResultCache | None, dataset: CaptionDataset,
                 run_dir: Path) -> dict:
    """Estimate EVERY request still to be made (the levels of each chain not yet cached, then the generalized
    captions) and refuse to start above llm.max_cost_usd."""
    todo, complete = remaining_chain_work(params, backend, cache, dataset)
    chains = estimate_chain_requests(params, todo)
    gen = _generalize_estimate(params, cache, dataset, run_dir, complete)
    estimate = {"requests": chains["requests"] + gen["requests"],
                "input_tokens": chains["input_tokens"] + gen["input_tokens"],
                "output_tokens": chains["output_tokens"] + gen["output_tokens"],
                "cost_usd": round(chains["cost_usd"] + gen["cost_usd"], 4), "chains": chains, "generalize": gen,
                "images_with_work": len(todo)}
    limit = params.llm.max_cost_usd
    if limit is not None and estimate["cost_usd"] > limit:
        raise BudgetRefusedError(
            f"estimated cost ${estimate['cost_usd']:.2f} of the requests still to be made ({chains['requests']} for "
            f"chains of {len(todo)} images, {gen['requests']} for generalized captions) exceeds llm.max_cost_usd "
            f"(${limit:.2f}); raise the limit, use llm.batch_api, or set data.max_images", estimate)
    return estimate


class BudgetRefusedError(ValueError):
    """The estimate of the requests still to be made passes llm.max_cost_usd: refused before sending any."""

    def __init__(self, message: str, estimate: dict) -> None:
        super().__init__(message)
        self.estimate = estimate
