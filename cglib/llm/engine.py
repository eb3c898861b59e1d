"""The abstraction engine: Algorithm 1, lines 2-11, at COCO scale (every image, l1..l_max, one chain each).

Level by level: level 1 asks for each image's l1 concept from all its captions; level k asks for the next,
more general concept from the captions and the chain so far. Every request goes through the on-disk cache
(a killed run resumes with zero repeated requests for finished items), identical requests are sent once,
and every failure is recorded with its reason; an image whose level k fails has no chain. Working level by
level is what the Batch API needs anyway (level k+1 depends on level k).

Outputs in `<run>/abstraction/`: chains.jsonl (one row per image), summary.json (counts, tokens, cost,
cache hits, failures by reason, few-shot copies, provenance), cache.sqlite (unless llm.cache_path).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm.base import Backend, ConceptTask, Failure, FatalBackendError, Job, Outcome, run_sync
from cglib.llm.cache import ResultCache
from cglib.llm.canonical import canonicalize
from cglib.llm.cost import cost_usd, estimate_concept_requests
from cglib.llm.prompts import few_shot_chains, load_prompts
from cglib.run import provenance, write_json

CHAINS_FILE = "chains.jsonl"
SUMMARY_FILE = "summary.json"
ORACLE_NOTE = ("oracle backend: chains are the synthetic world's ground truth, not inferred from captions; "
               "for controlled experiments only")


@dataclass
class AbstractionResult:
    """Chains of the images that succeeded, every failure, and the run summary."""

    chains: dict[str, list[str]]
    failures: list[Failure]
    summary: dict[str, Any]


@dataclass
class Stats:
    """Counters of one engine run (items are tasks: one image at one level, or one group)."""

    items: int = 0
    cache_hits: int = 0
    cache_failure_hits: int = 0  # cached reply failures returned as failures (llm.retry_failed: false)
    cache_misses: int = 0
    deduplicated: int = 0  # items answered by an identical request of another item
    requests: int = 0
    retries: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0  # what the cache hits cost when they were first asked
    cached_output_tokens: int = 0

    def as_dict(self, params: Params, price_factor: float) -> dict[str, Any]:
        spent = cost_usd(self.input_tokens, self.output_tokens, params.llm, price_factor)
        saved = cost_usd(self.cached_input_tokens, self.cached_output_tokens, params.llm, price_factor)
        return {"items": self.items,
                "cache": {"hits": self.cache_hits, "failure_hits": self.cache_failure_hits,
                          "misses": self.cache_misses, "deduplicated": self.deduplicated},
                "requests": self.requests, "retries_by_reason": dict(sorted(self.retries.items())),
                "failures_by_reason": dict(sorted(self.failures.items())),
                "tokens": {"input": self.input_tokens, "output": self.output_tokens,
                           "cached_input": self.cached_input_tokens, "cached_output": self.cached_output_tokens},
                "cost_usd": round(spent, 6), "cost_saved_by_cache_usd": round(saved, 6)}


def cache_path(params: Params, run_dir: Path) -> Path:
    """llm.cache_path (relative to the run directory), or `<run>/abstraction/cache.sqlite`."""
    if params.llm.cache_path is None:
        return Path(run_dir) / "abstraction" / "cache.sqlite"
    path = Path(params.llm.cache_path).expanduser()
    return path if path.is_absolute() else Path(run_dir) / path


def make_backend(params: Params, run_dir: Path, ground_truth: dict[str, list[str]] | None = None) -> Backend:
    """The concept backend named by llm.backend."""
    kind = params.llm.backend
    if kind == "openai":
        from cglib.llm.openai_backend import OpenAIBackend

        return OpenAIBackend(params, work_dir=Path(run_dir) / "abstraction" / "batches")
    from cglib.llm.offline_backend import OfflineBackend, OracleBackend

    if kind == "oracle":
        return OracleBackend(params, ground_truth)
    return OfflineBackend(params)


def _progress(total: int, desc: str, enabled: bool):
    from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, unit="item")


async def execute(backend: Backend, cache: ResultCache | None, tasks: list, stats: Stats, kind: str,
                  retry_failed: bool = False, desc: str = "", progress: bool = False) -> list[Outcome]:
    """Outcome of every task, in order: cache hits first, then the backend for the rest (results cached as
    they arrive). Identical requests are sent once."""
    jobs: dict[str, Job] = {}
    keys: list[str] = []
    for task in tasks:
        payload = backend.payload(task)
        key = backend.key(payload)
        jobs.setdefault(key, Job(key=key, payload=payload)).tasks.append(task)
        keys.append(key)
    stats.items += len(tasks)
    stats.deduplicated += len(tasks) - len(jobs)
    outcomes: dict[str, Outcome] = {}
    use_cache = cache is not None and backend.cacheable
    if use_cache:
        for key, hit in cache.get_many(list(jobs)).items():
            if hit.ok or not retry_failed:
                outcomes[key] = hit
                n = len(jobs[key].tasks)
                stats.cache_hits += n if hit.ok else 0
                stats.cache_failure_hits += 0 if hit.ok else n
                stats.cached_input_tokens += hit.input_tokens
                stats.cached_output_tokens += hit.output_tokens
    misses = [job for key, job in jobs.items() if key not in outcomes]
    stats.cache_misses += sum(len(j.tasks) for j in misses)
    bar = _progress(sum(len(j.tasks) for j in misses), desc, progress and bool(misses))

    def report(job: Job, outcome: Outcome) -> None:
        outcomes[job.key] = outcome
        stats.requests += outcome.requests
        stats.retries.update(outcome.retries)
        stats.input_tokens += outcome.input_tokens
        stats.output_tokens += outcome.output_tokens
        if use_cache and outcome.cacheable:
            cache.put(job.key, kind, backend.name, backend.model, backend.prompt_version, outcome,
                      commit=backend.streaming)
        bar.update(len(job.tasks))

    try:
        await backend.run(misses, report)
    finally:
        bar.close()
        if use_cache:
            cache.commit()
    lost = [j for j in misses if j.key not in outcomes]
    if lost:  # a backend must answer every job; say so loudly rather than dropping items
        raise RuntimeError(f"backend '{backend.name}' returned no outcome for {len(lost)} of {len(misses)} jobs")
    result = [outcomes[k] for k in keys]
    for out in result:
        if not out.ok:
            stats.failures[out.reason] += 1
    return result


def run_abstraction(dataset: CaptionDataset, params: Params, run_dir: Path,
                    ground_truth: dict[str, list[str]] | None = None, progress: bool = True) -> AbstractionResult:
    """Concept chains l1..l_max for every image of `dataset` with llm.backend; writes chains.jsonl and summary.json.

    `ground_truth` is used only by the oracle backend. Works from sync code and inside Jupyter.
    """
    run_dir = Path(run_dir)
    out_dir = run_dir / "abstraction"
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = make_backend(params, run_dir, ground_truth)
    return run_sync(lambda: _run_levels(dataset, params, run_dir, backend, progress))


async def _run_levels(dataset: CaptionDataset, params: Params, run_dir: Path, backend: Backend,
                      progress: bool) -> AbstractionResult:
    start = time.perf_counter()
    l_max = params.magic.l_max
    out_dir = run_dir / "abstraction"
    stats = Stats()
    chains: dict[str, list[str]] = {i: [] for i in dataset.image_ids}
    failures: dict[str, Failure] = {}
    estimate = None
    cache = ResultCache(cache_path(params, run_dir)) if backend.cacheable else None
    try:
        for level in range(1, l_max + 1):
            active = [i for i in dataset.image_ids if i not in failures]
            tasks = [ConceptTask(i, level, tuple(dataset.captions[i]), tuple(chains[i])) for i in active]
            if level == 1 and params.llm.backend == "openai":
                estimate = _check_budget(params, backend, cache, tasks)
                if progress and estimate["images"]:
                    print(f"estimate for {estimate['images']:,} uncached images: {estimate['requests']:,} requests, "
                          f"{estimate['input_tokens']:,} input tokens, about ${estimate['cost_usd']:.2f}")
            outcomes = await execute(backend, cache, tasks, stats, "concept", params.llm.retry_failed,
                                     desc=f"level {level}/{l_max}", progress=progress)
            for task, out in zip(tasks, outcomes):
                if out.ok:
                    chains[task.item_id].append(out.value)
                else:
                    failures[task.item_id] = Failure(task.item_id, level, out.reason, out.detail, out.raw)
    except FatalBackendError as exc:
        summary = _summary(params, backend, dataset, {}, [], stats, estimate, time.perf_counter() - start)
        summary.update(status="stopped", error=str(exc))
        write_json(out_dir / SUMMARY_FILE, summary)
        raise
    finally:
        if cache is not None:
            cache.close()
    done = {i: c for i, c in chains.items() if i not in failures}
    failed = [failures[i] for i in dataset.image_ids if i in failures]
    summary = _summary(params, backend, dataset, done, failed, stats, estimate, time.perf_counter() - start)
    write_chains(out_dir / CHAINS_FILE, dataset.image_ids, done, failures, backend)
    write_json(out_dir / SUMMARY_FILE, summary)
    return AbstractionResult(chains=done, failures=failed, summary=summary)


def _check_budget(params: Params, backend: Backend, cache: ResultCache | None, tasks: list[ConceptTask]) -> dict:
    """Estimate the cost of the level-1 misses (all levels); refuse to start above llm.max_cost_usd."""
    keys = [backend.key(backend.payload(t)) for t in tasks]
    cached = cache.get_many(keys) if cache is not None else {}
    todo = [list(t.captions) for t, k in zip(tasks, keys) if k not in cached]
    estimate = estimate_concept_requests(params, todo) if todo else {"images": 0, "cost_usd": 0.0}
    limit = params.llm.max_cost_usd
    if limit is not None and estimate["cost_usd"] > limit:
        raise ValueError(f"estimated cost ${estimate['cost_usd']:.2f} for {len(todo)} uncached images exceeds "
                         f"llm.max_cost_usd (${limit:.2f}); raise the limit, use llm.batch_api, or set "
                         "data.max_images")
    return estimate


def write_chains(path: Path, image_ids: list[str], chains: dict[str, list[str]], failures: dict[str, Failure],
                 backend: Backend) -> Path:
    """Write chains.jsonl (one JSON object per image, dataset order) atomically."""
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for i in image_ids:
            fail = failures.get(i)
            row = {"image_id": i, "chain": None if fail else chains[i], "status": "failed" if fail else "ok",
                   "failure_reason": fail.reason if fail else None, "failed_level": fail.level if fail else None,
                   "backend": backend.name, "model": backend.model, "prompt_version": backend.prompt_version}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load_chains(path: Path) -> dict[str, list[str]]:
    """Successful chains from a chains.jsonl file: image id -> [l1, ..., l_max]."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 02_abstraction first")
    chains: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not valid JSON ({exc}); re-run notebook 02_abstraction") from None
            if row.get("status") == "ok" and row.get("chain"):
                chains[str(row["image_id"])] = list(row["chain"])
    return chains


