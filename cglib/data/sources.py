"""Pick the captions source named in params: the synthetic world, COCO captions, or HierarCaps images."""

from __future__ import annotations

from cglib.config import Params
from cglib.data.dataset import CaptionDataset


def synthetic_world(params: Params, seed: int, images_per_concept: int | None = None):
    """The synthetic world of `data.synthetic` rendered from `seed` (MAGIC's: run.seed; the base's: another)."""
    from cglib.data.synthetic import make_world

    s = params.data.synthetic
    return make_world(images_per_concept=images_per_concept or s.images_per_concept, seed=seed,
                      image_size=s.image_size, captions_per_image=s.captions_per_image, min_objects=s.min_objects,
                      max_objects=s.max_objects, levels=params.magic.l_max)


def load_captions(params: Params) -> tuple[CaptionDataset, dict[str, list[str]] | None]:
    """The dataset of `params.data.source` and its ground-truth chains (synthetic world only, else None); with
    `magic.source` an export, the export's images and captions (see cglib.magic.hf_import)."""
    if params.magic.source != "build":
        from cglib.magic.hf_import import captions_from_export

        return captions_from_export(params)
    d = params.data
    if d.source == "synthetic":
        world = synthetic_world(params, params.run.seed)
        return world.dataset, world.ground_truth
    if d.source == "coco":
        from cglib.data.coco import load_coco_captions

        return load_coco_captions(d.coco_captions, d.coco_images, max_images=d.max_images), None
    from cglib.data.hierarcaps import load_hierarcaps_dataset

    return load_hierarcaps_dataset(d.hierarcaps_csv, d.hierarcaps_images, max_images=d.max_images,
                                   coco_captions_json=d.coco_captions), None
