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
            sims = matrix @ matrix[row[node]]
            sims[~alive] = -np.inf
            sims[row[node]] = -np.inf
            best = int(np.argmax(sims)) if alive.sum() > 1 else None
            similarity = float(sims[best]) if best is not None else None
            if best is None or similarity < sim_min:
                n_images = counts[node]
                touched = [*dag.graph.pred[node], *dag.graph.succ[node]]
                removed = dag.remove(node)
                alive[row[node]] = False
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
                touched = [target]
            dag.check(around=touched)  # the invariants after every operation (locally; in full per level)
            counts = dag.image_counts(up_to=level)


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
