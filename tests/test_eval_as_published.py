"""The evaluation as the authors' code ran it (issue #32 items 1-2): forced choice and HierarCaps columns against
literal re-implementations of their `EvaluationDataset`, `HierarcapsEvaluationDataset` and `evaluate_scores`
(ai-lab-conf/CLEAR_GLASS, src/training/data.py and train.py) on toy data."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from cglib.data.hierarcaps import HierarCapsItem
from cglib.evaluate.forced_choice import NO_GROUPS, sample_forced_choice, score_forced_choice
from cglib.evaluate.hierarcaps_published import (
    PublishedDraw,
    PublishedRecord,
    published_accuracy,
    published_draw,
    records_from_items,
)
from cglib.evaluate.items import build_items
from tests.factories import tiny_magic


# ------------------------------------------------------------------ literal re-implementations of the authors' code
def authors_evaluation_items(items, field, batch_size, choices):
    """EvaluationDataset: entries in data order with the FIRST text of the type; hard negatives kept when some
    entry has them as concept_level1; an entry with fewer than batch_size - 1 of them is dropped; __getitem__
    draws `choices(hard_negatives, k=batch_size - 1)` and takes the FIRST entry of each drawn concept."""
    data = [{"row": r, "concept_level1": items.groups[r], "text": field.texts[r][0],
             "hard_negatives": list(items.negatives.get(items.groups[r], []))} for r in range(len(items.groups))]
    lookup = {entry["concept_level1"] for entry in data}
    kept = []
    for entry in data:
        entry["hard_negatives"] = [h for h in entry["hard_negatives"] if h in lookup]
        if len(entry["hard_negatives"]) >= batch_size - 1:
            kept.append(entry)
    batches = []
    for entry in kept:
        drawn = choices(entry["hard_negatives"], batch_size - 1)
        negatives = [next(other for other in kept if other["concept_level1"] == h) for h in drawn]
        batches.append((entry["row"], entry["text"], [n["row"] for n in negatives], [n["text"] for n in negatives]))
    return batches


def authors_evaluate_scores(scores):
    """evaluate_scores(scores, anchor_only=True): scores N x images x captions; argmax of the anchor's row (the
    first of equal scores wins, and the anchor is first). Returns per-item correctness (i2t, t2i)."""
    i2t = np.argmax(scores, axis=-1)[:, 0] == 0
    t2i = np.argmax(np.transpose(scores, axes=[0, 2, 1]), axis=-1)[:, 0] == 0
    return i2t.astype(float), t2i.astype(float)


def batch_scores(image_vectors, text_vectors, image_rows, text_rows):
    """Their einsum over each batch's (anchor + negatives) images and captions: N x K x K."""
    return np.einsum("nkd,nld->nkl", image_vectors[image_rows], text_vectors[text_rows])


def paired_items(per_group=12):
    """tiny_magic with each l1 concept's hard negatives one other concept: a draw with replacement of M-1 = 1 is
    forced, so the authors' items and ours must be the same items."""
    magic, _ = tiny_magic(per_group=per_group)
    l1 = [n.id for n in magic.nodes_at(1)]
    for i, nid in enumerate(l1):
        magic.nodes[nid].hard_negatives = [l1[(i + 1) % len(l1)]]
    return build_items(magic)


# --------------------------------------------------------------------------------------------- forced choice
@pytest.mark.parametrize("key", ["caption", "generalized", "l1", "l2", "l4"])
def test_as_published_items_are_the_authors_items(key):
    """Same anchors, first texts, negative images (each concept's first test image) and their first texts, and
    no check against the anchor (at l2-l4 the negative's name is the anchor's in tiny_magic)."""
    items = paired_items()
    field = items.field(key)
    ours = sample_forced_choice(items, field, 2, seed=3, protocol="as_published")
    theirs = authors_evaluation_items(items, field, 2, lambda pool, k: [pool[0]] * k)
    assert [(int(a), t) for a, t in zip(ours.anchors, ours.anchor_texts)] == [(r, t) for r, t, _, _ in theirs]
    assert ours.negative_images.tolist() == [rows for _, _, rows, _ in theirs]
    assert ours.negative_texts == [texts for _, _, _, texts in theirs]
    if key in ("l2", "l4"):  # siblings share their ancestors' names: identical texts are scored, not skipped
        assert any(t == n[0] for t, n in zip(ours.anchor_texts, ours.negative_texts))
    corrected = sample_forced_choice(items, field, 2, seed=3)
    assert corrected.protocol == "corrected" and ours.protocol == "as_published"


