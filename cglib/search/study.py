"""Bayesian hyper-parameter search over the paper's Table 2 ranges with Optuna: `cglib search PARAMS --trials N`.

The paper chose M, N, the learning rate, tau and alpha "using a Bayesian hyperparameter search" maximizing the
average accuracy. Here each trial trains the `search.run` entry of train.runs (the real `Trainer`) with values
drawn by Optuna's TPE sampler from `search.space`, on the search view of MAGIC (validation.py: the test images
left out, a validation slice carved from MAGIC train); after every epoch the validation forced-choice accuracy is
reported and Optuna's median pruner may stop the trial (`MedianPruning`, a training callback). The study lives in
`search.storage` (storage.py: SQLite, a journal file or a PostgreSQL server), so a killed search resumes where it
stopped, and several workers (the same command, started again, on this or other machines) share one study.

`--trials N` is the number of finished (complete or pruned) trials the study should hold; a rerun tops it up.
A worker starts a trial while the study's live trials (finished, running, waiting) are fewer than N or a trial
waits to be run again; when the count is reached it waits for the other workers' running trials, since one of
them may die and need its values run again (storage.py finds the dead ones), and exits only when the study holds
N finished trials and nothing RUNNING or WAITING.

Files under <run>/search/<study>/: validation.json (the split), search.json (the study's summary), best_params.yaml
(the input params with the best values merged: a ready params file), and the trials' scratch folders (training/,
cache/; each trial's weights are deleted when it ends, Optuna's storage keeps its values).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.trial import TrialState

from cglib import distributed
from cglib.config import SHIPPED_TAXONOMY_NAMES, IntRange, Params, deep_merge, params_root, parse_params
from cglib.data.dataset import CaptionDataset
from cglib.magic.files import load_magic
from cglib.prepare import TrainInputs, model_image_size
from cglib.prepare.base import base_if_needed
from cglib.prepare.inputs import image_caches, keyword_permuter
from cglib.run import RunContext, output_path, provenance, runner_identity, write_json
from cglib.search.storage import (
    open_storage,
    recover_dead_trials,
    shown_url,
    storage_url,
    study_name,
    workspace,
)
from cglib.search.study_code import check_study_code
from cglib.search.validation import ValidationScore, ValidationScorer, search_view
from cglib.strict_yaml import load_yaml, read_text
from cglib.train.callbacks import Callback, StateView, TrainControl
from cglib.train.inputs import run_entry
from cglib.train.loop import ensure_initial
from cglib.train.trainer import Trainer

logger = logging.getLogger(__name__)

BEST_PARAMS = "best_params.yaml"
SUMMARY = "search.json"
VALIDATION = "validation.json"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
LIVE = (*FINISHED, TrialState.RUNNING, TrialState.WAITING)  # the trials that count towards --trials
# The paper's Table 2: the searched range of each key and the value it reports (arXiv 2024, Sec. 4).
TABLE2 = {"groups_per_batch": ("2 - 10", 2), "pairs_per_group": ("2 - 15", 10), "lr": ("1e-10 - 1e-4", 1e-8),
          "tau": ("0.1 - 1", 0.1), "alpha": ("0 - 1", 0.7)}


# ------------------------------------------------------------------------------------------- the study
def trial_seed(sampler_seed: int, trial_number: int) -> int:
    """The seed of one trial's draws: search.sampler_seed and the trial's number, mixed (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([sampler_seed, trial_number]).generate_state(1)[0])


class TrialSeededTPESampler(optuna.samplers.BaseSampler):
    """Optuna's TPE sampler, its random stream seeded per trial by (search.sampler_seed, trial number).

    Workers started together on one study must not draw the same values: with one seed for every worker, their
    random startup trials were identical draw for draw (two workers ran the same values as trials 0 and 1). The
    storage hands out each trial number once, so no two trials of a study share a stream, whichever worker runs
    them; and the study stays reproducible: trial k draws the same values from the same history for any number
    of workers, and one worker repeats a study exactly. `constant_liar` makes TPE (after the startup trials)
    treat the values of trials still running as bad results, so concurrent workers also spread out there."""

    def __init__(self, sampler_seed: int, n_startup_trials: int) -> None:
        self.sampler_seed, self.n_startup_trials = sampler_seed, n_startup_trials
        self._number: int | None = None
        self._tpe: optuna.samplers.TPESampler | None = None

    def _for(self, trial: optuna.trial.FrozenTrial) -> optuna.samplers.TPESampler:
        """The TPE sampler of this trial (TPE keeps no state between trials but its random stream)."""
        if self._tpe is None or trial.number != self._number:
            self._number = trial.number
            self._tpe = optuna.samplers.TPESampler(seed=trial_seed(self.sampler_seed, trial.number),
                                                   n_startup_trials=self.n_startup_trials, constant_liar=True)
        return self._tpe

    def infer_relative_search_space(self, study, trial):
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self._for(trial).after_trial(study, trial, state, values)


