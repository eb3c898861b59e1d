"""The run entries of a params file: which run is which, what determines its result (its spec), what it may not do
under torchrun, and what it was exposed to. The data they read is prepared below training (cglib.prepare)."""

from __future__ import annotations

import uuid
from typing import Any

from cglib.code_identity import CodeDigest, class_digest
from cglib.config import Params, TrainRunParams
from cglib.prepare.inputs import TrainInputs, model_image_size
from cglib.run import file_digest
from cglib.train.callbacks import load_callback
from cglib.train.released import released_file

__all__ = [
    "TrainInputs",
    "code_digests",
    "distributed_refusal",
    "exposure",
    "model_image_size",
    "related_methods",
    "run_entry",
    "run_spec",
    "text_source",
    "torchrun_refusals",
]


def run_entry(params: Params, name: str) -> TrainRunParams:
    """The train.runs entry called `name` (ValueError listing the names otherwise)."""
    for entry in params.train.runs:
        if entry.name == name:
            return entry
    raise ValueError(f"no run named {name!r} in train.runs; choose one of {[r.name for r in params.train.runs]}")


# Per-run keys added after runs were first trained: at their default they leave the spec (and so the cached
# weights of earlier runs) unchanged.
RUN_KEY_DEFAULTS: dict[str, Any] = {"init": None, "text_source": None, "groups": "magic", "options": {}}
TRAIN_KEY_DEFAULTS: dict[str, Any] = {"mask_identical_texts": True, "pretrain_features": "normalized",
                                      "augment": "none"}  # train keys added after runs were trained
OPTION_KEY_DEFAULTS: dict[str, Any] = {"hierarcaps_features": "normalized"}  # objective options added likewise


def run_spec(params: Params, entry: TrainRunParams, training_seed: int = 0) -> dict[str, Any]:
    """Everything that determines a run's result: the run entry with its effective tau and options, train, model,
    seed.

    An objective's own options (`train.runs[i].options`, with what they leave unset filled from the params by
    `Objective.resolve_options`, e.g. a group loss's alpha from train.alpha) are part of its entry; the files it reads
    (`Objective.input_files`, e.g. re's HierarCaps train hierarchies) enter by content; a run with `init` carries
    its starting run's spec, so retraining that run retrains this one. Run keys at their default leave the spec
    (RUN_KEY_DEFAULTS, and the train keys of TRAIN_KEY_DEFAULTS and options of OPTION_KEY_DEFAULTS): trained runs
    stay valid when a key is added. `train.seeds` is not in
    the spec (adding a seed does not retrain the others); training seed k > 0 is (`training_seed`).
    """
    t = params.train
    objective = entry.objective()
    spec = entry.model_dump(mode="json")
    spec["options"] = objective.resolve_options(entry.options, params).model_dump(mode="json")
    for key, default in OPTION_KEY_DEFAULTS.items():
        if spec["options"].get(key, default) == default:
            spec["options"].pop(key, None)
    for key, default in RUN_KEY_DEFAULTS.items():
        if spec[key] == default:
            del spec[key]
    spec["tau"] = entry.tau or t.tau
    # pretrain_targets acts through the entries' resolved `pretrain` (in the run spec above)
    # how a run is carried out (resumed, loaded, logged, on how many processes) leaves its result unchanged
    exclude = {"runs", "resume", "num_workers", "log_every", "keep_epoch_weights", "seeds", "pretrain_targets",
               "processes", "callbacks"}
    train = t.model_dump(mode="json", exclude=exclude)
    for key, default in TRAIN_KEY_DEFAULTS.items():
        if train[key] == default:
            del train[key]
    out = {"run": spec, "train": train, "model": params.model.model_dump(mode="json"), "seed": params.run.seed}
    files = objective.input_files(params, entry)
    if files:  # a file's content is part of the result (a changed HierarCaps train file retrains the row)
        out["input_files"] = {key: file_digest(path, "sha1") if path and path.is_file() else None
                              for key, path in files}
    released = released_file(entry)
    if released is not None:  # the file appearing (or changing) replaces the trained row
        out["released_file"] = file_digest(released, "sha1") if released.is_file() else None
    code = code_digests(params, entry)
    if code:  # outside code that shapes the weights: an edit retrains, unreadable code never reuses
        # an unreadable class's digest is new on every call: no finished run and no checkpoint ever matches it
        out["code"] = {key: digest.spec_value() if digest.digest else
                       {**digest.spec_value(), "sha1": f"unreadable-{uuid.uuid4().hex}"} for key, digest in code.items()}
    if training_seed:
        out["training_seed"] = training_seed
    if entry.init is not None:
        out["init"] = run_spec(params, run_entry(params, entry.init), training_seed)
    return out


