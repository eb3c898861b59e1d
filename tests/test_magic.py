"""MAGIC (Algorithm 1): the concept DAG, merge/remove, hard negatives, split, file format, statistics.

Most tests use hand-made chains and an embedder with fixed vectors, so every merge decision is known in advance.
"""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
from factories import tiny_magic

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.magic import (
    ConceptDAG,
    DagError,
    MagicInvariantError,
    build_magic,
    check_invariants,
    load_magic,
    save_magic,
    save_outputs,
    table1,
)
from cglib.magic.build import SKIP_EMPTY, SKIP_LENGTH, SKIP_NO_CHAIN, SKIP_UNKNOWN, align_chains
from cglib.magic.dag import choose_primary
from cglib.magic.generalized_captions import group_requests
from cglib.magic.negatives import hard_negatives
from cglib.magic.split import n_test_images, split_images


# ------------------------------------------------------------------------------------------------ helpers
def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def at_cos(c: float) -> np.ndarray:
    """A 3-d unit vector with cosine `c` to (1, 0, 0)."""
    return np.array([c, np.sqrt(1 - c * c), 0.0], dtype=np.float32)


class FixedEmbedder:
    """Embedder returning hand-set vectors by name (unknown names: an orthogonal-ish hash vector)."""

    def __init__(self, table: dict[str, np.ndarray], dim: int = 3) -> None:
        self.table = table
        self.dim = dim
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = []
        for t in texts:
            if t in self.table:
                out.append(np.asarray(self.table[t], dtype=np.float32))
            else:
                rng = np.random.default_rng(list(t.encode()))
                out.append(rng.normal(size=self.dim).astype(np.float32))
        return np.stack(out)


def fake_generalizer(fail: set[str] = frozenset()):
    """A deterministic LLM_gen stand-in: 'a scene of <concept> (k)'; groups in `fail` fail."""
    seen: list = []

    def generalize(requests, params, run_dir, progress=True):
        seen.extend(requests)
        caps = {r.group_id: [f"a scene of {r.concept} ({k})" for k in range(r.n)] for r in requests
                if r.group_id not in fail}
        failures = [SimpleNamespace(item_id=r.group_id, reason="invalid_json") for r in requests
                    if r.group_id in fail]
        return SimpleNamespace(captions=caps, failures=failures, summary={"groups": len(requests)})

    generalize.seen = seen
    return generalize


def dataset_for(chains: dict[str, list[str]], extra: list[str] = ()) -> CaptionDataset:
    ids = sorted(set(chains) | set(extra))
    caps = {i: [f"caption one of {i}", f"caption two of {i}"] for i in ids}
    return CaptionDataset(source="synthetic", image_ids=ids, captions=caps,
                          pixels=np.zeros((len(ids), 2, 2, 3), dtype=np.uint8))


def make_chains(spec: list[tuple[int, list[str]]], prefix: str = "img") -> dict[str, list[str]]:
    """[(count, chain), ...] -> image id -> chain."""
    chains, k = {}, 0
    for count, chain in spec:
        for _ in range(count):
            chains[f"{prefix}{k:04d}"] = list(chain)
            k += 1
    return chains


def params(**magic) -> Params:
    base = {"size_min": 5, "sim_min": 0.9, "hard_negative_sim": 0.85, "l_max": 2}
    base.update(magic)
    return Params.model_validate({"magic": base})


def build(chains, table, p=None, fail=frozenset(), **kw):
    gen = fake_generalizer(fail)
    p = p or params()
    magic = build_magic(dataset_for(chains), chains, p, generalizer=gen, embedder=FixedEmbedder(table), **kw)
    return magic, gen


# ------------------------------------------------------------------------------------------------ the DAG
def test_same_string_at_two_levels_stays_two_nodes_without_cycle():
    """The authors' code keyed nodes by raw string, so 'cooking' at l1 and l3 made cross-level edges and
    cycles; keyed by (level, name) they are two nodes and the graph stays a level-ordered DAG."""
    chains = make_chains([(3, ["cooking", "food", "cooking", "life"]),
                          (3, ["baking", "cooking", "food", "life"])])
    dag = ConceptDAG.from_chains(chains, l_max=4)
    assert {"l1:cooking", "l3:cooking", "l2:cooking"} <= set(dag.graph.nodes)
    assert nx.is_directed_acyclic_graph(dag.graph)
    assert dag.parents("l1:cooking") == {"l2:food": 3}
    assert dag.parents("l2:cooking") == {"l3:food": 3}
    for u, v in dag.graph.edges:
        assert dag.level(v) == dag.level(u) + 1


