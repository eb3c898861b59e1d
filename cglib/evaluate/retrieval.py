"""Gallery retrieval with faiss: Recall@k, precision@k and average precision, with ties counted against the model.

Relevance is a sparse membership matrix between gallery items and query items (an image "has" a text when
the text is one of its captions, its concept name at a level, ...), so duplicate strings are handled exactly:
a query is answered correctly by ANY image that carries its text. Ranks are pessimistic: an item tied in score
with others is ranked after all of them, never a lucky index-order win.

Ties must be exact to be counted, and faiss's float32 scores are not: its BLAS path can give identical gallery
vectors scores that differ by about 1e-6. So faiss only proposes the candidates; they are re-scored in float64,
where identical vectors score identically (within TIE_RTOL), and a query whose k_max-th candidate lies within
faiss's float32 error of the candidates left out is re-scored against the whole gallery, so that no tie or
near-tie across the candidate boundary is missed. Consequences: a degenerate model whose gallery embeddings
are all equal scores exactly 0 at every k below the gallery size (every item is tied with every other, so each
ranks last); constant query embeddings rank the gallery the same way for every query, so R@k is then the
share of queries whose relevant items happen to rank in that one top k (k/N for one relevant item each among
N, on average). A normal model's scores are those of the exact float64 ranking.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import faiss
import numpy as np
from scipy import sparse

SMALL_SEARCH = 2_000_000  # query x gallery pairs below which a search runs single-threaded
DENSE_LIMIT = 50_000_000
# relevance matrices up to DENSE_LIMIT cells are looked up densely (50 MB as bool)
QUERY_CHUNK_CELLS = 20_000_000  # queries x depth searched at once (bounds the score, rank and hit arrays)
RESCORE_CELLS = 4_000_000  # candidate vector elements gathered at once for the float64 re-scoring (32 MB)
FAISS_ERR_SCALE = 8.0  # see exact_candidates
TIE_RTOL = 1e-9  # float64 scores closer than this (times |q| max|g|) are ties: equal vectors land far inside


def set_faiss_threads(threads: int) -> None:
    """Fix faiss's OpenMP thread count (0 = all cores; faiss otherwise starts one thread per core)."""
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


def pessimistic_ranks(scores: np.ndarray, tol: np.ndarray | float = 0.0) -> np.ndarray:
    """1-based rank of each returned item when ties are broken against it: the count of items scoring >= it.

    `scores` is (queries, k), sorted descending per row; neighbours closer than `tol` (a scalar or one value
    per row) are tied. An item whose tie group reaches the last returned column may have more tied items
    beyond the list: its rank is then at least k, so search k_max + 1 items to resolve every rank <= k_max.
    """
    q, k = scores.shape
    if k == 0:
        return np.zeros((q, 0), np.int64)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64).reshape(-1, 1) if np.ndim(tol) else tol, (q, 1))
    position = np.broadcast_to(np.arange(1, k + 1), (q, k)).astype(np.float64)
    boundary = (scores[:, :-1] - scores[:, 1:]) > tol
    group_end = np.where(np.concatenate([boundary, np.ones((q, 1), bool)], axis=1), position, np.inf)
    return np.minimum.accumulate(group_end[:, ::-1], axis=1)[:, ::-1].astype(np.int64)


def exact_candidates(queries: np.ndarray, gallery: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-`depth` gallery indices per query and their pessimistic ranks over the WHOLE gallery, exact in float64.

    faiss proposes the candidates in float32; they are re-scored in float64 and re-sorted. Where the
    `depth - 1`-th candidate is not clearly above every item faiss left out (within faiss's float32 error),
    the query is scored against the whole gallery in float64 instead. Returns (ranks, ids), both (q, depth).
    """
    n_gallery, dim = gallery.shape
    depth = min(depth, n_gallery)
    q64 = np.asarray(queries, dtype=np.float64)
    g64 = np.asarray(gallery, dtype=np.float64)
    q_norm = np.linalg.norm(q64, axis=1)
    g_max = float(np.linalg.norm(g64, axis=1).max()) if n_gallery else 0.0
    tol = TIE_RTOL * q_norm * g_max
    if depth >= n_gallery:  # the full ranking is needed anyway (AP, or a gallery smaller than k_max + 1)
        return _whole_gallery(q64, g64, depth, tol)
    scores32, ids = search(queries, gallery, depth)
    scores = np.empty(ids.shape, np.float64)
    block = max(1, RESCORE_CELLS // max(1, depth * dim))
    for start in range(0, ids.shape[0], block):
        rows = slice(start, start + block)
        scores[rows] = (g64[ids[rows]] @ q64[rows, :, None])[..., 0]  # batched matmul: 10x einsum's speed
    order = np.argsort(-scores, axis=1, kind="stable")
    scores, ids = np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)
    ranks = pessimistic_ranks(scores, tol)
    # Items faiss left out score (in float32) at most its last returned score, so truly at most that plus
    # float32's rounding error; ranks 1..depth-1 are exact when the depth-1-th score clears it. The error
    # allowed is FAISS_ERR_SCALE times the typical float32 error of a D-term sum (sqrt(D) ulps; faiss's BLAS
    # path was seen 1.6e-6 off at D=512, a seventh of this): the worst-case bound (D ulps) would send
    # about 4% of the queries (measured: 10,000 noisy queries, 5,000 items) to the whole-gallery path.
    err32 = FAISS_ERR_SCALE * np.sqrt(dim) * 2.0 ** -24 * q_norm * g_max
    unresolved = np.flatnonzero(scores[:, depth - 2] - tol <= scores32[:, -1].astype(np.float64) + err32) \
        if depth >= 2 else np.arange(ids.shape[0])
    if unresolved.size:
        ranks[unresolved], ids[unresolved] = _whole_gallery(q64[unresolved], g64, depth, tol[unresolved])
    return ranks, ids


def _whole_gallery(q64: np.ndarray, g64: np.ndarray, depth: int, tol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, ids) of the top `depth` from float64 scores against every gallery item, in chunks of queries."""
    n_gallery = g64.shape[0]
    ranks = np.empty((q64.shape[0], depth), np.int64)
    ids = np.empty((q64.shape[0], depth), np.int64)
    chunk = max(1, QUERY_CHUNK_CELLS // 4 // max(1, n_gallery))  # four (chunk, gallery) arrays of 8 bytes
    for start in range(0, q64.shape[0], chunk):
        rows = slice(start, start + chunk)
        scores = q64[rows] @ g64.T
        order = np.argsort(-scores, axis=1, kind="stable")
        full = pessimistic_ranks(np.take_along_axis(scores, order, axis=1), tol[rows])
        ranks[rows], ids[rows] = full[:, :depth], order[:, :depth]
    return ranks, ids


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
    ranks, ids = exact_candidates(queries, gallery, depth)
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
