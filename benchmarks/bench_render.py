"""Rendering speed of the synthetic world: 2,000 images at 64 px on one core, against a copy-only floor.

Prints seconds and images/s for: the floor (copying the cached backgrounds, the least any renderer must do),
scene sampling, drawing (cold: icon sprites rasterised on first use; warm: cached), captioning, and the whole
`make_world` at the demo scale. Target (issue 4): 2,000 images well under 10 s.

    python benchmarks/bench_render.py [--images 2000] [--size 64]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says

import numpy as np

from cglib.data import render
from cglib.data.synthetic import make_world, sample_scene, scene_pools, write_captions
from cglib.data.taxonomy import load_taxonomy


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    n, size = args.images, args.size
    taxonomy = load_taxonomy()
    pools = {l1: scene_pools(taxonomy, l1) for l1 in taxonomy.l1}
    concepts = [taxonomy.l1[i % len(taxonomy.l1)] for i in range(n)]
    rngs = [np.random.default_rng([0, i]) for i in range(n)]

    t_sample, scenes = _timed(lambda: [sample_scene(taxonomy, c, r, size, 2, 5, pools[c]) for c, r in zip(concepts, rngs)])
    out = np.empty((n, size, size, 3), dtype=np.uint8)

    def floor() -> None:
        for i, s in enumerate(scenes):
            out[i] = render.background(s.setting, size)

    def draw() -> None:
        for i, s in enumerate(scenes):
            out[i] = render.render_scene(s.setting, s.placements, size, s.brightness)

    render.icon_sprite.cache_clear()
    render.background.cache_clear()
    t_cold, _ = _timed(draw)
    t_floor, _ = _timed(floor)
    t_warm, _ = _timed(draw)
    t_caption, _ = _timed(lambda: [write_captions(s, np.random.default_rng(i), 5) for i, s in enumerate(scenes)])
    per_concept = int(np.ceil(n / len(taxonomy.l1)))
    t_world, world = _timed(lambda: make_world(per_concept, seed=0, image_size=size))

    print(f"synthetic world rendering, {n} images at {size}px, one core")
    rows = [("floor: copy cached backgrounds", t_floor, n), ("sample scenes", t_sample, n),
            ("draw, cold (rasterise sprites)", t_cold, n), ("draw, warm (cached sprites)", t_warm, n),
            ("captions (5 per image)", t_caption, n), (f"make_world({per_concept}/concept), all steps", t_world,
                                                       len(world.dataset))]
    for name, seconds, count in rows:
        print(f"  {name:42s} {seconds:7.3f} s  {count / seconds:9.0f} images/s  {seconds / t_floor:7.1f}x floor")
    total = t_sample + t_cold + t_caption
    print(f"  sample + cold draw + captions for {n} images: {total:.2f} s (target: well under 10 s; "
          f"{10 / total:.0f}x margin)")


if __name__ == "__main__":
    main()
