"""LLM_gen requests (PAPER_NOTES step 5): generalized captions, per image or per l1 node, through the engine.

A `GroupRequest` of scope "image" (magic.generalize: image, the paper's step list and the authors' code) asks
for n captions of ONE image from its own captions, its l1 concept and that concept's ancestors; scope "group"
(magic.generalize: group) asks for n captions of a whole l1 node from its pooled captions. Both go through the
abstraction engine: same client, retries, SQLite cache (resumable, zero repeated requests) and failure
accounting by reason. Building the requests from the DAG and storing the answers is
`cglib.magic.generalized_captions`' job.

Backends: `openai` asks the LLM (the per-image prompt is versioned on its own, llm.generalize_image_prompt_version;
a group prompt shows at most llm.generalize_max_captions of the node's captions, a seeded sample). `offline` is
an honest, deterministic phrase counter: it keeps the phrases (objects, settings: runs of content words between
function words, head noun singularized) that the most captions share (of the group, or of the one image) and
phrases them as captions ("a scene with a cake, a balloon and a gift box in a living room"). It never sees the
concept name or the parents, so it cannot insert them: concept names are the evaluation queries, and a training
text that contains them would leak the answer. (A phrase can still contain a concept word when the captions
themselves do; the summary counts such captions for every backend.) `oracle` has nothing to say about
captions: generalization falls back to the offline generalizer, and the summary says so.
"""

from __future__ import annotations

import json
import math
import re
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.llm.base import Backend, Failure, FatalBackendError, GroupRequest, Job, Outcome, Report, run_sync
from cglib.llm.cache import ResultCache
from cglib.llm.canonical import INVARIANT, canonicalize
from cglib.llm.cost import CAPTION_REPLY_TOKENS, estimate_payloads, make_budget
from cglib.llm.engine import Stats, cache_path, execute
from cglib.run import provenance, write_json

GENERALIZED_FILE = "generalized.jsonl"
GENERALIZE_SUMMARY_FILE = "generalize_summary.json"
ORACLE_FALLBACK_NOTE = ("llm.backend is 'oracle': the ground truth has no generalized captions, so the offline "
                        "generalizer (shared phrases) wrote them")

