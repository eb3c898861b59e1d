"""Hard negatives (Algorithm 1): every other node of the same level whose concept cosine exceeds a threshold.

faiss (`IndexFlatIP` on unit vectors, i.e. exact cosine) finds the candidate pairs; each pair's cosine is then
computed once in float64 and used for both directions, so the relation is exactly symmetric even at the
threshold. With `min_hard_negatives = k`, a node with fewer than k threshold negatives gets the most similar
remaining nodes of its level as *fallback* negatives (flagged separately; not necessarily symmetric).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np

_SLACK = 1e-4  # faiss searches a little below the threshold; the exact float64 test decides


@dataclass
class Negatives:
    """Per node: threshold negatives and fallbacks (both most similar first) and their cosines."""

    hard: dict[str, list[str]] = field(default_factory=dict)
    fallback: dict[str, list[str]] = field(default_factory=dict)
    similarity: dict[str, dict[str, float]] = field(default_factory=dict)


def hard_negatives(ids: list[str], vectors: np.ndarray, threshold: float, min_negatives: int = 0,
                   threads: int | None = None) -> Negatives:
    """Hard negatives among `ids` (one level) from unit `vectors` (rows in `ids` order)."""
    if threads:
        faiss.omp_set_num_threads(threads)
    out = Negatives()
    n = len(ids)
    if n == 0:
        return out
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    exact = x.astype(np.float64)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    lims, _, found = index.range_search(x, float(threshold) - _SLACK)
    rows = np.repeat(np.arange(n), np.diff(lims).astype(np.int64))
    cols = found.astype(np.int64)
    off_diagonal = rows != cols
    # each unordered pair once: faiss may list a pair in one direction only when it sits at the threshold
    pairs = np.unique(np.sort(np.stack([rows, cols], axis=1)[off_diagonal], axis=1), axis=0).reshape(-1, 2)
    pair_sims = np.einsum("ij,ij->i", exact[pairs[:, 0]], exact[pairs[:, 1]])
    above = pair_sims > threshold
    neigh: dict[int, dict[int, float]] = {i: {} for i in range(n)}
    for (a, b), sim in zip(pairs[above].tolist(), pair_sims[above].tolist()):
        neigh[a][b] = sim
        neigh[b][a] = sim
    k = min(min_negatives, n - 1)
    if k > 0 and any(len(neigh[i]) < k for i in range(n)):
        _, top = index.search(x, min(n, k + 1 + 8))  # a few spare rows: self and exact ties may take slots
    for i in range(n):
        hard = sorted(neigh[i], key=lambda j: (-neigh[i][j], ids[j]))
        sims = {ids[j]: neigh[i][j] for j in hard}
        fallback: list[str] = []
        if len(hard) < k:
            candidates = {int(j) for j in top[i] if j >= 0 and j != i and j not in neigh[i]}
            if len(candidates) < k - len(hard):  # rare: many exact ties; fall back to all nodes
                candidates = {j for j in range(n) if j != i and j not in neigh[i]}
            scored = sorted(candidates, key=lambda j: (-float(exact[i] @ exact[j]), ids[j]))
            for j in scored[:k - len(hard)]:
                fallback.append(ids[j])
                sims[ids[j]] = float(exact[i] @ exact[j])
        out.hard[ids[i]] = [ids[j] for j in hard]
        out.fallback[ids[i]] = fallback
        out.similarity[ids[i]] = sims
    return out
