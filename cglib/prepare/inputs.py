"""What every run of a params file reads: magic.json (or its n-gram groups) and the image cache of its images."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field

from cglib import distributed
from cglib.config import Params, TrainRunParams
from cglib.data.crop_cache import CropCache, build_crop_cache, open_crop_cache
from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import ImageCache, magic_image_cache
from cglib.data.permute import KeywordPermuter, permuter_for
from cglib.distributed import DistInfo
from cglib.hf_clip import image_size
from cglib.magic.files import content_digest, load_magic
from cglib.magic.ngram import build_ngram_groups, ngram_path
from cglib.magic.schema import MagicFile
from cglib.models import CGLIB_CONFIGS, DEMO_VISION, TINY_VISION
from cglib.prepare.re_items import REItems
from cglib.run import RunContext


@dataclass
class TrainInputs:
    """What every run of a params file reads: the MAGIC file and the image cache of its images; for the `loss: re`
    runs that train on them, their RE items by options.data (prepare_inputs fills them)."""

    magic: MagicFile
    cache: ImageCache
    fingerprint: str  # hash of the groups' content and the cache key: a checkpoint of other data is not resumed
    groups: str = "magic"  # which groups `magic` holds: the run's MAGIC, or its n-gram groups (magic/ngram.json)
    re_items: dict[str, REItems] = field(default_factory=dict)
    permuter: KeywordPermuter | None = None  # the captions' keyword relations, for objectives that permute keywords
    crops: CropCache | None = None  # the images kept for random resized crops (train.augment), else None

    def re_items_for(self, data: str) -> REItems:
        """The RE items of options.data `data`; ValueError naming the fix when they were not prepared."""
        if data not in self.re_items:
            raise ValueError(f"the RE items of options.data: {data} were not prepared with these inputs; prepare "
                             "the run's inputs with cglib.prepare.prepare_inputs(run, names=[...the re run...])")
        return self.re_items[data]

    def keyword_permuter(self) -> KeywordPermuter:
        """The captions' keyword relations; ValueError naming the fix when they were not prepared."""
        if self.permuter is None:
            raise ValueError("the keyword relations were not prepared with these inputs; prepare the run's inputs "
                             "with cglib.prepare.prepare_inputs(run, names=[...the run...])")
        return self.permuter


def keyword_permuter(params: Params, entries: list[TrainRunParams]) -> KeywordPermuter | None:
    """The keyword relations of the run's captions when one of `entries` permutes keywords (clip_hn), else None."""
    if any(entry.objective().permutes_keywords for entry in entries):
        return permuter_for(params)
    return None


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


def image_caches(run: RunContext, images: Collection[str], dataset: CaptionDataset, image_size: int,
                 progress: bool = True, info: DistInfo | None = None) -> tuple[ImageCache, CropCache | None]:
    """The image cache of `images` at `image_size`, and their crop cache when the params augment (train.augment)."""
    cache = magic_image_cache(run, images, dataset, image_size, progress, info)
    if run.params.train.augment == "none":
        return cache, None
    return cache, magic_image_cache(run, images, dataset, image_size, progress, info, build_crop_cache,
                                    open_crop_cache)


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
    cache, crops = image_caches(run, magic.images, CaptionDataset.load(dataset_dir), image_size, progress, info)
    # the DAG's content, not the file's bytes: a rebuild of the same MAGIC (its timing and cache counts differ)
    # leaves every trained run valid
    digest = hashlib.sha1(f"magic:{content_digest(magic)}".encode())
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
    if crops is not None:
        digest.update(crops.directory.name.encode())
    return TrainInputs(magic, cache, digest.hexdigest()[:16], groups, crops=crops)