def open_study(params: Params, run_dir: Path) -> optuna.Study:
    """The study of these params (created, or loaded to resume): maximize, TPE sampler seeded per trial, median
    pruner."""
    s = params.search
    sampler = TrialSeededTPESampler(s.sampler_seed, s.startup_trials)
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


# --------------------------------------------------------------------------------------- the workspace
@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One process at a time prepares the shared workspace (several workers may start together)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(output_path(folder / ".lock"), "w") as handle:
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
    `ensure_initial` when the run has none yet, on the base corpus prepared for it), the image cache of the search view (no test image) and
    validation.json; shared by every worker of the study."""
    params = run.params
    folder = workspace(params, run.dir)
    magic_path = run.require("magic/magic.json", "03_magic_dag")
    dataset = CaptionDataset.load(run.require("captions/dataset.json", "01_captions").parent)
    view, validation = search_view(load_magic(magic_path), params.search.validation_fraction, params.run.seed,
                                   params.search.groups)
    space = RunContext(params=params, dir=folder, params_path=run.params_path)
    with _locked(folder):
        base = base_if_needed(run, model_image_size(params), progress)  # None after notebook 05: its base is current
        initial = ensure_initial(run, progress=progress, base=base)
        for source in (initial, initial.with_suffix(".json")):
            target = space.stage("training") / source.name
            if not target.is_file() or target.read_bytes() != source.read_bytes():
                shutil.copyfile(source, target.with_suffix(".tmp"))
                target.with_suffix(".tmp").replace(target)
        cache, crops = image_caches(space, view.images, dataset, model_image_size(params), progress)
        write_json(folder / VALIDATION, validation)
    digest = hashlib.sha1(view.model_dump_json().encode())
    digest.update(cache.directory.name.encode())
    if crops is not None:
        digest.update(crops.directory.name.encode())
    inputs = TrainInputs(view, cache, digest.hexdigest()[:16], crops=crops,
                         permuter=keyword_permuter(params, [run_entry(params, params.search_run())]))
    scorer = ValidationScorer(params, view, cache.get(view.split_ids("test")), view.split_ids("test"))
    return Workspace(folder, view, validation, inputs, scorer)


# ------------------------------------------------------------------------------------------- the search
class SurplusTrial(Exception):
    """A new trial beyond --trials: another worker started one at the same moment (the count check and the trial's
    creation are two steps); it is failed before training, never trained."""


def surplus(trial: optuna.Trial, target: int) -> bool:
    """Whether a new trial is one too many: `target` live trials (finished, running, waiting) have lower numbers.
    Trial numbers are handed out in order by the storage, so of two racing workers the later trial yields. A retry
    (`retry_of`) never yields: it replaces a failed trial and its values must run."""
    if "retry_of" in trial.user_attrs:
        return False
    live = trial.study.get_trials(deepcopy=False, states=LIVE)
    return sum(t.number < trial.number for t in live) >= target


VALIDATION_METRIC = "validation"  # the metric the trainer's scorer returns: the validation split's ValidationScore


class MedianPruning(Callback):
    """Reports each image-text epoch's validation accuracy to the trial and stops the run when Optuna's pruner
    says the trial falls behind (below the median of earlier trials at this epoch); the trial is then marked
    pruned (`pruned`: why)."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.scores: list[ValidationScore] = []
        self.pruned = ""

    def on_evaluate(self, state: StateView, control: TrainControl, metrics: Mapping[str, Any]) -> None:
        score, epoch = metrics[VALIDATION_METRIC], state.epoch
        self.scores.append(score)
        self.trial.report(score.mean, epoch)
        self.trial.set_user_attr("validation_by_field", score.by_field)
        logger.info("trial %d epoch %d: validation accuracy %.4f", self.trial.number, epoch, score.mean)
        if self.trial.should_prune():
            self.pruned = (f"epoch {epoch}: validation accuracy {score.mean:.3f} is below the median of earlier "
                           "trials at this epoch")
            control.stop(f"pruned by the search ({self.pruned})")


class Objective:
    """One trial: train the tuned run with the trial's values, report validation accuracy each epoch (pruning)."""

    def __init__(self, run: RunContext, space: Workspace, progress: bool, target: int) -> None:
        self.run, self.space, self.progress, self.target = run, space, progress, target

    def __call__(self, trial: optuna.Trial) -> float:
        if surplus(trial, self.target):
            trial.set_user_attr("surplus", True)
            raise SurplusTrial(f"the study already holds {self.target} trials; another worker started one at the "
                               "same moment, so this one is not trained")
        trial.set_user_attr("worker", runner_identity())
        retry = trial.user_attrs.get("retry_of")
        logger.info("trial %d started (pid %d)%s", trial.number, runner_identity()["pid"],
                    "" if retry is None else f", a retry of trial {retry}")
        values = suggest(trial, self.run.params)
        name = f"trial-{trial.number:05d}"
        params = trial_params(self.run.params, values, name)
        context = RunContext(params=params, dir=self.space.dir, params_path=self.run.params_path)
        pruning = MedianPruning(trial)
        info = distributed.current(context.device())
        try:
            Trainer(context, run_entry(params, name), self.space.inputs, info, None, self.progress,
                    callbacks=[pruning], evaluate=lambda bundle: {VALIDATION_METRIC: self.space.scorer.score(bundle)})()
        finally:
            shutil.rmtree(self.space.dir / "training" / name, ignore_errors=True)  # the storage keeps the values
        if pruning.pruned:
            raise optuna.TrialPruned(pruning.pruned)
        return pruning.scores[-1].mean