_FUNCTION_WORDS = """
a an the and or but with without of in on at to from by for into onto over under above below behind beside
besides between near next inside outside around through across along up down out off about against among
beneath toward towards while as than then there here this that these those it its it's he she they them
their his her him we our you your i my me who whom which what where when how some any each every all both
several many much few lots lot other another one two three four five six seven eight nine ten couple pair
group bunch is are was were be been being am has have had do does did can could will would may might shall
should very just also not no so too more most together top front side back middle edge area part view
photo picture image scene shot close closeup someone something people person
sitting sits sit standing stands stand holding holds hold looking looks look playing plays play eating eats
eat riding rides ride walking walks walk waiting waits wait lying lies laying lays parked filled covered
topped made shown seen using uses use wearing wears wear carrying carries carry flying flies getting gets
going goes taking takes showing shows watching watches having posing poses placed set stacked
big small large little tiny huge tall short long old young new white black red blue green yellow orange
brown pink purple gray grey dark light bright colorful colourful navy teal beige gold golden silver
striped spotted dotted plain checkered wooden various different same empty full open closed
"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())
SETTING_WORDS = frozenset({"in", "at", "on", "inside"})
MAX_PHRASE_WORDS = 3
TEMPLATES = ("a scene with {objects}{setting}", "{objects}{setting}", "a photo showing {objects}{setting}",
             "a picture of {objects}{setting}", "{objects} seen together{setting}")
SIZES = (3, 2, 4, 1, 3)


def _article(phrase: str) -> str:
    if phrase.rsplit(" ", 1)[-1] in INVARIANT:  # plural-only nouns: "binoculars", not "a binoculars"
        return phrase
    return f"{'an' if phrase[:1] in 'aeiou' else 'a'} {phrase}"


NOUNS_IN_ING = frozenset({"building", "ceiling", "clothing", "painting", "wedding", "evening", "morning", "icing",
                          "frosting", "stuffing", "railing", "awning", "sibling", "pudding", "bedding", "dumpling",
                          "seasoning", "topping", "filling", "landing", "crossing", "lightning", "earring",
                          "stocking", "sculpting", "offering", "gathering", "opening"})


def _is_verb_ing(token: str) -> bool:
    return len(token) > 5 and token.endswith("ing") and token not in NOUNS_IN_ING


def caption_phrases(caption: str) -> list[tuple[str, str]]:
    """(phrase, preposition) for each run of content words; the preposition is "in"/"at"/"on"/"inside" when
    one stands right before the run (a setting candidate), else "".

    Runs end at function words, punctuation and (inside a run) -ing verbs ("a dog sleeping"); a run's
    first word may end in -ing ("living room"). Phrases keep at most the last 3 words, head singularized.
    """
    tokens = re.findall(r"[a-z]+|[,.;:!?()]", caption.lower())
    phrases: list[tuple[str, str]] = []
    run: list[str] = []
    last_function = ""
    prep = ""

    def close() -> None:
        phrase = canonicalize(" ".join(run[-MAX_PHRASE_WORDS:]))
        if len(phrase) >= 3:
            phrases.append((phrase, prep))
        run.clear()

    for tok in [*tokens, "."]:
        boundary = tok in FUNCTION_WORDS or not tok.isalpha() or (run and _is_verb_ing(tok))
        if boundary:
            if run:
                close()
            if tok not in ("a", "an", "the"):
                last_function = tok
            continue
        if not run:
            prep = last_function if last_function in SETTING_WORDS else ""
        run.append(tok)
    return phrases


@dataclass
class SharedPhrases:
    """Phrases of a group ranked by how many captions contain them (objects) and the most shared setting."""

    objects: list[tuple[str, int]]
    settings: list[tuple[str, str, int]]  # phrase, its usual preposition, captions


def shared_phrases(captions: list[str]) -> SharedPhrases:
    """Count phrases over captions (each caption once); a phrase mostly after in/at/on is a setting.

    A multi-word phrase also counts for its head noun ("a birthday cake is a cake"); a head and its longer
    phrase are then reported once: the longer one when it accounts for at least half of the head's count.
    """
    df: Counter = Counter()
    preps: dict[str, Counter] = {}
    for caption in captions:
        found = caption_phrases(caption)
        heads = {p.rsplit(" ", 1)[-1] for p, _ in found if " " in p}
        df.update({p for p, _ in found} | heads)
        for p, prep in found:
            preps.setdefault(p, Counter())[prep] += 1
    settings = []
    for p, counter in preps.items():
        located = sum(n for k, n in counter.items() if k)
        if located * 2 >= sum(counter.values()):
            prep = max((k for k in counter if k), key=lambda k: (counter[k], k == "in"))
            settings.append((p, prep, df[p]))
    settings.sort(key=lambda x: (-x[2], x[0]))
    setting_names = {p for p, _, _ in settings}
    setting_heads = {p.rsplit(" ", 1)[-1] for p in setting_names}
    ranked = sorted(((p, n) for p, n in df.items() if p not in setting_names and p not in setting_heads),
                    key=lambda kv: (-kv[1], kv[0]))
    objects: list[tuple[str, int]] = []
    for phrase, n in ranked:
        longer = max((m for q, m in ranked if q.endswith(" " + phrase)), default=0)
        if " " not in phrase and longer * 2 >= n:
            continue  # represented by its longer phrase
        if " " in phrase and any(q == phrase.rsplit(" ", 1)[-1] for q, _ in objects):
            continue  # its head was kept instead
        objects.append((phrase, n))
    return SharedPhrases(objects=objects, settings=settings)


def offline_generalize(captions: list[str], n: int) -> tuple[list[str], dict[str, Any]]:
    """`n` deterministic captions from the phrases most captions share (no concept name involved)."""
    found = shared_phrases(captions)
    min_share = max(2, math.ceil(0.1 * len(captions)))  # shared: by at least 2 captions and 10% of them
    shared_objects = [p for p, k in found.objects if k >= min_share][:6]
    top_setting = next(((p, prep) for p, prep, k in found.settings if k >= min_share), None)
    weak = not shared_objects
    if weak:  # nothing is shared: use the most frequent phrases anyway, and say so in the meta
        shared_objects = [p for p, _ in found.objects[:3]] or ["everyday objects"]
    setting = f" {top_setting[1]} {_article(top_setting[0])}" if top_setting else ""
    out: list[str] = []
    for j in range(n * 4):
        if len(out) == n:
            break
        size = min(SIZES[j % len(SIZES)], len(shared_objects))
        start = (j // len(TEMPLATES)) % len(shared_objects)
        picked = (shared_objects[start:] + shared_objects[:start])[:size]
        listed = ", ".join(_article(p) for p in picked[:-1])
        listed = f"{listed} and {_article(picked[-1])}" if listed else _article(picked[-1])
        text = TEMPLATES[j % len(TEMPLATES)].format(objects=listed, setting=setting)
        if text not in out:
            out.append(text)
    duplicates = n - len(out)
    out += [out[k % len(out)] for k in range(duplicates)]  # too few distinct phrasings: repeat, counted
    return out, {"shared_objects": shared_objects, "setting": top_setting[0] if top_setting else None, "weak": weak,
                 "duplicates": duplicates}


class OfflineGeneralizer(Backend):
    """Generalized captions from shared phrases; deterministic, no network, never sees the concept name."""

    name = "offline"
    model = "shared-phrases-v1"
    prompt_version = None
    streaming = False

    def payload(self, task: GroupRequest) -> dict:
        body = {"captions": list(task.captions), "n": task.n}
        return body if task.scope == "group" else {**body, "scope": task.scope}  # group keys as before

    async def run(self, jobs: list[Job], report: Report) -> None:
        for job in jobs:
            captions, meta = offline_generalize(job.payload["captions"], job.payload["n"])
            report(job, Outcome(ok=True, value=captions, meta=meta))


@dataclass
class GeneralizeResult:
    """Generalized captions by group id (successful groups only), failures, and the summary."""

    captions: dict[str, list[str]]
    failures: list[Failure]
    summary: dict[str, Any]


def make_generalizer(params: Params, run_dir: Path, scope: str = "group") -> Backend:
    """The generalization backend for llm.backend (oracle falls back to the offline generalizer).

    Per-image requests carry their own prompt version (llm.generalize_image_prompt_version) in the cache key
    and in every row, so changing the concept prompts does not ask for them again.
    """
    if params.llm.backend == "openai":
        from cglib.llm.openai_backend import OpenAIBackend
        from cglib.llm.prompts import load_image_prompt

        backend = OpenAIBackend(params, work_dir=Path(run_dir) / "abstraction" / "batches")
        if scope == "image":
            backend.prompt_version = load_image_prompt(params.llm.generalize_image_prompt_version).version
        return backend
    return OfflineGeneralizer()


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
        raise ValueError(f"estimated cost ${estimate['cost_usd']:.2f} of {estimate['requests']} uncached "
                         f"generalized-caption requests exceeds llm.max_cost_usd (${limit:.2f}); raise the limit, "
                         "use llm.batch_api, or set magic.generalize: group (one request per l1 node)")
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


async def _generalize(requests: list[GroupRequest], params: Params, run_dir: Path, backend: Backend,
                      progress: bool, scope: str = "group") -> GeneralizeResult:
    start = time.perf_counter()
    stats = Stats()
    kind = "generalize" if scope == "group" else "generalize_image"
    out_dir = run_dir / "abstraction"
    estimate = None
    with ResultCache(cache_path(params, run_dir)) as cache:
        budget = None
        if params.llm.backend == "openai":
            estimate = check_generalize_budget(params, backend, cache, requests)
            budget = make_budget(params, backend.price_factor, estimate["max_request_usd"])
            if progress and estimate["requests"]:
                print(f"estimate for {estimate['requests']:,} uncached generalized-caption requests: "
                      f"{estimate['input_tokens']:,} input tokens, about ${estimate['cost_usd']:.2f}")
        try:
            outcomes = await execute(backend, cache, requests, stats, kind, params.llm.retry_failed,
                                     desc=f"generalized captions ({scope})", progress=progress, budget=budget)
        except FatalBackendError as exc:  # quota, auth, llm.max_cost_usd: answers so far are cached
            out_dir.mkdir(parents=True, exist_ok=True)
            write_json(out_dir / GENERALIZE_SUMMARY_FILE, {
                "status": "stopped", "error": str(exc), "scope": scope, "backend": backend.name,
                "estimate_before_run": estimate, **stats.as_dict(params, backend.price_factor),
                "provenance": provenance(params, stage="generalize")})
            raise
    captions = {r.group_id: list(o.value) for r, o in zip(requests, outcomes) if o.ok}
    failures = [Failure(r.group_id, None, o.reason, o.detail, o.raw) for r, o in zip(requests, outcomes) if not o.ok]
    mentions = sum(mentions_concept(c, r.concept) for r in requests for c in captions.get(r.group_id, []))
    by_level: Counter = Counter()  # every name the request showed (l1 and its ancestors), not l1 alone
    for r in requests:
        for c in captions.get(r.group_id, []):
            by_level.update(k for k, name in enumerate([r.concept, *r.parents], start=1) if mentions_concept(c, name))
    summary: dict[str, Any] = {
        "status": "complete", "scope": scope, "backend": backend.name, "model": backend.model,
        "prompt_version": backend.prompt_version, "groups": len(requests), "ok": len(captions),
        "failed": len(failures), "captions": sum(len(c) for c in captions.values()),
        "captions_mentioning_concept": mentions,
        "captions_mentioning_level": {f"l{k}": by_level[k] for k in range(1, 1 + max((1 + len(r.parents)
                                                                                       for r in requests), default=0))},
        "estimate_before_run": estimate,
        "wall_s": round(time.perf_counter() - start, 3), **stats.as_dict(params, backend.price_factor),
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
