"""Bayesian hyper-parameter search over the paper's Table 2 ranges with Optuna: `cglib search PARAMS --trials N`.

The paper chose M, N, the learning rate, tau and alpha "using a Bayesian hyperparameter search" maximizing the
average accuracy. Here each trial trains the `search.run` entry of train.runs (the real `Trainer`) with values
drawn by Optuna's TPE sampler from `search.space`, on the search view of MAGIC (validation.py: the test images
left out, a validation slice carved from MAGIC train); after every epoch the validation forced-choice accuracy is
reported and Optuna's median pruner may stop the trial. The study lives in `search.storage`, so a killed search
resumes where it stopped:

    null (default)          SQLite file <run>/search/<study>.sqlite3; one worker
    journal:PATH            Optuna's journal file (JournalStorage + JournalFileBackend); several processes on one
                            machine (Optuna's FAQ advises against SQLite for parallel workers: "database is locked")
    sqlite:///PATH, postgresql://..., mysql://...   any SQLAlchemy URL: workers on many machines share a server

A trial left RUNNING by a worker that died (killed, crashed) is marked FAIL when a worker on the same host starts,
and its values are queued again (a database storage also fails a trial whose worker on any host stopped its
heartbeat). `--trials N` is the number of finished (complete or pruned) trials the study should hold: a rerun tops
it up, several workers share the count.

Files under <run>/search/<study>/: validation.json (the split), search.json (the study's summary), best_params.yaml
(the input params with the best values merged: a ready params file), and the trials' scratch folders (training/,
cache/; each trial's weights are deleted when it ends, Optuna's storage keeps its values).
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import logging
import os
import shutil
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from cglib import distributed
from cglib.config import SHIPPED_TAXONOMY_NAMES, IntRange, Params, deep_merge, params_root, parse_params
from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import magic_image_cache
from cglib.magic.schema import load_magic
from cglib.run import RunContext, provenance, runner_gone, runner_identity, write_json
from cglib.search.validation import ValidationScorer, search_view
from cglib.strict_yaml import load_yaml, read_text
from cglib.train.inputs import TrainInputs, model_image_size, run_entry
from cglib.train.loop import ensure_initial
from cglib.train.trainer import Trainer

logger = logging.getLogger(__name__)

SEARCH_DIR = "search"
BEST_PARAMS = "best_params.yaml"
SUMMARY = "search.json"
VALIDATION = "validation.json"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# The paper's Table 2: the searched range of each key and the value it reports (arXiv 2024, Sec. 4).
TABLE2 = {"groups_per_batch": ("2 - 10", 2), "pairs_per_group": ("2 - 15", 10), "lr": ("1e-10 - 1e-4", 1e-8),
          "tau": ("0.1 - 1", 0.1), "alpha": ("0 - 1", 0.7)}


# ------------------------------------------------------------------------------------------- the study
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


def open_storage(params: Params, run_dir: Path) -> optuna.storages.BaseStorage:
    """The study's storage (see the module docstring); file storages get their folder created."""
    url = storage_url(params, run_dir)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    heartbeat = params.search.heartbeat_s
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
        optuna.storages.RetryFailedTrialCallback  # optuna < 4.9
    keyword = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in \
        inspect.signature(optuna.storages.RDBStorage).parameters else "failed_trial_callback"
    with warnings.catch_warnings():  # the heartbeat has been "experimental" since optuna 2.8
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                                          **{keyword: retry(max_retry=1)})


def open_study(params: Params, run_dir: Path) -> optuna.Study:
    """The study of these params (created, or loaded to resume): maximize, TPE sampler, median pruner."""
    s = params.search
    sampler = optuna.samplers.TPESampler(seed=s.sampler_seed, n_startup_trials=s.startup_trials,
                                         constant_liar=True)  # parallel workers do not all try the same values
    pruner = optuna.pruners.MedianPruner(n_startup_trials=s.pruner_startup_trials,
                                         n_warmup_steps=s.pruner_warmup_epochs)
    return optuna.create_study(storage=open_storage(params, run_dir), study_name=study_name(params),
                               direction="maximize", sampler=sampler, pruner=pruner, load_if_exists=True)


def suggest(trial: optuna.Trial, params: Params) -> dict[str, Any]:
    """The trial's values of the tuned train keys, drawn from search.space."""
    values: dict[str, Any] = {}
    for key, bounds in params.search.space.tuned().items():
        if isinstance(bounds, IntRange):
            values[key] = trial.suggest_int(key, bounds.low, bounds.high)
        else:
            values[key] = trial.suggest_float(key, bounds.low, bounds.high, log=bounds.log)
    return values


