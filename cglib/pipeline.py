"""Run the numbered notebook series headless with papermill, one params file per run.

Every notebook gets two parameters, the params file path and the run directory, so each one reads what the
previous ones wrote under `outputs/<run>/`. Executed notebooks go to `<run>/notebooks/`, and `<run>/run.json`
records params, git commit, package versions and each notebook's status and duration. A failing cell stops
the series and is reported by notebook, cell and exception.

Kernels of a run get `CGLIB_HEADLESS=1` (unless already set), so explorers render statically and open no widget
comm, and progress bars are text bars left at their final count (`cglib.frontend`); and matplotlib's inline backend
whatever MPLBACKEND the caller exported, so the figures cells show are saved in the executed notebooks. A cell that sends nothing
for `run.cell_silence_s` is treated as hung: its kernel is interrupted (killed if that does not help) and the
run fails naming the notebook and the cell, instead of waiting for `run.cell_timeout_s`.

At the end (finished or failed) run.json gets `summary`: per stage, what it kept, skipped by reason and failed
by reason, read from the files the stages write (`stage_summaries`), and `skipped_or_failed`, their total
(`cglib run --strict` exits 3 when it is not 0). run.json also records the runner (`pid`, `host`, process
start time), so `cglib status RUN_DIR` shows a run left "running" by a killed runner as `interrupted`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from cglib.config import Params
from cglib.frontend import HEADLESS_ENV
from cglib.llm.base import redact
from cglib.run import REPO_ROOT, provenance, runner_gone, runner_identity, write_json

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
DEFAULT_KERNEL = "cglib"


class NotebookFailed(RuntimeError):
    """A notebook of the series raised; the message names the notebook, the cell and the exception."""


class CellSilent(RuntimeError):
    """A cell sent nothing for longer than `run.cell_silence_s`; the message names the cell."""


@dataclass
class NotebookResult:
    name: str
    status: str  # ok | failed | skipped
    duration_s: float
    output: str | None = None
    error: str | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "duration_s": round(self.duration_s, 2),
                "output": self.output, "error": self.error}


def discover_notebooks(directory: Path) -> list[Path]:
    """Numbered notebooks `NN_name.ipynb` of a folder, in order."""
    if not directory.is_dir():
        raise FileNotFoundError(f"notebook folder not found: {directory}")
    return sorted(p for p in directory.iterdir() if NOTEBOOK_PATTERN.match(p.name))


def select_notebooks(notebooks: list[Path], only: list[str] | None = None, start: str | None = None) -> list[Path]:
    """Filter by number prefix: `only` keeps the listed numbers, `start` keeps that number and later ones."""
    known = {p.name[:2] for p in notebooks}
    for number in [*(only or []), *([start] if start else [])]:
        if number.zfill(2) not in known:
            raise ValueError(f"no notebook numbered {number!r}; available: {', '.join(sorted(known))}")
    selected = notebooks
    if only:
        wanted = {n.zfill(2) for n in only}
        selected = [p for p in selected if p.name[:2] in wanted]
    if start:
        selected = [p for p in selected if p.name[:2] >= start.zfill(2)]
    return selected


def ensure_kernel(name: str = DEFAULT_KERNEL) -> str:
    """Make sure kernel `name` runs this very Python (register it in this environment if needed)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        spec = None
    if spec is not None and _same_python(spec.argv[0]):
        return name
    if spec is not None and name != DEFAULT_KERNEL:
        raise RuntimeError(f"kernel '{name}' runs {spec.argv[0]}, not this environment's {sys.executable}")
    from ipykernel.kernelspec import install

    install(kernel_name=name, display_name=f"Python ({name})", prefix=sys.prefix)
    spec = KernelSpecManager().get_kernel_spec(name)
    if not _same_python(spec.argv[0]):
        raise RuntimeError(f"a kernel named '{name}' in {spec.resource_dir} runs {spec.argv[0]}, shadowing this "
                           f"environment's; remove it (`jupyter kernelspec remove {name}`) or pass --kernel")
    return name