def test_disagreeing_parents_are_all_kept_with_counts_and_majority_primary():
    """Images that disagree on a node's parent give it several parents with counts; the most frequent is the
    primary parent; a tie goes to the smallest id (deterministic)."""
    chains = make_chains([(4, ["birthday", "celebration"]), (2, ["birthday", "party"]),
                          (3, ["wedding", "ceremony"]), (3, ["wedding", "celebration"])])
    dag = ConceptDAG.from_chains(chains, l_max=2)
    assert dag.parents("l1:birthday") == {"l2:celebration": 4, "l2:party": 2}
    assert dag.primary_parent("l1:birthday") == "l2:celebration"
    assert dag.primary_parent("l1:wedding") == "l2:celebration"  # tie 3-3: 'l2:celebration' < 'l2:ceremony'
    assert choose_primary({"l2:b": 2, "l2:a": 2, "l2:c": 1}) == "l2:a"
    assert choose_primary({}) is None
    assert dag.image_counts() == {"l1:birthday": 6, "l1:wedding": 6, "l2:celebration": 12, "l2:party": 0,
                                  "l2:ceremony": 0}


def test_dag_check_rejects_level_skipping_edges_and_orphans():
    """check() fails on an edge that skips a level, and on a node below l_max without a parent."""
    dag = ConceptDAG.from_chains(make_chains([(2, ["a", "b", "c"])]), l_max=3)
    dag.graph.add_edge("l1:a", "l3:c", count=1)
    with pytest.raises(DagError, match="does not go from level 1 to 2"):
        dag.check()
    dag = ConceptDAG.from_chains(make_chains([(2, ["a", "b", "c"])]), l_max=3)
    dag.graph.remove_edge("l2:b", "l3:c")
    with pytest.raises(DagError, match="has no parent"):
        dag.check()
    with pytest.raises(DagError, match="without a parent"):
        ConceptDAG.from_chains(make_chains([(2, ["a", "b"])]), l_max=2).remove("l2:b")


# ------------------------------------------------------------------------------------------------ merge / remove
def test_small_node_merges_into_its_most_similar_node():
    """A node under size_min merges into the most similar same-level node when the cosine reaches sim_min:
    its images move there, its parent edges add up, and the merge is logged."""
    chains = make_chains([(8, ["feast", "meal"]), (2, ["banquet", "dinner"]), (6, ["hiking", "outdoors"])])
    table = {"feast": unit(1, 0, 0), "banquet": at_cos(0.95), "hiking": unit(0, 0, 1),
             "meal": unit(1, 0, 0), "dinner": at_cos(0.97), "outdoors": unit(0, 0, 1)}
    magic, _ = build(chains, table)
    assert "l1:banquet" not in magic.nodes
    assert magic.nodes["l1:feast"].n_images == 10 and magic.nodes["l1:feast"].merged_from == ["l1:banquet"]
    assert [(m.level, m.source, m.target, m.n_images) for m in magic.merges] == [
        (1, "l1:banquet", "l1:feast", 2), (2, "l2:dinner", "l2:meal", 0)]
    assert magic.merges[0].similarity == pytest.approx(0.95, abs=1e-5)
    assert magic.nodes["l1:feast"].parents == {"l2:meal": 10}  # dinner (0 images) then merged into meal
    assert not magic.removals
    check_invariants(magic)


def test_small_dissimilar_node_is_removed_with_its_images_reported():
    """Below size_min with no node reaching sim_min, a node is removed; its images leave the dataset and are
    listed in the removal record with the best match and its similarity."""
    chains = make_chains([(8, ["feast", "meal"]), (3, ["volcano", "meal"]), (6, ["hiking", "outdoors"])])
    table = {"feast": unit(1, 0, 0), "volcano": at_cos(0.5), "hiking": unit(0, 0, 1)}
    magic, _ = build(chains, table)
    assert "l1:volcano" not in magic.nodes
    [rec] = magic.removals
    assert (rec.level, rec.node, rec.n_images, rec.best_match) == (1, "l1:volcano", 3, "l1:feast")
    assert rec.similarity == pytest.approx(0.5, abs=1e-5)
    assert sorted(rec.image_ids) == [f"img{k:04d}" for k in range(8, 11)]
    assert not set(rec.image_ids) & set(magic.images)
    assert magic.stats["removed_images"] == 3 and magic.stats["removals"]["l1"] == 1
    assert magic.nodes["l2:meal"].n_images == 8


