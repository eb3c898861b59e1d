"""Retrieval over the whole test gallery, per text type: text->image and image->text.

Text->image: each distinct string of a type queries all test images; an image is relevant when it carries the
string (its caption; for a concept name, any image under that concept at that level). Image->text: each
image queries all distinct strings of the type; relevant are the image's own strings. Caption queries report
R@k (the COCO protocol); group-level queries (concept names, generalized captions) also precision@k and
mean average precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.items import TextField
from cglib.evaluate.retrieval import chance_recall, membership, ranked_metrics

T2I = "t2i"
I2T = "i2t"


@dataclass
class MetricScores:
    """Per-query scores of one metric and the score a random ranking gets on average (NaN when unknown)."""

    scores: Scores
    chance: float


def _query_units(text_field: TextField, matrix, group_ids: np.ndarray, image_units: np.ndarray) -> np.ndarray:
    """Resampling unit of each text query: itself, the first image carrying it (its unit), or its group."""
    n_queries = matrix.shape[1]
    if text_field.unit == "query":
        return np.arange(n_queries)
    first_image = np.asarray(matrix.tocsc().argmax(axis=0)).ravel()
    return image_units[first_image] if text_field.unit == "image" else group_ids[first_image]


def gallery_scores(text_field: TextField, image_vectors: np.ndarray, text_vectors: np.ndarray,
                   text_index: dict[str, int], ks: Sequence[int], group_ids: np.ndarray,
                   image_units: np.ndarray | None = None) -> dict[tuple[str, str], MetricScores]:
    """Per-query retrieval scores of one text field, keyed by (direction, metric).

    `group_ids[i]` is image i's l1 group; `image_units[i]` its resampling unit (default: the image itself).
    """
    image_units = np.arange(image_vectors.shape[0]) if image_units is None else image_units
    matrix, vocabulary = membership(text_field.texts)  # images x distinct strings
    out: dict[tuple[str, str], MetricScores] = {}
    if not vocabulary:
        return out
    group_level = text_field.unit != "image"
    queries = text_vectors[[text_index[t] for t in vocabulary]]
    n_images = image_vectors.shape[0]

    relevant = matrix.T.tocsr()
    t2i = ranked_metrics(queries, image_vectors, relevant, ks, precision=group_level, average_precision=group_level)
    units = _query_units(text_field, matrix, group_ids, image_units)
    n_rel = np.asarray(relevant.sum(axis=1)).ravel()
    for metric, values in t2i.items():
        chance = _chance(metric, n_rel, n_images)
        out[(T2I, metric)] = MetricScores(Scores(values, units), chance)

    has_text = np.flatnonzero(np.diff(matrix.indptr) > 0)
    relevant = matrix[has_text]
    i2t = ranked_metrics(image_vectors[has_text], queries, relevant, ks, average_precision=group_level)
    n_rel = np.asarray(relevant.sum(axis=1)).ravel()
    for metric, values in i2t.items():
        out[(I2T, metric)] = MetricScores(Scores(values, image_units[has_text]), _chance(metric, n_rel, len(vocabulary)))
    return out


def _chance(metric: str, n_relevant: np.ndarray, n_gallery: int) -> float:
    """Mean score of a random ranking for R@k and P@k (NaN for mAP, which has no closed form here)."""
    k = int(metric.split("@")[1]) if "@" in metric else None
    if metric.startswith("R@"):
        return float(chance_recall(n_relevant, n_gallery, k).mean())
    if metric.startswith("P@"):
        return float(np.mean(n_relevant / n_gallery))
    return float("nan")