def _same_python(executable: str) -> bool:
    if executable in ("python", "python3"):
        return False
    try:
        return Path(executable).resolve() == Path(sys.executable).resolve() or \
            Path(executable).absolute() == Path(sys.executable).absolute()
    except OSError:
        return False


def _failure_summary(exc: Exception) -> str:
    """One readable line from a PapermillExecutionError (cell number, exception name and value), secrets redacted.

    The line goes to the terminal and run.json, so a key that any library put into an exception message
    (not only the LLM layer's, which redacts its own) is removed here too.
    """
    cell = getattr(exc, "exec_count", None)
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    source = (getattr(exc, "source", "") or "").strip().splitlines()
    first_line = f" [{source[0][:80]}]" if source else ""
    return redact(f"cell In [{cell}]{first_line}: {ename}: {evalue}")


class SilenceWatch:
    """Watches one notebook's execution: every kernel message resets the clock; after `limit_s` of silence in a
    cell it interrupts the kernel (SIGINT), and kills it if still silent `grace_s` later."""

    def __init__(self, limit_s: float, grace_s: float = 10.0) -> None:
        self.limit_s, self.grace_s = limit_s, grace_s
        self.last = time.monotonic()
        self.cell: tuple[int, str] | None = None  # (index in the executed notebook, first source line)
        self.fired: tuple[int, str] | None = None  # the cell found silent, once that happened
        self._stop = threading.Event()

    def touch(self) -> None:
        """Activity seen (any iopub message of the running cell)."""
        self.last = time.monotonic()

    def cell_started(self, cell, cell_index: int, **_: object) -> None:
        """nbclient's on_cell_start hook."""
        lines = (cell.source or "").strip().splitlines()
        self.cell = (cell_index, lines[0][:80] if lines else "")
        self.touch()

    def watch(self, kernel_pid: int | None) -> None:
        """The watchdog loop (runs in a thread until `stop()`)."""
        poll = min(1.0, self.limit_s / 4)
        interrupted_at = None
        while not self._stop.wait(poll):
            silent = time.monotonic() - self.last
            if self.fired is None and silent > self.limit_s and self.cell is not None:
                self.fired = self.cell
                interrupted_at = self.last
                _signal(kernel_pid, signal.SIGINT)
            elif self.fired is not None and interrupted_at == self.last and silent > self.limit_s + self.grace_s:
                _signal(kernel_pid, signal.SIGKILL)  # the interrupt produced nothing: the kernel is stuck
                return

    def stop(self) -> None:
        self._stop.set()


