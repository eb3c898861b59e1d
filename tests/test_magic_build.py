"""build_magic with the real pieces around it: the synthetic world's captions, noisy chains, the abstraction
engine's generalize_groups (offline backend, with its cache) and, in the slow test, the default MiniLM embedder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cglib.config import Params
from cglib.data.synthetic import make_world
from cglib.magic import build_magic, check_invariants, load_magic, save_outputs


@pytest.fixture(scope="module")
def world():
    return make_world(images_per_concept=8, seed=0, image_size=16, captions_per_image=3)


def noisy(truth: dict[str, list[str]], seed: int = 0) -> dict[str, list[str]]:
    """Ground-truth chains with disagreements at l2 (10% of images) and a few rare l1 variants."""
    rng = np.random.default_rng(seed)
    l2_names = sorted({c[1] for c in truth.values()})
    out = {}
    for k, (image_id, chain) in enumerate(sorted(truth.items())):
        chain = list(chain)
        if rng.random() < 0.1:
            chain[1] = l2_names[rng.integers(len(l2_names))]
        if k % 37 == 0:
            chain[0] = f"{chain[0]} at dusk"
        out[image_id] = chain
    return out


def hashed_embedder(texts: list[str]) -> np.ndarray:
    """Fixed pseudo-random vectors per text (fast; no model)."""
    return np.stack([np.random.default_rng(list(t.encode())).normal(size=16) for t in texts])


def test_build_with_the_engine_generalizer_fills_every_group(world, tmp_path):
    """magic.generalize: group: with the engine's offline generalize_groups every l1 group gets n generalized
    captions, the engine writes generalized.jsonl under the run directory, and the file satisfies all invariants
    and loads back."""
    params = Params.model_validate({"magic": {"min_hard_negatives": 2, "generalize": "group"},
                                    "llm": {"backend": "offline"}})
    chains = noisy(world.ground_truth)
    magic = build_magic(world.dataset, chains, params, run_dir=tmp_path, embedder=hashed_embedder, progress=False)
    check_invariants(magic)
    n = params.llm.generalized_captions_per_node
    for node in magic.nodes_at(1):
        assert len(node.generalized_captions) == n and not node.generalized_fallback
    gen = magic.stats["generalization"]
    assert gen["requested"] == len(magic.groups()) == gen["generalized"]
    rows = [json.loads(line) for line in (tmp_path / "abstraction" / "generalized.jsonl").read_text().splitlines()]
    assert {r["group_id"] for r in rows} == set(magic.groups())
    # the rare 'at dusk' variants have 1 image each and no similar node: removed with their images
    assert {r.node for r in magic.removals if r.level == 1} == {f"l1:{chains[i][0]}" for i in chains
                                                                 if chains[i][0].endswith("at dusk")}
    assert len(magic.images) + magic.stats["removed_images"] == len(world.dataset)
    paths = save_outputs(magic, tmp_path / "magic")
    assert load_magic(paths["magic"]).model_dump() == magic.model_dump()


def test_build_needs_run_dir_for_the_default_generalizer(world):
    """Without run_dir the engine has nowhere for its cache: a clear error before any work."""
    with pytest.raises(ValueError, match="run_dir"):
        build_magic(world.dataset, world.ground_truth, Params(), embedder=hashed_embedder)


@pytest.mark.slow
def test_build_with_default_minilm_embedder_on_ground_truth(world, tmp_path):
    """The default path (MiniLM concept embeddings, engine generalizer) on ground-truth chains recovers the
    taxonomy exactly: every concept is big enough, nothing merges or is removed, and the node counts per level
    equal the taxonomy's."""
    from cglib.data.taxonomy import load_taxonomy

    tax = load_taxonomy()
    magic = build_magic(world.dataset, world.ground_truth, Params(), run_dir=tmp_path, progress=False)
    assert not magic.merges and not magic.removals
    assert magic.stats["nodes_per_level"] == {f"l{k}": len(tax.names(k)) for k in range(1, 5)}
    for image_id, chain in list(world.ground_truth.items())[:50]:
        assert magic.chain_names(image_id) == chain
    # siblings in the taxonomy tend to be hard negatives of one another at some threshold: check structure only
    for node in magic.nodes.values():
        assert all(magic.nodes[m].level == node.level for m in magic.negatives(node.id))
