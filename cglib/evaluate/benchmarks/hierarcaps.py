"""HierarCaps (eval.hierarcaps): its own images and four-level texts; per-level retrieval, the B-way in-batch
variant (Table 3's HierarCaps columns) and the hierarchy metrics (cglib/evaluate/hierarcaps.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cglib.data.dataset import CaptionDataset
from cglib.data.hierarcaps import load_hierarcaps
from cglib.data.image_cache import build_image_cache
from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, ImageSet, Key, Scored, image_vectors
from cglib.evaluate.embeddings import Embeddings, pixel_fingerprint
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.hierarcaps import (
    ROOT_TEXT,
    hierarchical_metric,
    in_batch_accuracy,
    level_retrieval,
)
from cglib.evaluate.hierarcaps_published import (
    PublishedDraw,
    published_accuracy,
    published_draw,
    records_from_items,
)
from cglib.evaluate.report import wide_table

TAU_KEY = ("hierarcaps_hierarchy", "hierarcaps", "-", "kendall_tau", "all")


@dataclass
class HierarCapsItems:
    """The HierarCaps items scored (unseen ones unless eval.hierarcaps_include_train), their images at the run's
    input size, and what was left out."""

    items: list
    images: ImageSet
    skipped: dict[str, int]
    overlap: dict[str, int]  # items whose image is in this run's MAGIC data: any split, train split
    include_train: bool
    left_out_train: int
    at_size: dict[int, ImageSet] = field(default_factory=dict)  # a zoo model's input size: the same images
    published: dict[int, PublishedDraw] = field(default_factory=dict)  # eval seed -> the authors' loader's draw


def load_hierarcaps_items(run, magic, size: int, progress: bool) -> HierarCapsItems:
    """HierarCaps items, lazy pixels (image cache at `size`), their fingerprint, texts (+ the root's empty string),
    and the authors' loader drawn on them once per eval seed (the `hierarcaps_published` columns)."""
    d = run.params.data
    if d.hierarcaps_csv is None or d.hierarcaps_images is None:
        raise ValueError("eval.hierarcaps is true but data.hierarcaps_csv / data.hierarcaps_images are not set; "
                         "set both (see params/hierarcaps.yaml) or set eval.hierarcaps: false")
    hc = load_hierarcaps(d.hierarcaps_csv, d.hierarcaps_images)
    if not hc.items:
        raise ValueError(f"no usable HierarCaps item in {d.hierarcaps_csv} (skipped: {dict(hc.skipped)})")
    dataset = CaptionDataset(source="hierarcaps", image_ids=[i.image_id for i in hc.items],
                             captions={i.image_id: [i.levels[-1]] for i in hc.items},
                             image_files={i.image_id: i.image_file for i in hc.items})
    cache = build_image_cache(dataset, size, run.dir / "cache" / "images", progress=progress)
    skipped = Counter(hc.skipped)
    skipped.update(cache.skipped)
    items = [i for i in hc.items if i.image_id in cache]

    # The same COCO photo may be in the run's own data (keyed by COCO id or by file stem).
    def in_run(item, split: str | None) -> bool:
        for key in (item.image_id, str(item.coco_id)):
            record = magic.images.get(key)
            if record is not None and (split is None or record.split == split):
                return True
        return False

    overlap = {"any": sum(in_run(i, None) for i in items), "train": sum(in_run(i, "train") for i in items)}
    include_train = run.params.eval.hierarcaps_include_train
    if not include_train:  # HierarCaps is unseen data: items the trained models saw are left out, and counted
        items = [i for i in items if not in_run(i, "train")]
        if not items:
            raise ValueError(f"all {overlap['train']} readable HierarCaps images are in this run's MAGIC train split, "
                             "so none is unseen; raise magic.test_fraction, or set eval.hierarcaps_include_train: "
                             "true to score seen images")
    ids = [i.image_id for i in items]
    texts = sorted({t for i in items for t in i.levels} | {ROOT_TEXT})
    images = ImageSet("hierarcaps", ids, lambda: cache.get(ids),
                      pixel_fingerprint(files=[i.image_file for i in items]), texts)
    records = records_from_items(items)
    published = {seed: published_draw(records, run.params.eval.choices, seed) for seed in run.params.eval.seeds}
    return HierarCapsItems(items, images, dict(skipped), overlap, include_train,
                           0 if include_train else overlap["train"], published=published)


class HierarCaps(Benchmark):
    name = "hierarcaps"
    protocol = (
        "Per level, each of the n items' texts queries all n images; a hit is an image with the same text at "
        "that level (strings repeat at levels 1-2). In-batch: each item against B-1 random other items "
        "(eval.hierarcaps_batch), R@1, resampled per seed. As published (the CLEAR GLASS authors' columns, "
        "hierarcaps_published): their loader's steps on Python's generator seeded per eval seed: each level's text "
        "drawn from the item's, M-1 concepts drawn at load time with replacement from all items, itself included "
        "(eval.choices = M), each found as the first item with that level-4 text (an item with an unmatched "
        "concept skipped and counted), ties to the anchor. Hierarchy: the "
        "HierarCaps authors' precision, recall (root = empty string, eval.hierarcaps_radii radii) and Kendall "
        "tau-b of root distance vs level.")
    absent: ClassVar[dict[str, None]] = {"hierarcaps": None}
    title = "HierarCaps"
    switch = "eval.hierarcaps: true; params/hierarcaps.yaml is the real-data profile"

    def enabled(self, params) -> bool:
        return params.eval.hierarcaps

    def tables(self, results) -> list[tuple[str, object]]:
        return [("per-level retrieval over all items, text to image R@1",
                 results.table("hierarcaps", "hierarcaps", "t2i", "R@1")),
                (f"in-batch variant ({results.info['settings'].get('hierarcaps_batch', 'B')}-way), R@1",
                 results.table("hierarcaps_batch", "hierarcaps", "t2i", "R@1")),
                ("the HierarCaps authors' hierarchical metric (precision, recall, Kendall tau of the root distance)",
                 wide_table(results.metrics, "hierarcaps_hierarchy", "hierarcaps", "all"))]

    def prepare(self, context: EvalContext) -> HierarCapsItems:
        return load_hierarcaps_items(context.run, context.magic, context.image_size(), context.progress)

    def images(self, items: HierarCapsItems, context: EvalContext, size: int | None) -> ImageSet:
        """The items' images at `size` (a zoo model's; an error when other images are readable there)."""
        if size is None or size == context.image_size():
            return items.images
        if size not in items.at_size:
            other = load_hierarcaps_items(context.run, context.magic, size, context.progress)
            if other.images.ids != items.images.ids:
                raise ValueError(f"the HierarCaps images readable at {size} px differ from those at "
                                 f"{context.image_size()} px")
            items.at_size[size] = other.images
        return items.at_size[size]

    def score(self, items: HierarCapsItems, emb: Embeddings, context: EvalContext) -> Scored:
        """Every HierarCaps score of one model, and the hierarchy metric's exclusions."""
        p = context.params.eval
        hc_items = items.items
        images = image_vectors(emb, [item.image_id for item in hc_items])
        out: dict[Key, MetricScores] = {}
        for level in range(1, len(hc_items[0].levels) + 1):
            texts = [item.levels[level - 1] for item in hc_items]
            for (direction, metric), ms in level_retrieval(texts, images, emb.text_vectors, emb.text_index,
                                                           p.recall_at).items():
                out[("hierarcaps", "hierarcaps", direction, metric, f"l{level}")] = ms
            for (direction, metric), ms in in_batch_accuracy(texts, images, emb.text_vectors, emb.text_index,
                                                             p.hierarcaps_batch, p.seeds).items():
                out[("hierarcaps_batch", "hierarcaps", direction, metric, f"l{level}")] = ms
            published = published_accuracy(list(items.published.values()), level, images, emb.text_vectors,
                                           emb.text_index)
            for (direction, metric), ms in published.items():
                out[("hierarcaps_published", "hierarcaps", direction, metric, f"l{level}")] = ms
        root = emb.text([ROOT_TEXT])[0]
        h = hierarchical_metric(hc_items, images, emb.text_vectors, emb.text_index, root, radii=p.hierarcaps_radii)
        nan = float("nan")
        out[("hierarcaps_hierarchy", "hierarcaps", "i2t", "precision", "all")] = MetricScores(h.precision, nan)
        out[("hierarcaps_hierarchy", "hierarcaps", "i2t", "recall", "all")] = MetricScores(h.recall, nan)
        out[TAU_KEY] = MetricScores(h.kendall_tau, 0.0)
        return Scored(out, info={"kendall_tau_undefined": h.n_tau_undefined})

    def excluded(self, items: HierarCapsItems, per_model: dict[str, dict]) -> dict[Key, dict[str, int]]:
        return {TAU_KEY: {name: v["kendall_tau_undefined"] for name, v in per_model.items()}}

    def exposure(self, items: HierarCapsItems) -> str:
        if items.include_train and items.overlap["train"]:
            return (f"trained on {items.overlap['train']} of the {len(items.items)} HierarCaps images (in this "
                    "run's MAGIC train split)")
        return ""

    def describe(self, items: HierarCapsItems, per_model: dict[str, dict]) -> dict[str, Any]:
        return {"hierarcaps": {"n_items": len(items.items), "skipped": items.skipped,
                               "overlap_with_run_images": items.overlap, "include_train": items.include_train,
                               "left_out_train": items.left_out_train,
                               "published_unmatched": {str(seed): d.unmatched for seed, d in items.published.items()},
                               "per_model": per_model}}
