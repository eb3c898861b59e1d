"""Training items of the Radial Embedding (RE) objective built from a MAGIC DAG, the way
`cglib.data.hierarcaps_train` builds them from the HierarCaps train file.

Positives are an image's concept chain l_max .. l1, then one of its original captions (K = l_max + 1); each
negative is a node of the same level off the chain (a sibling first), the caption's negative another image's
caption under the same l1 node.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cglib.data.hierarcaps_train import REItem
from cglib.magic.schema import MagicFile
from cglib.run import keyed_rng

logger = logging.getLogger(__name__)


def _draw(pool: list, rng: np.random.Generator, ok: Callable[[Any], bool], tries: int = 32) -> Any | None:
    """A seeded uniform draw from the entries of `pool` that pass `ok`, or None; rejection first, then a scan."""
    if not pool:
        return None
    for _ in range(tries):
        candidate = pool[int(rng.integers(len(pool)))]
        if ok(candidate):
            return candidate
    kept = [c for c in pool if ok(c)]
    return kept[int(rng.integers(len(kept)))] if kept else None


def re_items_from_magic(magic: MagicFile, split: str = "train", seed: int = 0, captions_per_image: int = 1,
                        single_top: str = "skip") -> tuple[list[REItem], Counter]:
    """RE items of one split's images (sorted ids, seeded per image), and counts of negative sources and skips.

    Concept tier i: a sibling of P_i under P_{i-1}'s node (top level: the other top-level nodes), else one of
    P_i's hard negatives (`magic.negatives`, flagged fallback negatives included), else any other node of the
    level ("fallback"); only nodes with images of `split` and names off the chain. Caption tier: another
    image's caption under the same l1 node, else under a hard-negative l1 node; never one of the image's own.
    Counts: `negative: sibling | hard negative | fallback` per concept tier drawn, `negative: same-l1 caption |
    hard-negative caption` per item, `skipped: <reason>` per image.

    `single_top`: what to do when fewer than two top-level nodes have images of the split (the top tier then has
    no negative): "skip" every image (counted), or "drop" the top tier (K = l_max; counted as `dropped top tier:
    a single top-level node` per image).
    """
    if single_top not in ("skip", "drop"):
        raise ValueError(f"single_top must be 'skip' or 'drop', got {single_top!r}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(captions_per_image, bool) or not isinstance(captions_per_image, int) or captions_per_image < 1:
        raise ValueError(f"captions_per_image must be a positive integer, got {captions_per_image!r}")
    has_images = {n: bool(magic.images_of(n, split)) for n in magic.nodes}
    context = _MagicContext(
        magic=magic, split=split,
        usable={level: [n.id for n in magic.nodes_at(level) if has_images[n.id]]
                for level in range(1, magic.l_max + 1)},
        children={n: [] for n in magic.nodes},
        hard={n: [m for m in magic.negatives(n) if has_images.get(m, False)] for n in magic.nodes},  # = negatives(n, split)
        captions={n: [] for n in magic.nodes})
    for n in sorted(magic.nodes):  # one pass instead of magic.children per node (quadratic in nodes)
        parent = magic.nodes[n].primary_parent
        if parent is not None and has_images[n]:
            context.children[parent].append(n)
    context.top = [n for n in context.usable[magic.l_max] if magic.nodes[n].primary_parent is None]
    context.drop_top = single_top == "drop" and len(context.top) < 2
    for image_id in magic.split_ids(split):
        record = magic.images[image_id]
        context.captions[record.node].extend((image_id, c) for c in record.captions if c.strip())
    counts: Counter = Counter()
    items: list[REItem] = []
    for image_id in magic.split_ids(split):
        items.extend(_image_items(context, image_id, keyed_rng(seed, image_id), captions_per_image, counts))
    logger.info("RE items from MAGIC (%s split): %d items; %s", split, len(items),
                ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return items, counts


@dataclass
class _MagicContext:
    """What every image of one split shares: usable nodes per level, children and hard negatives with images of
    the split, (image, caption) pairs of the split per l1 node."""

    magic: MagicFile
    split: str
    usable: dict[int, list[str]]
    children: dict[str, list[str]]
    hard: dict[str, list[str]]
    captions: dict[str, list[tuple[str, str]]]
    top: list[str] = field(default_factory=list)
    drop_top: bool = False


def _image_items(ctx: _MagicContext, image_id: str, rng: np.random.Generator, captions_per_image: int,
                 counts: Counter) -> list[REItem]:
    """The RE items of one image (empty when it is skipped; the reason is counted)."""
    magic = ctx.magic
    own = [c for c in magic.images[image_id].captions if c.strip()]
    if not own:
        counts["skipped: no captions"] += 1
        return []
    try:
        chain = magic.chain(image_id)[::-1]  # general (l_max) to specific (l1)
    except ValueError:
        counts["skipped: broken chain"] += 1
        return []
    start = 1 if ctx.drop_top and len(chain) > 1 else 0
    if start:
        counts["dropped top tier: a single top-level node"] += 1
    names = [magic.nodes[n].name for n in chain]
    negatives: list[str] = []
    for depth, node in enumerate(chain[start:], start):
        level = magic.nodes[node].level
        siblings = ctx.top if depth == 0 else ctx.children[chain[depth - 1]]
        for source, candidates in (("sibling", siblings), ("hard negative", ctx.hard[node]),
                                   ("fallback", ctx.usable[level])):
            kept = [c for c in candidates if c not in chain and magic.nodes[c].name not in names]
            if kept:
                negatives.append(magic.nodes[kept[int(rng.integers(len(kept)))]].name)
                counts[f"negative: {source}"] += 1
                break
        else:
            counts[f"skipped: no negative at level {level}"] += 1
            return []

    def other_caption(pair: tuple[str, str]) -> bool:
        return pair[0] != image_id and pair[1] not in own

    l1 = chain[-1]
    for source, nodes in (("same-l1 caption", [l1]),
                          ("hard-negative caption", ctx.hard[l1])):
        pool = [pair for n in nodes for pair in ctx.captions[n]]
        if _draw(pool, rng, other_caption) is not None:
            break
    else:
        counts["skipped: no negative caption"] += 1
        return []
    items = []
    for i in sorted(rng.permutation(len(own))[:captions_per_image]):
        negative = _draw(pool, rng, other_caption)
        counts[f"negative: {source}"] += 1
        items.append(REItem((*names[start:], own[i]), (*negatives, negative[1])))
    return items