def test_as_published_draws_negative_concepts_with_replacement():
    """With M = 3 and every other concept a hard negative, some item gets the same concept twice (the corrected
    protocol never does), never its own; with a single hard negative the item is dropped (fewer than M-1), as in
    the authors' filter."""
    magic, _ = tiny_magic()
    l1 = [n.id for n in magic.nodes_at(1)]
    for nid in l1:
        magic.nodes[nid].hard_negatives = [o for o in l1 if o != nid]
    items = build_items(magic)
    field = items.field("caption")
    repeats = 0
    for seed in range(20):
        fc = sample_forced_choice(items, field, 3, seed=seed, protocol="as_published")
        groups = [[items.groups[j] for j in row] for row in fc.negative_images]
        assert all(items.groups[a] not in g for a, g in zip(fc.anchors, groups))
        repeats += sum(g[0] == g[1] for g in groups)
        assert all(len(set(g)) == 2 for g in ([items.groups[j] for j in row] for row in
                                               sample_forced_choice(items, field, 3, seed=seed).negative_images))
    assert repeats > 0
    single = sample_forced_choice(paired_items(), paired_items().field("caption"), 3, 0, protocol="as_published")
    assert single.anchors.size == 0 and single.excluded[NO_GROUPS] == single.n_items


def test_ties_go_to_the_anchor_as_in_the_authors_scoring():
    """score_forced_choice on as-published items equals their argmax rule on random embeddings, on embeddings
    where every image is the same vector (all ties: every item correct, wrong under the corrected rule) and with
    duplicated texts."""
    items = paired_items()
    rng = np.random.default_rng(0)
    for key in ("caption", "l2"):
        field = items.field(key)
        fc = sample_forced_choice(items, field, 2, seed=1, protocol="as_published")
        names = sorted({t for texts in field.texts for t in texts})
        index = {t: i for i, t in enumerate(names)}
        text_vectors = rng.normal(size=(len(names), 8))
        for images in (rng.normal(size=(len(field.texts), 8)), np.ones((len(field.texts), 8))):
            t2i, i2t = score_forced_choice(fc, images, text_vectors, index)
            image_rows = np.concatenate([fc.anchors[:, None], fc.negative_images], axis=1)
            text_rows = np.array([[index[t] for t in [a, *n]] for a, n in zip(fc.anchor_texts, fc.negative_texts)])
            their_i2t, their_t2i = authors_evaluate_scores(batch_scores(images, text_vectors, image_rows, text_rows))
            assert t2i.tolist() == their_t2i.tolist() and i2t.tolist() == their_i2t.tolist()
        assert t2i.sum() == fc.anchors.size  # identical images: every text->image choice a tie, won by the anchor
        corrected = score_forced_choice(sample_forced_choice(items, field, 2, seed=1), images, text_vectors, index)
        assert corrected[0].sum() == 0


# ------------------------------------------------------------------------------------------------ HierarCaps
def authors_hierarcaps_loader(raw_data, batch_size, random):
    """HierarcapsEvaluationDataset._load_data and the lookup of its __getitem__, literally (`random`: a seeded
    stand-in for Python's random module). Returns self.data and, per entry, its negatives' entries (None: the entry
    returns [], [] and train.py's evaluate skips it)."""
    processed_data_initial = []
    for concept_data in raw_data:
        images = concept_data["images"]
        for image_id in images:
            processed_data_initial.append({
                'image_id': image_id,
                'concept_level1': random.choice(concept_data["general_captions_level1"]),
                'concept_level2': random.choice(concept_data["general_captions_level2"]),
                'concept_level3': random.choice(concept_data["general_captions_level3"]),
                'concept_level4': random.choice(concept_data["general_captions_level4"]),
                'hard_negatives': [concept["concept"] for concept in random.choices(raw_data, k=batch_size - 1)]
            })
    data = processed_data_initial
    negatives_per_item = []
    for item in data:
        found = []
        for hard_negative in item["hard_negatives"]:
            hard_negative_item = None
            for other_item in data:
                if hard_negative == other_item["concept_level4"]:
                    hard_negative_item = other_item
                    break
            if hard_negative_item is None:
                found = None
                break
            found.append(hard_negative_item)
        negatives_per_item.append(found)
    return data, negatives_per_item