def few_shot_copies(chains: dict[str, list[str]], params: Params) -> dict[str, Any]:
    """How many chains equal a few-shot example verbatim (whole chain, and concept by concept per level)."""
    examples = few_shot_chains(load_prompts(params.llm.prompt_version), params.magic.l_max)
    full = sum(1 for c in chains.values() if list(c) in examples)
    by_level = {}
    for level in range(1, params.magic.l_max + 1):
        seen = {ex[level - 1] for ex in examples if len(ex) >= level}
        by_level[level] = sum(1 for c in chains.values() if len(c) >= level and c[level - 1] in seen)
    n = max(1, len(chains))
    return {"full_chain": full, "full_chain_rate": round(full / n, 4), "by_level": by_level,
            "by_level_rate": {k: round(v / n, 4) for k, v in by_level.items()}}


def level_counts(chains: dict[str, list[str]], l_max: int) -> list[dict[str, Any]]:
    """Per level: distinct concepts, the most common one and its share of images."""
    rows = []
    for level in range(1, l_max + 1):
        counts = Counter(c[level - 1] for c in chains.values() if len(c) >= level)
        top, top_n = counts.most_common(1)[0] if counts else (None, 0)
        rows.append({"level": level, "distinct_concepts": len(counts), "images": sum(counts.values()),
                     "most_common": top, "most_common_share": round(top_n / max(1, sum(counts.values())), 4)})
    return rows