def trial_params(params: Params, values: dict[str, Any], name: str) -> Params:
    """The params one trial trains with: train.runs = the tuned entry renamed `name`, the trial's values, search.epochs,
    no resuming (every trial number is new) and no per-epoch weights."""
    entry = params.train.runs[[r.name for r in params.train.runs].index(params.search_run())]
    if entry.init is not None:
        raise ValueError(f"search.run {entry.name!r} starts from run {entry.init!r} (init); tune a run that starts "
                         "from the initial weights (init: null)")
    data = params.model_dump(mode="json")
    data["train"].update(values, runs=[{**entry.model_dump(mode="json"), "name": name}], resume=False,
                         keep_epoch_weights=False, epochs=params.search.epochs or params.train.epochs)
    data["search"]["run"] = name
    return Params.model_validate(data)


def recover_dead_trials(study: optuna.Study) -> list[int]:
    """Mark FAIL the RUNNING trials whose worker on this host is gone, and queue their values again; the numbers."""

    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not runner_gone(trial.user_attrs.get("worker") or {}):
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker recovered it first
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number}, skip_if_exists=False)
        recovered.append(trial.number)
    return recovered


# --------------------------------------------------------------------------------------- the workspace
@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One process at a time prepares the shared workspace (several workers may start together)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class Workspace:
    """What every trial of a study shares: the folder, the search view of MAGIC, its inputs and the scorer."""

    dir: Path
    view: Any  # MagicFile
    validation: dict[str, Any]
    inputs: Any  # TrainInputs
    scorer: Any  # ValidationScorer


def prepare_workspace(run: RunContext, progress: bool = True) -> Workspace:
    """The study folder with the base weights every trial starts from (the run's zero-shot model, built by
    `ensure_initial` when the run has none yet), the image cache of the search view (no test image) and
    validation.json; shared by every worker of the study."""
    params = run.params
    folder = workspace(params, run.dir)
    magic_path = run.require("magic/magic.json", "03_magic_dag")
    dataset = CaptionDataset.load(run.require("captions/dataset.json", "01_captions").parent)
    view, validation = search_view(load_magic(magic_path), params.search.validation_fraction, params.run.seed,
                                   params.search.groups)
    space = RunContext(params=params, dir=folder, params_path=run.params_path)
    with _locked(folder):
        initial = ensure_initial(run, progress=progress)  # the run's own base: nothing to do after notebook 05
        for source in (initial, initial.with_suffix(".json")):
            target = space.stage("training") / source.name
            if not target.is_file() or target.read_bytes() != source.read_bytes():
                shutil.copyfile(source, target.with_suffix(".tmp"))
                target.with_suffix(".tmp").replace(target)
        cache = magic_image_cache(space, view, dataset, model_image_size(params), progress)
        write_json(folder / VALIDATION, validation)
    digest = hashlib.sha1(view.model_dump_json().encode())
    digest.update(cache.directory.name.encode())
    inputs = TrainInputs(view, cache, digest.hexdigest()[:16])
    scorer = ValidationScorer(params, view, cache.get(view.split_ids("test")), view.split_ids("test"))
    return Workspace(folder, view, validation, inputs, scorer)