def _signal(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _watched_engine(watch: SilenceWatch) -> str:
    """Register (once per watch) a papermill engine whose nbclient reports every kernel message to `watch`."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger
    from papermill.utils import remove_args

    class WatchedClient(PapermillNotebookClient):
        def process_message(self, *args, **kwargs):
            watch.touch()
            return super().process_message(*args, **kwargs)

        def papermill_execute_cells(self):
            provisioner = getattr(self.km, "provisioner", None)
            thread = threading.Thread(target=watch.watch, args=(getattr(provisioner, "pid", None),), daemon=True)
            thread.start()
            try:
                super().papermill_execute_cells()
            finally:
                watch.stop()
                thread.join()

    class WatchedEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None, **kwargs):
            # as papermill's NBClientEngine, with the watched client
            kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
            return WatchedClient(nb_man, timeout=execution_timeout, startup_timeout=start_timeout,
                                 kernel_name=kernel_name, log=logger, log_output=log_output, stdout_file=stdout_file,
                                 stderr_file=stderr_file, on_cell_start=watch.cell_started, **kwargs).execute()

    papermill_engines.register("cglib-watched", WatchedEngine)
    return "cglib-watched"


# matplotlib's inline backend for the kernels of a run: an MPLBACKEND such as Agg exported for scripts (the Makefile
# does, and so do CI jobs) would reach the kernels and keep every figure out of the executed notebooks.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


@contextmanager
def headless_kernels() -> Iterator[None]:
    """Kernels started inside get CGLIB_HEADLESS=1, unless the user set the variable (then theirs wins), and
    matplotlib's inline backend (MPLBACKEND), so figures shown by cells are saved in the executed notebooks."""
    saved = {key: os.environ.get(key) for key in (HEADLESS_ENV, "MPLBACKEND")}
    os.environ.setdefault(HEADLESS_ENV, "1")
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute_notebook(notebook: Path, output: Path, parameters: dict, kernel: str, timeout_s: int,
                     silence_s: int, cwd: Path | None = None) -> None:
    """Run one notebook headless with papermill; a silent cell (no message for `silence_s`) raises `CellSilent`."""
    import papermill

    watch = SilenceWatch(silence_s) if silence_s > 0 else None
    with headless_kernels():
        try:
            papermill.execute_notebook(
                str(notebook), str(output), kernel_name=kernel, cwd=str(cwd or notebook.parent),
                parameters=parameters, execution_timeout=timeout_s, progress_bar=True,
                request_save_on_cell_execute=True, coalesce_streams=True,
                engine_name=_watched_engine(watch) if watch else None)
        except Exception as exc:  # whatever the kernel did after the interrupt: re-raised unless silent
            if watch is not None and watch.fired is not None:
                index, first_line = watch.fired
                raise CellSilent(f"cell {index} [{first_line}]: no output for {silence_s} s (run.cell_silence_s), "
                                 f"so the kernel was interrupted; a hang (e.g. a widget waiting for a front end) or "
                                 f"a long silent computation: if the cell is just slow, raise run.cell_silence_s "
                                 f"(0 = off)") from exc
            raise


def run_series(params: Params, params_path: Path, run_dir: Path, notebooks: list[Path],
               kernel: str = DEFAULT_KERNEL, log=print) -> list[NotebookResult]:
    """Execute `notebooks` in order into `run_dir/notebooks/`; write run.json after each; stop at a failure."""
    run_dir.mkdir(parents=True, exist_ok=True)
    executed_dir = run_dir / "notebooks"
    executed_dir.mkdir(exist_ok=True)
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    kernel = ensure_kernel(kernel)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[NotebookResult] = []
    manifest = provenance(params, params_file=str(params_path.resolve()), run_dir=str(run_dir.resolve()),
                          kernel=kernel, started=started, runner=runner_identity())

    def save(status: str) -> None:
        manifest.update(status=status, notebooks=[r.as_dict() for r in results],
                        total_s=round(sum(r.duration_s for r in results), 2))
        if status != "running":  # the end of the run: what every stage kept, skipped and failed
            manifest["summary"] = stage_summaries(run_dir, resume=resume_command(params_path, run_dir))
            manifest["skipped_or_failed"] = losses(manifest["summary"])
        write_json(run_dir / "run.json", manifest)

    save("running")  # from the start, so `cglib status` sees a run whose runner was killed early
    try:
        _run_each(notebooks, executed_dir, params, params_path, run_dir, kernel, results, save, log)
    except KeyboardInterrupt:
        save("interrupted")
        raise
    save("ok")
    return results


def _run_each(notebooks: list[Path], executed_dir: Path, params: Params, params_path: Path, run_dir: Path,
              kernel: str, results: list[NotebookResult], save, log) -> None:
    for index, notebook in enumerate(notebooks, start=1):
        output = executed_dir / notebook.name
        log(f"[{index}/{len(notebooks)}] {notebook.name}")
        t0 = time.perf_counter()
        try:
            execute_notebook(notebook, output, {"params_path": str(params_path.resolve()),
                                                "run_dir": str(run_dir.resolve())},
                             kernel, params.run.cell_timeout_s, params.run.cell_silence_s)
        except Exception as exc:  # noqa: BLE001 - PapermillExecutionError, nbclient timeouts, DeadKernelError
            summary = str(exc) if isinstance(exc, CellSilent) else _failure_summary(exc)
            results.append(NotebookResult(notebook.name, "failed", time.perf_counter() - t0, str(output), summary))
            save("failed")
            raise NotebookFailed(f"{notebook.name} failed at {summary}\n  executed notebook: {output}") from None
        results.append(NotebookResult(notebook.name, "ok", time.perf_counter() - t0, str(output)))
        log(f"    done in {results[-1].duration_s:.1f} s")
        save("running")


def resume_command(params_path: Path, run_dir: Path, notebook: str | None = None) -> str:
    """The command that runs the series again from `notebook` into the same run folder (without `notebook`: the
    command a stage completes with its own `--from NN`)."""
    return f"cglib run {params_path} --out {run_dir}" + (f" --from {notebook}" if notebook else "")


def default_notebook_dir() -> Path:
    """The repository's `notebooks/` folder."""
    return REPO_ROOT / "notebooks"


# ------------------------------------------------------------------------------------------ run summary
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


def _abstraction(run_dir: Path, summary: dict, resume: str | None) -> dict:
    """The abstraction stage: this attempt's account as the engine recorded it, and the files on disk that an
    earlier attempt wrote (named with that attempt's time and status, never added to this one's account)."""
    from cglib.llm.engine import CHAINS_FILE, load_attempts  # lazy: the engine pulls in every backend

    out = {"kept": summary.get("chains"), "unit": "images with a full chain", "skipped": {},
           "failed": _counts(summary.get("failed_images_by_reason")), "llm": summary.get("account"),
           "cache_rebuilt": summary.get("cache_rebuilt"), "attempt": summary.get("attempt")}
    if summary.get("status") not in (None, "complete"):
        out["failed"]["stopped: " + str(summary.get("error", ""))[:120]] = 1
        out["resume"] = resume and f"{resume} --from 02"
    chains = run_dir / "abstraction" / CHAINS_FILE
    attempt = summary.get("attempt") or {}
    if chains.is_file() and attempt and not attempt.get("chains_written"):
        writers = [a for a in load_attempts(run_dir / "abstraction") if a.get("chains_written")]
        if writers:
            w = writers[-1]
            out["other_files"] = {CHAINS_FILE: {"started": w.get("started"), "status": w.get("status"),
                                                "chains": w.get("chains")}}
        else:  # written by a cglib that recorded no attempts
            out["other_files"] = {CHAINS_FILE: {"started": _iso(chains.stat().st_mtime), "status": "unknown",
                                                "chains": None}}
    return out


def _generalize(summary: dict, resume: str | None) -> dict:
    """Notebook 03's generalized captions: the LLM account of its last attempt (the same as the chains'). Units
    whose requests failed keep their original captions and are counted by the magic stage, so only a stop is a
    loss here."""
    account = summary.get("account")
    out = {"kept": summary.get("ok", 0), "unit": "generalized-caption requests answered (generalized.jsonl)", "skipped": {}, "failed": {},
           "llm": account}
    if summary.get("status") not in (None, "complete"):
        out["failed"]["stopped: " + str(summary.get("error", ""))[:120]] = 1
        out["resume"] = resume and f"{resume} --from 03"
    return out


def _training(run_dir: Path, summaries: list[Path], resume: str | None) -> dict:
    """Per run and training seed, the account of the attempt that finished it (steps and epochs kept from a
    checkpoint, trained now, repeated after a kill), the image cache's account, and the runs an interrupted
    attempt left with a checkpoint and no final weights (still to resume)."""
    from cglib.run import seed_label  # lazy: numpy, only when a run has trained

    runs: dict[str, dict] = {}
    caches: dict[str, dict] = {}
    for path in summaries:
        s = _read_json(path)
        if not s:
            continue
        label = seed_label(s.get("name", path.parent.name), int(s.get("training_seed") or 0))
        runs[label] = s.get("account") or {}
        cache = (s.get("image_cache") or {}).get("account")
        if cache:  # one cache per image size, shared by the runs of a seed: the last summary's word
            caches[f"{cache['size']}px"] = cache
    waiting = sorted(str(p.parent.parent.relative_to(run_dir / "training"))
                     for p in (run_dir / "training").glob("**/checkpoints/last.pt")
                     if not (p.parent.parent / "summary.json").is_file())
    skipped = _merge(*(_counts(c["skipped_by_reason"]) for c in caches.values()))
    out = {"kept": len(runs), "unit": "models trained (every training seed)",
           "skipped": {f"image cache: {k}": v for k, v in skipped.items()}, "failed": {}, "runs": runs,
           "image_cache": caches}
    if waiting:
        out["failed"] = {"interrupted, a checkpoint waits": len(waiting)}
        out["interrupted"] = waiting
        out["resume"] = resume and f"{resume} --from 05"
    return out


def _search(summary: dict) -> dict:
    """The search study's account, read from its database when `cglib search` ended (search.json)."""
    account = summary.get("account") or {}
    return {"kept": account.get("finished"), "unit": f"finished trials of study {summary.get('study')}",
            "skipped": {}, "failed": {}, "trials": account}


def stage_summaries(run_dir: Path, resume: str | None = None) -> dict[str, dict]:
    """Per stage that has run: what it kept, skipped by reason and failed by reason, read from the files the
    stages write (captions/summary.json, abstraction/summary.json and generalize_summary.json, magic/stats.json,
    training/*/summary.json, evaluation/results.json, search/*/search.json), with each stage's account (the LLM
    stages', training's per run and seed with the image cache's, the search study's). A stage whose files are
    older than an earlier stage's last run is marked `earlier_run` (its numbers come from another run).
    `resume`: the command (without --from) that resumes a stopped stage."""
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
    if abstraction:
        out["abstraction"] = _abstraction(run_dir, abstraction, resume)
        started = (abstraction.get("attempt") or {}).get("started")
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
    summaries = sorted((run_dir / "training").glob("*/summary.json")) + sorted(
        (run_dir / "training").glob("seed*/*/summary.json"))  # training seed 0, then seeds k > 0
    if summaries or list((run_dir / "training").glob("**/checkpoints/last.pt")):
        out["training"] = _training(run_dir, summaries, resume)
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
        newer = [up for up in stages[:k] if ran_at[up] is not None and ran_at[stage] is not None
                 and ran_at[up] > ran_at[stage]]
        if newer:
            up = newer[-1]
            out[stage]["earlier_run"] = {"written": _iso(ran_at[stage]), "before": up, "before_ran": _iso(ran_at[up])}
    return out


def _llm_lines(s: dict) -> list[str]:
    """The LLM stage's account, its stop, its rebuilt cache and the files another attempt left."""
    pad = " " * 15
    lines = []
    a = s.get("llm")
    if a is None:
        return [pad + "LLM: no account (summary.json written by an older cglib; run the stage again)"]
    failed = ", ".join(f"{k}: {v}" for k, v in a["failed_by_reason"].items())
    retries = ", ".join(f"{k}: {v}" for k, v in a["requests"]["retries_by_reason"].items())
    cost = a["cost_usd"]
    line = (f"{pad}LLM: {a['items']} items = {a['cached']} cached + {a['cached_failures']} cached failures + "
            f"{a['answered']} answered + {a['failed']} failed" + (f" ({failed})" if failed else "")
            + f" + {a['never_asked']} never asked + {a['not_needed']} not needed after a failed level"
            + ("" if a["adds_up"] else " (DOES NOT ADD UP)")
            + f"; {a['requests']['http']} requests ({a['requests']['retries']} retries"
            + (f": {retries}" if retries else "") + f"); ${cost['spent']:.4f} spent"
            + (f" (estimated ${cost['estimated']:.4f})" if cost["estimated"] is not None else ""))
    lines.append(line)
    if a["status"] != "complete":
        cached = a["cached"] + a["cached_failures"]
        asked = cached + a["answered"] + a["failed"]
        lines.append(f"{pad}stopped ({a['stopped_by']}): {asked} of {a['items']} asked ({cached} from the cache), "
                     f"{a['never_asked']} never asked, ${cost['spent']:.4f} spent"
                     + (f"; resume with: {s['resume']}" if s.get("resume") else ""))
    if s.get("cache_rebuilt"):
        from cglib.llm.cache import rebuilt_message  # lazy: only a run whose cache was rebuilt needs it

        lines.append(f"{pad}cache rebuilt: {rebuilt_message(s['cache_rebuilt'])}")
    for name, w in (s.get("other_files") or {}).items():
        chains = f", {w['chains']} chains" if w.get("chains") is not None else ""
        lines.append(f"{pad}{name} on disk is from another attempt (started {w['started']}, {w['status']}{chains}); "
                     "not part of this attempt's account")
    return lines


def summary_lines(stages: dict[str, dict]) -> list[str]:
    """Terminal lines per stage: kept, skipped by reason, failed by reason; for the LLM stage its account; a
    stage whose files come from an earlier run says so."""
    def reasons(counts: dict[str, int]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in counts.items()) if counts else ""

    lines = []
    for stage, s in stages.items():
        skipped, failed = sum(s["skipped"].values()), sum(s["failed"].values())
        line = f"  {stage:12s} kept {s['kept']} {s['unit']}; skipped {skipped}"
        line += f" ({reasons(s['skipped'])})" if skipped else ""
        line += f"; failed {failed}" + (f" ({reasons(s['failed'])})" if failed else "")
        earlier = s.get("earlier_run")
        if earlier:
            line += (f" [from an earlier run: written {earlier['written']}, before {earlier['before']} ran again "
                     f"at {earlier['before_ran']}]")
        lines.append(line)
        if stage in ("abstraction", "generalize"):
            lines += _llm_lines(s)
        elif stage == "training":
            lines += _training_lines(s)
        elif stage.startswith("search "):
            from cglib.search.study import account_line  # lazy: optuna, only for a run that searched

            lines.append(" " * 15 + account_line(s["trials"]))
    return lines


def _training_lines(s: dict) -> list[str]:
    """Per run and training seed, steps and epochs kept from a checkpoint plus trained now (and repeated after a
    kill); per image size, the image cache's account; the runs still waiting on a checkpoint."""
    pad = " " * 15
    lines = []
    for label, a in s["runs"].items():
        if not a:
            lines.append(f"{pad}{label}: no account (summary.json written by an older cglib; train it again)")
            continue
        steps, epochs = a["steps"], a["epochs"]
        lines.append(f"{pad}{label}: {steps['total']} steps = {steps['kept']} kept from a checkpoint + "
                     f"{steps['trained_now']} trained now ({steps['repeated']} of them repeated after an "
                     f"interruption); {epochs['total']} epochs = {epochs['kept']} kept + {epochs['trained_now']} "
                     "trained now" + ("" if a["adds_up"] else " (DOES NOT ADD UP)"))
    for size, c in s["image_cache"].items():
        reasons = ", ".join(f"{k}: {v}" for k, v in c["skipped_by_reason"].items())
        lines.append(f"{pad}image cache {size}: {c['images']} images = {c['from_earlier_build']} from an earlier "
                     f"build + {c['built_now']} built now + {c['skipped']} skipped" + (f" ({reasons})" if reasons
                                                                                       else "")
                     + ("" if c["adds_up"] else " (DOES NOT ADD UP)"))
    for label in s.get("interrupted", []):
        lines.append(f"{pad}{label}: interrupted, its checkpoint waits"
                     + (f"; resume with: {s['resume']}" if s.get("resume") else ""))
    return lines


def losses(stages: dict[str, dict]) -> int:
    """Items skipped or failed over all stages (what --strict turns into a non-zero exit)."""
    return sum(sum(s["skipped"].values()) + sum(s["failed"].values()) for s in stages.values())


# ----------------------------------------------------------------------------------------- run status
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
