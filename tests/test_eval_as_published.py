"""The evaluation as the authors' code ran it (issue #32 items 1-2): forced choice and HierarCaps columns against
literal re-implementations of their `EvaluationDataset`, `HierarcapsEvaluationDataset` and `evaluate_scores`
(ai-lab-conf/CLEAR_GLASS, src/training/data.py and train.py) on toy data."""

from __future__ import annotations

import numpy as np
import pytest

from cglib.evaluate.forced_choice import NO_GROUPS, sample_forced_choice, score_forced_choice
from cglib.evaluate.hierarcaps import match_by_level4, published_accuracy, published_negatives
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
def test_hierarcaps_negatives_are_matched_by_their_level4_text():
    """The authors look a drawn concept up by its level-4 text: the first item with that text, so a drawn
    duplicate maps to the first copy; the item itself can be drawn."""
    level4 = ["a", "b", "c", "b", "d"]
    drawn = np.array([[3], [0], [1], [4], [2]])
    # literal: for other_item in data: if hard_negative == other_item["concept_level4"]: break
    literal = [[next(i for i, t in enumerate(level4) if t == level4[j]) for j in row] for row in drawn]
    assert match_by_level4(level4, drawn).tolist() == literal == [[1], [0], [1], [4], [2]]
    many = np.concatenate([published_negatives([f"t{i}" for i in range(6)], 2, seed) for seed in range(40)])
    assert (many[:, 0] == np.tile(np.arange(6), 40)).any()  # some item drew itself
    assert published_negatives(level4, 2, 5).tolist() == published_negatives(level4, 2, 5).tolist()


def test_hierarcaps_published_scores_equal_the_authors_argmax_and_self_draws_tie():
    """Per-item correctness equals their argmax over [anchor, negative]; an item that drew itself ties and is
    counted correct; chance is 1/2 except for such items."""
    rng = np.random.default_rng(2)
    n = 12
    texts = [f"text {i % 9}" for i in range(n)]  # some strings repeat, as at HierarCaps levels 1-2
    index = {t: i for i, t in enumerate(sorted(set(texts)))}
    text_vectors, images = rng.normal(size=(len(index), 6)), rng.normal(size=(n, 6))
    negatives = np.array([[(i * 5 + 1) % n] for i in range(n)])
    negatives[4, 0] = 4  # item 4 drew itself
    out = published_accuracy(texts, [negatives], images, text_vectors, index)
    image_rows = np.concatenate([np.arange(n)[:, None], negatives], axis=1)
    text_rows = np.array([[index[texts[j]] for j in row] for row in image_rows])
    their_i2t, their_t2i = authors_evaluate_scores(batch_scores(images, text_vectors, image_rows, text_rows))
    t2i, i2t = out[("t2i", "accuracy")], out[("i2t", "accuracy")]
    assert t2i.scores.values.tolist() == their_t2i.tolist() and i2t.scores.values.tolist() == their_i2t.tolist()
    assert t2i.scores.values[4] == 1.0 and i2t.scores.values[4] == 1.0
    same_text = sum(texts[i] == texts[negatives[i, 0]] for i in range(n))  # includes item 4
    assert t2i.chance == pytest.approx((n - 1) * 0.5 / n + 1 / n)
    assert i2t.chance == pytest.approx(((n - same_text) * 0.5 + same_text) / n)


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
