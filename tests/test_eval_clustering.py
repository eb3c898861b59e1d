"""Category discovery (cglib/evaluate/clustering.py): k-means + Hungarian clustering accuracy, seen vs held-out
concepts, and its rows in `evaluate_run` (eval.clustering)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from cglib.evaluate import evaluate_run
from cglib.evaluate.clustering import (
    clustering_accuracy,
    clustering_scores,
    hungarian_correct,
    kmeans,
    seen_concepts,
)
from cglib.evaluate.items import build_items
from cglib.evaluate.table3 import table3
from cglib.magic.files import load_magic, save_magic
from tests.factories import tiny_magic


def planted(k: int = 5, per: int = 20, dim: int = 16, spread: float = 0.05, seed: int = 0):
    """Unit vectors in k tight, well-separated clusters and their (k,) true labels per vector."""
    rng = np.random.default_rng(seed)
    centers = np.linalg.qr(rng.normal(size=(dim, k)))[0].T  # orthonormal centers
    truth = np.repeat(np.arange(k), per)
    x = centers[truth] + spread * rng.normal(size=(k * per, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), truth


def test_planted_clusters_are_found_under_any_label_names():
    """k-means recovers planted clusters: accuracy 1.0, also when the labels are a permutation of the clusters'
    numbering (the Hungarian matching, not the raw ids, decides), for every seed."""
    x, truth = planted()
    relabel = np.array([3, 0, 4, 1, 2])[truth]
    for seed in (0, 1, 2):
        clusters = kmeans(x, 5, seed)
        assert clustering_accuracy(truth, clusters) == 1.0
        assert clustering_accuracy(relabel, clusters) == 1.0
        assert clustering_accuracy(truth, (clusters + 1) % 5) == 1.0


def test_hungarian_matching_is_the_best_one_to_one_matching():
    """The number of correct items equals the maximum over all cluster->concept bijections (brute force)."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        truth, clusters = rng.integers(0, 4, 30), rng.integers(0, 4, 30)
        truth[:4], clusters[:4] = np.arange(4), np.arange(4)  # every label present
        best = max(sum(perm[c] == t for c, t in zip(clusters, truth)) for perm in itertools.permutations(range(4)))
        assert hungarian_correct(truth, clusters).sum() == best


