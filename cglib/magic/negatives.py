"""Hard negatives (Algorithm 1): every other node of the same level whose concept cosine exceeds a threshold.

faiss finds candidate pairs on the float32 unit vectors, a little below the threshold; each candidate pair's cosine
is then computed once in float64 and used for both directions, so the float64 test alone decides and the relation
is exactly symmetric even at the threshold. Two searches find the candidates (`magic.negative_search`):

- `exact`: `IndexFlatIP`, every pair of the level compared, O(n^2) in the level's n nodes.
- `hnsw`: `IndexHNSWFlat`, a graph index, O(n log n) to build and to search. Each node asks for its k nearest
  neighbours with k doubling until the k-th falls below the threshold (or k reaches the cap), so no node is cut
  short by k; a pair can only be missed where the graph search does not reach it. The graph is built in one
  thread, so a run gives the same pairs every time.
- `auto` (default): `hnsw` only for a capped search (`max_negatives`) of more than `EXACT_MAX_NODES` nodes,
  `exact` otherwise.

Why: the paper keeps every pair above the threshold, and where names crowd together that output itself grows
quadratically (more names of the same themes), so no search can do better than exact's all-pairs pass, and
exact is the faster of the two there (benchmarks/bench_negatives.py: 39 s exact and 43 s hnsw for 80,000 LLM-like
l1 names and their 2.8M pairs; hnsw's recall 99.7%). A cap (`magic.max_hard_negatives`) bounds the output at
about K pairs per node; then hnsw wins above ~20,000 nodes (18 s at 80,000; recall of the exact capped pairs
99.995% at 20,000, the largest size checked).

With `min_hard_negatives = k`, a node with fewer than k threshold negatives gets the most similar remaining nodes of
its level as *fallback* negatives (flagged separately; not necessarily symmetric).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import faiss
import numpy as np

if TYPE_CHECKING:
    from cglib.config import MagicParams
    from cglib.magic.schema import Node

_SLACK = 1e-4  # faiss searches a little below the threshold; the exact float64 test decides
EXACT_MAX_NODES = 20_000  # a capped search above this uses hnsw (benchmarks/bench_negatives.py: where it is faster)
_HNSW_LINKS, _HNSW_EF_CONSTRUCTION, _FIRST_K = 32, 80, 32


@dataclass
class Negatives:
    """Per node: threshold negatives and fallbacks (both most similar first) and their cosines; the search and the
    threshold used."""

    hard: dict[str, list[str]] = field(default_factory=dict)
    fallback: dict[str, list[str]] = field(default_factory=dict)
    similarity: dict[str, dict[str, float]] = field(default_factory=dict)
    search: str = "exact"
    threshold: float = float("nan")


@contextmanager
def _faiss_threads(n: int | None):
    before = faiss.omp_get_max_threads()
    if n:
        faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _above(index: faiss.Index, x: np.ndarray, rows: np.ndarray, k: int, radius: float) -> tuple[np.ndarray, ...]:
    """The k nearest of each of `rows` that lie above `radius`: (row, neighbour) pairs, and whether the k-th did."""
    sims, found = index.search(x[rows], k)
    hit = (found >= 0) & (sims > radius)
    return np.repeat(rows, hit.sum(axis=1)), found[hit].astype(np.int64), hit[:, -1]


def _exact_candidates(x: np.ndarray, radius: float, k_max: int | None) -> tuple[faiss.Index, np.ndarray, np.ndarray]:
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    if k_max is not None:  # capped: each node's k_max nearest are enough
        rows, cols, _ = _above(index, x, np.arange(len(x)), min(k_max, len(x)), radius)
        return index, rows, cols
    lims, _, found = index.range_search(x, radius)
    return index, np.repeat(np.arange(len(x)), np.diff(lims).astype(np.int64)), found.astype(np.int64)


def _hnsw_candidates(x: np.ndarray, radius: float, k_max: int | None) -> tuple[faiss.Index, np.ndarray, np.ndarray]:
    n = len(x)
    limit = min(n, k_max or n)
    index = faiss.IndexHNSWFlat(x.shape[1], _HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = _HNSW_EF_CONSTRUCTION
    with _faiss_threads(1):  # a multi-threaded build inserts in a racing order: another graph on every run
        index.add(x)
    rows, cols = [], []
    todo, k = np.arange(n), min(_FIRST_K, limit)
    while todo.size:
        index.hnsw.efSearch = max(2 * k, 64)
        found_rows, found_cols, kth_above = _above(index, x, todo, k, radius)
        rows.append(found_rows)
        cols.append(found_cols)
        todo = todo[kth_above] if k < limit else todo[:0]  # k-th neighbour still above: there may be more
        k = min(2 * k, limit)
    return index, np.concatenate(rows), np.concatenate(cols)


def _pair_cosines(exact: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """float64 cosine of each pair (a[i], b[i]), a chunk at a time: gathering all rows at once would copy
    pairs x dim float64s (2 GB for 700k pairs of 384-d vectors)."""
    out = np.empty(len(a))
    for start in range(0, len(a), chunk):
        end = start + chunk
        out[start:end] = np.einsum("ij,ij->i", exact[a[start:end]], exact[b[start:end]])
    return out


def _sorted_lists(a: np.ndarray, b: np.ndarray, sims: np.ndarray, rank: np.ndarray, cap: int | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both directions of every pair (src, dst, cosine), grouped by src, most similar first, ties by id rank. With
    `cap`, only the pairs among the `cap` most similar of at least one of their nodes (in both directions)."""
    pair = np.concatenate([np.arange(len(a)), np.arange(len(a))])
    src, dst, sim = np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([sims, sims])
    order = np.lexsort((rank[dst], -sim, src))
    src, dst, sim, pair = src[order], dst[order], sim[order], pair[order]
    if cap is not None:
        position = np.arange(len(src)) - np.searchsorted(src, src)  # 0 = a node's most similar negative
        kept = np.zeros(len(a), dtype=bool)
        kept[pair[position < cap]] = True
        both = kept[pair]  # filtering keeps the order
        src, dst, sim = src[both], dst[both], sim[both]
    return src, dst, sim