def chain_agreement(chains: dict[str, list[str]], ground_truth: dict[str, list[str]], l_max: int) -> list[dict]:
    """Per level, how often the chains agree with the ground truth (canonical names compared).

    accuracy: over images that have a chain; accuracy_all: over every ground-truth image, a missing chain
    counting as wrong; coverage: share of ground-truth images with a chain.
    """
    truth = {i: [canonicalize(c) for c in chain] for i, chain in ground_truth.items()}
    have = [i for i in truth if i in chains]
    rows = []
    for level in range(1, l_max + 1):
        right = sum(1 for i in have if len(chains[i]) >= level and len(truth[i]) >= level
                    and canonicalize(chains[i][level - 1]) == truth[i][level - 1])
        rows.append({"level": level, "accuracy": round(right / max(1, len(have)), 4),
                     "accuracy_all": round(right / max(1, len(truth)), 4),
                     "coverage": round(len(have) / max(1, len(truth)), 4), "images": len(have),
                     "distinct_predicted": len({chains[i][level - 1] for i in have if len(chains[i]) >= level}),
                     "distinct_truth": len({t[level - 1] for t in truth.values() if len(t) >= level})})
    return rows


def failure_table(failures: list[Failure]) -> list[dict[str, Any]]:
    """Failures grouped by reason: count, levels, and one example (item, detail, raw reply)."""
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(f.reason, []).append(f)
    return [{"reason": r, "count": len(fs), "levels": sorted({f.level for f in fs if f.level is not None}),
             "example_item": fs[0].item_id, "example_detail": fs[0].detail[:200],
             "example_raw": (fs[0].raw or "")[:200]}
            for r, fs in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def _summary(params: Params, backend: Backend, dataset: CaptionDataset, chains: dict[str, list[str]],
             failures: list[Failure], stats: Stats, estimate: dict | None, wall_s: float) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": "complete", "backend": backend.name, "model": backend.model,
        "prompt_version": backend.prompt_version, "images": len(dataset), "chains": len(chains),
        "failed_images": len(failures), "failed_images_by_reason": dict(Counter(f.reason for f in failures)),
        "levels": params.magic.l_max, "distinct_concepts_per_level": {
            r["level"]: r["distinct_concepts"] for r in level_counts(chains, params.magic.l_max)},
        "few_shot_copies": few_shot_copies(chains, params) if backend.name == "openai" else None,
        "estimate_before_run": estimate, "wall_s": round(wall_s, 3), **stats.as_dict(params, backend.price_factor),
    }
    if backend.name == "oracle":
        summary["note"] = ORACLE_NOTE
    if backend.name == "offline":
        summary["offline_method"] = params.llm.offline_method
    return {**summary, "provenance": provenance(params, stage="abstraction", dataset_source=dataset.source)}
