"""The synthetic world of params (MAGIC's and the base's); which source a run reads is `cglib.magic.sources`."""

from __future__ import annotations

from cglib.config import Params
from cglib.data.synthetic import make_world


def synthetic_world(params: Params, seed: int, images_per_concept: int | None = None):
    """The synthetic world of `data.synthetic` rendered from `seed` (MAGIC's: run.seed; the base's: another)."""
    s = params.data.synthetic
    return make_world(images_per_concept=images_per_concept or s.images_per_concept, seed=seed,
                      image_size=s.image_size, captions_per_image=s.captions_per_image, min_objects=s.min_objects,
                      max_objects=s.max_objects, levels=params.magic.l_max)
