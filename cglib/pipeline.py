"""Run the numbered notebook series headless with papermill, one params file per run.

Every notebook gets two parameters, the params file path and the run directory, so each one reads what the
previous ones wrote under `outputs/<run>/`. Executed notebooks go to `<run>/notebooks/`, and `<run>/run.json`
records params, git commit, package versions and each notebook's status and duration. A failing cell stops
the series and is reported by notebook, cell and exception.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from cglib.config import Params
from cglib.run import REPO_ROOT, provenance, write_json

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[\w-]+\.ipynb$")
DEFAULT_KERNEL = "cglib"


class NotebookFailed(RuntimeError):
    """A notebook of the series raised; the message names the notebook, the cell and the exception."""


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
    """One readable line from a PapermillExecutionError (cell number, exception name and value)."""
    cell = getattr(exc, "exec_count", None)
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    source = (getattr(exc, "source", "") or "").strip().splitlines()
    first_line = f" [{source[0][:80]}]" if source else ""
    return f"cell In [{cell}]{first_line}: {ename}: {evalue}"


def run_series(params: Params, params_path: Path, run_dir: Path, notebooks: list[Path],
               kernel: str = DEFAULT_KERNEL, log=print) -> list[NotebookResult]:
    """Execute `notebooks` in order into `run_dir/notebooks/`; write run.json after each; stop at a failure."""
    import papermill

    run_dir.mkdir(parents=True, exist_ok=True)
    executed_dir = run_dir / "notebooks"
    executed_dir.mkdir(exist_ok=True)
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    kernel = ensure_kernel(kernel)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[NotebookResult] = []
    manifest = provenance(params, params_file=str(params_path.resolve()), run_dir=str(run_dir.resolve()),
                          kernel=kernel, started=started)

    def save(status: str) -> None:
        manifest.update(status=status, notebooks=[r.as_dict() for r in results],
                        total_s=round(sum(r.duration_s for r in results), 2))
        write_json(run_dir / "run.json", manifest)

    for index, notebook in enumerate(notebooks, start=1):
        output = executed_dir / notebook.name
        log(f"[{index}/{len(notebooks)}] {notebook.name}")
        t0 = time.perf_counter()
        try:
            papermill.execute_notebook(
                str(notebook), str(output), kernel_name=kernel, cwd=str(notebook.parent),
                parameters={"params_path": str(params_path.resolve()), "run_dir": str(run_dir.resolve())},
                execution_timeout=params.run.cell_timeout_s, progress_bar=True, request_save_on_cell_execute=True)
        except Exception as exc:  # noqa: BLE001 - PapermillExecutionError, nbclient timeouts, DeadKernelError
            summary = _failure_summary(exc)
            results.append(NotebookResult(notebook.name, "failed", time.perf_counter() - t0, str(output), summary))
            save("failed")
            raise NotebookFailed(f"{notebook.name} failed at {summary}\n  executed notebook: {output}") from None
        results.append(NotebookResult(notebook.name, "ok", time.perf_counter() - t0, str(output)))
        log(f"    done in {results[-1].duration_s:.1f} s")
        save("running")
    save("ok")
    return results


def default_notebook_dir() -> Path:
    """The repository's `notebooks/` folder."""
    return REPO_ROOT / "notebooks"
