"""Evaluation metrics on hand-built embeddings whose right answers are known, the forced-choice rules,
HierarCaps duplicates and hierarchical metric, and the bootstrap's coverage."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from cglib.data.hierarcaps import HierarCapsItem
from cglib.evaluate import report
from cglib.evaluate.bootstrap import (
    Scores,
    confidence_intervals,
    intervals_and_differences,
    paired_difference,
)
from cglib.evaluate.forced_choice import NO_VALID, sample_forced_choice, score_forced_choice
from cglib.evaluate.gallery import gallery_scores
from cglib.evaluate.hierarcaps import batch_partners, hierarchical_metric, in_batch_accuracy, level_retrieval
from cglib.evaluate.items import DAG, MagicItems, TextField, build_items
from cglib.evaluate.reading import read_results
from cglib.evaluate.retrieval import chance_recall, pessimistic_ranks, ranked_metrics
from cglib.evaluate.table3 import table3, table3_display, table3_markdown
from tests.factories import tiny_magic


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def on_circle(cosines) -> np.ndarray:
    """Unit vectors in 2-D whose cosine with (1, 0) is each given value (second coordinate positive)."""
    c = np.asarray(cosines, dtype=np.float64)
    return np.stack([c, np.sqrt(1 - c ** 2)], axis=1).astype(np.float32)


# ------------------------------------------------------------------------------------------ retrieval
def test_pessimistic_ranks_put_ties_last():
    """Tied items share the worst rank of their tie group."""
    ranks = pessimistic_ranks(np.array([[0.9, 0.5, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3]]))
    assert ranks.tolist() == [[1, 3, 3, 4], [4, 4, 4, 4]]


def test_recall_precision_and_ap_on_known_ranking():
    """Query (1,0) ranks images 0..4 in order (cosines .9 .8 .7 .6 .5); relevant {1, 3}: R@1=0, R@2=1,
    P@2=1/2, P@5=2/5, AP=(1/2 + 2/4)/2=0.5. Query (0,1) ranks them 4..0; relevant {4}: all 1."""
    gallery = on_circle([0.9, 0.8, 0.7, 0.6, 0.5])
    queries = np.array([[1, 0], [0, 1]], dtype=np.float32)
    relevant = sparse.csr_matrix(np.array([[0, 1, 0, 1, 0], [0, 0, 0, 0, 1]]))
    m = ranked_metrics(queries, gallery, relevant, ks=[1, 2, 5], precision=True, average_precision=True)
    np.testing.assert_allclose(m["R@1"], [0, 1])
    np.testing.assert_allclose(m["R@2"], [1, 1])
    np.testing.assert_allclose(m["R@5"], [1, 1])
    np.testing.assert_allclose(m["P@1"], [0, 1])
    np.testing.assert_allclose(m["P@2"], [0.5, 0.5])
    np.testing.assert_allclose(m["P@5"], [0.4, 0.2])
    np.testing.assert_allclose(m["mAP"], [0.5, 1.0])


def test_degenerate_model_cannot_win_by_index_order():
    """Identical image embeddings tie everything: the relevant image is ranked last, R@1 = 0 (faiss would
    otherwise return the lowest index first and count a lucky hit)."""
    gallery = np.tile(unit([1, 1]), (4, 1))
    relevant = sparse.csr_matrix(np.eye(4)[[0]])
    m = ranked_metrics(unit([[1, 0]]), gallery, relevant, ks=[1, 3], average_precision=True)
    assert m["R@1"][0] == 0 and m["R@3"][0] == 0
    assert m["mAP"][0] == pytest.approx(1 / 4)


def test_queries_without_relevant_items_are_an_error():
    """A query no gallery item answers would silently score 0: it must be removed and counted instead."""
    with pytest.raises(ValueError, match="no relevant"):
        ranked_metrics(unit([[1, 0]]), unit([[1, 0], [0, 1]]), sparse.csr_matrix(np.zeros((1, 2))), ks=[1])


def test_chance_recall_is_the_hypergeometric_hit_probability():
    """Random ranking of G=10 with r=2 relevant: P(hit in top 3) = 1 - C(8,3)/C(10,3) = 1 - 56/120."""
    assert chance_recall(np.array([2]), 10, 3)[0] == pytest.approx(1 - 56 / 120)
    assert chance_recall(np.array([1]), 5, 1)[0] == pytest.approx(0.2)


def test_gallery_concept_queries_hit_any_image_under_the_concept():
    """Text 'sport' carried by images 1 and 2: retrieving image 2 first is a hit, P@2 = 1, AP = 1; images query
    the two distinct strings: image 0 ('meal') ranks 'meal' first."""
    field = TextField("l2", DAG, (("meal",), ("sport",), ("sport",)), unit="query", level=2)
    texts = ["meal", "sport"]
    text_vectors = unit([[1, 0], [0, 1]])
    images = unit([[1, 0.1], [0.3, 1], [0.1, 1]])
    out = gallery_scores(field, images, text_vectors, {t: i for i, t in enumerate(texts)}, ks=[1, 2],
                         group_ids=np.zeros(3, int))
    t2i = {m: out[("t2i", m)].scores.values.tolist() for m in ("R@1", "P@2", "mAP")}
    assert t2i == {"R@1": [1.0, 1.0], "P@2": [0.5, 1.0], "mAP": [1.0, 1.0]}
    assert out[("i2t", "R@1")].scores.values.tolist() == [1.0, 1.0, 1.0]
    # 'sport' has 2 relevant images of 3: a random first pick hits with probability 2/3
    assert out[("t2i", "R@1")].chance == pytest.approx((1 / 3 + 2 / 3) / 2)


def test_caption_queries_are_clustered_by_their_image():
    """Caption queries of one image share its resampling unit (the bootstrap resamples images, not captions)."""
    field = TextField("caption", DAG, (("a", "b"), ("c",)), unit="image")
    vectors = unit([[1, 0], [1, 0.1], [0, 1]])
    out = gallery_scores(field, unit([[1, 0], [0, 1]]), vectors, {"a": 0, "b": 1, "c": 2}, ks=[1],
                         group_ids=np.zeros(2, int))
    assert out[("t2i", "R@1")].scores.units.tolist() == [0, 0, 1]
    assert out[("t2i", "R@1")].scores.values.tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------------------------- forced choice
def crossed_items() -> MagicItems:
    """tiny_magic's items with every l1 group a hard negative of every other, so l2-l4 have valid negatives
    (other branches) and invalid ones (siblings with the same ancestor string)."""
    magic, _ = tiny_magic()
    l1 = [n.id for n in magic.nodes_at(1)]
    for nid in l1:
        magic.nodes[nid].hard_negatives = [o for o in l1 if o != nid]
    return build_items(magic)


def test_negatives_never_share_the_anchor_text_and_come_from_distinct_hard_negative_groups():
    """At every text type, with M = 3: each negative's image lacks the anchor's text, its text is not one of the
    anchor's, the M-1 groups are distinct hard negatives of the anchor's group, never its own group."""
    items = crossed_items()
    for field in items.fields:
        fc = sample_forced_choice(items, field, choices=3, seed=0)
        for a, text, negs, neg_texts in zip(fc.anchors, fc.anchor_texts, fc.negative_images, fc.negative_texts):
            groups = [items.groups[j] for j in negs]
            assert len(set(groups)) == 2 and items.groups[a] not in groups
            assert all(g in items.negatives[items.groups[a]] for g in groups)
            for j, t in zip(negs, neg_texts):
                assert text not in field.texts[j] and t not in field.texts[a] and t in field.texts[j]
        assert fc.anchors.size + sum(fc.excluded.values()) == len(items.image_ids)


def test_identical_ancestor_groups_are_skipped_not_scored():
    """In tiny_magic every hard negative is a sibling (same l2, l3, l4): at l2-l4 no valid negative exists, so
    every item is excluded and counted; at l1 none is."""
    magic, _ = tiny_magic()
    items = build_items(magic)
    for key, n_valid in (("l1", 12), ("l2", 0), ("l4", 0)):
        fc = sample_forced_choice(items, items.field(key), 2, seed=0)
        assert fc.anchors.size == n_valid
        assert fc.excluded.get(NO_VALID, 0) == 12 - n_valid


def test_level_negative_source_uses_the_level_nodes_hard_negatives():
    """negative_source='level': at l2 the negatives come from the hard negatives of the image's l2 node."""
    magic, _ = tiny_magic()
    magic.nodes["l2:sport"].hard_negatives = ["l2:meal"]
    magic.nodes["l2:meal"].hard_negatives = ["l2:sport"]
    items = build_items(magic)
    fc = sample_forced_choice(items, items.field("l2"), 2, seed=0, negative_source="level")
    nodes = items.nodes_at(2)
    assert fc.anchors.size == sum(n in ("l2:sport", "l2:meal") for n in nodes)
    for a, (j,) in zip(fc.anchors, fc.negative_images):
        assert {nodes[a], nodes[j]} == {"l2:sport", "l2:meal"}