def code_digests(params: Params, entry: TrainRunParams) -> dict[str, CodeDigest]:
    """The code from outside the library that shapes run `entry`'s weights, by spec key: its objective when a
    params file names it as package.module:ClassName (`loss`), and each train.callbacks entry that may stop
    training (`callbacks[i]`; a callback with `changes_result = False` only observes and is left out)."""
    out = {}
    if ":" in entry.loss:
        out["loss"] = class_digest(entry.loss, entry.objective())
    for index, path in enumerate(params.train.callbacks):
        callback = load_callback(path)
        if callback.changes_result:
            out[f"callbacks[{index}]"] = class_digest(path, callback)
    return out


def distributed_refusal(params: Params, entry: TrainRunParams) -> str | None:
    """Why run `entry` cannot train under torchrun (None: it can): its objective's own declaration
    (`Objective.distributed_refusal`), or a text phase on the projection alone (its steps bypass DDP)."""
    objective = entry.objective()
    if objective.distributed_refusal:
        return f"loss {entry.loss}: {objective.distributed_refusal}"
    if entry.pretrain != "none" and params.train.text_trains == "projection":
        return "its textual pretraining trains the text projection alone (train.text_trains: projection), " \
               "whose steps bypass DDP"
    return None


def torchrun_refusals(params: Params, name: str) -> dict[str, str]:
    """Why run `name`, or a run of its init chain (trained first when needed), cannot train under torchrun: {run:
    why}; empty when all can."""
    entry = run_entry(params, name)
    refusal = distributed_refusal(params, entry)
    chain = torchrun_refusals(params, entry.init) if entry.init is not None else {}
    return {**chain, **({name: refusal} if refusal else {})}


def text_source(params: Params, entry: TrainRunParams) -> str:
    """The run's text side of training pairs: its own text_source, else train.text_source."""
    return entry.text_source or params.train.text_source


NGRAM_GROUPS = "n-gram concept groups (C3)"


def related_methods(entry: TrainRunParams) -> list[str]:
    """The related methods (book/stages/06_related_methods.md) a run trains with; empty for the paper's own rows
    (CLIP, pairwise, centroid, RE). Such runs are rows of every table but enter none of the paper's gain rows."""
    objective = entry.objective()
    # your own objective (loss: package.module:Class) is a row of every table, like a related method, never one
    # of the paper's gain sets
    related = objective.related or (f"your own objective ({entry.loss})" if ":" in entry.loss else None)
    return ([related] if related else []) + ([NGRAM_GROUPS] if entry.groups == "ngram" else [])


def exposure(params: Params, entry: TrainRunParams) -> list[str]:
    """Why a run has seen strings that evaluation uses as queries (empty: it has not); inherited through `init`."""
    reasons = []
    if entry.pretrain == "with_concepts":
        reasons.append("textual pretraining with the l1-l4 concept names (pretrain: with_concepts)")
    reasons += entry.objective().exposure(params, entry)
    if entry.init is not None:
        reasons += [f"from {entry.init}: {r}" for r in exposure(params, run_entry(params, entry.init))]
    return reasons
