"""Run the numbered notebook series headless with papermill, one params file per run.

Every notebook gets two parameters, the params file path and the run directory, so each one reads what the
previous ones wrote under `outputs/<run>/`. Executed notebooks go to `<run>/notebooks/`, and `<run>/run.json`
records params, git commit, package versions and each notebook's status and duration. A failing cell stops
the series and is reported by notebook, cell and exception.

Kernels of a run get `CGLIB_HEADLESS=1` (unless already set), so explorers render statically and open no widget
comm, and progress bars are text bars left at their final count (`cglib.frontend`); matplotlib's inline backend
whatever MPLBACKEND the caller exported, so the figures cells show are saved in the executed notebooks; and the
runner's PID, so a kernel dies with its runner (`cglib.kernel_guard`; papermill starts it in a session of its
own). A cell that sends nothing for `run.cell_silence_s` is treated as hung: its kernel is interrupted (killed if
that does not help) and the run fails naming the notebook and the cell, instead of waiting for
`run.cell_timeout_s`.

At the end (finished or failed) run.json gets `summary`: per stage, what it kept, skipped by reason and failed
by reason, read from the files the stages write (`cglib.accounts`), and `skipped_or_failed`, their total
(`cglib run --strict` exits 3 when it is not 0). run.json also records the runner (`pid`, `host`, process
start time), so `cglib status RUN_DIR` shows a run left "running" by a killed runner as `interrupted`.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import nbformat

from cglib.accounts import losses, stage_summaries
from cglib.config import Params
from cglib.frontend import HEADLESS_ENV
from cglib.kernel_guard import KERNEL_ARGUMENTS, RUNNER_PID_ENV
from cglib.llm.base import redact
from cglib.run import REPO_ROOT, provenance, runner_identity, save_params, write_json

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
ALLOWED_TO_RAISE = "raises-exception"  # Jupyter's cell tag: the notebook goes on past the cell's error
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
    cpu_s: float | None = None  # user + system CPU of the runner and the notebook's kernel
    raised: list[str] | None = None  # cells allowed to raise that did (a student's exercise not yet done)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "duration_s": round(self.duration_s, 2),
                "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 2),
                "output": self.output, "error": self.error, "raised": self.raised or []}


def raised_cells(executed: Path) -> list[str]:
    """The cells of an executed notebook that raised and were allowed to (tagged `raises-exception`, as the student
    version tags its exercises): "cell N: Name: value" each, secrets redacted."""
    notebook = nbformat.read(executed, as_version=4)
    out = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.output_type == "error":
                out.append(redact(f"cell {index}: {output.ename}: {output.evalue}"[:200]))
    return out


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its children that have exited and been waited for (a
    notebook's kernel, once papermill has shut it down). On a shared machine a notebook's wall time grows with
    the other jobs' load while its CPU time stays near what it needs."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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
    """Kernels started inside get CGLIB_HEADLESS=1, unless the user set the variable (then theirs wins),
    matplotlib's inline backend (MPLBACKEND), so figures shown by cells are saved in the executed notebooks, and
    this process's PID, so that they stop at once when it dies (`cglib.kernel_guard`)."""
    saved = {key: os.environ.get(key) for key in (HEADLESS_ENV, "MPLBACKEND", RUNNER_PID_ENV)}
    os.environ.setdefault(HEADLESS_ENV, "1")
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    os.environ[RUNNER_PID_ENV] = str(os.getpid())
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
                request_save_on_cell_execute=True, coalesce_streams=True, extra_arguments=KERNEL_ARGUMENTS,
                engine_name=_watched_engine(watch) if watch else None)
        except Exception as exc:  # whatever the kernel did after the interrupt: re-raised unless silent
            if watch is not None and watch.fired is not None:
                index, first_line = watch.fired
                raise CellSilent(f"cell {index} [{first_line}]: no output for {silence_s} s (run.cell_silence_s), "
                                 f"so the kernel was interrupted; a hang (e.g. a widget waiting for a front end) or "
                                 f"a long silent computation: if the cell is just slow, raise run.cell_silence_s "
                                 f"(0 = off)") from exc
            if not _only_allowed_errors(exc, output):
                raise