def test_forced_choice_is_deterministic_per_seed():
    """The same seed draws the same items; another seed draws different ones."""
    items = crossed_items()
    field = items.field("caption")
    a, b = sample_forced_choice(items, field, 3, 7), sample_forced_choice(items, field, 3, 7)
    c = sample_forced_choice(items, field, 3, 8)
    assert a.anchor_texts == b.anchor_texts and np.array_equal(a.negative_images, b.negative_images)
    assert a.negative_texts == b.negative_texts
    assert a.anchor_texts != c.anchor_texts or not np.array_equal(a.negative_images, c.negative_images)


def test_forced_choice_scores_known_embeddings_and_counts_ties_as_wrong():
    """Each text equals its own image's vector: every item is right both ways; with all images identical
    every text->image choice is a tie, and ties are wrong."""
    items = crossed_items()
    field = items.field("l1")
    fc = sample_forced_choice(items, field, 2, seed=0)
    names = sorted({t for texts in field.texts for t in texts})
    index = {t: i for i, t in enumerate(names)}
    text_vectors = np.eye(len(names), dtype=np.float32)
    images = text_vectors[[index[t[0]] for t in field.texts]]
    t2i, i2t = score_forced_choice(fc, images, text_vectors, index)
    assert t2i.tolist() == [1.0] * fc.anchors.size and i2t.tolist() == [1.0] * fc.anchors.size
    t2i, _ = score_forced_choice(fc, np.ones_like(images) / math.sqrt(images.shape[1]), text_vectors, index)
    assert t2i.sum() == 0
    # the opposite assignment (each image looks like another group's name) is always wrong
    shifted = text_vectors[[(index[t[0]] + 1) % len(names) for t in field.texts]]
    t2i, i2t = score_forced_choice(fc, shifted, text_vectors, index)
    assert 0 <= t2i.mean() < 1 and 0 <= i2t.mean() < 1


