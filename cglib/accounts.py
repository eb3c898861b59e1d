"""Run accounts: per stage, what it kept, skipped by reason and failed by reason, read from the files the stages
write, with each stage's own account (the LLM stages', the preparation's before training, training's per run and
seed with the image cache's, the search study's); `cglib.account_lines` turns them into the terminal lines
`cglib run` and `cglib status` print.

Nothing here is derived by subtraction: every number is one a stage recorded, and a stage whose files come from
another attempt (an earlier run, a reused trained run) is named as such instead of being added to this attempt.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from cglib.account_lines import summary_lines
from cglib.run import runner_gone, seed_label

Resume = Callable[[str], str]  # a stopped stage's notebook number -> the command that resumes the run there


def _read_json(path: Path) -> dict | None:
    """A stage's JSON file, or None when the stage has not written it (or it is unreadable)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _counts(mapping: dict | None) -> dict[str, int]:
    """reason -> count, dropping zeros."""
    return {str(k): int(v) for k, v in (mapping or {}).items() if isinstance(v, (int, float)) and v}


def _merge(*mappings: dict[str, int]) -> dict[str, int]:
    total: Counter = Counter()
    for m in mappings:
        total.update(m)
    return dict(sorted(total.items()))


def _mtime(*paths: Path) -> float | None:
    """The newest modification time of the paths that exist (None: none does)."""
    times = [p.stat().st_mtime for p in paths if p.is_file()]
    return max(times) if times else None


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="seconds")


def _before(earlier: str, later: str) -> bool:
    """ISO times compared as instants (run.json and summaries write them with their UTC offset)."""
    return datetime.fromisoformat(earlier) < datetime.fromisoformat(later)


def _abstraction(run_dir: Path, summary: dict | None, resume: Resume | None) -> dict:
    """The abstraction stage: this attempt's account as the engine recorded it, the files on disk that an
    earlier attempt wrote (named with that attempt's time and status, never added to this one's account), and an
    attempt killed after it (or before any ended): what it recorded before the kill and the answers now cached."""
    from cglib.llm.attempts import (  # lazy: cglib.llm's backends
        INTERRUPTED,
        RUNNING,
        cached_answers,
        load_attempts,
    )
    from cglib.llm.engine import CHAINS_FILE  # lazy: the engine pulls in every backend

    attempts = load_attempts(run_dir / "abstraction")
    summary = summary or {}
    out = {"kept": summary.get("chains") if summary else 0, "unit": "images with a full chain", "skipped": {},
           "failed": _counts(summary.get("failed_images_by_reason")), "llm": summary.get("account"),
           "cache_rebuilt": summary.get("cache_rebuilt"), "attempt": summary.get("attempt")}
    if summary and summary.get("status") not in (None, "complete"):
        out["failed"][_stop_reason(summary)] = 1
        out["stop_error"] = summary.get("error")
        out["resume"] = resume and resume("02")
    chains = run_dir / "abstraction" / CHAINS_FILE
    attempt = summary.get("attempt") or {}
    if chains.is_file() and attempt and not attempt.get("chains_written"):
        writers = [a for a in attempts if a.get("chains_written")]
        if writers:
            w = writers[-1]
            out["other_files"] = {CHAINS_FILE: {"started": w.get("started"), "status": w.get("status"),
                                                "chains": w.get("chains")}}
        else:  # written by a cglib that recorded no attempts
            out["other_files"] = {CHAINS_FILE: {"started": _iso(chains.stat().st_mtime), "status": "unknown",
                                                "chains": None}}
    last = attempts[-1] if attempts else {}
    if last.get("status") in (RUNNING, INTERRUPTED) and last.get("started") != attempt.get("started"):
        out["unfinished_attempt"] = {"started": last.get("started"), "status": last["status"],
                                     "progress": last.get("progress") or {},
                                     "cached_answers": cached_answers(last.get("cache"))}
        if last["status"] == INTERRUPTED:
            out["failed"]["interrupted: its process is gone"] = 1
            out["resume"] = resume and resume("02")
    return out


