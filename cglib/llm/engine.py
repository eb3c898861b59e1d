"""The abstraction engine: Algorithm 1, lines 2-11, at COCO scale (every image, l1..l_max, one chain each).

Level by level: level 1 asks for each image's l1 concept from all its captions; level k asks for the next,
more general concept from the captions and the chain so far. Every request goes through the on-disk cache
(committed as each answer arrives: a killed run asks again only what was in flight), identical requests are sent
once, and every failure is recorded with its reason; an image whose level k fails has no chain. Working level by
level is what the Batch API needs anyway (level k+1 depends on level k).

Outputs in `<run>/abstraction/`: chains.jsonl (one row per image, `cglib.llm.chains`), summary.json (counts,
tokens, cost, cache hits, failures by reason, few-shot copies, provenance), cache.sqlite (unless llm.cache_path).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.llm.attempts import AttemptLog
from cglib.llm.base import (
    Backend,
    BudgetExceededError,
    ConceptTask,
    Failure,
    FatalBackendError,
    Job,
    Outcome,
    QuotaExhaustedError,
    run_sync,
)
from cglib.llm.budget_check import BudgetRefusedError, check_budget
from cglib.llm.cache import ResultCache, rebuilt_message
from cglib.llm.chains import few_shot_copies, level_counts, write_chains
from cglib.llm.cost import (
    Budget,
    cost_usd,
    make_budget,
)
from cglib.llm.offline_backend import OfflineBackend, OracleBackend
from cglib.llm.openai_backend import OpenAIBackend
from cglib.run import provenance, write_json

CHAINS_FILE = "chains.jsonl"
SUMMARY_FILE = "summary.json"
# failure reasons of the request that met a stop (the run's end, not the image's answer)
STOP_REASONS = (FatalBackendError.reason, QuotaExhaustedError.reason, BudgetExceededError.reason)
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
    """Counters of one engine run (items are tasks: one image at one level, or one group).

    Every item of a run ends in exactly one place, counted where it happens: answered from the cache
    (`cache_hits`), a cached failure returned as it is (`cache_failure_hits`), sent and answered (`answered`),
    sent and failed (`sent_failures` by reason), never asked because the run stopped (`never_asked`), or not
    needed because the image's chain had already failed (`not_needed`). `account` adds them up against the
    items planned, so a counter that misses an item shows as an account that does not add up."""

    items: int = 0
    cache_hits: int = 0
    cache_failure_hits: int = 0  # cached reply failures returned as failures (llm.retry_failed: false)
    cache_misses: int = 0
    deduplicated: int = 0  # items answered by an identical request of another item
    sent: int = 0  # distinct requests sent (jobs that reached a server); `requests` counts every attempt
    answered: int = 0  # items sent this run and answered
    sent_failures: Counter = field(default_factory=Counter)  # items sent this run that failed, by reason
    never_asked: int = 0  # items not sent because the run stopped (cost cap, fatal server error)
    not_needed: int = 0  # later levels of an image whose chain failed at an earlier level
    requests: int = 0
    retries: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)  # every failed item: sent, or a cached failure
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0  # what the cache hits cost when they were first asked
    cached_output_tokens: int = 0

    def account(self, planned: int, spent_usd: float, estimated_usd: float | None, status: str,
                stopped_by: str | None = None) -> dict[str, Any]:
        """What happened to each of the `planned` items, the requests (retries included) and the cost; `adds_up`
        checks the items counted where they ended against `planned`, counted before the run."""
        failed = sum(self.sent_failures.values())
        retries = sum(self.retries.values())
        counted = (self.cache_hits + self.cache_failure_hits + self.answered + failed + self.never_asked
                   + self.not_needed)
        return {"status": status, "stopped_by": stopped_by, "items": planned, "cached": self.cache_hits,
                "cached_failures": self.cache_failure_hits, "answered": self.answered, "failed": failed,
                "failed_by_reason": dict(sorted(self.sent_failures.items())), "never_asked": self.never_asked,
                "not_needed": self.not_needed, "deduplicated": self.deduplicated,
                "requests": {"sent": self.sent, "retries": retries, "retries_by_reason": dict(sorted(self.retries.items())),
                             "http": self.requests},
                "cost_usd": {"spent": round(spent_usd, 6),
                             "estimated": None if estimated_usd is None else round(estimated_usd, 6)},
                "adds_up": counted == planned}

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
        return OpenAIBackend(params, work_dir=Path(run_dir) / "abstraction" / "batches")
    if kind == "oracle":
        return OracleBackend(params, ground_truth)
    return OfflineBackend(params)


def _progress(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, unit="item")


async def execute(backend: Backend, cache: ResultCache | None, tasks: list, stats: Stats, kind: str,
                  retry_failed: bool = False, desc: str = "", progress: bool = False,
                  budget: Budget | None = None, on_progress: Callable[[], None] | None = None) -> list[Outcome]:
    """Outcome of every task, in order: cache hits first, then the backend for the rest (results cached as
    they arrive). Identical requests are sent once. With a `budget` (llm.max_cost_usd) the backend stops
    sending before the spend would pass it: every answer so far is cached, then BudgetExceededError.

    Every task is counted in `stats` where its outcome arrives. When the run stops (FatalBackendError, the
    budget included) the tasks never sent are counted as never asked, and the exception carries `outcomes`:
    the outcome of every task, None for those never asked, so the caller keeps what was answered. `on_progress()`
    is called after the cache lookups and after every outcome is counted (the attempt's record, attempts.py)."""
    on_progress = on_progress or (lambda: None)
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
                if hit.ok:
                    stats.cache_hits += n
                else:
                    stats.cache_failure_hits += n
                    stats.failures[hit.reason] += n
                stats.cached_input_tokens += hit.input_tokens
                stats.cached_output_tokens += hit.output_tokens
        on_progress()
    misses = [job for key, job in jobs.items() if key not in outcomes]
    stats.cache_misses += sum(len(j.tasks) for j in misses)
    bar = _progress(sum(len(j.tasks) for j in misses), desc, progress and bool(misses))

    def report(job: Job, outcome: Outcome) -> None:
        # stored (and, streaming, committed) before it is counted: a paid answer counted is an answer kept
        if use_cache and outcome.cacheable:
            cache.put(job.key, kind, backend.name, backend.model, backend.prompt_version, outcome,
                      commit=backend.streaming)
        outcomes[job.key] = outcome
        n = len(job.tasks)
        stats.sent += 1 if outcome.requests else 0
        stats.requests += outcome.requests
        stats.retries.update(outcome.retries)
        stats.input_tokens += outcome.input_tokens
        stats.output_tokens += outcome.output_tokens
        if outcome.ok:
            stats.answered += n
        else:
            stats.sent_failures[outcome.reason] += n
            stats.failures[outcome.reason] += n
        on_progress()
        bar.update(n)

    backend.budget = budget
    try:
        await backend.run(misses, report)
    except FatalBackendError as exc:  # quota, a refused key, a dead server: what was answered is kept
        stats.never_asked += sum(len(j.tasks) for j in misses if j.key not in outcomes)
        exc.outcomes = [outcomes.get(k) for k in keys]
        raise
    finally:
        backend.budget = None
        bar.close()
        if use_cache:
            cache.commit()
    lost = [j for j in misses if j.key not in outcomes]
    if budget is not None and budget.stopped:
        stats.never_asked += sum(len(j.tasks) for j in lost)
        stop = BudgetExceededError(budget.message(answered=len(misses) - len(lost), unanswered=len(lost)))
        stop.outcomes = [outcomes.get(k) for k in keys]
        raise stop
    if lost:  # a backend must answer every job; say so loudly rather than dropping items
        raise RuntimeError(f"backend '{backend.name}' returned no outcome for {len(lost)} of {len(misses)} jobs")
    return [outcomes[k] for k in keys]


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
    attempt = {"started": _now()}
    l_max = params.magic.l_max
    out_dir = run_dir / "abstraction"
    stats = Stats()
    # on record from its start, updated after every answer: a killed attempt keeps what it got (attempts.py)
    log = AttemptLog(out_dir, {**attempt, "cache": str(cache_path(params, run_dir)) if backend.cacheable else None})

    def record_progress() -> None:
        log.update(progress_record(stats, params, backend))

    chains: dict[str, list[str]] = {i: [] for i in dataset.image_ids}
    failures: dict[str, Failure] = {}
    estimate = None
    budget = None
    cache = ResultCache(cache_path(params, run_dir)) if backend.cacheable else None
    rebuilt = cache.rebuilt if cache is not None else None
    level = 0
    try:
        if params.llm.backend == "openai":
            try:
                estimate = check_budget(params, backend, cache, dataset, run_dir)
            except BudgetRefusedError as exc:  # nothing was sent: the summary still says what would be asked
                estimate = exc.estimate
                raise
            finally:
                if rebuilt is not None and estimate is not None:
                    rebuilt.update(to_ask=estimate["chains"]["requests"],
                                   to_ask_cost_usd=estimate["chains"]["cost_usd"],
                                   run_estimate_usd=estimate["cost_usd"], max_cost_usd=params.llm.max_cost_usd)
                    if progress:
                        print(rebuilt_message(rebuilt))
            budget = make_budget(params, backend.price_factor, estimate["chains"]["max_request_usd"])
            if progress and estimate["requests"]:
                print(f"estimate of the requests still to be made: {estimate['chains']['requests']:,} for chains "
                      f"(per level {estimate['chains']['requests_per_level']}) and about "
                      f"{estimate['generalize']['requests']:,} for generalized captions, "
                      f"{estimate['input_tokens']:,} input tokens, about ${estimate['cost_usd']:.2f}")
        for level in range(1, l_max + 1):
            active = [i for i in dataset.image_ids if i not in failures]
            tasks = [ConceptTask(i, level, tuple(dataset.captions[i]), tuple(chains[i])) for i in active]
            try:
                outcomes = await execute(backend, cache, tasks, stats, "concept", params.llm.retry_failed,
                                         desc=f"level {level}/{l_max}", progress=progress, budget=budget,
                                         on_progress=record_progress)
            except FatalBackendError as exc:
                _keep(tasks, exc.outcomes or [], chains, failures, stats, l_max)
                raise
            _keep(tasks, outcomes, chains, failures, stats, l_max)
    except (FatalBackendError, BudgetRefusedError) as exc:
        # The levels not reached are never asked for every image still in the game (the items of the level
        # that stopped were counted by `execute`).
        stats.never_asked += sum(l_max - level for i in dataset.image_ids
                                 if i not in failures or failures[i].reason in STOP_REASONS)
        summary = _summary(params, backend, dataset, {}, [], stats, estimate, time.perf_counter() - start)
        stopped_by = "llm.max_cost_usd" if isinstance(exc, BudgetExceededError | BudgetRefusedError) else exc.reason
        summary.update(status="stopped", error=str(exc), cache_rebuilt=rebuilt,
                       account=_account(stats, dataset, params, backend, estimate, "stopped", stopped_by))
        _record_attempt(log, out_dir, summary, attempt, chains_written=False)
        raise
    except BaseException as exc:  # Ctrl-C, or an error of the engine itself: the record says so, then it goes on
        log.update(progress_record(stats, params, backend))
        log.finish({**attempt, "ended": _now(), "chains_written": False, "chains": None,
                    "status": "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                    "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        if cache is not None:
            cache.close()
    done = {i: c for i, c in chains.items() if i not in failures}
    failed = [failures[i] for i in dataset.image_ids if i in failures]
    summary = _summary(params, backend, dataset, done, failed, stats, estimate, time.perf_counter() - start)
    summary.update(cache_rebuilt=rebuilt,
                   account=_account(stats, dataset, params, backend, estimate, "complete"))
    write_chains(out_dir / CHAINS_FILE, dataset.image_ids, done, failures, backend)
    _record_attempt(log, out_dir, summary, attempt, chains_written=True)
    return AbstractionResult(chains=done, failures=failed, summary=summary)


def _keep(tasks: list[ConceptTask], outcomes: list[Outcome | None], chains: dict[str, list[str]],
          failures: dict[str, Failure], stats: Stats, l_max: int) -> None:
    """Add one level's answers to the chains; a failure ends its image's chain (its later levels are not needed),
    unless it is the stop of the run itself (its later levels are never asked)."""
    for task, out in zip(tasks, outcomes):
        if out is None:  # never asked: the run stopped first
            continue
        if out.ok:
            chains[task.item_id].append(out.value)
        else:
            failures[task.item_id] = Failure(task.item_id, task.level, out.reason, out.detail, out.raw)
            if out.reason not in STOP_REASONS:  # a stop's later levels are never asked (counted by the caller)
                stats.not_needed += l_max - task.level


def _account(stats: Stats, dataset: CaptionDataset, params: Params, backend: Backend, estimate: dict | None,
             status: str, stopped_by: str | None = None) -> dict[str, Any]:
    """The run's account (`Stats.account`): every image needs l_max items."""
    estimated = estimate["chains"]["cost_usd"] if estimate else None
    return llm_account(stats, len(dataset) * params.magic.l_max, params, backend, estimated, status, stopped_by)


def llm_account(stats: Stats, planned: int, params: Params, backend: Backend, estimated_usd: float | None,
                status: str, stopped_by: str | None = None) -> dict[str, Any]:
    """`Stats.account` priced with the backend's actual usage: the one account of every LLM stage (chains,
    generalized captions)."""
    spent = cost_usd(stats.input_tokens, stats.output_tokens, params.llm, backend.price_factor)
    return stats.account(planned, spent, estimated_usd, status, stopped_by)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def progress_record(stats: Stats, params: Params, backend: Backend) -> dict[str, Any]:
    """What an attempt has got so far, as its running line in attempts.jsonl records it."""
    return {"cached": stats.cache_hits, "cached_failures": stats.cache_failure_hits, "answered": stats.answered,
            "failed": sum(stats.sent_failures.values()), "requests": stats.requests,
            "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens,
            "spent_usd": round(cost_usd(stats.input_tokens, stats.output_tokens, params.llm, backend.price_factor), 6)}


def _record_attempt(log: AttemptLog, out_dir: Path, summary: dict[str, Any], attempt: dict[str, Any],
                    chains_written: bool) -> None:
    """summary.json of this attempt, and its final line in attempts.jsonl (every attempt of the stage: when, how it
    ended, whether it wrote chains.jsonl), so a summary never mixes this attempt with files of an earlier one."""
    attempt.update(ended=_now(), status=summary["status"], error=summary.get("error"),
                   chains_written=chains_written, chains=summary["chains"] if chains_written else None,
                   account=summary["account"])
    summary["attempt"] = {k: attempt[k] for k in ("started", "ended", "chains_written")}
    write_json(out_dir / SUMMARY_FILE, summary)
    log.finish(attempt)


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