# ---------------------------------------------------------------------------------------- HierarCaps
def hc_items(chains: list[tuple[str, str, str, str]]) -> list[HierarCapsItem]:
    from pathlib import Path

    return [HierarCapsItem(f"img{i}", Path(f"img{i}.jpg"), c) for i, c in enumerate(chains)]


def test_hierarcaps_level_retrieval_counts_any_image_with_the_same_text():
    """Items 0 and 1 both say 'dog' at level 1; the text 'dog' retrieves image 1 first: a hit for item 0 too."""
    texts = ["dog", "dog", "cat"]
    text_vectors = unit([[1, 0], [0, 1]])
    index = {"dog": 0, "cat": 1}
    images = unit([[0.9, 0.4], [1, 0.1], [0, 1]])
    out = level_retrieval(texts, images, text_vectors, index, ks=[1])
    assert out[("t2i", "R@1")].scores.values.tolist() == [1.0, 1.0, 1.0]
    assert out[("t2i", "R@1")].scores.units.tolist() == [0, 1, 2]
    assert out[("i2t", "R@1")].scores.values.tolist() == [1.0, 1.0, 1.0]


def test_in_batch_partners_are_distinct_others():
    """Each item's B-1 rivals are distinct and never itself."""
    partners = batch_partners(20, 6, seed=3)
    assert partners.shape == (20, 5)
    assert all(len(set(row)) == 5 and i not in row for i, row in enumerate(partners.tolist()))
    with pytest.raises(ValueError, match="hierarcaps_batch"):
        batch_partners(5, 6, seed=0)


def test_in_batch_same_text_rival_is_a_hit_and_chance_reflects_duplicates():
    """B = 2 over 2 items with the same text: any pick is right (accuracy 1, chance 1)."""
    out = in_batch_accuracy(["dog", "dog"], unit([[1, 0], [0, 1]]), unit([[1, 1]]), {"dog": 0}, 2, [0])
    assert out[("t2i", "R@1")].scores.values.tolist() == [1.0, 1.0]
    assert out[("t2i", "R@1")].chance == 1.0