def hard_negatives(ids: list[str], vectors: np.ndarray, threshold: float, min_negatives: int = 0,
                   threads: int | None = None, search: str = "auto", max_negatives: int | None = None) -> Negatives:
    """Hard negatives among `ids` (one level) from unit `vectors` (rows in `ids` order).

    `max_negatives = K` keeps, of each node's threshold negatives, its K most similar; a pair kept by either of its
    nodes is kept by both (the relation stays symmetric, so a node can hold more than K).
    """
    if search not in ("auto", "exact", "hnsw"):
        raise ValueError(f"negative search {search!r}: use auto, exact or hnsw")
    if max_negatives is not None and max_negatives < 1:
        raise ValueError(f"max_negatives={max_negatives}: use a positive count, or None for every negative")
    n = len(ids)
    bounded = max_negatives is not None and n > EXACT_MAX_NODES
    kind = search if search != "auto" else ("hnsw" if bounded else "exact")
    out = Negatives(search=kind, threshold=float(threshold))
    if n == 0:
        return out
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    exact = x.astype(np.float64)
    with _faiss_threads(threads):
        find = _exact_candidates if kind == "exact" else _hnsw_candidates
        # capped: K + 1 (the node itself) + a few spare rows, since float32 ranks may differ from float64 ones
        k_max = None if max_negatives is None else max_negatives + 1 + 8
        index, rows, cols = find(x, float(threshold) - _SLACK, k_max)
        # each unordered pair once: a search may list a pair in one direction only (at the threshold, or hnsw)
        a, b = np.minimum(rows, cols), np.maximum(rows, cols)
        keys = np.unique((a * n + b)[a != b])
        a, b = keys // n, keys % n
        pair_sims = _pair_cosines(exact, a, b)
        above = pair_sims > threshold
        rank = {name: r for r, name in enumerate(sorted(ids))}
        id_rank = np.array([rank[name] for name in ids])
        src, dst, sim = _sorted_lists(a[above], b[above], pair_sims[above], id_rank, max_negatives)
        k = min(min_negatives, n - 1)
        top = None
        if k > 0 and (np.bincount(src, minlength=n) < k).any():
            if kind == "hnsw":
                index.hnsw.efSearch = max(2 * (k + 9), 64)
            _, top = index.search(x, min(n, k + 1 + 8))  # a few spare rows: self and exact ties may take slots

    names, sims = np.array(ids, dtype=object)[dst].tolist(), sim.tolist()
    bounds = np.searchsorted(src, np.arange(n + 1)).tolist()
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        hard = names[lo:hi]
        similarity = dict(zip(hard, sims[lo:hi], strict=True))
        fallback: list[str] = []
        if len(hard) < k:
            taken = set(dst[lo:hi].tolist())
            candidates = {int(j) for j in top[i] if j >= 0 and j != i and j not in taken}
            if len(candidates) < k - len(hard):  # rare: many exact ties; fall back to all nodes
                candidates = {j for j in range(n) if j != i and j not in taken}
            cosine = {j: float(exact[i] @ exact[j]) for j in candidates}
            for j in sorted(candidates, key=lambda j: (-cosine[j], ids[j]))[:k - len(hard)]:
                fallback.append(ids[j])
                similarity[ids[j]] = cosine[j]
        out.hard[ids[i]] = hard
        out.fallback[ids[i]] = fallback
        out.similarity[ids[i]] = similarity
    return out


