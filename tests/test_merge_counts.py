"""The merge loop (local recounts, nearest-neighbour candidates) decides exactly as the first, quadratic version."""

from __future__ import annotations

import numpy as np
import pytest

from cglib.magic import merge
from cglib.magic.dag import ConceptDAG
from cglib.magic.merge import merge_and_remove
from cglib.magic.schema import MergeRecord, RemovalRecord


def reference_merge_level(dag: ConceptDAG, level: int, vectors: dict[str, np.ndarray], size_min: int,
                          sim_min: float) -> tuple[list, list]:
    """The merge loop as first written: all counts recomputed and a full similarity scan after each operation."""
    ids = dag.nodes_at(level)
    if not ids:
        return [], []
    row = {n: i for i, n in enumerate(ids)}
    matrix = np.stack([vectors[n] for n in ids]).astype(np.float64)
    alive = np.ones(len(ids), dtype=bool)
    merges, removals, rnd = [], [], 0
    while True:
        rnd += 1
        counts = dag.image_counts(up_to=level)
        small = sorted((n for n in ids if alive[row[n]] and counts[n] < size_min), key=lambda n: (counts[n], n))
        if not small:
            return merges, removals
        for node in small:
            if not alive[row[node]] or counts[node] >= size_min:
                continue
            sims = matrix @ matrix[row[node]]
            sims[~alive] = -np.inf
            sims[row[node]] = -np.inf
            best = int(np.argmax(sims)) if alive.sum() > 1 else None
            similarity = float(sims[best]) if best is not None else None
            if best is None or similarity < sim_min:
                n_images = counts[node]
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
            counts = dag.image_counts(up_to=level)


def noisy_dag(seed: int, n_images: int) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    """LLM-like chains: many small l1 names (Zipf), parents that disagree; clustered random concept vectors."""
    rng = np.random.default_rng(seed)
    l1 = [f"c{k}" for k in range(n_images // 3)]
    weights = 1.0 / np.arange(1, len(l1) + 1) ** 1.05
    chains = {}
    for i in range(n_images):
        name = l1[rng.choice(len(l1), p=weights / weights.sum())]
        k = int(name[1:])
        l2 = f"p{k % 40}" if rng.random() > 0.2 else f"p{rng.integers(60)}"
        l3 = f"q{k % 9}" if rng.random() > 0.1 else f"q{rng.integers(12)}"
        chains[f"img{i:05d}"] = [name, l2, l3, f"r{k % 3}"]
    centres = rng.normal(size=(25, 16))
    vectors = {}
    for level, names in enumerate(({c[j] for c in chains.values()} for j in range(4)), start=1):
        for name in sorted(names):
            v = centres[hash(name) % 25] + 0.35 * rng.normal(size=16)
            vectors[f"l{level}:{name}"] = v / np.linalg.norm(v)
    return chains, vectors


@pytest.mark.parametrize(("seed", "neighbours"), [(0, 64), (1, 64), (2, 64), (0, 2)])
def test_same_decisions_as_full_recount_and_scan(seed: int, neighbours: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same merges, removals (with counts) and final DAG as the full recount and scan after every operation."""
    # with 2 candidates per node most lookups exhaust them and take the full-scan fallback
    monkeypatch.setattr(merge, "NEIGHBOURS", neighbours)
    chains, vectors = noisy_dag(seed, 1500)
    fast, slow = ConceptDAG.from_chains(chains, 4), ConceptDAG.from_chains(chains, 4)
    merges, removals = merge_and_remove(fast, vectors, size_min=5, sim_min=0.86)
    ref_merges, ref_removals = [], []
    for level in range(1, 5):
        m, r = reference_merge_level(slow, level, vectors, 5, 0.86)
        ref_merges += m
        ref_removals += r
    # the same decisions; similarities equal up to float rounding (candidates come from one matrix product)
    assert [m.model_copy(update={"similarity": 0.0}) for m in merges] == \
        [m.model_copy(update={"similarity": 0.0}) for m in ref_merges]
    assert [r.model_copy(update={"similarity": 0.0}) for r in removals] == \
        [r.model_copy(update={"similarity": 0.0}) for r in ref_removals]
    assert [m.similarity for m in merges] == pytest.approx([m.similarity for m in ref_merges], abs=1e-12)
    assert [r.similarity for r in removals] == pytest.approx([r.similarity for r in ref_removals], abs=1e-12)
    assert len(merges) > 50 and len(removals) > 5 and any(m.level > 1 for m in merges)
    assert sorted(fast.graph.edges(data=True)) == sorted(slow.graph.edges(data=True))
    assert fast.images == slow.images and fast.image_counts() == slow.image_counts()