def authors_evaluated_loader(raw_data, batch_size, seed):
    """Their main.py: random.seed(args.seed), the loader built for training (get_train_data), then the one scored."""
    stand_in = random.Random(seed)
    authors_hierarcaps_loader(raw_data, batch_size, stand_in)
    return authors_hierarcaps_loader(raw_data, batch_size, stand_in)


def toy_records():
    """Records with several images and several texts per level, level-4 texts that repeat across records, and one
    concept ("a cat on a mat") that no entry can carry at level 4."""
    def record(images, l4_options, concept):
        return PublishedRecord(tuple(images), (("animal", "pet"), ("dog",), ("dog on grass", "dog outside"),
                                               tuple(l4_options)), concept)
    return [record(["a", "b"], ["a dog runs", "a dog sits"], "a dog runs"),
            record(["c"], ["a bird flies"], "a bird flies"),
            record(["d", "e", "f"], ["a dog sits", "a horse trots"], "a dog sits"),
            record(["g"], ["a fish swims"], "a cat on a mat"),
            record(["h"], ["a horse trots", "a bird flies"], "a horse trots")]


def as_json(records):
    return [{"images": list(r.images), "concept": r.concept,
             **{f"general_captions_level{k + 1}": list(texts) for k, texts in enumerate(r.level_texts)}}
            for r in records]


@pytest.mark.parametrize("choices", [2, 3])
def test_hierarcaps_published_draws_what_the_authors_loader_draws(choices):
    """Entry by entry, for the same seed: each level's text (random.choice of the record's), the negatives found
    for the concepts drawn from the records at load time (the entry's own record allowed, the first entry with
    that level-4 text), and the entries skipped because a concept matched none, counted."""
    records, skipped_somewhere, not_first_text, same_level4 = toy_records(), 0, 0, 0
    for seed in range(12):
        ours = published_draw(records, choices, seed)
        data, negatives = authors_evaluated_loader(as_json(records), choices, seed)
        assert ours.image_ids == [item["image_id"] for item in data]
        assert ours.texts == [tuple(item[f"concept_level{k}"] for k in range(1, 5)) for item in data]
        row_of = {id(item): row for row, item in enumerate(data)}
        kept = [row for row, found in enumerate(negatives) if found is not None]
        assert ours.anchors.tolist() == kept
        assert ours.negatives.tolist() == [[row_of[id(n)] for n in negatives[row]] for row in kept]
        assert ours.unmatched == len(data) - len(kept)
        skipped_somewhere += ours.unmatched
        not_first_text += sum(t != (r.level_texts[0][0]) for t, r in zip(
            [levels[0] for levels in ours.texts], [r for r in records for _ in r.images]))
        same_level4 += sum(data[row]["concept_level4"] == data[n]["concept_level4"]
                          for row, found in zip(kept, ours.negatives) for n in found)
    assert skipped_somewhere and not_first_text and same_level4  # every path of their loader was exercised


def test_hierarcaps_items_are_one_record_each_and_every_drawn_concept_matches():
    """Our reading of their file: one record per item, its level-4 text its concept; so nothing is skipped, an item
    can draw itself, and a drawn duplicate level-4 text finds its first copy."""
    chains = [("animal", "dog", "dog on grass", "a dog runs"), ("animal", "bird", "bird in sky", "a bird flies"),
              ("vehicle", "car", "red car", "a dog runs"), ("animal", "cat", "cat indoors", "a cat sleeps")]
    items = [HierarCapsItem(f"img{i}", Path(f"img{i}.jpg"), c) for i, c in enumerate(chains)]
    draws = [published_draw(records_from_items(items), 2, seed) for seed in range(30)]
    assert all(d.unmatched == 0 and d.anchors.tolist() == [0, 1, 2, 3] for d in draws)
    assert all(d.texts == chains for d in draws)
    negatives = np.concatenate([d.negatives[:, 0] for d in draws])
    assert (negatives == np.tile(np.arange(4), 30)).any()  # some item drew itself
    assert 2 not in negatives and 0 in negatives  # item 2 shares item 0's level-4 text: it is found as item 0
    with pytest.raises(ValueError, match="eval.choices must be at least 2"):
        published_draw(records_from_items(items), 1, 0)