def test_two_small_nodes_merge_smaller_into_larger_and_then_survive():
    """Two similar small nodes merge smaller into larger; together they reach size_min and stay."""
    chains = make_chains([(2, ["brunch", "meal"]), (3, ["breakfast", "meal"]), (9, ["hiking", "outdoors"])])
    table = {"brunch": at_cos(0.92), "breakfast": unit(1, 0, 0), "hiking": unit(0, 0, 1)}
    magic, _ = build(chains, table)
    assert [(m.source, m.target, m.n_images) for m in magic.merges] == [("l1:brunch", "l1:breakfast", 2)]
    assert magic.nodes["l1:breakfast"].n_images == 5 and not magic.removals


def test_repeat_until_stable_chains_merges_across_rounds():
    """Merging is repeated until stable: a node that grows by absorbing another but is still small merges on."""
    chains = make_chains([(1, ["a", "top"]), (2, ["b", "top"]), (10, ["c", "top"])])
    # a is most similar to b (0.99), b is most similar to a; b+a=3 < 5, then b's best alive match is c.
    table = {"a": unit(1, 0, 0), "b": unit(0.99, 0.141, 0), "c": unit(0.9, 0.436, 0)}
    magic, _ = build(chains, table, p=params(sim_min=0.85))
    assert [(m.source, m.target) for m in magic.merges] == [("l1:a", "l1:b"), ("l1:b", "l1:c")]
    assert magic.nodes["l1:c"].n_images == 13 and magic.nodes["l1:c"].merged_from == ["l1:a", "l1:b"]
    assert len({m.round for m in magic.merges}) >= 1
    check_invariants(magic)


def test_minority_parent_at_l2_is_merged_or_removed_without_losing_images():
    """An l2 node that no child chose as primary parent has 0 images: if similar enough it merges into its
    match (its edges add to the target); else it is removed and only its minority edges disappear - no image
    is lost above l1 and no child loses its primary parent."""
    spec = [(8, ["party", "celebration"]), (2, ["party", "festivity"]), (6, ["match", "sport"])]
    chains = make_chains(spec)
    similar = {"celebration": unit(1, 0, 0), "festivity": at_cos(0.93), "sport": unit(0, 0, 1)}
    magic, _ = build(chains, similar)
    assert magic.nodes["l1:party"].parents == {"l2:celebration": 10}
    assert [(m.level, m.source, m.target) for m in magic.merges] == [(2, "l2:festivity", "l2:celebration")]
    dissimilar = {"celebration": unit(1, 0, 0), "festivity": unit(0, 1, 0), "sport": unit(0, 0, 1)}
    magic, _ = build(chains, dissimilar)
    assert magic.nodes["l1:party"].parents == {"l2:celebration": 8}
    [rec] = magic.removals
    assert (rec.level, rec.node, rec.n_images, rec.image_ids) == (2, "l2:festivity", 0, [])
    assert len(magic.images) == 16


def test_merging_minority_parents_can_change_the_primary_parent():
    """Merging two minority parents can outvote the old primary parent; the rounds then settle the level."""
    chains = make_chains([(5, ["x", "a"]), (4, ["x", "b"]), (3, ["x", "b2"]), (6, ["y", "c"])])
    table = {"a": unit(0, 1, 0), "b": unit(1, 0, 0), "b2": at_cos(0.95), "c": unit(0, 0, 1)}
    magic, _ = build(chains, table)
    # b (0 images) goes into its equally small match b2: x's parents become {a: 5, b2: 7}, so b2 is primary;
    # a is left with 0 images and nothing similar: removed.
    assert magic.nodes["l1:x"].primary_parent == "l2:b2"
    assert magic.nodes["l1:x"].parents == {"l2:b2": 7}
    assert [r.node for r in magic.removals] == ["l2:a"]
    assert magic.nodes["l2:b2"].n_images == 12