@dataclass
class SearchResult:
    """What a search call leaves: the study, its folder, the best params file (None before a complete trial)."""

    study: optuna.Study
    dir: Path
    best_params: Path | None
    summary: dict[str, Any]


def run_search(run: RunContext, trials: int | None = None, progress: bool = True) -> SearchResult:
    """Run (or resume, or join) the study until it holds `trials` (default search.trials) finished trials and
    nothing RUNNING or WAITING (see the module docstring); write search.json and best_params.yaml."""
    params = run.params
    target = trials or params.search.trials
    study = open_study(params, run.dir)  # first: a storage that cannot open fails before any work
    check_study_code(study, params)
    space = prepare_workspace(run, progress)
    objective = Objective(run, space, progress, target)
    waiting_for: list[int] = []
    while True:
        recover_dead_trials(study, space.dir)
        trials_now = study.get_trials(deepcopy=False)
        states = Counter(t.state for t in trials_now)
        if states[TrialState.WAITING] or sum(states[s] for s in LIVE) < target:
            study.optimize(objective, n_trials=1, gc_after_trial=True, catch=(SurplusTrial,))
            continue
        running = [t.number for t in trials_now if t.state == TrialState.RUNNING]
        if not running:
            break
        if running != waiting_for:  # one line per change, not per poll
            logger.info("waiting for trials %s of other workers: if one's worker dies, its values run here", running)
            waiting_for = running
        # a dead worker on this host is seen at the next poll, one elsewhere after its heartbeat's grace (2 x
        # search.heartbeat_s, database storages)
        time.sleep(min(5, params.search.heartbeat_s))
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
    output_path(path).write_text(header + yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
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
                                                                           "WAITING")},
                   "retried": sorted(t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs),
                   "surplus": sorted(t.number for t in trials if t.user_attrs.get("surplus"))},
        "account": trial_account(trials),
        "epochs_per_trial": params.search.epochs or params.train.epochs,
        "space": params.search.space.model_dump(mode="json"),
        "best": None if not best else {"trial": best.number, "value": best.value, "params": best.params,
                                       "by_field": best.user_attrs.get("validation_by_field")},
        "table2": table2_rows(params, study),
        "provenance": provenance(params),
    }


def trial_account(trials: list[optuna.trial.FrozenTrial]) -> dict[str, Any]:
    """The study's account, read from its database: every trial in one place (finished: complete or pruned; failed
    by reason; left running; waiting to run), each failure by why, and the dead workers' trials re-queued (their
    values queued again as a new trial). `adds_up` checks the places against the trials stored."""
    requeued = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    place: Counter = Counter()
    failed: Counter = Counter()
    for t in trials:
        if t.state in FINISHED:
            place[t.state.name.lower()] += 1
        elif t.state == TrialState.FAIL:
            place["failed"] += 1
            failed["worker died (values re-queued)" if t.number in requeued else
                   "surplus (another worker started it at the same moment; never trained)"
                   if t.user_attrs.get("surplus") else "error in training (see the worker's log)"] += 1
        else:  # RUNNING or WAITING
            place[t.state.name.lower()] += 1
    counted = sum(place[k] for k in ("complete", "pruned", "failed", "running", "waiting"))
    return {"trials": len(trials), "finished": place["complete"] + place["pruned"], "complete": place["complete"],
            "pruned": place["pruned"], "failed": place["failed"], "failed_by_reason": dict(sorted(failed.items())),
            "requeued": len(requeued), "left_running": place["running"], "waiting": place["waiting"],
            "adds_up": counted == len(trials) and sum(failed.values()) == place["failed"]}


def account_line(account: dict[str, Any]) -> str:
    """The study's account on one line (`cglib search`, `cglib status`)."""
    failed = ", ".join(f"{k}: {v}" for k, v in account["failed_by_reason"].items())
    return (f"{account['trials']} trials = {account['complete']} complete + {account['pruned']} pruned + "
            f"{account['failed']} failed" + (f" ({failed})" if failed else "")
            + f" + {account['left_running']} left running + {account['waiting']} waiting"
            + ("" if account["adds_up"] else " (DOES NOT ADD UP)") + f"; {account['requeued']} re-queued")


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
