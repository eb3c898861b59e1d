"""Where a run's captions come from (notebook 01): the data source named in params (the synthetic world, COCO
captions, HierarCaps images), or a MAGIC export (`magic.source`), whose images and captions it carries."""

from __future__ import annotations

from cglib.config import Params
from cglib.data.coco import load_coco_captions
from cglib.data.dataset import CaptionDataset
from cglib.data.hierarcaps import load_hierarcaps_dataset
from cglib.data.sources import synthetic_world
from cglib.magic.hf_import import captions_from_export


def load_captions(params: Params) -> tuple[CaptionDataset, dict[str, list[str]] | None]:
    """The dataset of `params.data.source` and its ground-truth chains (synthetic world only, else None); with
    `magic.source` an export, the export's images and captions (see cglib.magic.hf_import)."""
    if params.magic.source != "build":
        return captions_from_export(params)
    d = params.data
    if d.source == "synthetic":
        world = synthetic_world(params, params.run.seed)
        return world.dataset, world.ground_truth
    if d.source == "coco":
        return load_coco_captions(d.coco_captions, d.coco_images, max_images=d.max_images), None
    return load_hierarcaps_dataset(d.hierarcaps_csv, d.hierarcaps_images, max_images=d.max_images,
                                   coco_captions_json=d.coco_captions), None