# ------------------------------------------------------------------------------------------- the search
class Objective:
    """One trial: train the tuned run with the trial's values, report validation accuracy each epoch (pruning)."""

    def __init__(self, run: RunContext, space: Workspace, progress: bool) -> None:
        self.run, self.space, self.progress = run, space, progress

    def __call__(self, trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", runner_identity())
        values = suggest(trial, self.run.params)
        name = f"trial-{trial.number:05d}"
        params = trial_params(self.run.params, values, name)
        context = RunContext(params=params, dir=self.space.dir, params_path=self.run.params_path)
        scores = []

        def on_epoch(epoch: int, bundle) -> None:
            score = self.space.scorer.score(bundle)
            scores.append(score)
            trial.report(score.mean, epoch)
            trial.set_user_attr("validation_by_field", score.by_field)
            if trial.should_prune():
                raise optuna.TrialPruned(f"epoch {epoch}: validation accuracy {score.mean:.3f} is below the median "
                                         "of earlier trials at this epoch")

        info = distributed.current(context.device())
        try:
            Trainer(context, run_entry(params, name), self.space.inputs, info, None, self.progress,
                    on_epoch=on_epoch)()
        finally:
            shutil.rmtree(self.space.dir / "training" / name, ignore_errors=True)  # the storage keeps the values
        return scores[-1].mean


@dataclass
class SearchResult:
    """What a search call leaves: the study, its folder, the best params file (None before a complete trial)."""

    study: optuna.Study
    dir: Path
    best_params: Path | None
    summary: dict[str, Any]


def run_search(run: RunContext, trials: int | None = None, progress: bool = True) -> SearchResult:
    """Run (or resume) the study until it holds `trials` (default search.trials) finished trials; write
    search.json and best_params.yaml."""
    params = run.params
    target = trials or params.search.trials
    space = prepare_workspace(run, progress)
    study = open_study(params, run.dir)
    recovered = recover_dead_trials(study)
    for number in recovered:  # the dead worker's scratch weights
        shutil.rmtree(space.dir / "training" / f"trial-{number:05d}", ignore_errors=True)
    if recovered:
        logger.warning("trials %s were left RUNNING by a worker that is gone: marked FAIL, their values queued again",
                       recovered)
    done = len(study.get_trials(deepcopy=False, states=FINISHED))
    if done < target:
        stop = optuna.study.MaxTrialsCallback(target, states=FINISHED)  # the total over every worker
        study.optimize(Objective(run, space, progress), n_trials=target - done, callbacks=[stop],
                       gc_after_trial=True)
    best = write_best_params(run, study, space.dir / BEST_PARAMS)
    summary = search_summary(run, study, space)
    write_json(space.dir / SUMMARY, summary)
    return SearchResult(study, space.dir, best, summary)


# ------------------------------------------------------------------------------------------ the outputs
def complete_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


PATH_KEYS = [("data", "coco_captions"), ("data", "coco_images"), ("data", "hierarcaps_csv"),
             ("data", "hierarcaps_images"), ("data", "hierarcaps_train_csv"), ("model", "checkpoint"),
             ("model", "hf_state_dict"), ("llm", "offline_taxonomy"), ("llm", "cache_path")]


def _absolute_inputs(raw: dict, root: Path) -> dict:
    """The input paths of a params mapping made absolute (the file is written far from the params/ folder)."""
    out = deep_merge(raw, {})
    for section, key in PATH_KEYS:
        value = (out.get(section) or {}).get(key)
        if isinstance(value, str) and not Path(value).is_absolute() and value not in SHIPPED_TAXONOMY_NAMES:
            out[section] = {**out[section], key: str(root / value)}
    return out


def write_best_params(run: RunContext, study: optuna.Study, path: Path) -> Path | None:
    """The input params file with the best trial's values merged into `train` (run.name + '-tuned', input paths
    absolute), validated; None while the study has no complete trial."""
    if not complete_trials(study) or run.params_path is None:
        return None
    best = study.best_trial
    raw = load_yaml(read_text(run.params_path)) or {}
    root = params_root(run.params_path)
    # the run folder stays beside the original's (output_dir as the input file meant it, now absolute)
    tuned_run = {"name": f"{run.params.run.name}-tuned", "output_dir": str(run.params.run_dir(root).parent)}
    merged = deep_merge(_absolute_inputs(raw, root), {"train": dict(best.params), "run": tuned_run})
    parse_params(merged, root, check_paths=False)  # the file must load: fail here, not in the user's next run
    header = (f"# {run.params_path.name} with the best values of study '{study.study_name}' (trial {best.number}, "
              f"validation accuracy {best.value:.4f}: mean forced choice on a validation slice of MAGIC train; the "
              "MAGIC test split was never read).\n# Written by `cglib search`; `cglib run` this file to train and "
              "report with these values.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    return path


def search_summary(run: RunContext, study: optuna.Study, space: Workspace) -> dict[str, Any]:
    """search.json: study, storage, trial states, the best trial, the validation split, the ranges and Table 2."""
    params = run.params
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    best = complete_trials(study) and study.best_trial
    validation = {k: v for k, v in space.validation.items() if k != "validation_ids"}
    return {
        "study": study.study_name, "storage": shown_url(storage_url(params, run.dir)), "tuned_run": params.search_run(),
        "objective": params.search.objective,
        "objective_meaning": "mean text->image forced-choice accuracy on the validation split (eval.choices "
                             f"= {params.eval.choices}, eval.seeds = {params.eval.seeds}) over "
                             + ("the concept levels" if params.search.objective == "levels" else "Table 3's columns"),
        "validation": {**validation, "items": space.scorer.n_items, "unscorable_fields": space.scorer.unscorable,
                       "note": "carved from MAGIC train, seeded by run.seed; the MAGIC test split is never read"},
        "trials": {"total": len(trials), **{s: states.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING",
                                                                           "WAITING")}},
        "epochs_per_trial": params.search.epochs or params.train.epochs,
        "space": params.search.space.model_dump(mode="json"),
        "best": None if not best else {"trial": best.number, "value": best.value, "params": best.params,
                                       "by_field": best.user_attrs.get("validation_by_field")},
        "table2": table2_rows(params, study),
        "provenance": provenance(params),
    }


def table2_rows(params: Params, study: optuna.Study) -> list[dict[str, Any]]:
    """Per Table 2 key: the paper's range and value, the range searched here, and the best trial's value."""
    best = complete_trials(study) and study.best_trial
    space = params.search.space
    rows = []
    for key, (paper_range, paper_value) in TABLE2.items():
        bounds = getattr(space, key)
        searched = "not tuned" if bounds is None else f"{bounds.low:g} - {bounds.high:g}" + (
            " (log)" if getattr(bounds, "log", False) else "")
        chosen = best.params.get(key) if best else None
        rows.append({"parameter": key, "paper_range": paper_range, "paper_value": paper_value,
                     "searched_range": searched,
                     "chosen": chosen if chosen is not None else getattr(params.train, key)})
    return rows
