"""The base corpus of the offline profiles (`train.base.corpus`), prepared when the initial weights must still be
trained: the dataset the base trains on, the record of what it holds, and its image cache.

    synthetic     scenes rendered from another seed of the synthetic world (run.seed + train.base.seed_offset):
                  the same taxonomy and templates, none of MAGIC's images
    magic_train   the MAGIC-train images with their original captions: never a test image, never a concept name

Whether the initial weights must be trained is decided by their spec (`initial_spec`): the model, the seed and,
with a base corpus, how the base trains and on which data. `training/initial.json` keeps the spec they were
trained for; training (cglib.train.loop.ensure_initial) trains them again when it differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import ImageCache, build_image_cache, image_cache_dir
from cglib.data.sources import synthetic_world
from cglib.data.synthetic import leaked_concept_names
from cglib.magic.files import content_digest, load_magic
from cglib.run import RunContext, file_digest

INITIAL = "initial.safetensors"  # training/initial.safetensors (+ initial.json): the weights every run starts from


@dataclass(frozen=True)
class BaseCorpus:
    """The base corpus: its (image, captions) dataset, the record of what it holds, and its image cache."""

    dataset: CaptionDataset
    record: dict[str, Any]
    cache: ImageCache


def base_corpus(run: RunContext) -> tuple[CaptionDataset, dict[str, Any]]:
    """The base corpus of `train.base.corpus` and a record of what it holds (which images, which texts)."""
    params = run.params
    base = params.train.base
    if base.corpus == "synthetic":
        seed = params.run.seed + base.seed_offset
        world = synthetic_world(params, seed, base.images_per_concept)
        texts = [c for i in world.dataset.image_ids for c in world.dataset.captions[i]]
        leaked = sum(leaked_concept_names(texts, world.taxonomy).values())
        return world.dataset, {"corpus": "synthetic", "world_seed": seed, "texts": "original captions",
                               "captions_naming_a_concept": leaked}
    if base.corpus == "magic_train":
        magic = load_magic(run.require("magic/magic.json", "03_magic_dag"))
        dataset = CaptionDataset.load(run.require("captions/dataset.json", "01_captions").parent)
        subset = dataset.subset([i for i in dataset.image_ids if i in magic.images and
                                 magic.images[i].split == "train"])
        held_out = sum(1 for record in magic.images.values() if record.split == "test")
        return subset, {"corpus": "magic_train", "texts": "original captions", "test_images_left_out": held_out}
    raise ValueError(f"train.base.corpus is {base.corpus!r}: there is no base corpus to train on")


def prepare_base(run: RunContext, image_size: int, progress: bool = True) -> BaseCorpus:
    """The base corpus with its image cache at `image_size` (the model's input size), built when absent."""
    dataset, record = base_corpus(run)
    cache = build_image_cache(dataset, image_size, image_cache_dir(run), progress=progress)
    return BaseCorpus(dataset, record, cache)


def initial_spec(run: RunContext) -> dict[str, Any]:
    """What determines the initial weights: the model, the seed and, with a base corpus, how the base trains."""
    p = run.params
    spec: dict[str, Any] = {"model": p.model.model_dump(mode="json"), "seed": p.run.seed}
    if run.training_seed:
        spec["training_seed"] = run.training_seed
    if p.train.base.corpus != "none":
        spec["base"] = p.train.base.model_dump(mode="json")
        spec["base_train"] = {"tau": p.train.tau, "weight_decay": p.train.weight_decay,
                              "grad_clip": p.train.grad_clip, "amp": p.train.amp}
        if p.train.base.corpus == "synthetic":
            spec["world"] = {**p.data.synthetic.model_dump(mode="json"), "levels": p.magic.l_max}
        else:  # the MAGIC-train images: another DAG or new captions make another base (a rebuild of the same does not)
            spec["data"] = [content_digest(load_magic(run.require("magic/magic.json", "03_magic_dag"))),
                            file_digest(run.require("captions/dataset.json", "01_captions"), "sha1")]
    return spec


def initial_is_current(run: RunContext) -> bool:
    """True when `training/initial.safetensors` of the run's training seed was saved for `initial_spec(run)`."""
    path = run.training_dir / INITIAL
    meta_path = path.with_suffix(".json")
    if not (meta_path.is_file() and path.is_file()):
        return False
    return json.loads(meta_path.read_text(encoding="utf-8")).get("spec") == initial_spec(run)


def base_if_needed(run: RunContext, image_size: int, progress: bool = True) -> BaseCorpus | None:
    """The base corpus (with its cache at `image_size`) when the initial weights of the run's training seed must
    still be trained on one; None when there is no base corpus or they are current."""
    if run.params.train.base.corpus == "none" or initial_is_current(run):
        return None
    return prepare_base(run, image_size, progress)