def test_hierarchical_metric_matches_a_hand_computation():
    """Worked example, root r = (1,0,0), d = |e - r|, 3 radii.

    Item A texts t1=(.8,.6,0) d=sqrt(.4)=.632, t2=(.6,.8,0) d=sqrt(.8)=.894, t3=(0,1,0) d=sqrt(2)=1.414,
    t4=(.28,.96,0) d=sqrt(.5184+.9216)=1.2. Item B texts u1=(.8,0,.6) .632, u2=(.6,0,.8) .894, u3=(0,0,1) 1.414,
    u4=(-.6,0,.8) sqrt(3.2)=1.789. Radii = linspace(.632, 1.789, 3) = .632, 1.211, 1.789.
    Image A = (0,1,0): cos t1 .6, t2 .8, t3 1, t4 .96, u* 0. Radius .632: {t1, u1} -> t1; 1.211: {t1,t2,t4,u1,u2}
    -> t4; 1.789: all -> t3. Predicted {t1,t4,t3}: precision 3/3 = 1, recall 3/4.
    Image B = (0,.8,.6): cos t1 .48, t2 .64, t3 .8, t4 .768, u1 .36, u2 .48, u3 .6, u4 .48. Radius .632 -> t1;
    1.211 -> t4; 1.789 -> t3. Predicted {t1,t4,t3}, none of B's: precision 0, recall 0.
    Means: precision 0.5, recall 0.375. Kendall tau of d vs level: A's d order t1<t2<t4<t3 -> one discordant
    pair of 6 -> (5-1)/6 = 2/3; B increasing -> 1; mean 5/6.
    """
    a = ("t1", "t2", "t3", "t4")
    b = ("u1", "u2", "u3", "u4")
    vectors = {"t1": [.8, .6, 0], "t2": [.6, .8, 0], "t3": [0, 1, 0], "t4": [.28, .96, 0],
               "u1": [.8, 0, .6], "u2": [.6, 0, .8], "u3": [0, 0, 1], "u4": [-.6, 0, .8]}
    names = sorted(vectors)
    text_vectors = np.array([vectors[n] for n in names], dtype=np.float32)
    images = np.array([[0, 1, 0], [0, .8, .6]], dtype=np.float32)
    result = hierarchical_metric(hc_items([a, b]), images, text_vectors, {n: i for i, n in enumerate(names)},
                                 root_vector=np.array([1, 0, 0], dtype=np.float32), radii=3)
    np.testing.assert_allclose(result.thresholds, [math.sqrt(.4), (math.sqrt(.4) + math.sqrt(3.2)) / 2,
                                                   math.sqrt(3.2)], rtol=1e-6)
    assert result.precision.values.tolist() == [1.0, 0.0]
    assert result.recall.values.tolist() == [0.75, 0.0]
    np.testing.assert_allclose(result.kendall_tau.values, [2 / 3, 1.0])
    assert result.n_tau_undefined == 0


def test_kendall_tau_undefined_when_all_levels_tie_is_counted():
    """A chain with the same string at all 4 levels has no order to correlate: left out and counted."""
    items = hc_items([("x", "x", "x", "x"), ("a", "b", "c", "d")])
    names = ["a", "b", "c", "d", "x"]
    vecs = unit([[1, .1, 0], [1, .3, 0], [1, .6, 0], [1, 1, 0], [1, .5, 0]])
    result = hierarchical_metric(items, unit([[0, 1, 0], [0, 1, 0]]), vecs, {n: i for i, n in enumerate(names)},
                                 root_vector=unit([1, 0, 0]), radii=5)
    assert result.n_tau_undefined == 1 and result.kendall_tau.units.tolist() == [1]
    assert result.kendall_tau.values[0] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_ci_covers_the_true_value_at_about_the_nominal_rate():
    """200 simulated test sets of 150 Bernoulli(0.7) items: the 95% percentile interval covers 0.7 in
    [90%, 99%] of them."""
    rng = np.random.default_rng(0)
    covered = 0
    for sim in range(200):
        values = (rng.random(150) < 0.7).astype(float)
        iv = confidence_intervals([Scores(values, np.arange(150))], 1000, 0.95, seed=sim)[0]
        covered += iv.low <= 0.7 <= iv.high
    assert 0.90 <= covered / 200 <= 0.99