def test_hierarcaps_published_scores_equal_the_authors_argmax_and_self_draws_tie():
    """Per-entry correctness equals their argmax over [anchor, negative]; an entry that drew itself ties and is
    counted correct; chance is 1/2 except for such entries; a skipped entry is not scored."""
    rng = np.random.default_rng(2)
    n = 12
    texts = [f"text {i % 9}" for i in range(n)]  # some strings repeat, as at HierarCaps levels 1-2
    index = {t: i for i, t in enumerate(sorted(set(texts)))}
    text_vectors, images = rng.normal(size=(len(index), 6)), rng.normal(size=(n, 6))
    anchors = np.array([i for i in range(n) if i != 7])  # entry 7 was skipped
    negatives = np.array([[(i * 5 + 1) % n] for i in anchors])
    negatives[4, 0] = 4  # entry 4 drew itself
    draw = PublishedDraw([f"img{i}" for i in range(n)], [(t, "x", "y", "z") for t in texts], anchors, negatives, 1)
    out = published_accuracy([draw], 1, images, text_vectors, index)
    image_rows = np.concatenate([anchors[:, None], negatives], axis=1)
    text_rows = np.array([[index[texts[j]] for j in row] for row in image_rows])
    their_i2t, their_t2i = authors_evaluate_scores(batch_scores(images, text_vectors, image_rows, text_rows))
    t2i, i2t = out[("t2i", "accuracy")], out[("i2t", "accuracy")]
    assert t2i.scores.values.tolist() == their_t2i.tolist() and i2t.scores.values.tolist() == their_i2t.tolist()
    assert t2i.scores.units.tolist() == anchors.tolist()
    assert t2i.scores.values[4] == 1.0 and i2t.scores.values[4] == 1.0
    k = len(anchors)
    same_text = sum(texts[a] == texts[m[0]] for a, m in zip(anchors, negatives))  # includes entry 4
    assert t2i.chance == pytest.approx((k - 1) * 0.5 / k + 1 / k)
    assert i2t.chance == pytest.approx(((k - same_text) * 0.5 + same_text) / k)
    with pytest.raises(ValueError, match="one per entry"):
        published_accuracy([draw], 1, images[:5], text_vectors, index)


# ------------------------------------------------------------------------------- what the corrections change
def test_image_means_pair_two_protocols_by_image():
    """Per image (and training seed) mean correctness over the images asked for, in their order."""
    from cglib.evaluate.bootstrap import Scores
    from cglib.evaluate.protocols import image_means

    scores = Scores(np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]]), np.array([7, 7, 3, 9]))
    out = image_means(scores, np.array([3, 7]))
    assert out.units.tolist() == [3, 7] and out.values.tolist() == [[1.0, 0.5], [1.0, 0.0]]


def test_protocol_changes_recover_a_known_shift():
    """Two protocols whose per-image accuracies differ by a known amount on shared
    images give that change with a CI around it, Holm-corrected; a column without its published twin is absent."""
    import pandas as pd

    from cglib.evaluate.bootstrap import Scores
    from cglib.evaluate.protocols import protocol_changes, protocol_changes_markdown

    rng = np.random.default_rng(0)
    n = 400
    units = np.arange(n)
    metrics = pd.DataFrame([{"model": m, "benchmark": b, "labels": "dag", "direction": "t2i", "metric": "accuracy",
                             "level": "l1"} for m in ("a", "b") for b in ("forced_choice", "forced_choice_published")])
    base = (rng.random(n) < 0.6).astype(float)
    flip = rng.random(n) < 0.2  # the corrected protocol gets these items right, the published one wrong
    corrected = np.maximum(base, flip.astype(float))
    scores = {("forced_choice", "dag", "t2i", "accuracy", "l1"): {m: Scores(corrected, units) for m in "ab"},
              ("forced_choice_published", "dag", "t2i", "accuracy", "l1"): {m: Scores(base, units) for m in "ab"}}
    changes = protocol_changes(metrics, scores, resamples=500, ci=0.95, seed=0)
    row = changes.set_index("column").loc["MAGIC l1"]
    expected = 100 * (corrected.mean() - base.mean())
    assert row["change"] == pytest.approx(expected) and row["ci_low"] < expected < row["ci_high"]
    assert row["ci_low"] > 0 and bool(row["significant"]) and (row["models"], row["images"]) == (2, n)
    assert "| MAGIC l1 | +" in "\n".join(protocol_changes_markdown(changes))
