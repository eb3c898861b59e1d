"""The generalized-caption column of evaluation: per-image texts (magic.generalize: image), fallback images left
out and counted (issue 14 item 10), and the leakage note of the exposure column (issue 15 item 6)."""

from __future__ import annotations

import sys
from pathlib import Path

from cglib.evaluate.forced_choice import sample_forced_choice
from cglib.evaluate.items import FALLBACK_REASON, build_items
from cglib.evaluate.pipeline import leakage_note
from cglib.evaluate.table3 import table3_notes

sys.path.insert(0, str(Path(__file__).parent))
from factories import tiny_magic


def per_image_magic(fallback: set[str] = frozenset()):
    """tiny_magic in image mode: every image has its own generalized caption naming its id."""
    magic, _ = tiny_magic(per_group=4, test_fraction=0.5)
    magic.generalize = "image"
    for i, record in magic.images.items():
        record.generalized_captions = [f"own generalized caption of {i}"]
        if i in fallback:
            record.generalized_captions = record.captions[:1]
            record.generalized_fallback = True
    return magic


def test_each_test_image_is_scored_against_its_own_generalized_caption():
    """Image mode: the generalized field of a test image holds exactly its own caption; unit 'image'."""
    magic = per_image_magic()
    items = build_items(magic)
    gen = items.field("generalized")
    assert gen.unit == "image"
    assert [t for t in gen.texts] == [(f"own generalized caption of {i}",) for i in items.image_ids]
    fc = sample_forced_choice(items, gen, 2, seed=0)
    for anchor, text in zip(fc.anchors, fc.anchor_texts):
        assert text == f"own generalized caption of {items.image_ids[anchor]}"


def test_fallback_images_are_left_out_of_the_column_by_default_and_counted():
    """An image whose generalization failed takes no part in the generalized column (its fallback copies would
    score the original captions twice) and is counted; it stays in every other column; the flag scores it."""
    magic = per_image_magic()
    tests = magic.split_ids("test")
    magic = per_image_magic(fallback=set(tests[:2]))
    items = build_items(magic)
    gen = items.field("generalized")
    assert gen.n_without_text() == 2 and not any(gen.texts[items.image_ids.index(i)] for i in tests[:2])
    assert items.text_exclusions == {"generalized": {FALLBACK_REASON: 2}}
    assert items.field("caption").n_without_text() == 0 and items.field("l1").n_without_text() == 0
    fc = sample_forced_choice(items, gen, 2, seed=0)
    assert not {items.image_ids[a] for a in fc.anchors} & set(tests[:2])
    included = build_items(magic, include_generalized_fallback=True)
    assert included.field("generalized").n_without_text() == 0 and included.text_exclusions == {}


def test_group_mode_fallback_nodes_are_left_out_too():
    """Group mode: the images of a flagged l1 node are left out of the generalized column and counted."""
    magic, _ = tiny_magic(per_group=4, test_fraction=0.5)
    magic.nodes["l1:wedding"].generalized_fallback = True
    items = build_items(magic)
    n_wedding = sum(1 for g in items.groups if g == "l1:wedding")
    assert n_wedding and items.text_exclusions == {"generalized": {FALLBACK_REASON: n_wedding}}
    assert items.field("generalized").unit == "group"


def test_table3_notes_report_the_left_out_images():
    """The notes under Table 3 say how many test images the generalized column leaves out and why."""
    info = {"settings": {"bootstrap": 10, "choices": 2, "seeds": [0]}, "models": [],
            "items": {"n_test_images": 8, "n_groups": 2, "ground_truth": False,
                      "text_exclusions": {"generalized": {FALLBACK_REASON: 3}}}}
    assert any("3 test images whose generalization failed" in n for n in table3_notes(info))


def test_leakage_note_gives_per_level_shares_or_nothing():
    """The exposure note lists l1..l4 shares of training captions naming their concept; empty when none do."""
    magic = per_image_magic()
    assert leakage_note(magic) == ""
    train = magic.split_ids("train")
    magic.images[train[0]].generalized_captions = [f"a {magic.chain_names(train[0])[1]} outdoors"]  # its l2 name
    note = leakage_note(magic)
    assert note.startswith("its generalized training captions contain their concept names")
    assert f"l2 {100 / len(train):.1f}%" in note and "l1 0.0%" in note and f"of {len(train)})" in note


def test_umap_generalized_texts_are_each_images_own_in_image_mode():
    """The centroid maps read generalized texts through generalized_texts: one per image in image mode."""
    from cglib.viz.umap_centroids import group_texts

    magic = per_image_magic()
    ids = magic.split_ids("test")
    texts, groups = group_texts(magic, ids, "generalized")
    assert texts == [f"own generalized caption of {i}" for i in ids]
    assert groups == [magic.images[i].node for i in ids]