def test_everything_removed_is_a_clear_error():
    """When no node can reach size_min the build stops with an error naming the parameters to change."""
    chains = make_chains([(2, ["a", "x"]), (2, ["b", "y"])])
    with pytest.raises(ValueError, match="size_min"):
        build(chains, {"a": unit(1, 0, 0), "b": unit(0, 1, 0)})


# ------------------------------------------------------------------------------------------------ negatives
def test_hard_negatives_are_symmetric_above_threshold_and_complete():
    """Threshold negatives: exactly the other same-level nodes with cosine > threshold (brute force), in both
    directions, most similar first, with their similarities stored."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(5, 16))
    x = np.concatenate([c + 0.35 * rng.normal(size=(8, 16)) for c in centers]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [f"l1:n{i:02d}" for i in range(len(x))]
    found = hard_negatives(ids, x, threshold=0.8)
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    assert sum(len(v) for v in found.hard.values()) > 0
    for i, a in enumerate(ids):
        expected = {ids[j] for j in range(len(ids)) if j != i and sims[i, j] > 0.8}
        assert set(found.hard[a]) == expected
        for b in found.hard[a]:
            assert a in found.hard[b]
            assert found.similarity[a][b] == found.similarity[b][a] > 0.8
        got = [found.similarity[a][b] for b in found.hard[a]]
        assert got == sorted(got, reverse=True)
        assert found.fallback[a] == []


def test_min_hard_negatives_adds_flagged_fallbacks_in_similarity_order():
    """With min_hard_negatives=k every node gets >= k negatives; the extra ones are the most similar nodes below
    the threshold, flagged as fallbacks, never duplicating a threshold negative."""
    x = np.stack([unit(1, 0, 0), at_cos(0.9), at_cos(0.5), at_cos(0.2), unit(0, 0, 1)])
    ids = ["l1:a", "l1:b", "l1:c", "l1:d", "l1:e"]
    found = hard_negatives(ids, x, threshold=0.85, min_negatives=2)
    assert found.hard["l1:a"] == ["l1:b"] and found.fallback["l1:a"] == ["l1:c"]
    assert found.hard["l1:e"] == [] and len(found.fallback["l1:e"]) == 2
    for n in ids:
        assert len(found.hard[n]) + len(found.fallback[n]) >= 2
        assert not set(found.hard[n]) & set(found.fallback[n])
        assert set(found.similarity[n]) == set(found.hard[n]) | set(found.fallback[n])
    e_sims = [found.similarity["l1:e"][m] for m in found.fallback["l1:e"]]
    assert e_sims == sorted(e_sims, reverse=True)
    small = hard_negatives(ids[:2], x[:2], threshold=0.99, min_negatives=5)
    assert small.fallback["l1:a"] == ["l1:b"]  # k is capped by the nodes available


def test_build_stores_negatives_per_level_and_flags_fallbacks():
    """In a built file: l1 siblings above the threshold are hard negatives; min_hard_negatives adds flagged
    fallbacks, counted in the stats."""
    chains = make_chains([(6, ["tennis", "sport"]), (6, ["badminton", "sport"]), (6, ["wedding", "party"])])
    table = {"tennis": unit(1, 0, 0), "badminton": at_cos(0.88), "wedding": unit(0.1, 0, 1),
             "sport": unit(1, 0, 0), "party": unit(0, 1, 0)}
    magic, _ = build(chains, table, p=params(min_hard_negatives=1))
    assert magic.negatives("l1:tennis", include_fallback=False) == ["l1:badminton"]
    assert magic.nodes["l1:wedding"].hard_negatives == []
    assert set(magic.stats["settings"]["negative_search"].values()) == {"exact"}
    assert magic.nodes["l1:wedding"].fallback_negatives == ["l1:tennis"]
    assert magic.nodes["l2:sport"].fallback_negatives == ["l2:party"]
    assert magic.stats["hard_negatives"]["l1"]["nodes_with_fallback"] == 1


# ------------------------------------------------------------------------------------------------ split
def test_image_split_is_disjoint_reproducible_and_keeps_a_train_image():
    """Image split: every image in exactly one split, the same for the same seed, round(n*f) test images per
    node (half up), and a node with >= 2 images always keeps >= 1 training image."""
    groups = {f"l1:g{g}": [f"g{g}-{k}" for k in range(n)] for g, n in enumerate([1, 2, 3, 5, 10, 23])}
    a = split_images(groups, "image", 0.2, seed=3)
    assert a == split_images(groups, "image", 0.2, seed=3)
    assert a != split_images(groups, "image", 0.2, seed=4)
    assert set(a) == {i for ids in groups.values() for i in ids}
    for ids in groups.values():
        n_test = sum(a[i] == "test" for i in ids)
        assert n_test == n_test_images(len(ids), 0.2)
        assert len(ids) == 1 or n_test < len(ids)
    assert [n_test_images(n, 0.2) for n in (1, 2, 3, 5, 10, 23)] == [0, 0, 1, 1, 2, 5]
    assert n_test_images(2, 0.9) == 1 and n_test_images(2, 0.5) == 1
    # one node's split does not depend on which other nodes exist
    alone = split_images({"l1:g4": groups["l1:g4"]}, "image", 0.2, seed=3)
    assert all(alone[i] == a[i] for i in groups["l1:g4"])


def test_concept_split_holds_out_whole_concepts():
    """Concept split: each l1 concept is entirely train or entirely test; round(n*f) concepts are test."""
    groups = {f"l1:g{g:02d}": [f"g{g}-{k}" for k in range(4)] for g in range(20)}
    s = split_images(groups, "concept", 0.2, seed=0)
    test_nodes = {n for n, ids in groups.items() if s[ids[0]] == "test"}
    assert len(test_nodes) == 4
    for ids in groups.values():
        assert len({s[i] for i in ids}) == 1
    assert s == split_images(groups, "concept", 0.2, seed=0)
    assert split_images({"l1:a": ["x", "y"]}, "concept", 0.2, seed=0) == {"x": "train", "y": "train"}


def test_built_concept_split_never_trains_on_test_concepts():
    """In a built concept-split file no test concept has a training image, and train negatives skip them."""
    spec = [(6, [f"c{g}", "top"]) for g in range(10)]
    chains = make_chains(spec)
    table = {f"c{g}": unit(1, 0.01 * g, 0) for g in range(10)}
    magic, _ = build(chains, table, p=params(split="concept"))
    train, test = set(magic.groups("train")), set(magic.groups("test"))
    assert len(test) == 2 and not train & test
    for g in train:
        assert not set(magic.negatives(g, split="train")) & test
    assert magic.stats["split"]["test_groups"] == 2


# ------------------------------------------------------------------------------------------------ generalized captions
def test_generalized_captions_from_training_images_with_parents_and_fallback_on_failure():
    """magic.generalize: group: each l1 node asks LLM_gen once with its concept, its ancestors' names and its
    training captions only; a failed node keeps original captions, is flagged, and the failure is counted."""
    chains = make_chains([(6, ["tennis", "sport"]), (6, ["wedding", "party"])])
    table = {"tennis": unit(1, 0, 0), "wedding": unit(0, 0, 1)}
    magic, gen = build(chains, table, p=params(generalize="group"), fail={"l1:wedding"})
    by_id = {r.group_id: r for r in gen.seen}
    req = by_id["l1:tennis"]
    assert (req.concept, req.parents, req.n) == ("tennis", ["sport"], 5)
    train_caps = {c for i in magic.images_of("l1:tennis", "train") for c in magic.images[i].captions}
    assert set(req.captions) == train_caps and len(req.captions) == 2 * 5
    assert magic.nodes["l1:tennis"].generalized_captions[0] == "a scene of tennis (0)"
    wedding = magic.nodes["l1:wedding"]
    assert wedding.generalized_fallback and len(wedding.generalized_captions) == 5
    assert set(wedding.generalized_captions) <= {c for i in magic.images_of("l1:wedding") for c in
                                                 magic.images[i].captions}
    g = magic.stats["generalization"]
    assert (g["requested"], g["generalized"], g["fallback_to_original"]) == (2, 1, 1)
    assert g["failure_reasons"] == {"invalid_json": 1}
    all_from = group_requests(magic, 3, "all")
    assert len(all_from[0].captions) == 12


# ------------------------------------------------------------------------------------------------ inputs
def test_align_chains_counts_every_skipped_image():
    """Images without a chain, chains of unknown images, wrong-length chains and empty names are counted."""
    chains = {"a": ["x", "y"], "b": ["x"], "c": ["x", " "], "zz": ["x", "y"]}
    usable, skipped = align_chains(dataset_for({"a": [], "b": [], "c": []}, extra=["d"]), chains, l_max=2)
    assert usable == {"a": ["x", "y"]}
    assert skipped == Counter({SKIP_NO_CHAIN: 1, SKIP_UNKNOWN: 1, SKIP_LENGTH: 1, SKIP_EMPTY: 1})
    with pytest.raises(ValueError, match="magic.l_max"):
        align_chains(dataset_for({"a": []}), {"a": ["x", "y", "z"]}, l_max=2)


# ------------------------------------------------------------------------------------------------ file format
def _built():
    chains = make_chains([(8, ["tennis", "sport"]), (2, ["squash", "sport"]), (7, ["wedding", "party"]),
                          (1, ["wedding", "sport"]), (3, ["volcano", "nature"])])
    table = {"tennis": unit(1, 0, 0), "squash": at_cos(0.93), "wedding": unit(0, 0, 1), "volcano": unit(0, 1, 0),
             "sport": unit(1, 0, 0), "party": unit(0, 0, 1), "nature": unit(0, 1, 0)}
    return build(chains, table, p=params(min_hard_negatives=1, generalize="group"), fail={"l1:wedding"})[0]


def test_round_trip_through_magic_json(tmp_path):
    """save_magic + load_magic give back the same file, queries included."""
    magic = _built()
    path = save_magic(magic, tmp_path / "magic.json")
    back = load_magic(path)
    assert back.model_dump() == magic.model_dump()
    assert back.chain_names("img0000") == ["tennis", "sport"]
    assert back.images_of("l2:sport") == magic.images_of("l2:sport")


def test_corrupted_or_old_magic_json_gives_a_clear_error(tmp_path):
    """Bad JSON, another schema version, a missing field and a broken DAG each raise an error naming the fix."""
    magic = _built()
    path = save_magic(magic, tmp_path / "magic.json")
    raw = json.loads(path.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(path.read_text()[:-50])
    with pytest.raises(ValueError, match="not valid JSON.*03_magic_dag"):
        load_magic(bad)
    bad.write_text(json.dumps({**raw, "schema_version": 0}))
    with pytest.raises(ValueError, match="schema_version 0.*03_magic_dag"):
        load_magic(bad)
    del raw["nodes"]["l1:tennis"]["level"]
    bad.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="malformed at nodes.l1:tennis.level"):
        load_magic(bad)
    raw = json.loads(path.read_text())
    raw["nodes"]["l1:tennis"]["n_images"] += 1
    bad.write_text(json.dumps(raw))
    with pytest.raises(MagicInvariantError, match="n_images"):
        load_magic(bad)
    with pytest.raises(FileNotFoundError, match="03_magic_dag"):
        load_magic(tmp_path / "missing.json")


@pytest.mark.parametrize("corrupt, message", [
    (lambda r: r["nodes"]["l1:tennis"]["parents"].update({"l2:nowhere": 1}), "does not exist"),
    (lambda r: r["nodes"]["l1:tennis"].update({"primary_parent": "l2:party"}), "most supported parent"),
    (lambda r: r["images"]["img0000"].update({"node": "l2:sport"}), "not an l1 node"),
    (lambda r: r["nodes"]["l1:tennis"]["hard_negatives"].append("l1:wedding"), "hard negative"),
    (lambda r: r["nodes"]["l2:party"].update({"parents": {"l1:tennis": 1}, "primary_parent": "l1:tennis"}),
     "edge l2:party -> l1:tennis does not go from level 2 to 3"),
])
def test_invariants_catch_broken_files(corrupt, message):
    """check_invariants names the rule a hand-edited file breaks (parents, primary, images, negatives, levels)."""
    raw = _built().model_dump()
    corrupt(raw)
    from cglib.magic.schema import MagicFile

    with pytest.raises(MagicInvariantError, match=message):
        check_invariants(MagicFile.model_validate(raw))


def test_graphml_export_is_readable_and_carries_the_hierarchy(tmp_path):
    """magic.graphml reads back with networkx as the same DAG: edges child -> parent with counts and the
    primary flag, node attributes as scalars (lists as JSON strings)."""
    magic = _built()
    paths = save_outputs(magic, tmp_path)
    graph = nx.read_graphml(paths["graphml"])
    assert set(graph.nodes) == set(magic.nodes)
    assert nx.is_directed_acyclic_graph(graph)
    assert graph.nodes["l1:tennis"]["level"] == 1 and graph.nodes["l1:tennis"]["n_images"] == 10
    assert json.loads(graph.nodes["l1:tennis"]["generalized_captions"]) == magic.nodes["l1:tennis"].generalized_captions
    assert graph.edges["l1:wedding", "l2:party"]["count"] == 7 and graph.edges["l1:wedding", "l2:party"]["primary"]
    assert graph.edges["l1:wedding", "l2:sport"]["primary"] is False
    stats = json.loads(paths["stats"].read_text())
    assert stats["stats"]["nodes_per_level"] == magic.stats["nodes_per_level"]
    assert "git_commit" in stats["provenance"]


def test_stats_and_table1():
    """The stats count nodes per level, pairs, merges, removals, fallbacks; Table 1 puts the paper beside us.
    Group mode: every image pairs with each of its node's 5 written captions (tennis: 10 images); the failed
    wedding node's 8 images x 5 fallback copies are counted apart, not as pairs."""
    magic = _built()
    s = magic.stats
    assert s["nodes_per_level"] == {"l1": 2, "l2": 2}
    assert s["images"] == 18 and s["original_caption_pairs"] == 36
    assert s["pairs"] == 10 * 5 and s["pairs_fallback"] == 8 * 5
    assert s["merges"]["l1"] == 1 and s["removals"]["l1"] == 1 and s["removed_images"] == 3
    assert s["generalization"]["fallback_to_original"] == 1 and s["generalized_fallback_nodes"] == 1
    assert s["own_chain_differs_from_primary"]["l2"] == 1  # the wedding image whose own l2 was 'sport'
    table = table1(magic)
    assert table.loc["l1 nodes", "paper"] == 1071 and table.loc["l1 nodes", "ours"] == 2
    assert table.loc["mean images per node", "ours"] == 9.0


