"""LLM_gen requests (PAPER_NOTES step 5): generalized captions, per image or per l1 node, through the engine.

A `GroupRequest` of scope "image" (magic.generalize: image, the paper's step list) asks for n captions of ONE
image from its own captions, its l1 concept and that concept's ancestors; scope "level" (magic.generalize:
level, the authors' generate_new_caption.py) asks for one caption of one image at one level, given only that
level's concept; scope "group" (magic.generalize: group) asks for n captions of a whole l1 node from its pooled
captions. Both go through the
abstraction engine: same client, retries, SQLite cache (resumable: a kill repeats only the requests in flight)
and failure accounting by reason. Building the requests from the DAG and storing the answers is
`cglib.magic.generalized_captions`' job.

Backends: `openai` asks the LLM (the per-image and per-level prompts are versioned on their own,
llm.generalize_image_prompt_version and llm.generalize_level_prompt_version;
a group prompt shows at most llm.generalize_max_captions of the node's captions, a seeded sample). `offline` is
an honest, deterministic phrase counter: it keeps the phrases (objects, settings: runs of content words between
function words, head noun singularized) that the most captions share (of the group, or of the one image) and
phrases them as captions ("a scene with a cake, a balloon and a gift box in a living room"). It never sees the
concept name or the parents, so it cannot insert them: concept names are the evaluation queries, and a training
text that contains them would leak the answer. (A phrase can still contain a concept word when the captions
themselves do; the summary counts such captions for every backend.) `oracle` has nothing to say about
captions: generalization falls back to the offline generalizer, and the summary says so. The backends are in
`cglib.llm.generalizers`.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.llm.base import Backend, BudgetExceededError, Failure, FatalBackendError, GroupRequest, run_sync
from cglib.llm.budget_check import BudgetRefusedError
from cglib.llm.cache import ResultCache
from cglib.llm.canonical import canonicalize
from cglib.llm.cost import CAPTION_REPLY_TOKENS, estimate_payloads, make_budget
from cglib.llm.engine import Stats, cache_path, execute, llm_account
from cglib.llm.generalizers import OfflineGeneralizer, make_generalizer
from cglib.run import provenance, write_json

GENERALIZED_FILE = "generalized.jsonl"
GENERALIZE_SUMMARY_FILE = "generalize_summary.json"
ORACLE_FALLBACK_NOTE = ("llm.backend is 'oracle': the ground truth has no generalized captions, so the offline "
                        "generalizer (shared phrases) wrote them")

@dataclass
class GeneralizeResult:
    """Generalized captions by group id (successful groups only), failures, and the summary."""

    captions: dict[str, list[str]]
    failures: list[Failure]
    summary: dict[str, Any]


def _check_requests(requests: list[GroupRequest]) -> str:
    """Validate a request list and return its one scope ("group" or "image")."""
    scopes = {r.scope for r in requests}
    if len(scopes) > 1:
        raise ValueError("group and image requests mixed in one call; send each scope in its own call")
    ids = Counter(r.group_id for r in requests)
    dupes = [g for g, k in ids.items() if k > 1]
    if dupes:
        raise ValueError(f"duplicate group ids {dupes[:5]}; give every GroupRequest its own group_id")
    for r in requests:
        if r.n < 1 or not r.captions:
            raise ValueError(f"group {r.group_id}: needs n >= 1 and at least one caption (got n={r.n}, "
                             f"{len(r.captions)} captions)")
    return scopes.pop() if scopes else "group"


def _word_forms(text: str) -> list[str]:
    """Lower-case words of a text, each in canonical (singular) form; '&' reads as 'and'."""
    text = unicodedata.normalize("NFKC", text).lower().replace("&", " and ")
    return [canonicalize(w) for w in re.findall(r"[a-z0-9]+", text)]


def mentions_concept(caption: str, concept: str) -> bool:
    """Whether a caption contains the concept name as whole words, case-insensitive (every word compared in its
    canonical singular form, so "Birthday Parties" mentions "birthday party")."""
    name = [w for w in _word_forms(canonicalize(concept)) if w]
    words = " " + " ".join(_word_forms(caption)) + " "
    return bool(name) and f" {' '.join(name)} " in words


def check_generalize_budget(params: Params, backend: Backend, cache: ResultCache, requests: list[GroupRequest]
                            ) -> dict[str, Any]:
    """Estimate the uncached requests from their exact bodies; refuse to start above llm.max_cost_usd."""
    payloads = {}
    for r in requests:
        payload = backend.payload(r)
        payloads.setdefault(backend.key(payload), (payload, r.n))
    cached = cache.get_many(list(payloads))
    todo = [v for k, v in payloads.items() if k not in cached or (not cached[k].ok and params.llm.retry_failed)]
    estimate = estimate_payloads(params, [p for p, _ in todo], [n * CAPTION_REPLY_TOKENS for _, n in todo])
    limit = params.llm.max_cost_usd
    if limit is not None and estimate["cost_usd"] > limit:
        raise BudgetRefusedError(f"estimated cost ${estimate['cost_usd']:.2f} of {estimate['requests']} uncached "
                         f"generalized-caption requests exceeds llm.max_cost_usd (${limit:.2f}); raise the limit, "
                         "use llm.batch_api, or set magic.generalize: group (one request per l1 node)", estimate)
    return estimate


def generalize_groups(requests: list[GroupRequest], params: Params, run_dir: Path,
                      progress: bool = True) -> GeneralizeResult:
    """Generalized captions for every request (all of one scope: groups or images) with llm.backend; writes
    generalized.jsonl and its summary under `<run_dir>/abstraction/`. Same cache, retries and failure handling
    as `run_abstraction`. Keyed by `group_id` (the image id for scope "image")."""
    scope = _check_requests(requests)
    run_dir = Path(run_dir)
    backend = make_generalizer(params, run_dir, scope)
    return run_sync(lambda: _generalize(requests, params, run_dir, backend, progress, scope))


def _account(stats: Stats, requests: list[GroupRequest], params: Params, backend: Backend, estimate: dict | None,
             status: str, stopped_by: str | None = None) -> dict[str, Any]:
    """The stage's account (`cglib.llm.engine.llm_account`): one item per request."""
    estimated = estimate["cost_usd"] if estimate else None
    return llm_account(stats, len(requests), params, backend, estimated, status, stopped_by)