def test_cluster_bootstrap_covers_with_correlated_queries():
    """Queries correlated within units (5 captions of an image share its difficulty): resampling units keeps
    the nominal coverage (resampling queries would be too narrow)."""
    rng = np.random.default_rng(1)
    covered = 0
    for sim in range(200):
        p = rng.beta(2, 1, size=60)  # per-image difficulty, mean 2/3
        values = (rng.random((60, 5)) < p[:, None]).astype(float).ravel()
        units = np.repeat(np.arange(60), 5)
        iv = confidence_intervals([Scores(values, units)], 1000, 0.95, seed=sim)[0]
        covered += iv.low <= 2 / 3 <= iv.high
    assert 0.90 <= covered / 200 <= 0.99


def test_paired_difference_is_exact_and_narrower_than_unpaired():
    """b = a with 30 of 200 failures turned into successes: difference a - b = -0.15 exactly, its paired CI
    excludes 0, is much narrower than independent intervals would suggest and matches normal theory; identical models differ by exactly 0."""
    rng = np.random.default_rng(2)
    a = (rng.random(200) < 0.6).astype(float)
    b = a.copy()
    b[np.flatnonzero(a == 0)[:30]] = 1.0
    units = np.arange(200)
    d = paired_difference(Scores(a, units), Scores(b, units), 1000, 0.95, seed=0)
    assert d.value == pytest.approx(-0.15) and d.high < 0 and d.significant
    ia, ib = confidence_intervals([Scores(a, units), Scores(b, units)], 1000, 0.95, seed=0)
    assert d.high - d.low < 0.75 * math.hypot(ia.high - ia.low, ib.high - ib.low)
    # ~ normal theory for a paired 0/1 difference: 2 * 1.96 * sqrt(0.15 * 0.85 / 200) = 0.099
    assert d.high - d.low == pytest.approx(2 * 1.96 * math.sqrt(0.15 * 0.85 / 200), rel=0.2)
    same = paired_difference(Scores(a, units), Scores(a, units), 500, 0.95, seed=0)
    assert (same.value, same.low, same.high, same.significant) == (0.0, 0.0, 0.0, False)


def test_intervals_are_deterministic_and_need_identical_items():
    """Same seed, same interval; scores on different items cannot be compared pairwise."""
    s = Scores(np.array([1.0, 0.0, 1.0, 1.0]), np.arange(4))
    first, _ = intervals_and_differences({"m": s}, [], 300, 0.95, seed=4, stream="x")
    again, _ = intervals_and_differences({"m": s}, [], 300, 0.95, seed=4, stream="x")
    assert first == again
    with pytest.raises(ValueError, match="identical items"):
        paired_difference(s, Scores(s.values, np.array([0, 1, 2, 5])), 10, 0.95, seed=0)


# -------------------------------------------------------------------------------------------- report
def toy_metrics() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, diffs = [], []
    for model, base in (("zero-shot", 0.5), ("clip", 0.6), ("pairwise", 0.7)):
        for i, level in enumerate(["caption", "generalized", "l1", "l2"]):
            rows.append({"model": model, "benchmark": "forced_choice", "labels": "dag", "direction": "t2i",
                         "metric": "accuracy", "level": level, "value": base + 0.01 * i, "ci_low": base - 0.05,
                         "ci_high": base + 0.05, "n": 100, "n_queries": 100, "n_excluded": 0, "chance": 0.5,
                         "exposed_to_eval_strings": model == "pairwise", "exposure": ""})
    for level, (d, lo, hi) in {"l1": (0.1, 0.02, 0.18), "l2": (0.03, -0.04, 0.1)}.items():
        diffs.append({"model_a": "pairwise", "model_b": "clip", "benchmark": "forced_choice", "labels": "dag",
                      "direction": "t2i", "metric": "accuracy", "level": level, "difference": d, "ci_low": lo,
                      "ci_high": hi, "n": 100, "significant": lo > 0})
    return pd.DataFrame(rows, columns=report.METRIC_COLUMNS), pd.DataFrame(diffs, columns=report.DIFF_COLUMNS)


def test_reading_states_significance_from_the_paired_ci():
    """A difference whose CI excludes 0 is stated as a win with its CI; one whose CI includes 0 is 'no
    significant difference'; a model whose CI covers chance is called indistinguishable from chance."""
    metrics, diffs = toy_metrics()
    text = read_results(metrics, diffs, [("pairwise", "clip")])
    assert "pairwise beats clip at l1 by 10.0 points (95% CI [2.0, 18.0])" in text[0]
    assert "no significant difference (paired CI includes 0) at l2 (+3.0 [-4.0, 10.0])" in text[0]
    assert any(s.startswith("zero-shot: indistinguishable from chance") for s in text)
    reverse = read_results(metrics, diffs, [("clip", "pairwise")])
    assert "clip is worse than pairwise at l1 by 10.0 points (95% CI [-18.0, -2.0])" in reverse[0]


