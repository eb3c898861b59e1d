"""What every run of a params file reads: magic.json, the image cache of its images, and the run entries."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cglib import distributed
from cglib.config import Params, TrainRunParams
from cglib.data.dataset import CaptionDataset
from cglib.data.download import file_digest
from cglib.data.image_cache import ImageCache, magic_image_cache
from cglib.distributed import DistInfo
from cglib.hf_clip import image_size
from cglib.magic.files import load_magic
from cglib.magic.ngram import build_ngram_groups, content_digest, ngram_path
from cglib.magic.schema import MagicFile
from cglib.models import CGLIB_CONFIGS, DEMO_VISION, TINY_VISION
from cglib.run import RunContext
from cglib.train.released import released_file


@dataclass
class TrainInputs:
    """What every run of a params file reads: the MAGIC file and the image cache of its images."""

    magic: MagicFile
    cache: ImageCache
    fingerprint: str  # hash of magic.json and the cache key: a checkpoint of other data is not resumed
    groups: str = "magic"  # which groups `magic` holds: the run's MAGIC, or its n-gram groups (magic/ngram.json)


def model_image_size(params: Params) -> int:
    """The input size of params.model (the training image cache is built at it)."""
    if params.model.image_size is not None:
        return params.model.image_size
    if params.model.source == "hf":
        return image_size(params.model.name)
    name = params.model.name
    if name in CGLIB_CONFIGS:
        return (DEMO_VISION if name == "cglib-demo-vit" else TINY_VISION)["image_size"]
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise ValueError(f"model.name '{name}' is not an open_clip architecture (see open_clip.list_models())")
    size = config["vision_cfg"]["image_size"]
    return int(size[0] if isinstance(size, list | tuple) else size)


def load_inputs(run: RunContext, image_size: int | None = None, progress: bool = True,
                info: DistInfo | None = None, groups: str = "magic") -> TrainInputs:
    """magic.json, and the image cache of its images at `image_size` (default: the model's input size).

    groups "ngram": the run's n-gram groups instead (magic/ngram.json, built by rank 0 when absent or out of
    date, cglib.magic.ngram.build_ngram_groups) over the same image cache; the fingerprint hashes their content.
    """
    image_size = image_size or model_image_size(run.params)
    magic_path = run.require("magic/magic.json", "03_magic_dag")
    dataset_dir = run.require("captions/dataset.json", "01_captions").parent
    magic = load_magic(magic_path)
    cache = magic_image_cache(run, magic.images, CaptionDataset.load(dataset_dir), image_size, progress, info)
    digest = hashlib.sha1(magic_path.read_bytes())
    if groups == "ngram":
        info = info or DistInfo()
        if info.is_main:
            build_ngram_groups(run)
        distributed.barrier(info)
        magic = load_magic(ngram_path(run))
        digest = hashlib.sha1(f"ngram:{content_digest(magic)}".encode())
    elif groups != "magic":
        raise ValueError(f"unknown groups {groups!r}; use magic or ngram")
    digest.update(cache.directory.name.encode())
    return TrainInputs(magic, cache, digest.hexdigest()[:16], groups)


def inputs_for(run: RunContext, entry: TrainRunParams, inputs: TrainInputs | None, progress: bool = True,
               info: DistInfo | None = None) -> TrainInputs:
    """`inputs` when they hold the groups the run entry trains on (train.runs[i].groups), else those loaded."""
    if inputs is not None and inputs.groups == entry.groups:
        return inputs
    return load_inputs(run, progress=progress, info=info, groups=entry.groups)


def run_entry(params: Params, name: str) -> TrainRunParams:
    """The train.runs entry called `name` (ValueError listing the names otherwise)."""
    for entry in params.train.runs:
        if entry.name == name:
            return entry
    raise ValueError(f"no run named {name!r} in train.runs; choose one of {[r.name for r in params.train.runs]}")


# Per-run keys added after runs were first trained: at their default they leave the spec (and so the cached
# weights of earlier runs) unchanged.
RUN_KEY_DEFAULTS: dict[str, Any] = {"init": None, "text_source": None, "groups": "magic", "options": {}}
TRAIN_KEY_DEFAULTS: dict[str, Any] = {"mask_identical_texts": True}  # train keys added after runs were trained
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
    if training_seed:
        out["training_seed"] = training_seed
    if entry.init is not None:
        out["init"] = run_spec(params, run_entry(params, entry.init), training_seed)
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
    """The related methods (issue #21) a run trains with; empty for the paper's own rows (CLIP, pairwise, centroid,
    RE). Such runs are rows of every table but enter none of the paper's gain rows."""
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