def test_random_embeddings_score_near_chance():
    """On random embeddings with no relation to the labels, accuracy is close to the chance column (the accuracy
    of random partitions with the same cluster sizes), and far below 1."""
    rng = np.random.default_rng(0)
    n, k = 300, 6
    items = _flat_items(np.repeat(np.arange(k), n // k))
    x = rng.normal(size=(n, 8)).astype(np.float32)
    scores, info = clustering_scores(items, x / np.linalg.norm(x, axis=1, keepdims=True),
                                     seen={("dag", 1): set()}, seeds=[0, 1, 2])
    ms = scores[("clustering", "dag", "-", "accuracy", "l1")]
    assert info["dag|l1"]["k"] == k
    assert abs(ms.scores.values.mean() - ms.chance) < 0.06 and ms.chance < 0.35
    # no concept seen: every image is held out, the seen part is an empty row
    assert scores[("clustering", "dag", "-", "accuracy_seen", "l1")].scores.n_queries == 0
    np.testing.assert_allclose(scores[("clustering", "dag", "-", "accuracy_held_out", "l1")].scores.values,
                               ms.scores.values)


def test_scores_are_per_image_means_over_seeds_split_by_seen_concepts():
    """Per-image scores average the seeds' 0/1 correctness; seen and held-out rows partition the images under the
    same matching; a planted clustering scores 1.0 on both parts."""
    x, truth = planted(k=4, per=10)
    items = _flat_items(truth)
    seen = {("dag", 1): {"c0", "c1"}}
    scores, info = clustering_scores(items, x, seen, seeds=[0, 5])
    assert info["dag|l1"] == {"k": 4, "images": 40, "seen": 20, "held_out": 20, "without_label": 0,
                              "seen_concepts": 2}
    for metric, n in (("accuracy", 40), ("accuracy_seen", 20), ("accuracy_held_out", 20)):
        ms = scores[("clustering", "dag", "-", metric, "l1")]
        assert ms.scores.n_queries == n and ms.scores.values.min() == 1.0
        assert 0.0 < ms.chance < 0.6


def _flat_items(truth: np.ndarray):
    """MagicItems-like holder with one level whose concept of image i is c<truth[i]>."""
    from cglib.evaluate.items import MagicItems

    ids = [f"i{k}" for k in range(len(truth))]
    groups = [f"c{t}" for t in truth]
    return MagicItems(image_ids=ids, groups=groups, negatives={}, fields=[], levels=[1])


def test_seen_concepts_follow_the_split():
    """Image split: every test concept has training images; moving a whole l1 group to test makes it held out
    at l1 while its l2 parent stays seen."""
    magic, _ = tiny_magic()
    items = build_items(magic)
    seen = seen_concepts(magic, None, items.levels)
    assert set(items.nodes_at(1)) <= seen[("dag", 1)]
    group = magic.images["img-05-00"].node
    for image in magic.images.values():
        if image.node == group:
            image.split = "test"
    seen = seen_concepts(magic, None, [1, 2])
    assert group not in seen[("dag", 1)] and magic.ancestor(group, 2) in seen[("dag", 2)]


@pytest.mark.parametrize("held_out", [False, True])
def test_evaluation_writes_clustering_rows(tmp_path, held_out):
    """eval.clustering: true adds rows (clustering, dag|ground_truth, -, accuracy|accuracy_seen|accuracy_held_out,
    l1..l4) with CIs and a chance column; Table 3 keeps its columns. With magic.split image the held-out rows are
    empty (n = 0, NaN); with a group held out of training, its images form the l1 held-out row."""
    from test_eval_pipeline import make_run

    from cglib.train import ensure_initial

    run = make_run(tmp_path, runs=[], clustering=True)
    if held_out:  # a concept split for one group: all its images in test
        path = run.dir / "magic" / "magic.json"
        magic = load_magic(path)
        for image in magic.images.values():
            if image.node == magic.images["img-05-00"].node:
                image.split = "test"
        save_magic(magic, path)
    ensure_initial(run)
    result = evaluate_run(run, progress=False)
    m = result.metrics
    rows = m[m["benchmark"] == "clustering"]
    assert set(rows["labels"]) == {"dag", "ground_truth"}
    assert set(rows["metric"]) == {"accuracy", "accuracy_seen", "accuracy_held_out"}
    assert set(rows["level"]) == {"l1", "l2", "l3", "l4"} and (rows["direction"] == "-").all()
    acc = rows[(rows["metric"] == "accuracy") & (rows["labels"] == "dag")].set_index("level")
    n_test = 18 if held_out else 12  # the held-out group: its 6 training images join its 2 test images
    assert (acc["n"] == n_test).all() and acc["value"].between(0, 1).all() and acc["chance"].between(0, 1).all()
    assert (acc["ci_low"] <= acc["value"]).all() and (acc["value"] <= acc["ci_high"]).all()
    assert acc.loc["l4", "value"] == 1.0  # one l4 concept: one cluster, always right
    out = rows[(rows["metric"] == "accuracy_held_out") & (rows["labels"] == "dag")].set_index("level")
    info = result.info["clustering"]["per_model"]["zero-shot"]
    if held_out:
        assert out.loc["l1", "n"] == 8 and info["dag|l1"]["held_out"] == 8 and info["dag|l2"]["held_out"] == 0
    else:
        assert (out["n"] == 0).all() and out["value"].isna().all()
    assert info["dag|l1"]["k"] == 6
    # Table 3 is what it is without the clustering rows
    pd.testing.assert_frame_equal(result.table3, table3(m[m["benchmark"] != "clustering"]))