def test_table3_marks_exposed_models_and_formats_cis():
    """Table 3 has one row per model with value and CI per column; exposed models carry a dagger."""
    metrics, _ = toy_metrics()
    table = table3(metrics)
    assert list(table.index) == ["zero-shot", "clip", "pairwise"]
    assert table.loc["clip", "MAGIC l1"] == pytest.approx(62.0)
    shown = table3_display(table)
    assert "pairwise †" in shown.index and shown.loc["clip", "COCO"] == "60.0 [55.0, 65.0]"
    md = table3_markdown(table, ["note"])
    assert "| pairwise † |" in md and "- note" in md


def test_wide_table_names_directions_and_keeps_correlations_unscaled():
    """COCO/hierarchy tables: one column per direction and metric; rates in percent, Kendall tau as is."""
    metrics, _ = toy_metrics()
    tau = metrics.iloc[[0]].assign(benchmark="hierarcaps_hierarchy", labels="hierarcaps", direction="-",
                                   metric="kendall_tau", level="all", value=0.7, ci_low=0.65, ci_high=0.75)
    acc = metrics.iloc[[0]].assign(benchmark="hierarcaps_hierarchy", labels="hierarcaps", direction="i2t",
                                   metric="recall", level="all")
    table = report.wide_table(pd.concat([acc, tau]), "hierarcaps_hierarchy", "hierarcaps", "all")
    assert list(table.columns) == ["image->text recall", "kendall_tau"]
    assert table.loc["zero-shot", "kendall_tau"] == "0.700 [0.650, 0.750]"
    assert table.loc["zero-shot", "image->text recall"] == "50.0 [45.0, 55.0]"


def test_accuracy_by_level_figure_has_a_panel_and_band_per_model():
    """Fig. 4's absolute values from a metrics table: one panel per model (a dagger for an exposed one), each with
    its line and CI band, the zero-shot line in the others, and chance."""
    from cglib.viz.eval_figures import plot_accuracy_by_level

    metrics, _ = toy_metrics()
    fig = plot_accuracy_by_level(metrics)
    assert [ax.get_title() for ax in fig.axes] == ["zero-shot", "clip", "pairwise †"]
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 3, 3]  # own line, (zero-shot line), chance
    assert all(len(ax.collections) == 1 for ax in fig.axes)
    with pytest.raises(ValueError, match="no rows"):
        plot_accuracy_by_level(metrics, benchmark="hierarcaps")


def test_chunked_search_equals_one_pass(monkeypatch):
    """Searching the queries in small chunks (to bound memory at paper scale) gives the same per-query metrics."""
    from cglib.evaluate import retrieval

    rng = np.random.default_rng(5)
    queries, gallery = unit(rng.normal(size=(40, 8))), unit(rng.normal(size=(30, 8)))
    relevant = sparse.csr_matrix((rng.random((40, 30)) < 0.1) | np.eye(40, 30, dtype=bool))
    whole = ranked_metrics(queries, gallery, relevant, [1, 5], precision=True, average_precision=True)
    monkeypatch.setattr(retrieval, "QUERY_CHUNK_CELLS", 70)  # 2 queries per chunk at full depth
    chunked = ranked_metrics(queries, gallery, relevant, [1, 5], precision=True, average_precision=True)
    for name in whole:
        np.testing.assert_array_equal(whole[name], chunked[name])


# ---------------------------------------------------------------------------------------- embeddings
@pytest.fixture(scope="module")
def tiny_bundle():
    from cglib.config import ModelParams
    from cglib.models import build_model
    from cglib.run import seed_everything

    seed_everything(0)
    return build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm"))


def test_trimmed_text_encoding_equals_the_models_own(tiny_bundle):
    """Cutting each text to its own length (HF tower, batches of texts of one length) gives the same embeddings as
    the full padded context, in input order."""
    import torch

    from cglib.encoding import encode_texts

    texts = ["a dog", "a very long caption about a birthday party with a cake and many balloons", "x", "picnic"]
    with torch.no_grad():
        full_context = tiny_bundle.model.encode_text(tiny_bundle.tokenizer(texts), normalize=True).numpy()
    np.testing.assert_allclose(encode_texts(tiny_bundle, texts), full_context, atol=1e-5)


