"""Shared fixtures: the real data beside the repo (skipped with a reason when absent), offline HF settings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Under pytest-xdist (`make test` runs one worker per core, at most four): each worker's torch, and every kernel
# or process a test starts, gets its share of the cores, set before torch is imported. Two workers that each
# used every core would make their OpenMP threads spin against each other.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, CORES // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import torch  # after the thread setting above
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
# The demo profile with fewer images: the run up to MAGIC (notebooks 01-03) that the headless explorers, the HTML
# report and the browser tests share, in a fraction of the demo's time.
SMALL_DEMO = {"data": {"synthetic": {"images_per_concept": 8}}}
SHARED_DATA = Path(os.environ.get("CGLIB_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def hierarcaps_data(folder: Path) -> dict:
    """params/hierarcaps.yaml's data paths pointed at another copy of its data (`cglib download hierarcaps-1k`'s
    layout), as overrides for load_params or deep_merge: how tests read the shared copy."""
    return {"data": {"coco_captions": str(folder / "coco_captions_hc1k.json"), "coco_images": str(folder / "test_imgs"),
                     "hierarcaps_csv": str(folder / "hierarcaps_test.csv"),
                     "hierarcaps_images": str(folder / "test_imgs")}}


# torch's thread count and the thread variables before any test changed them: all cores, or what the caller asks
TORCH_THREADS = torch.get_num_threads()
THREAD_VARIABLES_AT_START = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@contextmanager
def process_settings_restored() -> Iterator[None]:
    """Give back this process's environment as it was on entry, and its threads as they were before any test.

    A test or fixture that starts a run in the pytest process with run.threads: 1 (cglib.run.set_threads) sets
    OMP_NUM_THREADS=1 and torch's thread count for the rest of the process. Every later test inherits them, and so
    does every kernel it starts: the notebooks of a later series then train on one core of two (the rehearsal's
    notebook 05 took 132 s in the suite against 88 s alone). The thread settings go back to the session's start,
    not to the entry's: a module fixture set up before the test may have changed them already."""
    environ = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for name, value in THREAD_VARIABLES_AT_START.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.set_num_threads(TORCH_THREADS)


@pytest.fixture(autouse=True)
def _process_settings_per_test() -> Iterator[None]:
    with process_settings_restored():
        yield


# `make test` runs pytest-xdist with `--dist loadscope`, and tests/xdist_groups.py widens a scope from a file to a
# group of files: a worker runs a whole group. The session runs that several files read are made once per worker
# that needs them, so every file that reads one is in that run's group (checked below at collection); any other
# file is a group of its own (its module fixtures run once). The groups that take longest start first, so that no
# worker is left with a long group at the end.
SHARED_RUNS = {"classroom": {"classroom_run", "class_run", "demo_paths_run"}, "small_run": {"small_run"}}
GROUP_OF_FILE = {
    **dict.fromkeys(["tests/test_book.py", "tests/test_classroom.py", "tests/test_course.py",
                     "tests/test_demo_pipeline.py", "tests/test_student_run.py"], "classroom"),
    **dict.fromkeys(["tests/test_browser.py", "tests/test_magic_hf.py", "tests/test_related_e2e.py",
                     "tests/test_report.py", "tests/test_run_travels.py", "tests/test_stage_accounts.py",
                     "tests/test_viz_headless.py"], "small_run"),
}
LONGEST_GROUPS_FIRST = ["classroom", "small_run", "tests/test_rehearsal_e2e.py"]


