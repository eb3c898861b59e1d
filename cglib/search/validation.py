"""The hyper-parameter search's data: a validation slice carved from MAGIC train, and its forced-choice score.

Data roles (DESIGN.md): MAGIC test is for reported numbers only, so the search never reads it. `search_view`
returns magic.json as the search sees it: the MAGIC-test images are gone, a seeded share of the MAGIC-train images
(`search.validation_fraction`, carved per l1 node like the test split, or whole concepts with `magic.split:
concept`, from generator streams of their own) is relabelled "test" (validation), and the rest stays "train". The
training code reads split "train" and the evaluation code split "test", so both run unchanged on the view:
the trials train on the remaining MAGIC-train pairs and are scored on validation images they never saw.

`ValidationScorer` is the paper's forced choice (`cglib.evaluate.forced_choice`, eval.choices / eval.seeds /
eval.negative_source) on the validation items, text->image, DAG labels; the objective is the mean accuracy over
the concept levels l1..l_max (`search.objective: levels`) or over Table 3's columns (`table3`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cglib.config import Params
from cglib.encoding import encode_images, encode_texts
from cglib.evaluate.embeddings import tower_fingerprints
from cglib.evaluate.forced_choice import sample_forced_choice, score_forced_choice
from cglib.evaluate.items import DAG, MagicItems, build_items
from cglib.magic.schema import MagicFile
from cglib.magic.split import split_images
from cglib.models import ClipModel

VALIDATION_SALT = "search-validation/"  # the validation split's generator streams differ from the test split's


def group_subset(magic: MagicFile, size: int, seed: int) -> list[str]:
    """`size` l1 groups with MAGIC-train images, drawn in a seeded order, each followed by its hard negatives, so
    the groups of a shrunken search keep negatives among themselves; sorted ids."""
    groups = magic.groups("train")
    chosen: list[str] = []
    for k in np.random.default_rng([seed, 8]).permutation(len(groups)):
        for group in [groups[k], *magic.negatives(groups[k], split="train")]:
            if len(chosen) < size and group not in chosen:
                chosen.append(group)
    return sorted(chosen)


def search_view(magic: MagicFile, fraction: float, seed: int, groups: int | None = None
                ) -> tuple[MagicFile, dict[str, Any]]:
    """magic.json without its test images, a seeded slice of MAGIC train relabelled "test" (validation); and a
    record of the split (counts, seed, the validation image ids). `groups`: keep only that many l1 groups
    (`group_subset`), a shrunken world for a quick search."""
    train_ids = magic.split_ids("train")
    kept = None if groups is None else set(group_subset(magic, groups, seed))
    if kept is not None:
        train_ids = [i for i in train_ids if magic.images[i].node in kept]
    groups: dict[str, list[str]] = {}
    for image_id in train_ids:
        groups.setdefault(magic.images[image_id].node, []).append(image_id)
    split = split_images(groups, magic.split_kind, fraction, seed, salt=VALIDATION_SALT)
    data = magic.model_dump()
    data["images"] = {i: {**data["images"][i], "split": split[i]} for i in train_ids}
    data["stats"] = {}
    data["provenance"] = {**data.get("provenance", {}), "search_view": {
        "of": "MAGIC train", "validation_fraction": fraction, "seed": seed, "test_images_left_out": True}}
    view = MagicFile.model_validate(data)  # not load_magic: node counts describe the whole DAG, as they should
    validation = view.split_ids("test")
    record = {"seed": seed, "validation_fraction": fraction, "split_kind": magic.split_kind,
              "groups": len(view.groups()), "groups_in_magic": len(magic.groups("train")),
              "train_images": len(train_ids) - len(validation), "validation_images": len(validation),
              "validation_groups": len(view.groups("test")),
              "test_images_left_out": len(magic.split_ids("test")), "validation_ids": validation}
    return view, record


@dataclass
class ValidationScore:
    """One model's validation accuracy: text->image forced choice per text field and the objective's mean."""

    mean: float
    by_field: dict[str, float]  # the fields with scorable items (ValidationScorer.unscorable: the others)
    items: int


class ValidationScorer:
    """Forced-choice accuracy on the validation split of a search view, for models trained on its train split."""

    def __init__(self, params: Params, view: MagicFile, pixels: np.ndarray, image_ids: list[str]) -> None:
        items = build_items(view, available=set(image_ids), split="test",
                            include_fallback=params.eval.fallback_negatives,
                            include_generalized_fallback=params.eval.include_generalized_fallback)
        keys = [f"l{k}" for k in items.levels]
        if params.search.objective == "table3":
            keys = ["generalized", "caption", *keys]
        self.fields = [items.field(k, DAG) for k in keys]
        self.items: MagicItems = items
        row = {image_id: r for r, image_id in enumerate(image_ids)}
        self.pixels = pixels[[row[i] for i in items.image_ids]]
        self.sets = {f.key: [sample_forced_choice(items, f, params.eval.choices, seed, params.eval.negative_source)
                             for seed in params.eval.seeds] for f in self.fields}
        # a level whose validation images all share one concept (a single top node) has no valid negative
        self.unscorable = [k for k, sets in self.sets.items() if not any(s.anchors.size for s in sets)]
        for key in self.unscorable:
            del self.sets[key]
        if not self.sets:
            raise ValueError(f"the validation split has no scorable forced-choice item for {keys}; raise "
                             "search.validation_fraction (or data.synthetic.images_per_concept)")
        self._text_vectors: dict[str, np.ndarray] = {}
        self.texts = sorted({t for sets in self.sets.values() for s in sets
                             for t in [*s.anchor_texts, *(x for row in s.negative_texts for x in row)]})

    @property
    def n_items(self) -> int:
        return sum(s.anchors.size for sets in self.sets.values() for s in sets)

    def score(self, bundle: ClipModel) -> ValidationScore:
        """Text->image accuracy per field (pooled over eval.seeds) and its mean over the fields."""
        images = encode_images(bundle, self.pixels)
        text_key = tower_fingerprints(bundle)[1]
        if text_key not in self._text_vectors:  # a frozen text tower: embedded once for every epoch and trial
            self._text_vectors = {text_key: encode_texts(bundle, self.texts)}
        text_vectors = self._text_vectors[text_key]
        index = {t: k for k, t in enumerate(self.texts)}
        by_field = {}
        for key, sets in self.sets.items():
            correct = np.concatenate([score_forced_choice(s, images, text_vectors, index)[0] for s in sets])
            by_field[key] = float(correct.mean())
        return ValidationScore(mean=float(np.mean(list(by_field.values()))), by_field=by_field, items=self.n_items)