def test_embedding_cache_is_keyed_by_weights_and_items(tmp_path, tiny_bundle):
    """Second call: nothing recomputed. New image-tower weights: images recomputed, texts reused (same text
    tower). New strings: texts recomputed. Another model with the same text tower reuses its texts."""
    import torch

    from cglib.evaluate.embeddings import EmbeddingStore

    _magic, dataset = tiny_magic()
    ids = dataset.image_ids[:6]
    pixels = dataset.pixels[:6]
    store = EmbeddingStore(tmp_path)
    args = {"bundle_fn": lambda: tiny_bundle, "image_ids": ids, "image_source": "px", "pixels_fn": lambda: pixels}
    first = store.embed("m", "magic", texts=["a", "b"], **args)
    assert store.computed["m.magic"] == ["images", "texts"]
    again = store.embed("m", "magic", texts=["b", "a"], **args)
    assert store.computed["m.magic"] == [] and np.array_equal(first.images, again.images)
    with torch.no_grad():
        next(tiny_bundle.model.visual.parameters()).add_(0.5)
    store.embed("m", "magic", texts=["a", "b"], **args)
    assert store.computed["m.magic"] == ["images"]
    store.embed("m", "magic", texts=["a", "b", "c"], **args)
    assert store.computed["m.magic"] == ["texts"]
    fresh = EmbeddingStore(tmp_path)  # another process: text vectors found in m's file
    fresh.embed("other", "magic", texts=["a", "b", "c"], **args)
    assert fresh.computed["other.magic"] == ["images"]


def test_group_resampling_units_replace_image_units():
    """With eval.bootstrap_unit = group, image-level queries are resampled by l1 group: forced-choice anchors
    and caption queries carry their image's group id instead of the image's row."""
    from cglib.evaluate.forced_choice import pooled_scores

    items = crossed_items()
    group_ids = np.unique(np.asarray(items.groups), return_inverse=True)[1]
    sets = [sample_forced_choice(items, items.field("l1"), 2, seed) for seed in (0, 1)]
    pooled = pooled_scores(sets, [np.ones(s.anchors.size) for s in sets], group_ids)
    assert pooled.n_units == len(set(items.groups)) and pooled.n_queries == 24
    field = items.field("caption")
    texts = items.all_texts()
    vectors = unit(np.random.default_rng(0).normal(size=(len(texts), 4)))
    images = unit(np.random.default_rng(1).normal(size=(12, 4)))
    out = gallery_scores(field, images, vectors, {t: i for i, t in enumerate(texts)}, [1], group_ids, group_ids)
    assert set(out[("t2i", "R@1")].scores.units) == set(group_ids)
    assert out[("i2t", "R@1")].scores.units.tolist() == group_ids.tolist()


def test_uninformed_model_scores_chance_on_average():
    """Image embeddings drawn independently of everything: over 40 draws, mean forced-choice accuracy is 1/M
    within sampling error, both directions and M = 2, 3 (the protocol itself favours neither side)."""
    magic, _ = tiny_magic(per_group=40)
    l1 = [n.id for n in magic.nodes_at(1)]
    for nid in l1:
        magic.nodes[nid].hard_negatives = [o for o in l1 if o != nid]
    items = build_items(magic)
    texts = items.all_texts()
    index = {t: i for i, t in enumerate(texts)}
    rng = np.random.default_rng(0)
    text_vectors = unit(rng.normal(size=(len(texts), 16)))
    for choices in (2, 3):
        accuracies = []
        for draw in range(40):
            images = unit(rng.normal(size=(len(items.image_ids), 16)))
            for key in ("caption", "l1", "l2"):
                fc = sample_forced_choice(items, items.field(key), choices, seed=draw)
                accuracies.extend(score_forced_choice(fc, images, text_vectors, index))
        values = np.concatenate(accuracies)
        assert abs(values.mean() - 1 / choices) < 3 * math.sqrt((1 / choices) * (1 - 1 / choices) / values.size) + 0.01


