"""HierarCaps (Alper and Averbuch-Elor, ECCV 2024): per-level retrieval, a B-way in-batch variant, and the
authors' hierarchical-retrieval metric.

Strings repeat at levels 1-2 (491 and 717 distinct of 1,000), so at every level an image is a correct answer
to a text when it carries the SAME text at that level, whichever image the text came from.

Hierarchical metric (the HierarCaps authors' definition): root r = the text embedding of the empty string;
genericness d(e) = |e - r| (unit-normalised embeddings); R radius thresholds evenly spaced between the
smallest and largest d over all 4 x n texts; for each image and each radius, the text most similar to the
image among the texts with d <= radius. The set of texts so retrieved is the predicted chain: precision =
|predicted & image's texts| / |predicted|; recall = the fraction of the image's 4 levels whose text was
retrieved (exact string match). Kendall tau between d and the level order of each image's 4 texts (tau-b,
so tied distances, e.g. the same string at two levels, count as ties; the authors rank with argsort, which
breaks ties by position, i.e. in the hierarchy's favour); chains whose 4 distances all tie have no tau and
are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.stats import kendalltau

from cglib.data.hierarcaps import HierarCapsItem
from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.gallery import I2T, T2I, MetricScores
from cglib.evaluate.retrieval import chance_recall, ranked_metrics

ROOT_TEXT = ""


@dataclass
class HierarchyResult:
    """Per-image precision, recall and Kendall tau of the hierarchical metric, and the tau exclusions."""

    precision: Scores
    recall: Scores
    kendall_tau: Scores
    n_tau_undefined: int
    thresholds: np.ndarray


def level_texts(items: Sequence[HierarCapsItem], level: int) -> list[str]:
    """The text of every item at a 1-based level (general first)."""
    return [item.levels[level - 1] for item in items]


def _encode_level(texts: list[str]) -> tuple[list[str], np.ndarray]:
    vocabulary, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    return [str(v) for v in vocabulary], inverse.astype(np.int64)


def level_retrieval(texts: list[str], image_vectors: np.ndarray, text_vectors: np.ndarray,
                    text_index: dict[str, int], ks: Sequence[int]) -> dict[tuple[str, str], MetricScores]:
    """R@k at one level over all images, one query per item; a hit is any image with the same text."""
    vocabulary, inverse = _encode_level(texts)
    n = len(texts)
    onehot = sparse.csr_matrix((np.ones(n, np.int8), (np.arange(n), inverse)), shape=(n, len(vocabulary)))
    queries = text_vectors[[text_index[t] for t in vocabulary]]
    items = np.arange(n)
    out: dict[tuple[str, str], MetricScores] = {}
    # Text->image: search each distinct string once; every item asking that string gets its result.
    t2i = ranked_metrics(queries, image_vectors, onehot.T.tocsr(), ks)
    n_same = np.bincount(inverse)[inverse]
    for metric, values in t2i.items():
        k = int(metric.split("@")[1])
        out[(T2I, metric)] = MetricScores(Scores(values[inverse], items),
                                          float(chance_recall(n_same, n, k).mean()))
    i2t = ranked_metrics(image_vectors, queries, onehot, ks)
    for metric, values in i2t.items():
        k = int(metric.split("@")[1])
        out[(I2T, metric)] = MetricScores(Scores(values, items),
                                          float(chance_recall(np.ones(n), len(vocabulary), k).mean()))
    return out


def batch_partners(n: int, batch: int, seed: int) -> np.ndarray:
    """(n, batch-1) distinct other items per item, uniformly at random (seeded): each item's in-batch rivals."""
    if not 2 <= batch <= n:
        raise ValueError(f"eval.hierarcaps_batch must be between 2 and the number of items ({n}), got {batch}")
    rng = np.random.default_rng([seed, n, batch])
    keys = rng.random((n, n))
    np.fill_diagonal(keys, np.inf)  # never one's own rival
    return np.argpartition(keys, batch - 2, axis=1)[:, : batch - 1]


