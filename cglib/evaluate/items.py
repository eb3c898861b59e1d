"""The evaluation items of a MAGIC test split, built once and shared by every model (identical items).

For each test image and each text type it lists the strings the image is paired with:

    caption        the image's original captions (COCO, or the synthetic world's templated captions)
    generalized    the image's generalized captions, read through `MagicFile.generalized_texts`: its own
                   (magic.generalize: image, the paper's) or its l1 group's (group)
    l1 .. l_max    the concept name at that level along the image's chain in the DAG (magic.json)
    gt:l1 ..       (synthetic world only) the name at that level of the image's ground-truth chain

An image with no text of a type (a group without generalized captions, an image without a ground-truth
chain) takes no part in that type and is counted, never silently dropped. An image whose generalization failed
(its own, or its group's) carries fallback copies of its original captions (`generalized_fallback`): scoring
them would measure the original-caption column twice, so by default it takes no part in the generalized column
and is counted in `MagicItems.text_exclusions` (reported beside the column).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cglib.magic.schema import MagicFile

DAG = "dag"
GROUND_TRUTH = "ground_truth"
CAPTIONS = "captions"
FALLBACK_REASON = "generalization failed (fallback copies of original captions)"


@dataclass(frozen=True)
class TextField:
    """One text type over the evaluation images: `texts[i]` are the strings paired with image i."""

    key: str  # "caption", "generalized", "l1", ...
    labels: str  # whose labels: "dag" (magic.json), "ground_truth" (the synthetic world), "captions"
    texts: tuple[tuple[str, ...], ...]
    unit: str  # resampling unit of text->image queries: "image", "group" or "query"
    level: int = 1  # the abstraction level the texts describe (captions: 1)

    @property
    def name(self) -> str:
        return self.key if self.labels != GROUND_TRUTH else f"gt:{self.key}"

    def n_without_text(self) -> int:
        return sum(1 for t in self.texts if not t)


@dataclass
class MagicItems:
    """Test images (evaluation order), their DAG nodes per level, every node's hard negatives, every text field."""

    image_ids: list[str]
    groups: list[str]  # l1 node of each image
    negatives: dict[str, list[str]]  # node id (any level) -> its hard-negative node ids, same level
    fields: list[TextField]
    levels: list[int]
    ancestors: dict[int, list[str]] = field(default_factory=dict)  # level -> node id of each image at that level
    skipped: Counter = field(default_factory=Counter)
    text_exclusions: dict[str, dict[str, int]] = field(default_factory=dict)  # field name -> reason -> images

    def nodes_at(self, level: int) -> list[str]:
        """Each image's DAG node at `level` (its l1 group at level 1)."""
        return self.groups if level == 1 else self.ancestors[level]

    def field(self, key: str, labels: str = DAG) -> TextField:
        """The field of one text type and label source."""
        for f in self.fields:
            if f.key == key and f.labels == labels:
                return f
        raise KeyError(f"no text field {key!r} with labels {labels!r}; have {[f.name for f in self.fields]}")

    def all_texts(self) -> list[str]:
        """Every distinct string of every field, sorted (what the text tower must embed)."""
        return sorted({t for f in self.fields for texts in f.texts for t in texts})

    @property
    def has_ground_truth(self) -> bool:
        return any(f.labels == GROUND_TRUTH for f in self.fields)


def build_items(magic: MagicFile, available: set[str] | None = None,
                ground_truth: dict[str, list[str]] | None = None, split: str = "test",
                include_fallback: bool = True, include_generalized_fallback: bool = False) -> MagicItems:
    """Items of one split of magic.json; images outside `available` (unreadable) are skipped and counted.

    `include_fallback`: hard-negative fallbacks as negatives; `include_generalized_fallback`: score images whose
    generalized captions are fallback copies of original captions in the generalized column (default: left out,
    counted in `text_exclusions`).
    """
    skipped: Counter = Counter()
    image_ids = []
    for image_id in magic.split_ids(split):
        if available is not None and image_id not in available:
            skipped["image unreadable or missing from the dataset"] += 1
            continue
        image_ids.append(image_id)
    if not image_ids:
        raise ValueError(f"magic.json has no usable '{split}' image (skipped: {dict(skipped)}); "
                         "rebuild the DAG with a test split (magic.test_fraction > 0)")
    groups = [magic.images[i].node for i in image_ids]
    chain_ids = {i: magic.chain(i) for i in image_ids}
    chains = {i: [magic.nodes[n].name for n in chain_ids[i]] for i in image_ids}
    levels = list(range(1, magic.l_max + 1))
    ancestors = {k: [chain_ids[i][k - 1] for i in image_ids] for k in levels}
    fallback = [magic.images[i].generalized_fallback if magic.per_image
                else magic.nodes[magic.images[i].node].generalized_fallback for i in image_ids]
    generalized = tuple(() if flagged and not include_generalized_fallback else tuple(magic.generalized_texts(i))
                        for i, flagged in zip(image_ids, fallback))
    text_exclusions = {}
    if sum(fallback) and not include_generalized_fallback:
        text_exclusions["generalized"] = {FALLBACK_REASON: sum(fallback)}
    fields = [
        TextField("caption", DAG, tuple(tuple(magic.images[i].captions) for i in image_ids), unit="image"),
        TextField("generalized", DAG, generalized, unit="image" if magic.per_image else "group"),
    ]
    fields += [TextField(f"l{k}", DAG, tuple((chains[i][k - 1],) for i in image_ids), unit="query", level=k)
               for k in levels]
    if ground_truth is not None:
        missing = [i for i in image_ids if i not in ground_truth]
        if missing:
            skipped["no ground-truth chain (excluded from ground-truth fields)"] += len(missing)
        for k in levels:
            texts = tuple((ground_truth[i][k - 1],) if i in ground_truth and len(ground_truth[i]) >= k else ()
                          for i in image_ids)
            fields.append(TextField(f"l{k}", GROUND_TRUTH, texts, unit="query", level=k))
    used = sorted({n for k in levels for n in ancestors[k]})
    negatives = {n: [m for m in magic.negatives(n, include_fallback=include_fallback) if m != n] for n in used}
    return MagicItems(image_ids=image_ids, groups=groups, negatives=negatives, fields=fields, levels=levels,
                      ancestors=ancestors, skipped=skipped, text_exclusions=text_exclusions)
