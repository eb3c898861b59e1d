"""Category discovery on the MAGIC test images (as in generalized category discovery, e.g. DCCL, Pu et al. 2023).

Per level l and label source (the DAG's nodes, and the synthetic world's ground-truth names), the test images'
embeddings are clustered by k-means (faiss, k = the number of distinct concepts of level l among the labelled
test images, one run per evaluation seed `eval.seeds`, each image's own unit embedding). The clusters are matched
one-to-one to the concepts by the Hungarian algorithm on the cluster x concept counts (maximum agreement), over
ALL labelled images at once; an image is correct when its cluster's concept is its own. Its score is its
correctness averaged over the k-means seeds (a per-image value in [0, 1]), so the metric rows carry per-image
scores and the evaluation's bootstrap, seed and difference machinery gives their intervals. Those intervals are
conditional on the matching (and the clusters): resampling images does not re-run k-means or the matching.

Metrics: `accuracy` (all labelled images), `accuracy_seen` (images whose concept at level l has training images:
its node is in some training image's chain, or for ground truth its name is), `accuracy_held_out` (the others),
the last two under the same matching. With `magic.split: image` every concept is seen: the held-out row is empty
(n = 0, value NaN) and says so. Chance: the accuracy of a random assignment of the images to clusters of the same
sizes (the k-means partition permuted over the images), matched the same way, averaged over seeded draws.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.items import DAG, GROUND_TRUTH, MagicItems
from cglib.magic.schema import MagicFile

BENCHMARK = "clustering"
METRICS = ("accuracy", "accuracy_seen", "accuracy_held_out")
CHANCE_DRAWS = 20  # random partitions per k-means seed behind the chance column

Key = tuple[str, str, str, str, str]


def kmeans(vectors: np.ndarray, k: int, seed: int, iterations: int = 25) -> np.ndarray:
    """Cluster index (n,) of each row by faiss k-means with `k` centroids, seeded (every row used, no subsampling)."""
    import faiss

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if not 1 <= k <= len(x):
        raise ValueError(f"k-means needs 1 <= k <= the number of vectors, got k = {k} for {len(x)} vectors")
    if k == 1:
        return np.zeros(len(x), dtype=np.int64)
    km = faiss.Kmeans(x.shape[1], k, niter=iterations, seed=seed, verbose=False, min_points_per_centroid=1,
                      max_points_per_centroid=len(x))
    km.train(x)
    return km.index.search(x, 1)[1][:, 0].astype(np.int64)


def hungarian_correct(truth: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Per item: True when its cluster's concept under the best one-to-one cluster-concept matching is its own.

    `truth` and `clusters` are (n,) integer labels; the matching maximizes the number of correct items.
    """
    n_truth, n_clusters = int(truth.max()) + 1, int(clusters.max()) + 1
    counts = np.zeros((n_clusters, n_truth), dtype=np.int64)
    np.add.at(counts, (clusters, truth), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    concept_of = np.full(n_clusters, -1, dtype=np.int64)  # an unmatched cluster (more clusters than concepts): wrong
    concept_of[rows] = cols
    return concept_of[clusters] == truth


def clustering_accuracy(truth: np.ndarray, clusters: np.ndarray) -> float:
    """Clustering accuracy: the share of items correct under the Hungarian matching."""
    return float(hungarian_correct(truth, clusters).mean())


def seen_concepts(magic: MagicFile, ground_truth: dict[str, list[str]] | None, levels: list[int]
                  ) -> dict[tuple[str, int], set[str]]:
    """Concepts with training images per (labels, level): DAG node ids on training chains, ground-truth names."""
    train = magic.split_ids("train")
    chains = [magic.chain(i) for i in train]
    out = {(DAG, k): {c[k - 1] for c in chains if len(c) >= k} for k in levels}
    if ground_truth is not None:
        for k in levels:
            out[(GROUND_TRUTH, k)] = {ground_truth[i][k - 1] for i in train
                                      if i in ground_truth and len(ground_truth[i]) >= k}
    return out


def _label_sets(items: MagicItems) -> list[tuple[str, int, list[str | None]]]:
    """(labels, level, each test image's concept or None) for every level, DAG first, then ground truth."""
    out: list[tuple[str, int, list[str | None]]] = [(DAG, k, list(items.nodes_at(k))) for k in items.levels]
    if items.has_ground_truth:
        for k in items.levels:
            texts = items.field(f"l{k}", GROUND_TRUTH).texts
            out.append((GROUND_TRUTH, k, [t[0] if t else None for t in texts]))
    return out


def _partition_scores(truth: np.ndarray, labelled_seen: np.ndarray, seeds: list[int], vectors: np.ndarray,
                      k: int, level: int) -> tuple[np.ndarray, dict[str, float]]:
    """Per-image correctness averaged over k-means seeds, and the chance of each metric (random partitions)."""
    correct = np.zeros(len(truth), dtype=np.float64)
    chance = {m: [] for m in METRICS}
    for seed in seeds:
        clusters = kmeans(vectors, k, seed)
        correct += hungarian_correct(truth, clusters)
        rng = np.random.default_rng([seed, level, k, len(truth)])
        for _ in range(CHANCE_DRAWS):
            hits = hungarian_correct(truth, rng.permutation(clusters))
            chance["accuracy"].append(hits.mean())
            for metric, mask in (("accuracy_seen", labelled_seen), ("accuracy_held_out", ~labelled_seen)):
                chance[metric].append(hits[mask].mean() if mask.any() else np.nan)
    return correct / len(seeds), {m: float(np.mean(v)) for m, v in chance.items()}


def clustering_scores(items: MagicItems, images: np.ndarray, seen: dict[tuple[str, int], set[str]],
                      seeds: list[int], unit: str = "image") -> tuple[dict[Key, MetricScores], dict[str, dict]]:
    """Category-discovery scores of one model's test-image embeddings (rows in `items.image_ids` order).

    Keys (benchmark "clustering", labels, "-", metric, "l<k>"); `unit`: what the bootstrap resamples (the image
    or its l1 group). Also per "labels|l<k>": k, images, seen and held-out counts, images without a label.
    """
    group_ids = np.unique(np.asarray(items.groups), return_inverse=True)[1]
    image_units = group_ids if unit == "group" else np.arange(len(items.image_ids))
    out: dict[Key, MetricScores] = {}
    info: dict[str, dict] = {}
    for labels, level, concepts in _label_sets(items):
        rows = np.array([i for i, c in enumerate(concepts) if c is not None], dtype=np.int64)
        names = [concepts[i] for i in rows]
        vocabulary, truth = np.unique(np.asarray(names, dtype=object), return_inverse=True)
        is_seen = np.array([c in seen.get((labels, level), set()) for c in names], dtype=bool)
        k = len(vocabulary)
        info[f"{labels}|l{level}"] = {"k": k, "images": int(rows.size), "seen": int(is_seen.sum()),
                                      "held_out": int((~is_seen).sum()),
                                      "without_label": len(concepts) - int(rows.size),
                                      "seen_concepts": int(sum(1 for c in vocabulary if c in
                                                               seen.get((labels, level), set())))}
        if rows.size == 0:
            continue
        values, chance = _partition_scores(truth, is_seen, seeds, images[rows], k, level)
        units = image_units[rows]
        for metric, mask in (("accuracy", np.ones(rows.size, dtype=bool)), ("accuracy_seen", is_seen),
                             ("accuracy_held_out", ~is_seen)):
            # an empty part (no held-out concept under magic.split: image) is still a row: n = 0, value NaN
            out[(BENCHMARK, labels, "-", metric, f"l{level}")] = MetricScores(Scores(values[mask], units[mask]),
                                                                             chance[metric])
    return out, info
