"""Train/test splits of the MAGIC groups, seeded by `run.seed`.

image    (paper) within each l1 node, round(n * test_fraction) images go to test (round half up), but a node
         with >= 2 images always keeps >= 1 train image, and a node with 1 image is train only. Each node is
         shuffled by its own generator seeded from (seed, node id), so one node's split does not depend on
         which other nodes exist.
concept  whole l1 concepts are held out: round(n_nodes * test_fraction) nodes (at least 1, at most n - 1 when
         there are >= 2 nodes) are test, with every image; the others are train. Test concepts are never seen
         in training, a stricter test of whether abstraction emerges. Their ancestors at l2+ are shared with
         training concepts, which is the point: can an unseen l1 concept be placed under known l2+ concepts?
"""

from __future__ import annotations

import math
from typing import Literal

from cglib.run import keyed_rng


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def n_test_images(n: int, test_fraction: float) -> int:
    """Test images of a node of n images: round-half-up share, keeping >= 1 train image when n >= 2."""
    if n <= 1:
        return 0
    return min(_round_half_up(n * test_fraction), n - 1)


def split_images(groups: dict[str, list[str]], kind: Literal["image", "concept"], test_fraction: float, seed: int,
                 salt: str = "") -> dict[str, Literal["train", "test"]]:
    """Image id -> "train"/"test" for `groups` (l1 node id -> image ids).

    `salt` prefixes every generator key, so a second split of the same groups (the search's validation slice of
    MAGIC train) draws from streams of its own; "" is the MAGIC train/test split."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    split: dict[str, Literal["train", "test"]] = {}
    if kind == "image":
        for node in sorted(groups):
            images = sorted(groups[node])
            order = keyed_rng(seed, salt + node).permutation(len(images))
            n_test = n_test_images(len(images), test_fraction)
            for rank, i in enumerate(order):
                split[images[i]] = "test" if rank < n_test else "train"
        return split
    if kind == "concept":
        nodes = sorted(groups)
        order = keyed_rng(seed, salt + "concept-split").permutation(len(nodes))
        n_test = 0 if len(nodes) < 2 else min(max(1, _round_half_up(len(nodes) * test_fraction)), len(nodes) - 1)
        test_nodes = {nodes[i] for i in order[:n_test]}
        for node in nodes:
            for image_id in groups[node]:
                split[image_id] = "test" if node in test_nodes else "train"
        return split
    raise ValueError(f"unknown split kind {kind!r}; use magic.split: image or concept")
