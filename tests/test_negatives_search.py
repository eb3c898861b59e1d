"""The hard-negative searches: hnsw finds exactly exact's pairs on clustered concept vectors, `auto` switches at
EXACT_MAX_NODES, and the answer does not depend on the run (the graph is built in one thread)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cglib.config import MagicParams
from cglib.magic import negatives
from cglib.magic.negatives import EXACT_MAX_NODES, hard_negatives

REPO = Path(__file__).resolve().parent.parent


def clustered(n: int, dim: int = 32, clusters: int = 40, spread: float = 0.45, seed: int = 0) -> np.ndarray:
    """Unit vectors in tight clusters, as concept names of one theme are (many pairs above a high threshold)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim))
    x = centers[rng.integers(clusters, size=n)] + spread * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def ids_for(n: int) -> list[str]:
    return [f"l1:n{i:05d}" for i in range(n)]


def as_tuple(found: negatives.Negatives) -> tuple:
    return found.hard, found.fallback, found.similarity


@pytest.mark.parametrize("threshold,min_negatives", [(0.85, 0), (0.7, 4)])
def test_hnsw_finds_exactly_the_pairs_of_the_exact_search(threshold, min_negatives):
    """On 3,000 clustered vectors (nodes with over a hundred negatives, beyond hnsw's first k = 32): the same
    negatives in the same order with the same float64 cosines, and the same fallbacks."""
    x, ids = clustered(3000), ids_for(3000)
    exact = hard_negatives(ids, x, threshold, min_negatives, search="exact")
    hnsw = hard_negatives(ids, x, threshold, min_negatives, search="hnsw")
    assert (exact.search, hnsw.search) == ("exact", "hnsw")
    degrees = [len(v) for v in exact.hard.values()]
    assert max(degrees) > 2 * negatives._FIRST_K and sum(degrees) > 10_000
    assert as_tuple(hnsw) == as_tuple(exact)


def test_hnsw_gives_the_same_answer_on_every_run():
    x, ids = clustered(2000, seed=1), ids_for(2000)
    first = hard_negatives(ids, x, 0.8, 2, threads=2, search="hnsw")
    assert as_tuple(hard_negatives(ids, x, 0.8, 2, threads=2, search="hnsw")) == as_tuple(first)


def test_hnsw_keeps_every_negative_of_a_node_beyond_the_first_k():
    """200 near-copies: each node has 199 negatives, found by doubling k (32, 64, 128, 256)."""
    rng = np.random.default_rng(2)
    x = np.ones((200, 16)) + 0.01 * rng.normal(size=(200, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    found = hard_negatives(ids_for(200), x, 0.99, search="hnsw")
    assert all(len(v) == 199 for v in found.hard.values())


def test_auto_uses_hnsw_only_for_a_capped_level_above_the_limit(monkeypatch):
    """Uncapped, the output bounds the work and exact is the faster search at every size; capped, hnsw above
    EXACT_MAX_NODES (here lowered to 299) with the same answer as the exact capped search."""
    x, ids = clustered(300, seed=3), ids_for(300)
    assert hard_negatives(ids, x, 0.85, max_negatives=4).search == "exact"
    monkeypatch.setattr(negatives, "EXACT_MAX_NODES", 299)
    assert hard_negatives(ids, x, 0.85).search == "exact"
    above = hard_negatives(ids, x, 0.85, max_negatives=4)
    assert above.search == "hnsw"
    assert as_tuple(above) == as_tuple(hard_negatives(ids, x, 0.85, search="exact", max_negatives=4))


def test_the_params_describe_the_limit_the_code_uses():
    assert f"{EXACT_MAX_NODES:,}" in MagicParams.model_fields["negative_search"].description


def test_an_unknown_search_is_refused():
    with pytest.raises(ValueError, match="auto, exact or hnsw"):
        hard_negatives(["l1:a", "l1:b"], np.eye(2), 0.5, search="ivf")


def test_the_benchmark_measures_both_searches_on_llm_like_names():
    """benchmarks/bench_negatives.py at two small sizes: both searches timed, hnsw's recall against exact."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_negatives import llm_like_names, measure

    names = llm_like_names()
    assert len(names) == len(set(names)) == 52 * 40 * 39
    rows = measure([120, 480], threshold=0.85, threads=2, cap=2)
    assert [r["nodes"] for r in rows] == [120, 480]
    assert all(r["recall"] == 1.0 and r["extra"] == 0 and r["cap_recall"] == 1.0 for r in rows)
    assert 0 < rows[-1]["hnsw_cap_pairs"] < rows[-1]["exact_pairs"]  # the cap bit: some node had more than 2
    assert all(r[f"{run}_s"] > 0 for r in rows for run in ("exact", "hnsw", "hnsw_cap", "exact_cap"))


def capped_reference(x: np.ndarray, ids: list[str], threshold: float, k: int) -> set[tuple[str, str]]:
    """Brute force: each node's k most similar threshold negatives (float64, ties by id), made symmetric."""
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    pairs = set()
    for i in range(len(ids)):
        above = [j for j in range(len(ids)) if j != i and sims[i, j] > threshold]
        for j in sorted(above, key=lambda j: (-sims[i, j], ids[j]))[:k]:
            pairs |= {(ids[i], ids[j]), (ids[j], ids[i])}
    return pairs


@pytest.mark.parametrize("search", ["exact", "hnsw"])
def test_a_cap_keeps_each_nodes_most_similar_negatives_symmetrically(search):
    """max_negatives=K: exactly the brute-force union of every node's K most similar threshold negatives; every
    node keeps min(K, its threshold negatives) or more, most similar first, and the relation stays symmetric."""
    x, ids = clustered(1500, seed=4), ids_for(1500)
    full = hard_negatives(ids, x, 0.8, search="exact")
    capped = hard_negatives(ids, x, 0.8, search=search, max_negatives=5)
    assert max(len(v) for v in full.hard.values()) > 20
    assert {(a, b) for a, hard in capped.hard.items() for b in hard} == capped_reference(x, ids, 0.8, 5)
    for a in ids:
        assert len(capped.hard[a]) >= min(5, len(full.hard[a]))
        assert capped.hard[a][:5] == full.hard[a][:5]
        assert all(a in capped.hard[b] for b in capped.hard[a])
        assert all(capped.similarity[a][b] == full.similarity[a][b] for b in capped.hard[a])


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="positive count"):
        hard_negatives(["l1:a", "l1:b"], np.eye(2), 0.5, max_negatives=0)