async def _generalize(requests: list[GroupRequest], params: Params, run_dir: Path, backend: Backend,
                      progress: bool, scope: str = "group") -> GeneralizeResult:
    start = time.perf_counter()
    stats = Stats()
    kind = {"group": "generalize", "image": "generalize_image", "level": "generalize_level"}[scope]
    out_dir = run_dir / "abstraction"
    estimate = None
    with ResultCache(cache_path(params, run_dir)) as cache:
        budget = None
        try:
            if params.llm.backend == "openai":
                try:
                    estimate = check_generalize_budget(params, backend, cache, requests)
                except BudgetRefusedError as exc:  # nothing sent: every item is never asked
                    estimate = exc.estimate
                    stats.never_asked += len(requests)
                    raise
                budget = make_budget(params, backend.price_factor, estimate["max_request_usd"])
                if progress and estimate["requests"]:
                    print(f"estimate for {estimate['requests']:,} uncached generalized-caption requests: "
                          f"{estimate['input_tokens']:,} input tokens, about ${estimate['cost_usd']:.2f}")
            outcomes = await execute(backend, cache, requests, stats, kind, params.llm.retry_failed,
                                     desc=f"generalized captions ({scope})", progress=progress, budget=budget)
        except (FatalBackendError, BudgetRefusedError) as exc:  # quota, auth, llm.max_cost_usd: answers so far are cached
            stopped_by = "llm.max_cost_usd" if isinstance(exc, BudgetExceededError | BudgetRefusedError) else exc.reason
            out_dir.mkdir(parents=True, exist_ok=True)
            write_json(out_dir / GENERALIZE_SUMMARY_FILE, {
                "status": "stopped", "error": str(exc), "scope": scope, "backend": backend.name,
                "estimate_before_run": estimate, **stats.as_dict(params, backend.price_factor),
                "account": _account(stats, requests, params, backend, estimate, "stopped", stopped_by),
                "provenance": provenance(params, stage="generalize")})
            raise
    captions = {r.group_id: list(o.value) for r, o in zip(requests, outcomes) if o.ok}
    failures = [Failure(r.group_id, None, o.reason, o.detail, o.raw) for r, o in zip(requests, outcomes) if not o.ok]
    mentions = sum(mentions_concept(c, r.concept) for r in requests for c in captions.get(r.group_id, []))
    by_level: Counter = Counter()  # every name the request showed (l1 and its ancestors), not l1 alone
    for r in requests:
        for c in captions.get(r.group_id, []):
            by_level.update(k for k, name in enumerate([r.concept, *r.parents], start=r.level)
                            if mentions_concept(c, name))
    summary: dict[str, Any] = {
        "status": "complete", "scope": scope, "backend": backend.name, "model": backend.model,
        "prompt_version": backend.prompt_version, "groups": len(requests), "ok": len(captions),
        "failed": len(failures), "captions": sum(len(c) for c in captions.values()),
        "captions_mentioning_concept": mentions,
        "captions_mentioning_level": {f"l{k}": by_level[k] for k in range(1, 1 + max((r.level + len(r.parents)
                                                                                       for r in requests), default=0))},
        "estimate_before_run": estimate,
        "wall_s": round(time.perf_counter() - start, 3), **stats.as_dict(params, backend.price_factor),
        "account": _account(stats, requests, params, backend, estimate, "complete"),
    }
    if isinstance(backend, OfflineGeneralizer):
        summary["items_without_shared_phrase"] = sum(1 for o in outcomes if o.ok and o.meta.get("weak"))
        summary["repeated_captions"] = sum(int(o.meta.get("duplicates", 0)) for o in outcomes if o.ok)
    if params.llm.backend == "oracle":
        summary["note"] = ORACLE_FALLBACK_NOTE
    summary["provenance"] = provenance(params, stage="generalize")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (GENERALIZED_FILE + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r, o in zip(requests, outcomes):
            fh.write(json.dumps({"group_id": r.group_id, "scope": r.scope, "concept": r.concept,
                                 "captions": list(o.value) if o.ok else None, "status": "ok" if o.ok else "failed",
                                 "failure_reason": o.reason, "backend": backend.name, "model": backend.model,
                                 "prompt_version": backend.prompt_version}, ensure_ascii=False) + "\n")
    tmp.replace(out_dir / GENERALIZED_FILE)
    write_json(out_dir / GENERALIZE_SUMMARY_FILE, summary)
    return GeneralizeResult(captions=captions, failures=failures, summary=summary)