def nearest_neighbour_cosines(vectors: np.ndarray, threads: int | None = None) -> np.ndarray:
    """Each row's float64 cosine with its most similar other row (unit `vectors`; NaN for a lone row)."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if len(x) < 2:
        return np.full(len(x), np.nan)
    with _faiss_threads(threads):
        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        _, found = index.search(x, min(len(x), 3))  # self and a float32 tie may take two slots
    exact = x.astype(np.float64)
    cosines = np.einsum("ij,ikj->ik", exact, exact[np.maximum(found, 0)])
    cosines[(found < 0) | (found == np.arange(len(x))[:, None])] = -np.inf
    return cosines.max(axis=1)


def calibrated_threshold(vectors: np.ndarray, coverage: float, threads: int | None = None) -> float:
    """The cosine above which `coverage` of the nodes (rows of `vectors`, one level) have a hard negative: just
    below the nearest-neighbour cosine of the ceil(coverage * n)-th node, most similar first (ties may add
    nodes). A lone node gets 1.0 (no pair)."""
    nearest = nearest_neighbour_cosines(vectors, threads)
    if len(nearest) < 2:
        return 1.0
    ranked = np.sort(nearest)[::-1]
    return float(ranked[math.ceil(coverage * len(ranked)) - 1]) - 1e-12  # the float64 test is strict (>)


def level_threshold(vectors: np.ndarray, magic: MagicParams, threads: int | None = None) -> float:
    """The level's hard-negative threshold: magic.hard_negative_sim, or with `calibrated` the cosine that gives
    about magic.hard_negative_coverage of its nodes a hard negative."""
    if magic.hard_negative_sim == "calibrated":
        return calibrated_threshold(vectors, magic.hard_negative_coverage, threads)
    return float(magic.hard_negative_sim)


def level_negatives(levels: dict[int, list[str]], vectors: dict[str, np.ndarray], magic: MagicParams,
                    threads: int | None = None) -> dict[int, Negatives]:
    """`hard_negatives` of each non-empty level ({level: node ids}; `vectors` keyed by node id) with the `magic`
    section's settings (the threshold per level: `level_threshold`)."""
    out = {}
    for level, ids in levels.items():
        if ids:
            x = np.stack([vectors[n] for n in ids])
            out[level] = hard_negatives(ids, x, level_threshold(x, magic, threads), magic.min_hard_negatives,
                                        threads=threads, search=magic.negative_search,
                                        max_negatives=magic.max_hard_negatives)
    return out


def attach_negatives(nodes: dict[str, Node], vectors: dict[str, np.ndarray], magic: MagicParams,
                     threads: int | None = None) -> dict[str, dict[str, float | str]]:
    """Each level's hard negatives, fallbacks and cosines written into its `nodes` (`vectors` keyed by node id),
    with the `magic` section's settings; returns each level's search and threshold ({"l1": {"search": "exact",
    "threshold": 0.85}, ...})."""
    levels = {level: sorted(n for n, node in nodes.items() if node.level == level)
              for level in sorted({node.level for node in nodes.values()})}
    found = level_negatives(levels, vectors, magic, threads)
    for level, ids in levels.items():
        for n in ids:
            nodes[n].hard_negatives = found[level].hard[n]
            nodes[n].fallback_negatives = found[level].fallback[n]
            nodes[n].negative_similarity = found[level].similarity[n]
    return {f"l{level}": {"search": negatives.search, "threshold": negatives.threshold}
            for level, negatives in found.items()}


def negative_settings(levels: dict[str, dict[str, float | str]], magic: MagicParams) -> dict:
    """The stats' record of attach_negatives' result: the search and the threshold each level used (and, when
    calibrated, the coverage asked for)."""
    out = {"negative_search": {k: v["search"] for k, v in levels.items()},
           "hard_negative_sim_by_level": {k: round(float(v["threshold"]), 6) for k, v in levels.items()}}
    if magic.hard_negative_sim == "calibrated":
        out["hard_negative_coverage"] = magic.hard_negative_coverage
    return out