def _stop_reason(summary: dict) -> str:
    """A stopped LLM stage's failure reason: what stopped it, in a few words (the whole message is `stop_error`)."""
    return f"stopped by {(summary.get('account') or {}).get('stopped_by') or 'an error'}"


def _generalize(summary: dict, resume: Resume | None) -> dict:
    """Notebook 03's generalized captions: the LLM account of its last attempt (the same as the chains'). Units
    whose requests failed keep their original captions and are counted by the magic stage, so only a stop is a
    loss here."""
    account = summary.get("account")
    out = {"kept": summary.get("ok", 0), "unit": "generalized-caption requests answered (generalized.jsonl)",
           "skipped": {}, "failed": {}, "llm": account}
    if summary.get("status") not in (None, "complete"):
        out["failed"][_stop_reason(summary)] = 1
        out["stop_error"] = summary.get("error")
        out["resume"] = resume and resume("03")
    return out


def _prepare(account: dict) -> dict:
    """The preparation stage (training/prepare.json, written by cglib.prepare before training): the MAGIC images it
    cached for training (rows from an earlier build or built now); its images skipped by reason are training's too
    (its image cache line), counted once there."""
    cache = account.get("image_cache") or {}
    return {"kept": cache.get("from_earlier_build", 0) + cache.get("built_now", 0), "unit": "images cached for training",
            "skipped": {}, "failed": {}, "account": account}


def _training(run_dir: Path, summaries: list[Path], resume: Resume | None, attempt_started: str | None) -> dict:
    """Per run and training seed that these params asked for (training/prepare.json: the runs and seeds the last
    training attempt prepared), the account of the attempt that finished it (steps and epochs kept from a
    checkpoint, trained now, repeated after a kill), the image cache's account, the runs that failed (their
    failed.json, with the reason), the runs an interrupted attempt left with a checkpoint and no final weights
    (still to resume), and those not trained at all. A run finished before this attempt started (`attempt_started`,
    run.json's `started`) was reused with its weights: its account gets `reused_from`, the time the earlier
    attempt finished it, and nothing of it was trained now. Models in the folder that these params do not name
    are listed apart (`not_in_params`), never counted as kept."""
    from cglib.train.failures import FAILED  # lazy: cglib.train's package loads torch on first use of a name

    training = run_dir / "training"
    prepared = _read_json(training / "prepare.json") or {}
    asked = ([seed_label(n, int(k)) for k in prepared.get("training_seeds") or [0] for n in prepared["runs"]]
             if prepared.get("runs") else None)  # None: no record of what was asked (an older cglib)

    def folder(label: str) -> Path:
        name, _, seed = label.partition("@seed")
        return training / (f"seed{seed}/{name}" if seed else name)

    runs: dict[str, dict] = {}
    caches: dict[str, dict] = {}
    others: list[str] = []
    finished_at: dict[str, str | None] = {}
    for path in summaries:
        s = _read_json(path)
        if not s:
            continue
        label = seed_label(s.get("name", path.parent.name), int(s.get("training_seed") or 0))
        if asked is not None and label not in asked:
            others.append(label)
            continue
        runs[label] = dict(s.get("account") or {})
        finished = (s.get("provenance") or {}).get("created")
        finished_at[label] = finished
        if runs[label] and finished and attempt_started and _before(finished, attempt_started):
            runs[label]["reused_from"] = finished
        cache = (s.get("image_cache") or {}).get("account")
        if cache:  # one cache per image size, shared by the runs of a seed: the last summary's word
            caches[f"{cache['size']}px"] = cache
    failed_runs = {}
    for label in asked or []:
        failure = _read_json(folder(label) / FAILED)
        if failure and (label not in runs or not finished_at.get(label)
                        or _before(finished_at[label], failure.get("failed", ""))):
            failed_runs[label] = failure.get("error") or "no reason recorded"
            runs.pop(label, None)
    waiting = sorted(str(p.parent.parent.relative_to(training)) for p in training.glob("**/checkpoints/last.pt")
                     if not (p.parent.parent / "summary.json").is_file())
    if asked is not None:
        waiting = [w for w in waiting if seed_label(*_name_and_seed(w)) in asked]
    waiting_labels = {seed_label(*_name_and_seed(w)) for w in waiting}
    untrained = [label for label in asked or [] if label not in runs and label not in failed_runs
                 and label not in waiting_labels]
    skipped = _merge(*(_counts(c["skipped_by_reason"]) for c in caches.values()))
    out = {"kept": len(runs), "unit": "models trained (every training seed)",
           "skipped": {f"image cache: {k}": v for k, v in skipped.items()}, "failed": {}, "runs": runs,
           "image_cache": caches}
    if untrained:
        out["skipped"]["not trained (training stopped before it)"] = len(untrained)
        out["untrained"] = untrained
    if failed_runs:
        out["failed"].update({f"{label}: {why}": 1 for label, why in failed_runs.items()})
        out["failed_runs"] = failed_runs
    if others:
        out["not_in_params"] = sorted(others)
    if waiting:
        out["failed"]["interrupted, a checkpoint waits"] = len(waiting)
        out["interrupted"] = waiting
    if waiting or failed_runs or untrained:
        out["resume"] = resume and resume("05")
    return out


