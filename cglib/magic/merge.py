"""Algorithm 1's merge-and-remove step: small nodes join their most similar same-level node, or leave.

A node is *small* when fewer than `size_min` images lie under it (l1: its own images; higher levels: the
images whose primary chain passes through it). A small node merges into its most similar node of the same
level by concept-embedding cosine when that cosine reaches `sim_min`; the pair merges smaller into larger (on a
tie, the small node being processed goes into its match). Otherwise the small node is removed; removing an l1
node removes its images (reported in the `RemovalRecord`). Rounds repeat until no node changes.

Levels are processed bottom-up, l1 first. Once a level is stable every node on it has >= size_min images, and
later levels never change the image counts below them, so on levels >= 2 a node is small only when *no* child
chose it as primary parent (it has 0 images and is only a minority parent of some children). Merging such a
node adds its supporting edges to the target (which may change a child's primary parent, hence the rounds);
removing it drops those minority edges. No image is ever lost above l1, and no child is left without a parent.
"""

from __future__ import annotations

import numpy as np

from cglib.magic.dag import ConceptDAG
from cglib.magic.schema import MergeRecord, RemovalRecord


def merge_level(dag: ConceptDAG, level: int, vectors: dict[str, np.ndarray], size_min: int, sim_min: float
                ) -> tuple[list[MergeRecord], list[RemovalRecord]]:
    """Merge or remove the small nodes of one level until stable; `vectors`: node id -> unit concept vector."""
    ids = dag.nodes_at(level)
    if not ids:
        return [], []
    row = {n: i for i, n in enumerate(ids)}
    matrix = np.stack([vectors[n] for n in ids]).astype(np.float64)
    alive = np.ones(len(ids), dtype=bool)
    n_alive = len(ids)
    near_index, near_sims = nearest_neighbours(matrix, NEIGHBOURS)
    merges: list[MergeRecord] = []
    removals: list[RemovalRecord] = []
    rnd = 0
    while True:
        rnd += 1
        counts = dag.image_counts(up_to=level)
        small = sorted((n for n in ids if alive[row[n]] and counts[n] < size_min), key=lambda n: (counts[n], n))
        if not small:
            dag.check()
            return merges, removals
        for node in small:
            if not alive[row[node]] or counts[node] >= size_min:
                continue  # merged away, or grew past size_min earlier in this round
            best, similarity = _most_similar_alive(row[node], matrix, alive, near_index, near_sims, n_alive)
            if best is None or similarity < sim_min:
                n_images = counts[node]
                touched = [*dag.graph.pred[node], *dag.graph.succ[node]]
                removed = dag.remove(node)
                alive[row[node]] = False
                n_alive -= 1
                removals.append(RemovalRecord(level=level, node=node, n_images=n_images,
                                              best_match=None if best is None else ids[best],
                                              similarity=similarity, image_ids=sorted(removed)))
            else:
                match = ids[best]
                source, target = (node, match) if counts[match] >= counts[node] else (match, node)
                merges.append(MergeRecord(level=level, source=source, target=target, similarity=similarity,
                                          n_images=counts[source], round=rnd))
                dag.merge(source, target)
                alive[row[source]] = False
                n_alive -= 1
                touched = [target]
            dag.check(around=touched)  # the invariants after every operation (locally; in full per level)
            _update_counts(dag, level, counts, touched)


NEIGHBOURS = 64  # candidates kept per node; a node whose candidates are all gone falls back to a full scan


def nearest_neighbours(matrix: np.ndarray, k: int, block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k most similar other rows (by dot product), most similar first, ties by lower index.

    Computed once per level with blocked matrix products, so that finding a small node's best match costs a scan
    of k candidates instead of a product with the whole level (K products of K x D made the loop quadratic in
    memory traffic: tens of minutes at COCO scale).
    """
    n = len(matrix)
    k = min(k, n - 1)
    index = np.zeros((n, max(k, 0)), dtype=np.int64)
    sims = np.zeros((n, max(k, 0)), dtype=np.float64)
    if k <= 0:
        return index, sims
    for start in range(0, n, block):
        rows = np.arange(start, min(start + block, n))
        s = matrix[rows] @ matrix.T
        s[np.arange(len(rows)), rows] = -np.inf
        top = np.argpartition(-s, k - 1, axis=1)[:, :k] if k < n - 1 else np.argsort(-s, axis=1)[:, :k]
        top_sims = np.take_along_axis(s, top, axis=1)
        order = np.lexsort((top, -top_sims), axis=1)  # by similarity, then by index (np.argmax's tie rule)
        index[rows] = np.take_along_axis(top, order, axis=1)
        sims[rows] = np.take_along_axis(top_sims, order, axis=1)
    return index, sims


def _most_similar_alive(r: int, matrix: np.ndarray, alive: np.ndarray, near_index: np.ndarray,
                        near_sims: np.ndarray, n_alive: int) -> tuple[int | None, float | None]:
    """The alive row most similar to row `r` (ties: lower index) and its similarity; (None, None) when alone."""
    if n_alive <= 1:
        return None, None
    for j, sim in zip(near_index[r], near_sims[r]):
        if alive[j]:
            return int(j), float(sim)
    sims = matrix @ matrix[r]  # every candidate is gone: scan the whole level
    sims[~alive] = -np.inf
    sims[r] = -np.inf
    best = int(np.argmax(sims))
    return best, float(sims[best])


def _update_counts(dag: ConceptDAG, level: int, counts: dict[str, int], touched: list[str]) -> None:
    """Recount, in place, the nodes of `level` whose image count an operation around `touched` may have changed.

    Counts below `level` never change here, and a node's count is its own images (l1) or the counts of the
    children that chose it as primary parent; a merge or removal changes only the edges of the children of the
    nodes it touched, so only those children's parents at this level can change. Recounting them alone, instead
    of the whole DAG after every operation, keeps the loop near-linear in the number of nodes (the full recount
    made it cubic: hours at COCO scale, see benchmarks/bench_scale.py).
    """
    affected: set[str] = set()
    for node in touched:
        if node not in dag.graph:
            continue
        node_level = dag.level(node)
        if node_level == level:
            affected.add(node)
            children = dag.graph.pred[node]
        elif node_level == level - 1:
            children = (node,)
        else:
            continue
        for child in children:
            affected.update(dag.graph.succ[child])
    for node in affected:
        if level == 1:
            counts[node] = len(dag.images.get(node, ()))
        else:
            counts[node] = sum(counts[c] for c in dag.graph.pred[node] if dag.primary_parent(c) == node)


def merge_and_remove(dag: ConceptDAG, vectors: dict[str, np.ndarray], size_min: int, sim_min: float
                     ) -> tuple[list[MergeRecord], list[RemovalRecord]]:
    """Run the merge loop on every level, l1 first (see the module docstring for why bottom-up)."""
    merges: list[MergeRecord] = []
    removals: list[RemovalRecord] = []
    for level in range(1, dag.l_max + 1):
        m, r = merge_level(dag, level, vectors, size_min, sim_min)
        merges += m
        removals += r
    return merges, removals