def _only_allowed_errors(exc: Exception, output: Path) -> bool:
    """Whether the notebook ran to its end and raised only in cells tagged `raises-exception` (the student
    version's exercises). nbclient runs past such a cell, but papermill then raises on any error output; in that
    case its error banners are removed from the executed notebook and the run goes on (`raised_cells` lists them)."""
    from papermill.exceptions import PapermillExecutionError
    from papermill.execute import remove_error_markers

    if not isinstance(exc, PapermillExecutionError) or not output.is_file():
        return False
    notebook = remove_error_markers(nbformat.read(output, as_version=4))
    failed = [c for c in notebook.cells if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)]
    if not failed or any(ALLOWED_TO_RAISE not in c.metadata.get("tags", []) for c in failed):
        return False
    notebook.metadata.get("papermill", {}).pop("exception", None)
    nbformat.write(notebook, output)
    return True


def run_series(params: Params, params_path: Path, run_dir: Path, notebooks: list[Path],
               kernel: str = DEFAULT_KERNEL, log=print, available: list[Path] | None = None) -> list[NotebookResult]:
    """Execute `notebooks` in order into `run_dir/notebooks/`; write run.json after each; stop at a failure.
    `available`: every notebook of the folder they were selected from (default: `notebooks`), so that the
    command printed to resume a stopped stage runs only what was asked (`resume_command`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    executed_dir = run_dir / "notebooks"
    executed_dir.mkdir(exist_ok=True)
    save_params(params, run_dir / "params.yaml")
    kernel = ensure_kernel(kernel)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[NotebookResult] = []
    folder = notebooks[0].parent if notebooks else default_notebook_dir()
    scope = {"asked": [p.name[:2] for p in notebooks], "available": [p.name[:2] for p in available or notebooks],
             "notebook_dir": None if folder.resolve() == default_notebook_dir().resolve() else str(folder)}
    # the folders of this machine that pages may print (the repository, the home folder): a report or book made
    # from a copy of the run elsewhere writes them by short names (cglib.executed_notebooks.machine_paths)
    manifest = provenance(params, params_file=str(params_path.resolve()), run_dir=str(run_dir.resolve()),
                          repository=str(REPO_ROOT), home=os.path.expanduser("~"),
                          kernel=kernel, started=started, runner=runner_identity(), scope=scope)

    def save(status: str) -> None:
        manifest.update(status=status, notebooks=[r.as_dict() for r in results],
                        total_s=round(sum(r.duration_s for r in results), 2))
        if status != "running":  # the end of the run: what every stage kept, skipped and failed
            manifest["summary"] = stage_summaries(run_dir, resume=resume_command(params_path, run_dir, **scope))
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
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        try:
            execute_notebook(notebook, output, {"params_path": str(params_path.resolve()),
                                                "run_dir": str(run_dir.resolve())},
                             kernel, params.run.cell_timeout_s, params.run.cell_silence_s)
        except Exception as exc:  # noqa: BLE001 - PapermillExecutionError, nbclient timeouts, DeadKernelError
            summary = str(exc) if isinstance(exc, CellSilent) else _failure_summary(exc)
            results.append(NotebookResult(notebook.name, "failed", time.perf_counter() - t0, str(output), summary,
                                          cpu_seconds() - cpu0))
            save("failed")
            raise NotebookFailed(f"{notebook.name} failed at {summary}\n  executed notebook: {output}") from None
        results.append(NotebookResult(notebook.name, "ok", time.perf_counter() - t0, str(output),
                                      cpu_s=cpu_seconds() - cpu0, raised=raised_cells(output)))
        log(f"    done in {results[-1].duration_s:.1f} s ({results[-1].cpu_s:.1f} s CPU)")
        for line in results[-1].raised or []:
            log(f"    raised (the cell may, so the notebook went on): {line}")
        save("running")


def resume_command(params_path: Path | str, run_dir: Path | str, asked: list[str] | None = None,
                   available: list[str] | None = None, notebook_dir: str | None = None) -> Callable[[str], str]:
    """The command that resumes a run stopped in notebook NN, as a function of NN: it runs again, into the same
    run folder, what the run was asked to run from NN on. `--from NN` when that is every notebook from NN (or the
    run's scope is unknown), else `--only` those notebooks: a run of `--only 00,01,02` stopped in 02 resumes with
    `--only 02`, never with 03 onwards. `asked` and `available` are notebook numbers (run.json's `scope`)."""
    base = f"cglib run {params_path} --out {run_dir}" + (f" --notebooks {notebook_dir}" if notebook_dir else "")

    def command(notebook: str) -> str:
        if asked is None or available is None:
            return f"{base} --from {notebook}"
        wanted = sorted({n for n in asked if n >= notebook} | {notebook})
        if wanted == sorted(n for n in available if n >= notebook):
            return f"{base} --from {notebook}"
        return f"{base} --only {','.join(wanted)}"

    return command


def default_notebook_dir() -> Path:
    """The repository's `notebooks/` folder."""
    return REPO_ROOT / "notebooks"
