"""Gallery retrieval with faiss: Recall@k, precision@k and average precision, with ties counted against the model.

Relevance is a sparse membership matrix between gallery items and query items (an image "has" a text when
the text is one of its captions, its concept name at a level, ...), so duplicate strings are handled exactly:
a query is answered correctly by ANY image that carries its text. Ranks are pessimistic: an item tied in score
with others is ranked after all of them, so a degenerate model (constant embeddings) scores the minimum, never
a lucky index-order win.
"""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np
from scipy import sparse

SMALL_SEARCH = 2_000_000  # query x gallery pairs below which a search runs single-threaded
DENSE_LIMIT = 50_000_000
QUERY_CHUNK_CELLS = 20_000_000  # queries x depth searched at once (bounds the score, rank and hit arrays)  # relevance matrices up to this many cells are looked up densely (50 MB as bool)


def set_faiss_threads(threads: int) -> None:
    """Fix faiss's OpenMP thread count (0 = all cores; faiss otherwise starts one thread per core)."""
    import os

    faiss.omp_set_num_threads(threads if threads > 0 else (os.cpu_count() or 1))


def search(queries: np.ndarray, gallery: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product search (faiss IndexFlatIP): top-k scores and gallery indices, best first."""
    if gallery.shape[0] == 0 or queries.shape[0] == 0:
        return np.zeros((queries.shape[0], 0), np.float32), np.zeros((queries.shape[0], 0), np.int64)
    k = min(k, gallery.shape[0])
    index = faiss.IndexFlatIP(gallery.shape[1])
    index.add(np.ascontiguousarray(gallery, dtype=np.float32))
    threads = faiss.omp_get_max_threads()
    if queries.shape[0] * gallery.shape[0] < SMALL_SEARCH:
        # OpenMP start-up and synchronisation cost more than a small search itself (40 ms vs 0.1 ms on a busy
        # 2-core machine): run it on one thread.
        faiss.omp_set_num_threads(1)
    try:
        scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    finally:
        faiss.omp_set_num_threads(threads)
    return scores, ids


def pessimistic_ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of each returned item when ties are broken against it: the count of items scoring >= it.

    `scores` is (queries, k), sorted descending per row. An item whose tie group reaches the last returned
    column may have more tied items beyond the list: its rank is then at least k, so search k_max + 1 items
    to resolve every rank <= k_max exactly.
    """
    q, k = scores.shape
    if k == 0:
        return np.zeros((q, 0), np.int64)
    position = np.broadcast_to(np.arange(1, k + 1), (q, k)).astype(np.float64)
    group_end = np.where(np.concatenate([scores[:, :-1] != scores[:, 1:], np.ones((q, 1), bool)], axis=1),
                         position, np.inf)
    return np.minimum.accumulate(group_end[:, ::-1], axis=1)[:, ::-1].astype(np.int64)


def membership(item_texts: Sequence[Sequence[str]]) -> tuple[sparse.csr_matrix, list[str]]:
    """Items x unique texts 0/1 matrix (CSR) and the sorted unique texts (each item's texts of one type)."""
    vocabulary = sorted({t for texts in item_texts for t in texts})
    column = {t: j for j, t in enumerate(vocabulary)}
    rows = [i for i, texts in enumerate(item_texts) for _ in set(texts)]
    cols = [column[t] for texts in item_texts for t in set(texts)]
    matrix = sparse.csr_matrix((np.ones(len(rows), np.int8), (rows, cols)),
                               shape=(len(item_texts), len(vocabulary)))
    return matrix, vocabulary


def ranked_metrics(queries: np.ndarray, gallery: np.ndarray, relevant: sparse.csr_matrix, ks: Sequence[int],
                   precision: bool = False, average_precision: bool = False) -> dict[str, np.ndarray]:
    """Per-query R@k (and P@k, AP) of `queries` searched against `gallery`; `relevant` is (queries, gallery).

    Queries without any relevant gallery item are an error: drop them before calling (and count them).
    AP needs the full ranking, so it searches the whole gallery (in chunks of queries to bound memory).
    """
    relevant = sparse.csr_matrix(relevant)
    n_relevant = np.asarray(relevant.sum(axis=1)).ravel()
    if np.any(n_relevant == 0):
        raise ValueError(f"{int(np.sum(n_relevant == 0))} queries have no relevant gallery item; "
                         "remove them before scoring")
    n_gallery = gallery.shape[0]
    depth = n_gallery if average_precision else min(n_gallery, max(ks) + 1)
    chunk = max(1, QUERY_CHUNK_CELLS // max(depth, 1))
    parts = [_ranked_chunk(queries[s:s + chunk], gallery, relevant[s:s + chunk], ks, depth, precision,
                           average_precision) for s in range(0, queries.shape[0], chunk)]
    if not parts:
        return {}
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def _ranked_chunk(queries: np.ndarray, gallery: np.ndarray, relevant: sparse.csr_matrix, ks: Sequence[int],
                  depth: int, precision: bool, average_precision: bool) -> dict[str, np.ndarray]:
    scores, ids = search(queries, gallery, depth)
    ranks = pessimistic_ranks(scores)
    hit = _lookup(relevant, ids)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        within = hit & (ranks <= k)
        out[f"R@{k}"] = within.any(axis=1).astype(np.float64)
        if precision:
            out[f"P@{k}"] = within.sum(axis=1) / float(k)
    if average_precision:
        # Precision at each relevant item's (pessimistic) rank, averaged over the query's relevant items
        # (the full ranking holds all of them).
        ap = np.zeros(queries.shape[0])
        for q in range(queries.shape[0]):
            r = np.sort(ranks[q][hit[q]])
            at_or_above = np.searchsorted(r, r, side="right")  # relevant items ranked at or above (ties included)
            ap[q] = float(np.mean(at_or_above / r))
        out["mAP"] = ap
    return out


def _lookup(relevant: sparse.csr_matrix, ids: np.ndarray) -> np.ndarray:
    """relevant[q, ids[q, j]] as a bool array shaped like `ids` (dense when small, sparse lookup otherwise)."""
    if relevant.shape[0] * relevant.shape[1] <= DENSE_LIMIT:
        return np.take_along_axis(relevant.toarray().astype(bool), ids, axis=1)
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    return np.asarray(relevant[rows, ids.ravel()]).reshape(ids.shape).astype(bool)


def chance_recall(n_relevant: np.ndarray, n_gallery: int, k: int) -> np.ndarray:
    """Expected R@k of a random ranking: 1 - C(G - r, k) / C(G, k) for r relevant items among G."""
    r = np.asarray(n_relevant, dtype=np.float64)
    k = min(k, n_gallery)
    # Product form of the hypergeometric zero-hit probability, stable for large G.
    miss = np.ones_like(r)
    for j in range(k):
        miss *= np.clip((n_gallery - r - j) / (n_gallery - j), 0.0, 1.0)
    return 1.0 - miss