def group_of_test(nodeid: str) -> str:
    """The group of files a test belongs to (a file not in GROUP_OF_FILE is its own group)."""
    file = nodeid.split("::")[0]
    return GROUP_OF_FILE.get(file, file)


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        from xdist_groups import GroupScheduler

        config.pluginmanager.register(GroupScheduler(group_of_test), "cglib-test-groups")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for run, fixtures in SHARED_RUNS.items():
            if fixtures & set(item.fixturenames) and group_of_test(item.nodeid) != run:
                raise pytest.UsageError(f"{item.nodeid} reads the session's {run} run: add its file to "
                                        f"GROUP_OF_FILE in tests/conftest.py as '{run}', or a second worker makes "
                                        "the run again")

    rank = {group: i for i, group in enumerate(LONGEST_GROUPS_FIRST)}
    # stable: a file's tests keep their order; the order in which workers receive the groups follows it
    items.sort(key=lambda item: rank.get(group_of_test(item.nodeid), len(rank)))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real data folder (HierarCaps 1K, COCO captions); skips the test when it is absent."""
    if not (SHARED_DATA / "hierarcaps" / "hierarcaps_test.csv").is_file():
        pytest.skip(f"real data not found at {SHARED_DATA} (set CGLIB_SHARED_DATA to the shared/data folder)")
    return SHARED_DATA


def shrunk_demo_run(tmp_path_factory, name: str, *args: str) -> Path:
    """The demo profile with SMALL_DEMO's overrides, executed by `cglib run` (papermill, headless) with `args`."""
    from cglib.cli import main as cli_main
    from cglib.config import deep_merge

    root = tmp_path_factory.mktemp(name)
    params = deep_merge(yaml.safe_load((REPO_ROOT / "params/demo.yaml").read_text()), SMALL_DEMO)
    params["run"]["name"] = name
    path = root / "params" / f"{name}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(params))
    out = root / "run"
    assert cli_main(["run", str(path), "--out", str(out), *args]) == 0
    return out


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> Path:
    """Notebooks 01-03 of the shrunken demo: the run directory shared by every test of the session that needs a run
    up to MAGIC (headless explorers, the HTML report, the browser)."""
    return shrunk_demo_run(tmp_path_factory, "headless", "--only", "01,02,03")


@pytest.fixture(scope="session")
def classroom_run(tmp_path_factory) -> Path:
    """The whole series (00-09, solutions included) on params/classroom.yaml, executed once by `cglib run`:
    the run directory."""
    from cglib.cli import main as cli_main

    out = tmp_path_factory.mktemp("classroom") / "run"
    assert cli_main(["run", str(REPO_ROOT / "params/classroom.yaml"), "--out", str(out)]) == 0
    return out


def set_writable(root: Path, writable: bool) -> None:
    """Give (True) or take (False) the write permission of every file and folder under `root` (links left)."""
    import stat

    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (links not followed): kind, size, modification time and content digest."""
    import hashlib
    import stat

    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else ""
        out[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns, digest)
    return out


@pytest.fixture(scope="session")
def class_run(classroom_run, tmp_path_factory):
    """A class's run as a teacher shares it: a copy of the classroom run (its report and book left out), every
    file and folder read-only, and its snapshot taken now (students' tests link to it and check it afterwards;
    as root the permissions do not stop a write, the snapshot does)."""
    import shutil

    shared = tmp_path_factory.mktemp("class") / "run"
    shutil.copytree(classroom_run, shared, symlinks=True, ignore=shutil.ignore_patterns("report", "book"))
    set_writable(shared, False)
    yield shared, snapshot(shared)
    set_writable(shared, True)  # so that pytest can remove it


def demo_code_paths() -> dict:
    """What params/demo.yaml runs and params/classroom.yaml leaves out, as overrides for the classroom profile:
    every kind of Table 3 row (textual pretraining, the HierarCaps RE row, the row initialised from it), two
    training seeds (training/seed1/, the hierarchical bootstrap, the seed lines of Fig. 4) and PDF figures."""
    demo = yaml.safe_load((REPO_ROOT / "params/demo.yaml").read_text())
    return {"run": {"name": "demo_paths"}, "train": {"runs": demo["train"]["runs"], "seeds": [0, 1]},
            "viz": {"formats": ["png", "pdf"]}}


@pytest.fixture(scope="session")
def demo_paths_run(classroom_run, tmp_path_factory) -> Path:
    """classroom_run continued from training (notebooks 05-07) with demo_code_paths(): the demo's training and
    evaluation code paths without running the stages before training (00-04) a second time. The stages up to MAGIC
    are the classroom run's (its params differ only in train and viz keys), copied with its image cache and its
    training: seed 0's base and its clip, pairwise and centroid rows are reused (train.seeds and the other rows are
    not in a run's spec), as when a user adds rows and a seed to a finished run; the rest trains."""
    import shutil

    from cglib.cli import main as cli_main
    from cglib.config import deep_merge

    root = tmp_path_factory.mktemp("demo_paths")
    out = root / "run"
    shutil.copytree(classroom_run, out, ignore=shutil.ignore_patterns(
        "evaluation", "figures", "notebooks", "own_objective", "search", "run.json"))
    params = deep_merge(yaml.safe_load((REPO_ROOT / "params/classroom.yaml").read_text()), demo_code_paths())
    path = root / "params" / "demo_paths.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(params))
    assert cli_main(["run", str(path), "--out", str(out), "--only", "05,06,07"]) == 0
    return out