def in_batch_accuracy(texts: list[str], image_vectors: np.ndarray, text_vectors: np.ndarray,
                      text_index: dict[str, int], batch: int, seeds: Sequence[int]
                      ) -> dict[tuple[str, str], MetricScores]:
    """B-way in-batch R@1 at one level: each item against B-1 random others; ties and rivals' wins are wrong.

    Text->image: the item's text must score an image with the same text strictly above every image with a
    different text. Image->text: the item's image must score its own string strictly above every other string
    in the batch. Seeds resample the rivals; one query per (seed, item), the item as the resampling unit.
    """
    vocabulary, inverse = _encode_level(texts)
    n = len(texts)
    vocab_vectors = text_vectors[[text_index[t] for t in vocabulary]]
    sim = image_vectors @ vocab_vectors.T  # (n images, distinct strings): one score matrix for both directions
    t2i, i2t, chance, i2t_chance, units = [], [], [], [], []
    for seed in seeds:
        cand = np.concatenate([np.arange(n)[:, None], batch_partners(n, batch, seed)], axis=1)  # (n, B)
        same = inverse[cand] == inverse[:, None]
        t2i_s = sim[cand, inverse[:, None]]  # the item's string against each candidate image
        i2t_s = sim[np.arange(n)[:, None], inverse[cand]]  # the item's image against each candidate string
        for store, s in ((t2i, t2i_s), (i2t, i2t_s)):
            best_same = np.where(same, s, -np.inf).max(axis=1)
            best_other = np.where(same, -np.inf, s).max(axis=1)
            store.append((best_same > best_other).astype(np.float64))
        # A random scorer wins text->image when it ranks a same-text image first, and image->text when it
        # ranks the item's string first among the batch's distinct strings.
        chance.append(same.mean(axis=1))
        ids = np.sort(inverse[cand], axis=1)
        i2t_chance.append(1.0 / (1 + (np.diff(ids, axis=1) != 0).sum(axis=1)))
        units.append(np.arange(n))
    units_all = np.concatenate(units)
    return {(T2I, "R@1"): MetricScores(Scores(np.concatenate(t2i), units_all), float(np.mean(chance))),
            (I2T, "R@1"): MetricScores(Scores(np.concatenate(i2t), units_all), float(np.mean(i2t_chance)))}


def hierarchical_metric(items: Sequence[HierarCapsItem], image_vectors: np.ndarray, text_vectors: np.ndarray,
                        text_index: dict[str, int], root_vector: np.ndarray, radii: int = 50) -> HierarchyResult:
    """The HierarCaps authors' precision, recall and Kendall tau of the root distance (see module docstring)."""
    n_levels = len(items[0].levels)
    vocabulary = sorted({t for item in items for t in item.levels})
    vectors = text_vectors[[text_index[t] for t in vocabulary]].astype(np.float64)
    d = np.linalg.norm(vectors - root_vector.astype(np.float64)[None, :], axis=1)
    thresholds = np.linspace(d.min(), d.max(), radii)
    order = np.argsort(d, kind="stable")
    d_sorted = d[order]
    sim = (image_vectors.astype(np.float64) @ vectors.T)[:, order]  # images x texts, by increasing d
    # Best text among the first p texts (by d) for every prefix p: a running argmax.
    running_max = np.maximum.accumulate(sim, axis=1)
    previous = np.concatenate([np.full((sim.shape[0], 1), -np.inf), running_max[:, :-1]], axis=1)
    record = np.where(sim > previous, np.arange(sim.shape[1])[None, :], 0)
    best_prefix = np.maximum.accumulate(record, axis=1)
    prefix_len = np.searchsorted(d_sorted, thresholds, side="right")  # >= 1: the first threshold is min d
    predicted = order[best_prefix[:, prefix_len - 1]]  # (n images, radii) text ids
    column = {t: j for j, t in enumerate(vocabulary)}
    precision, recall, tau = [], [], []
    tau_units = []
    for i, item in enumerate(items):
        truth = [column[t] for t in item.levels]
        chain = set(predicted[i].tolist())
        precision.append(len(chain & set(truth)) / len(chain))
        recall.append(sum(t in chain for t in truth) / n_levels)
        value = kendalltau(d[truth], np.arange(1, n_levels + 1)).statistic
        if np.isfinite(value):
            tau.append(value)
            tau_units.append(i)
    units = np.arange(len(items))
    return HierarchyResult(
        precision=Scores(np.asarray(precision), units), recall=Scores(np.asarray(recall), units),
        kendall_tau=Scores(np.asarray(tau, dtype=np.float64), np.asarray(tau_units, dtype=np.int64)),
        n_tau_undefined=len(items) - len(tau), thresholds=thresholds)