# ------------------------------------------------------------------------- ties (issue 14, item 9)
def reference_metrics(queries, gallery, relevant, ks):
    """Brute force in float64: an item's rank is the number of gallery items scoring at least as high."""
    scores = np.asarray(queries, np.float64) @ np.asarray(gallery, np.float64).T
    rel = np.asarray(sparse.csr_matrix(relevant).todense()).astype(bool)
    ranks = (scores[:, None, :] >= scores[:, :, None] - 1e-12).sum(axis=2)  # (q, g): rank of each item
    out = {}
    for k in ks:
        out[f"R@{k}"] = (rel & (ranks <= k)).any(axis=1).astype(float)
        out[f"P@{k}"] = (rel & (ranks <= k)).sum(axis=1) / k
    out["mAP"] = np.array([np.mean([(r[rel_q] <= x).sum() / x for x in r[rel_q]]) for r, rel_q in zip(ranks, rel)])
    return out


def jittered_search(monkeypatch, size=2e-6):
    """Make faiss's scores of identical vectors differ by up to `size`, as its BLAS path does on some builds
    (seen on HierarCaps: 1.6e-6), by perturbing the real search's output and re-sorting it."""
    from cglib.evaluate import retrieval

    real = retrieval.search

    def search(queries, gallery, k):
        scores, ids = real(queries, gallery, k)
        noisy = scores + np.random.default_rng(0).uniform(-size, size, scores.shape).astype(np.float32)
        order = np.argsort(-noisy, axis=1, kind="stable")
        return np.take_along_axis(noisy, order, axis=1), np.take_along_axis(ids, order, axis=1)

    monkeypatch.setattr(retrieval, "search", search)


@pytest.mark.parametrize("jitter", [False, True], ids=["faiss as is", "faiss with BLAS jitter"])
def test_degenerate_model_scores_the_minimum_on_a_gallery_of_1000(monkeypatch, jitter):
    """Constant image embeddings (a collapsed model) on 1,000 images: text->image R@k is exactly 0 for every k
    and AP is 1/1000, even when faiss scores the identical vectors slightly differently."""
    if jitter:
        jittered_search(monkeypatch)
    rng = np.random.default_rng(0)
    images = np.tile(unit(rng.normal(size=64)), (1000, 1))
    texts = unit(rng.normal(size=(3000, 64)))  # 3 captions per image; many queries: faiss's threaded BLAS path
    relevant = sparse.csr_matrix((np.ones(3000), (np.arange(3000), np.arange(3000) // 3)), shape=(3000, 1000))
    m = ranked_metrics(texts, images, relevant, ks=[1, 5, 10], precision=True)
    assert all(m[name].max() == 0 for name in m)
    ap = ranked_metrics(texts[:50], images, relevant[:50], ks=[10], average_precision=True)["mAP"]
    np.testing.assert_allclose(ap, 1 / 1000)


def test_constant_queries_rank_the_gallery_one_way():
    """Constant text embeddings: one ranking for every query, so R@k is the share of queries whose image is in
    that top k (k/1000 with one image each), exactly as the brute-force ranking says."""
    rng = np.random.default_rng(1)
    images = unit(rng.normal(size=(1000, 32)))
    texts = np.tile(unit(rng.normal(size=32)), (1000, 1))
    relevant = sparse.identity(1000, format="csr")
    m = ranked_metrics(texts, images, relevant, ks=[1, 10])
    assert m["R@1"].mean() == pytest.approx(1 / 1000) and m["R@10"].mean() == pytest.approx(10 / 1000)


@pytest.mark.parametrize("jitter", [False, True], ids=["faiss as is", "faiss with BLAS jitter"])
def test_normal_model_scores_equal_the_exact_ranking(monkeypatch, jitter):
    """A model with distinct embeddings (plus a few exact duplicate images) gets exactly the brute-force
    float64 numbers: R@k, P@k and AP per query."""
    if jitter:
        jittered_search(monkeypatch, size=1e-7)
    rng = np.random.default_rng(2)
    images = unit(rng.normal(size=(400, 16)))
    images[200:210] = images[100]  # duplicates tie for real
    texts = unit(images[rng.integers(0, 400, 150)] + 0.8 * rng.normal(size=(150, 16)))
    relevant = sparse.csr_matrix((rng.random((150, 400)) < 0.01) | (np.arange(400)[None, :] == 100))
    got = ranked_metrics(texts, images, relevant, ks=[1, 5, 10], precision=True, average_precision=True)
    want = reference_metrics(texts, images, relevant, ks=[1, 5, 10])
    for name in want:
        np.testing.assert_allclose(got[name], want[name], err_msg=name)
