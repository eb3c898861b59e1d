"""Where a study lives (`search.storage`) and how a trial whose worker died is found and run again.

    null (default)          SQLite file <run>/search/<study>.sqlite3; one worker
    journal:PATH            Optuna's journal file (JournalStorage + JournalFileBackend); several processes on one
                            machine (Optuna's FAQ advises against SQLite for parallel workers: "database is locked")
    postgresql://USER@HOST[:PORT]/DB   a PostgreSQL server shared by workers on many machines (driver: psycopg 3,
                            the `postgres` extra); another SQLAlchemy URL (mysql://...) with its driver: untested

A worker died (SIGKILL, a crash, a machine lost) leaves its trial RUNNING. Two checks find it, and both fail the
trial and queue its values again as a new trial with user attribute `retry_of`:
- on the worker's own host, its process is gone (`runner_gone`): every storage, at once;
- on any host, database storages: Optuna's heartbeat (the trial's worker writes one every `search.heartbeat_s`;
  `fail_stale_trials` fails a trial silent for twice that). The journal storage has no heartbeat: it serves
  workers on one machine, where the first check sees every worker.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from cglib.config import Params
from cglib.run import runner_gone

logger = logging.getLogger(__name__)
SEARCH_DIR = "search"

TABLE_RACE_TRIES = 4  # opening attempts while workers started together create Optuna's tables (open_storage)
# The pip package of each SQLAlchemy driver a user is likely to name, for the missing-driver error.
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]  (or: pip install -e '.[postgres]')", "psycopg2": "psycopg2-binary",
                   "mysqldb": "mysqlclient", "pymysql": "PyMySQL", "asyncpg": "asyncpg"}


class StorageError(RuntimeError):
    """The study's storage cannot be opened: a missing driver or an unreachable server (the message names the fix)."""


def study_name(params: Params) -> str:
    """search.study_name, else '<run.name>-<tuned run>'."""
    return params.search.study_name or f"{params.run.name}-{params.search_run()}"


def workspace(params: Params, run_dir: Path) -> Path:
    """The study's folder under the run: <run>/search/<study>/."""
    return Path(run_dir) / SEARCH_DIR / study_name(params)


def _under(run_dir: Path, path: str) -> Path:
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() else Path(run_dir) / resolved


def storage_url(params: Params, run_dir: Path) -> str:
    """The storage string with environment variables expanded and relative file paths under the run directory."""
    spec = os.path.expandvars(params.search.storage or f"sqlite:///{SEARCH_DIR}/{study_name(params)}.sqlite3")
    if spec.startswith("journal:"):
        return "journal:" + str(_under(run_dir, spec.removeprefix("journal:")))
    if spec.startswith("sqlite:///"):
        return "sqlite:///" + str(_under(run_dir, spec.removeprefix("sqlite:///")))
    return spec


def shown_url(url: str) -> str:
    """The storage string for logs and files, a password in a database URL masked."""
    if url.startswith("journal:") or "@" not in url:
        return url
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def database_url(url: str) -> str:
    """The SQLAlchemy URL a storage string means: plain postgresql:// is psycopg 3 (the `postgres` extra), named
    explicitly because SQLAlchemy before 2.1 reads it as psycopg2."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def check_driver(url: str) -> None:
    """Raise StorageError naming the package to install when the database URL's driver cannot be imported."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StorageError(f"search.storage {shown_url(url)!r} is not a database URL SQLAlchemy knows ({exc}); "
                           "use journal:PATH, sqlite:///PATH or postgresql://USER@HOST/DB") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        driver = parsed.get_driver_name()
        package = DRIVER_PACKAGES.get(driver, f"the {driver} driver")
        raise StorageError(f"search.storage {shown_url(url)} needs the {driver} driver, which is not installed "
                           f"({exc}): pip install {package}") from None


class RetryDeadTrial:
    """Queue a dead worker's trial again (its values, `retry_of` = its number) and delete its scratch weights.
    The heartbeat's stale-trial callback and the host check both call it. Not Optuna's
    RetryHeartbeatStaleTrialCallback: that one copies the dead trial's user attributes, among them the dead
    worker's identity, which the host check would take for the retry's own worker."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number}, skip_if_exists=False)
        shutil.rmtree(self.folder / "training" / f"trial-{trial.number:05d}", ignore_errors=True)
        worker = trial.user_attrs.get("worker") or {}
        logger.warning("trial %d: its worker (host %s, pid %s) is gone; marked FAIL, its values queued again",
                       trial.number, worker.get("host", "?"), worker.get("pid", "?"))


def open_storage(params: Params, run_dir: Path) -> optuna.storages.BaseStorage:
    """The study's storage (see the module docstring); file storages get their folder created. A missing driver or
    a server that does not answer is a StorageError."""
    url = storage_url(params, run_dir)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    url = database_url(url)
    check_driver(url)
    import sqlalchemy.exc

    heartbeat = params.search.heartbeat_s
    retry = RetryDeadTrial(workspace(params, run_dir))
    keyword = "heartbeat_stale_trial_callback" if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback") \
        else "failed_trial_callback"  # optuna < 4.9
    attempt = 0
    while True:
        try:
            with warnings.catch_warnings():  # the heartbeat has been "experimental" since optuna 2.8
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                                                  **{keyword: retry})
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # workers started together on an empty database all create Optuna's tables; the losers fail with
            # "duplicate key" or "already exists" (optuna#1092): open again, the tables are there now
            attempt += 1
            if attempt == TABLE_RACE_TRIES:
                raise
            time.sleep(attempt)
        except sqlalchemy.exc.OperationalError as exc:
            reason = str(exc.orig or exc).strip().splitlines()[0]
            raise StorageError(f"cannot open search.storage {shown_url(url)}: {reason}") from None


def recover_dead_trials(study: optuna.Study, folder: Path) -> None:
    """Fail the RUNNING trials whose worker is gone (see the module docstring) and queue their values again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # database storages: a silent heartbeat, on any host
    retry = RetryDeadTrial(folder)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not runner_gone(trial.user_attrs.get("worker") or {}):
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker failed it first (and queued it)
        retry(study, trial)