def _name_and_seed(folder: str) -> tuple[str, int]:
    """`seed1/clip` -> ("clip", 1); `clip` -> ("clip", 0): a run's folder under training/ as (name, seed)."""
    seed, _, name = folder.rpartition("/")
    return name, int(seed.removeprefix("seed")) if seed else 0


def _search(summary: dict) -> dict:
    """The search study's account, read from its database when `cglib search` ended (search.json)."""
    account = summary.get("account") or {}
    return {"kept": account.get("finished"), "unit": f"finished trials of study {summary.get('study')}",
            "skipped": {}, "failed": {}, "trials": account}


def stage_summaries(run_dir: Path, resume: Resume | None = None) -> dict[str, dict]:
    """Per stage that has run: what it kept, skipped by reason and failed by reason, read from the files the
    stages write (captions/summary.json, abstraction/summary.json and generalize_summary.json, magic/stats.json,
    training/prepare.json, training/*/summary.json, evaluation/results.json, search/*/search.json), with each stage's account (the LLM
    stages', training's per run and seed with the image cache's, the search study's). A stage whose files are
    older than an earlier stage's last run is marked `earlier_run` (its numbers come from another run).
    `resume`: the command that resumes a stage stopped in notebook NN, as a function of NN
    (`cglib.pipeline.resume_command`)."""
    run_dir = Path(run_dir)
    out: dict[str, dict] = {}
    ran_at: dict[str, float] = {}  # when each stage last ran (its files' time)
    captions = _read_json(run_dir / "captions" / "summary.json")
    if captions:
        stats = captions.get("statistics") or {}
        out["captions"] = {"kept": stats.get("images"), "unit": "images", "skipped": _counts(stats.get("skipped")),
                           "failed": {}}
        ran_at["captions"] = _mtime(run_dir / "captions" / "summary.json")
    abstraction = _read_json(run_dir / "abstraction" / "summary.json")
    if abstraction or (run_dir / "abstraction" / "attempts.jsonl").is_file():  # a first attempt killed: no summary
        out["abstraction"] = _abstraction(run_dir, abstraction, resume)
        started = (out["abstraction"].get("unfinished_attempt") or (abstraction or {}).get("attempt") or {}).get(
            "started")
        ran_at["abstraction"] = (datetime.fromisoformat(started).timestamp() if started
                                 else _mtime(run_dir / "abstraction" / "summary.json"))
    generalize = _read_json(run_dir / "abstraction" / "generalize_summary.json")
    if generalize and generalize.get("account"):
        out["generalize"] = _generalize(generalize, resume)
        ran_at["generalize"] = _mtime(run_dir / "abstraction" / "generalize_summary.json")
    magic = (_read_json(run_dir / "magic" / "stats.json") or {}).get("stats")
    if magic:
        generalization = magic.get("generalization") or {}
        removed = {"removed with a group below magic.size_min": magic.get("removed_images", 0)}
        out["magic"] = {"kept": magic.get("images"), "unit": "images in the DAG",
                        "skipped": _merge(_counts(magic.get("skipped_before_dag")), _counts(removed)),
                        "failed": {f"generalization (original captions kept): {k}": v
                                   for k, v in _counts(generalization.get("failure_reasons")).items()}}
        ran_at["magic"] = _mtime(run_dir / "magic" / "stats.json")
    prepared = _read_json(run_dir / "training" / "prepare.json")
    if prepared:
        out["prepare"] = _prepare(prepared)
        ran_at["prepare"] = _mtime(run_dir / "training" / "prepare.json")
    summaries = sorted((run_dir / "training").glob("*/summary.json")) + sorted(
        (run_dir / "training").glob("seed*/*/summary.json"))  # training seed 0, then seeds k > 0
    if summaries or list((run_dir / "training").glob("**/checkpoints/last.pt")):
        attempt_started = (_read_json(run_dir / "run.json") or {}).get("started")  # this `cglib run`'s start
        out["training"] = _training(run_dir, summaries, resume, attempt_started)
        ran_at["training"] = _mtime(*summaries)
    results = _read_json(run_dir / "evaluation" / "results.json")
    if results:
        info = results.get("info", results)
        items = info.get("items") or {}
        hierarcaps = info.get("hierarcaps") or {}
        out["evaluation"] = {"kept": items.get("n_test_images"), "unit": "test images",
                             "skipped": _merge(_counts(items.get("skipped_images")),
                                               {f"hierarcaps: {k}": v for k, v in _counts(hierarcaps.get("skipped")).items()}),
                             "failed": {}}
        ran_at["evaluation"] = _mtime(run_dir / "evaluation" / "results.json")
    for path in sorted((run_dir / "search").glob("*/search.json")):
        study = _read_json(path)
        if study and study.get("account"):
            out[f"search {path.parent.name}"] = _search(study)
    stages = list(ran_at)
    for k, stage in enumerate(stages):  # a stage older than one it builds on is another run's result
        # (the preparation runs again before every training call, which then reuses its trained runs: it dates none)
        newer = [up for up in stages[:k] if ran_at[up] is not None and ran_at[stage] is not None
                 and ran_at[up] > ran_at[stage] and up != "prepare"]
        if newer:
            up = newer[-1]
            out[stage]["earlier_run"] = {"written": _iso(ran_at[stage]), "before": up, "before_ran": _iso(ran_at[up])}
    return out


def stage_lines(run_dir: Path, stage: str) -> list[str]:
    """The terminal lines of one stage of the run in `run_dir`, as `cglib status` prints them (none when the stage
    has not run): what a notebook shows of its own stage's account."""
    stages = stage_summaries(run_dir)
    return summary_lines({stage: stages[stage]}) if stage in stages else []


def losses(stages: dict[str, dict]) -> int:
    """Items skipped or failed over all stages (what --strict turns into a non-zero exit)."""
    return sum(sum(s["skipped"].values()) + sum(s["failed"].values()) for s in stages.values())


def run_status(run_dir: Path) -> dict:
    """run.json with its status as of now: a "running" run whose runner PID is gone on this host is
    "interrupted" (another host's run cannot be checked and stays "running")."""
    manifest = _read_json(Path(run_dir) / "run.json")
    if manifest is None:
        raise FileNotFoundError(f"{Path(run_dir) / 'run.json'} not found or unreadable: not a run directory "
                                "(pass outputs/<run> of a `cglib run`)")
    if manifest.get("status") == "running" and runner_gone(manifest.get("runner") or {}):
        manifest["status"] = "interrupted"
    return manifest
