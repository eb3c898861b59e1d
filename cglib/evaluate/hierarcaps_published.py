"""HierarCaps as the CLEAR GLASS authors scored it (the `hierarcaps_published` columns): their
HierarcapsEvaluationDataset (src/training/data.py) and evaluate_scores (src/training/train.py), step by step.

Their loader reads a JSON list of records (`images`, `general_captions_level1..4`, `concept`) and, once at load
time, makes one entry per image of each record, in file order: each level's text is `random.choice` of the
record's texts at that level, and M-1 negatives are `random.choices` over all RECORDS (with replacement, the
entry's own record included), each keeping the record's `concept`. When the entry is scored, each drawn concept is
looked up as the first entry whose level-4 text equals it; an entry with a concept that no entry carries is
skipped by train.py's evaluate ("Skipping batch"). Here the same steps run on Python's own generator (the one
their `random` module uses), seeded with the evaluation seed, and a skipped entry is counted, never dropped
silently.

What cannot be known: their JSON file is not published, so neither its order nor its contents are. We read the
HierarCaps test CSV as one record per row, in CSV order, with that row's one text per level and its level-4 text
as `concept` (the only reading under which a drawn record's lookup finds an entry, so nothing is skipped on the
real file); a file that grouped several images in a record would pick other texts and match other entries. Nor
can the generator's state be: their main.py seeds `random` with args.seed (0) and builds this dataset twice before
scoring (for training, then the evaluated copy, `DATASET_BUILDS`), but any library drawing from `random` in
between (wandb, model loading) would shift every draw.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cglib.data.hierarcaps import HierarCapsItem
from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.gallery import I2T, T2I, MetricScores

DATASET_BUILDS = 2  # their main.py builds the loader for training (get_train_data), then the one it evaluates


@dataclass(frozen=True)
class PublishedRecord:
    """One record of the authors' HierarCaps JSON: its images, its texts per level (general first), its concept."""

    images: tuple[str, ...]
    level_texts: tuple[tuple[str, ...], ...]
    concept: str


@dataclass
class PublishedDraw:
    """One seed's entries as their loader made them, and which of them were scored against which negatives.

    image_ids and texts (per level): one entry per image of each record, in record order; anchors: the entries
    scored; negatives (len(anchors), M-1): the entries their lookup found for each anchor's drawn concepts;
    unmatched: entries skipped because a drawn concept is no entry's level-4 text.
    """

    image_ids: list[str]
    texts: list[tuple[str, ...]]
    anchors: np.ndarray
    negatives: np.ndarray
    unmatched: int


def records_from_items(items: Sequence[HierarCapsItem]) -> list[PublishedRecord]:
    """Our reading of their unpublished JSON: one record per item, its one text per level, its level-4 text as
    the concept (see the module docstring)."""
    return [PublishedRecord((item.image_id,), tuple((text,) for text in item.levels), item.levels[-1])
            for item in items]


def published_draw(records: Sequence[PublishedRecord], choices: int, seed: int) -> PublishedDraw:
    """The entries and negatives of their loader for eval.choices = M, drawn with `random.Random(seed)`."""
    if choices < 2:
        raise ValueError(f"eval.choices must be at least 2 (an item and one negative), got {choices}")
    if not records:
        raise ValueError("no HierarCaps record to draw from")
    rng = random.Random(seed)
    for _ in range(DATASET_BUILDS):  # every build draws anew from the same generator; the last one is scored
        image_ids, texts, drawn = [], [], []
        for record in records:
            for image_id in record.images:
                image_ids.append(image_id)
                texts.append(tuple(rng.choice(level) for level in record.level_texts))  # level 1 first, as theirs
                drawn.append([r.concept for r in rng.choices(records, k=choices - 1)])
    first_with_level4: dict[str, int] = {}
    for row, levels in enumerate(texts):
        first_with_level4.setdefault(levels[-1], row)
    anchors, negatives = [], []
    for row, concepts in enumerate(drawn):
        if all(c in first_with_level4 for c in concepts):
            anchors.append(row)
            negatives.append([first_with_level4[c] for c in concepts])
    return PublishedDraw(image_ids, texts, np.array(anchors, dtype=np.int64),
                         np.array(negatives, dtype=np.int64).reshape(len(anchors), choices - 1),
                         len(drawn) - len(anchors))


def published_accuracy(draws: Sequence[PublishedDraw], level: int, image_vectors: np.ndarray,
                       text_vectors: np.ndarray, text_index: dict[str, int]) -> dict[tuple[str, str], MetricScores]:
    """The authors' HierarCaps columns at one 1-based level: each scored entry's text (image) against its
    negatives' images (texts), ties to the anchor (their argmax takes the first of equal scores, the anchor
    first). `image_vectors`: one row per entry of the draws. One query per (seed, scored entry), the entry as
    the resampling unit. Chance: a random scorer picks one of the distinct candidates (identical ones tie with
    the anchor and so count as the anchor)."""
    out: dict[tuple[str, str], list] = {(T2I, "accuracy"): [], (I2T, "accuracy"): []}
    chance: dict[tuple[str, str], list] = {key: [] for key in out}
    units = []
    for draw in draws:
        if len(draw.texts) != len(image_vectors):
            raise ValueError(f"{len(image_vectors)} image vectors for {len(draw.texts)} entries: give one per entry")
        text_rows = np.array([text_index[levels[level - 1]] for levels in draw.texts])
        cand = np.concatenate([draw.anchors[:, None], draw.negatives], axis=1)  # (k, M) entries, the anchor first
        t2i = np.einsum("kd,kmd->km", text_vectors[text_rows[draw.anchors]], image_vectors[cand])
        i2t = np.einsum("kd,kmd->km", image_vectors[draw.anchors], text_vectors[text_rows[cand]])
        # a candidate is its image (t2i) or its string (i2t): identical ones score alike
        for key, scores, identity in (((T2I, "accuracy"), t2i, cand), ((I2T, "accuracy"), i2t, text_rows[cand])):
            out[key].append((scores[:, 0] >= scores[:, 1:].max(axis=1)).astype(np.float64))
            chance[key].append(1.0 / np.array([len(set(row)) for row in identity]))
        units.append(draw.anchors)
    units_all = np.concatenate(units)
    if not units_all.size:
        raise ValueError("no HierarCaps entry could be scored as published: every entry drew a concept that is no "
                         "entry's level-4 text (check the records' concepts)")
    return {key: MetricScores(Scores(np.concatenate(values), units_all), float(np.mean(np.concatenate(chance[key]))))
            for key, values in out.items()}
