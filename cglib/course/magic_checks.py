"""Checks of notebook 03's exercises: symmetric hard negatives from a threshold (against
`cglib.magic.negatives.hard_negatives`) and a merge-and-remove setting (against `cglib.magic.merge`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, passed
from cglib.magic.dag import ConceptDAG
from cglib.magic.merge import merge_and_remove
from cglib.magic.negatives import hard_negatives
from cglib.magic.schema import MergeRecord, RemovalRecord


def tie_case() -> tuple[list[str], np.ndarray, float]:
    """Unit vectors whose cosines are exact in binary, one pair exactly at the threshold (0.5): the rule keeps a
    pair strictly above it."""
    x = np.array([[1.0, 0.0, 0.0, 0.0],  # a . b = 0.5 exactly: a tie, not a negative
                  [0.5, 0.5, 0.5, 0.5],
                  [0.75, np.sqrt(1 - 0.75 ** 2), 0.0, 0.0],  # a . c = 0.75, b . c ~ 0.81
                  [0.0, 0.0, 0.0, 1.0]])
    return ["a", "b", "c", "d"], x, 0.5


def negatives_case(seed: int) -> tuple[list[str], np.ndarray, float]:
    """Seeded unit vectors in a few clusters (so some pairs lie above the threshold and some nodes have none), with
    names not in vector order; seed 0 is the exact-tie case."""
    if seed == 0:
        return tie_case()
    rng = np.random.default_rng(seed)
    n, dim, clusters = int(rng.integers(8, 16)), int(rng.integers(4, 10)), int(rng.integers(2, 5))
    centres = rng.normal(size=(clusters, dim))
    x = centres[rng.integers(clusters, size=n)] + 0.6 * rng.normal(size=(n, dim))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32).astype(np.float64)
    names = [f"node {i}" for i in rng.permutation(n)]
    return names, x, float(np.round(rng.uniform(0.6, 0.85), 2))


def _negatives_failure(ids, x, threshold, node, yours, expected) -> CheckFailed:
    cos = {b: float(x[ids.index(node)] @ x[ids.index(b)]) for b in ids}
    lines = [(f"hard negatives of {node!r} (threshold {threshold}, {len(ids)} nodes): yours {yours}, the "
             f"library's {expected}")]
    extra, missing = [b for b in yours if b not in expected], [b for b in expected if b not in yours]
    if node in yours:
        lines.append(f"  {node!r} is listed as its own negative: a node is never its own hard negative")
    ties = [b for b in extra if b != node and abs(cos[b] - threshold) < 1e-12]
    if ties:
        lines.append(f"  {ties} lie exactly at the threshold (cosine {threshold}): a pair counts only when its "
                     "cosine is strictly above it (>, not >=)")
    below = [b for b in extra if b != node and b not in ties]
    if below:
        lines.append("  listed but not above the threshold: " + ", ".join(f"{b!r} (cosine {cos[b]:.4f})"
                                                                          for b in below))
    if missing:
        lines.append("  missing: " + ", ".join(f"{b!r} (cosine {cos[b]:.4f})" for b in missing))
    if not (extra or missing):
        lines.append("  the same nodes in another order: list them most similar first (equal cosines: by name)")
    return CheckFailed("\n".join(lines))


def check_hard_negatives(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(ids, vectors, threshold)` -> {id: [ids of its hard negatives, most similar first]} for every id must
    match `hard_negatives(ids, vectors, threshold).hard`: same level, cosine strictly above the threshold,
    symmetric, never the node itself."""
    for seed in seeds:
        ids, x, threshold = negatives_case(seed)
        answer = fn(list(ids), x.copy(), threshold)
        if not isinstance(answer, dict):
            raise CheckFailed(f"return a dict {{node id: list of its hard negatives}}; got {type(answer).__name__}")
        absent = [n for n in ids if n not in answer]
        if absent:
            raise CheckFailed(f"no entry for {absent}: give every node a list, an empty one when it has no hard "
                              "negative (training looks every node up)")
        yours = {n: list(answer[n]) for n in ids}
        one_way = [(a, b) for a in ids for b in yours[a] if b in yours and a not in yours[b] and a != b]
        if one_way:
            a, b = one_way[0]
            raise CheckFailed(f"{b!r} is a hard negative of {a!r} but {a!r} is not one of {b!r} ({len(one_way)} "
                              "such one-way pairs): the cosine is symmetric, so the relation must be too; a loop "
                              "over pairs i < j must record both directions")
        expected = hard_negatives(ids, x, threshold).hard
        for node in ids:
            if yours[node] != expected[node]:
                raise _negatives_failure(ids, x, threshold, node, yours[node], expected[node])
    passed("your hard negatives", seeds)


def library_merges(chains: dict[str, list[str]], l_max: int, vectors: dict[str, np.ndarray], size_min: int,
                   sim_min: float) -> tuple[list[MergeRecord], list[RemovalRecord]]:
    """The library's merges and removals for these settings, on a DAG built afresh from the chains."""
    return merge_and_remove(ConceptDAG.from_chains(chains, l_max), vectors, size_min, sim_min)


def check_merge_setting(merges: list[MergeRecord], removals: list[RemovalRecord], size_min: int, sim_min: float,
                        chains: dict[str, list[str]], l_max: int, vectors: dict[str, np.ndarray]) -> None:
    """Your (size_min, sim_min) must make at least one merge and one removal appear, and your `merges` and
    `removals` must be what the library's merge-and-remove gives for them on the same chains and vectors."""
    expected_merges, expected_removals = library_merges(chains, l_max, vectors, size_min, sim_min)
    if not expected_removals and not expected_merges:
        raise CheckFailed(f"size_min={size_min}: no node is small (every node has at least {size_min} images), so "
                          "nothing merges or leaves; raise size_min above the smallest l1 node's image count")
    if not expected_merges:
        best = max((r.similarity for r in expected_removals if r.similarity is not None), default=None)
        raise CheckFailed(f"sim_min={sim_min}: {len(expected_removals)} small nodes were removed, none merged: a "
                          "small node merges only when its most similar node of the level reaches sim_min; the "
                          f"closest any removed node came was cosine {best:.3f}, so lower sim_min below it")
    if not expected_removals:
        worst = min(m.similarity for m in expected_merges)
        raise CheckFailed(f"sim_min={sim_min}: {len(expected_merges)} small nodes merged, none was removed: every "
                          f"small node found a partner (the least similar merge: cosine {worst:.3f}); raise sim_min "
                          "above that so the least similar ones are removed instead, or raise size_min")
    for what, yours, expected in (("merges", merges, expected_merges), ("removals", removals, expected_removals)):
        if list(yours) != expected:
            raise CheckFailed(f"your {what} ({len(yours)}) differ from the library's ({len(expected)}) for "
                              f"size_min={size_min}, sim_min={sim_min}: build a fresh DAG from the aligned chains "
                              "(merging changes it in place, so a DAG merged once cannot be merged again) and "
                              "pass the same size_min and sim_min you report")
    print(f"Correct: size_min={size_min}, sim_min={sim_min} gives {len(merges)} merges and {len(removals)} removals "
          f"({sum(r.n_images for r in removals if r.level == 1)} images leave with removed l1 nodes).")
