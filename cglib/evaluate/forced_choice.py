"""The paper's Table 3 protocol, made sound: an M-way forced choice against hard negatives.

For each test item (an image and one of its texts of a type) we draw M-1 negatives, each from a DIFFERENT
hard-negative group of the item's l1 group; each negative brings its own image and its own text of the same
type. (`negative_source="level"` instead draws, for a level-k concept name, from the hard negatives of the
image's level-k node: negatives hard at the evaluated level, whose names always differ from the anchor's.) Text->image is correct when the item's text scores its own image strictly above every negative image;
image->text when the item's image scores its own text strictly above every negative text. Chance is 1/M.

Rules (and how the authors' code differs):
- A negative must not be a valid answer: its image must not carry the anchor's text, and its text must not be
  one of the anchor image's texts of that type. At l2-l4 a hard-negative group often shares the anchor's
  ancestor, so the whole group is skipped and another is drawn. (Authors: no check, so identical strings
  at l2-l4 make the item a coin toss decided by the tie rule.)
- Ties count as wrong. (Authors: ties resolve in the anchor's favour, so identical texts score as correct.)
- Negative groups are drawn without replacement, and the image and text inside a group at random.
  (Authors: with replacement, and always the group's first item.)
- Seeded: the same seed gives the same items for every model. Items that cannot get M-1 valid negatives are
  counted per reason and reported, not dropped silently.

`protocol="as_published"` samples as the authors' code did (`EvaluationDataset` in their `src/training/data.py`,
scored by `evaluate_scores(..., anchor_only=True)` in `train.py`), so that our numbers can sit beside the paper's:
the anchor's text is the first of its type, the M-1 negative concepts are drawn with replacement from the l1
group's hard negatives that have test images, each brings its concept's first test image and that image's first
text of the type, nothing is checked against the anchor's texts, and ties go to the anchor (argmax takes the first
of equal scores, and the anchor is first).
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.items import MagicItems, TextField

NO_TEXT = "no text of this type"
NO_GROUPS = "fewer than M-1 hard-negative groups with test images"
NO_VALID = "fewer than M-1 hard-negative groups with a negative whose text differs from the anchor's"


@dataclass
class ForcedChoiceSet:
    """Sampled items of one text field and seed: anchors and their M-1 negatives (image rows and texts)."""

    field: str
    labels: str
    seed: int
    choices: int
    anchors: np.ndarray  # (n,) image rows of the scorable items
    anchor_texts: list[str]
    negative_images: np.ndarray  # (n, M-1) image rows
    negative_texts: list[list[str]]  # n lists of M-1 strings
    n_items: int  # candidate items before exclusion
    excluded: Counter = field(default_factory=Counter)
    protocol: str = "corrected"  # or "as_published": the authors' sampling, ties to the anchor


def _rng(seed: int, text_field: TextField) -> np.random.Generator:
    # One stream per (seed, field): adding a field or a model never changes another field's draws.
    return np.random.default_rng([seed, zlib.crc32(text_field.name.encode())])


PROTOCOLS = ("corrected", "as_published")


def sample_forced_choice(items: MagicItems, text_field: TextField, choices: int, seed: int,
                         negative_source: str = "group", protocol: str = "corrected") -> ForcedChoiceSet:
    """Draw M-1 valid negatives from distinct hard-negative groups for every item of a field (seeded).

    `negative_source`: "group" (the paper: hard negatives of the image's l1 group) or "level" (hard negatives
    of the image's node at the field's level). `protocol`: "corrected" (the rules above) or "as_published" (the
    authors' sampling; always from the l1 group).
    """
    if choices < 2:
        raise ValueError(f"forced choice needs at least 2 choices (eval.choices), got {choices}")
    if negative_source not in ("group", "level"):
        raise ValueError(f"negative_source must be 'group' or 'level', got {negative_source!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "as_published":
        return _sample_as_published(items, text_field, choices, seed)
    rng = _rng(seed, text_field)
    text_sets = [set(t) for t in text_field.texts]
    nodes = items.nodes_at(text_field.level if negative_source == "level" else 1)
    rows_by_group: dict[str, list[int]] = {}
    for row, group in enumerate(nodes):
        if text_field.texts[row]:
            rows_by_group.setdefault(group, []).append(row)
    anchors, anchor_texts, neg_rows, neg_texts = [], [], [], []
    excluded: Counter = Counter()
    for row, group in enumerate(nodes):
        texts = text_field.texts[row]
        if not texts:
            excluded[NO_TEXT] += 1
            continue
        anchor_text = texts[int(rng.integers(len(texts)))]
        candidates = [g for g in items.negatives.get(group, []) if g in rows_by_group]
        if len(candidates) < choices - 1:
            excluded[NO_GROUPS] += 1
            continue
        picked_rows, picked_texts = [], []
        for g in rng.permutation(len(candidates)):
            for j in rng.permutation(rows_by_group[candidates[g]]):
                if anchor_text in text_sets[j]:
                    continue  # this image also answers the anchor's text
                allowed = [t for t in text_field.texts[j] if t not in text_sets[row]]
                if allowed:
                    picked_rows.append(int(j))
                    picked_texts.append(allowed[int(rng.integers(len(allowed)))])
                    break
            if len(picked_rows) == choices - 1:
                break
        if len(picked_rows) < choices - 1:
            excluded[NO_VALID] += 1
            continue
        anchors.append(row)
        anchor_texts.append(anchor_text)
        neg_rows.append(picked_rows)
        neg_texts.append(picked_texts)
    return ForcedChoiceSet(
        field=text_field.key, labels=text_field.labels, seed=seed, choices=choices,
        anchors=np.asarray(anchors, dtype=np.int64), anchor_texts=anchor_texts,
        negative_images=np.asarray(neg_rows, dtype=np.int64).reshape(len(anchors), choices - 1),
        negative_texts=neg_texts, n_items=len(nodes), excluded=excluded)


def _sample_as_published(items: MagicItems, text_field: TextField, choices: int, seed: int) -> ForcedChoiceSet:
    """The authors' items: first texts, negative concepts with replacement, each concept's first test image."""
    rng = np.random.default_rng([seed, zlib.crc32(f"as_published/{text_field.name}".encode())])
    nodes = items.nodes_at(1)
    first_row: dict[str, int] = {}  # each l1 concept's first test image with a text of this type
    for row, group in enumerate(nodes):
        if text_field.texts[row]:
            first_row.setdefault(group, row)
    anchors, anchor_texts, neg_rows, neg_texts = [], [], [], []
    excluded: Counter = Counter()
    for row, group in enumerate(nodes):
        if not text_field.texts[row]:
            excluded[NO_TEXT] += 1
            continue
        concepts = [g for g in items.negatives.get(group, []) if g in first_row]
        if len(concepts) < choices - 1:
            excluded[NO_GROUPS] += 1
            continue
        picked = [first_row[concepts[k]] for k in rng.integers(len(concepts), size=choices - 1)]
        anchors.append(row)
        anchor_texts.append(text_field.texts[row][0])
        neg_rows.append(picked)
        neg_texts.append([text_field.texts[j][0] for j in picked])
    return ForcedChoiceSet(
        field=text_field.key, labels=text_field.labels, seed=seed, choices=choices,
        anchors=np.asarray(anchors, dtype=np.int64), anchor_texts=anchor_texts,
        negative_images=np.asarray(neg_rows, dtype=np.int64).reshape(len(anchors), choices - 1),
        negative_texts=neg_texts, n_items=len(nodes), excluded=excluded, protocol="as_published")


def score_forced_choice(fc: ForcedChoiceSet, image_vectors: np.ndarray, text_vectors: np.ndarray,
                        text_index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-item correctness (1.0/0.0) for text->image and image->text; ties are wrong (as published: the
    anchor's)."""
    n = fc.anchors.size
    if n == 0:
        return np.zeros(0), np.zeros(0)
    anchor_text_rows = np.array([text_index[t] for t in fc.anchor_texts])
    neg_text_rows = np.array([[text_index[t] for t in row] for row in fc.negative_texts]).reshape(n, -1)
    image_rows = np.concatenate([fc.anchors[:, None], fc.negative_images], axis=1)  # (n, M), anchor first
    text_rows = np.concatenate([anchor_text_rows[:, None], neg_text_rows], axis=1)
    anchor_txt = text_vectors[anchor_text_rows]
    anchor_img = image_vectors[fc.anchors]
    # Every candidate's score comes from the same einsum, so identical vectors give identical scores (a tie).
    t2i = np.einsum("nd,nmd->nm", anchor_txt, image_vectors[image_rows])
    i2t = np.einsum("nd,nmd->nm", anchor_img, text_vectors[text_rows])
    wins = np.greater_equal if fc.protocol == "as_published" else np.greater
    return (wins(t2i[:, 0], t2i[:, 1:].max(axis=1)).astype(np.float64),
            wins(i2t[:, 0], i2t[:, 1:].max(axis=1)).astype(np.float64))


def pooled_scores(sets: list[ForcedChoiceSet], correct: list[np.ndarray],
                  image_units: np.ndarray | None = None) -> Scores:
    """Pool several seeds' items: one query per (seed, item); the resampling unit is the anchor image's
    (`image_units[row]`, default the image itself)."""
    anchors = np.concatenate([s.anchors for s in sets]) if sets else np.zeros(0, np.int64)
    return Scores(values=np.concatenate(correct) if correct else np.zeros(0),
                  units=anchors if image_units is None else image_units[anchors])