def test_build_is_deterministic():
    """The same inputs and seed give the same file (provenance aside)."""
    a, b = _built(), _built()
    assert a.model_dump(exclude={"provenance"}) == b.model_dump(exclude={"provenance"})


def test_factory_tiny_magic_satisfies_the_invariants():
    """tests/factories.tiny_magic, used by training and evaluation tests, is a valid MAGIC file."""
    magic, _ = tiny_magic()
    check_invariants(magic)
    magic, _ = tiny_magic(per_group=3)
    check_invariants(magic)


def test_invariants_hold_after_every_merge_and_removal():
    """On a noisy random DAG (many small nodes, disagreeing parents), the full structural check and the image
    accounting hold after every single merge and removal, and every surviving node ends with >= size_min."""
    from cglib.magic.merge import merge_and_remove

    rng = np.random.default_rng(1)
    l2 = [f"b{k}" for k in range(6)]
    chains = {}
    for i in range(400):
        base = int(rng.integers(8))
        l1 = f"a{base}" if rng.random() < 0.7 else f"a{base} v{int(rng.integers(12))}"
        if rng.random() < 0.03:
            l1 = f"odd{i}"  # a one-off concept with its own direction: removed
        parent = l2[base % 6] if rng.random() < 0.8 else l2[int(rng.integers(6))]
        chains[f"i{i:03d}"] = [l1, parent, f"c{base % 3}"]

    class Checked(ConceptDAG):
        ops = 0

        def merge(self, source, target):
            super().merge(source, target)
            self._verify()

        def remove(self, node):
            removed = super().remove(node)
            self._verify()
            return removed

        def _verify(self):
            Checked.ops += 1
            self.check()
            counts = self.image_counts()
            for level in range(1, self.l_max):
                assert sum(counts[n] for n in self.nodes_at(level)) == self.n_images

    dag = Checked(l_max=3)
    for image_id in sorted(chains):
        dag.add_chain(image_id, chains[image_id])
    vectors = {}
    for n in dag.graph.nodes:
        name = dag.name(n).split()[0]  # variants of one base concept share a direction, plus noise
        v = np.random.default_rng(list(name.encode())).normal(size=8) + 0.2 * rng.normal(size=8)
        vectors[n] = v / np.linalg.norm(v)
    merges, removals = merge_and_remove(dag, vectors, size_min=5, sim_min=0.9)
    assert merges and removals and Checked.ops == len(merges) + len(removals)
    assert min(dag.image_counts().values()) >= 5
    assert dag.n_images + sum(len(r.image_ids) for r in removals) == 400
