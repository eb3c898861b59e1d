"""Per-image generalized captions (magic.generalize: image, issue 15 item 2), fallbacks (issue 14 item 10) and
the leakage of concept names into generalized captions across levels (issue 15 item 6)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cglib.config import Params
from cglib.data.synthetic import make_world
from cglib.data.taxonomy import load_taxonomy
from cglib.llm import GroupRequest, generalize_groups
from cglib.llm.generalize_requests import mentions_concept
from cglib.magic import build_magic, leakage, leakage_table, load_magic, save_magic, table1
from cglib.magic.generalized_captions import image_requests

sys.path.insert(0, str(Path(__file__).parent))
from factories import tiny_magic
from test_magic import FixedEmbedder, dataset_for, fake_generalizer, make_chains, unit


def params(**magic) -> Params:
    base = {"size_min": 5, "sim_min": 0.9, "hard_negative_sim": 0.85, "l_max": 2}
    return Params.model_validate({"magic": {**base, **magic}})


def built(fail=frozenset(), **magic):
    """Two l1 nodes (tennis/sport, wedding/party), 6 images each, per-image LLM_gen by the fake generalizer."""
    chains = make_chains([(6, ["tennis", "sport"]), (6, ["wedding", "party"])])
    gen = fake_generalizer(fail)
    magic_file = build_magic(dataset_for(chains), chains, params(**magic), generalizer=gen,
                             embedder=FixedEmbedder({"tennis": unit(1, 0, 0), "wedding": unit(0, 0, 1)}),
                             progress=False)
    return magic_file, gen


def test_one_request_per_image_of_every_split_with_only_its_own_captions_and_chain():
    """Image mode sends one request per image of BOTH splits; each holds exactly that image's captions, its l1
    concept and the l1's ancestors (no other image's caption), and its answer is stored on that image only."""
    magic, gen = built()
    assert magic.generalize == "image"
    assert sorted(r.group_id for r in gen.seen) == sorted(magic.images)
    assert {magic.images[r.group_id].split for r in gen.seen} == {"train", "test"}
    for req in gen.seen:
        record = magic.images[req.group_id]
        assert req.scope == "image" and req.n == 1
        assert req.captions == record.captions
        assert [req.concept, *req.parents] == magic.chain_names(req.group_id)
        others = {c for i, r in magic.images.items() if i != req.group_id for c in r.captions}
        assert not others & set(req.captions)
        assert record.generalized_captions == [f"a scene of {req.concept} (0)"]
        assert magic.generalized_texts(req.group_id) == record.generalized_captions
    assert all(not n.generalized_captions for n in magic.nodes.values())  # nothing pooled per node
    g = magic.stats["generalization"]
    assert (g["mode"], g["requested"], g["generalized"], g["captions_per_image"]) == ("image", 12, 12, 1)


def test_count_per_image_is_configurable():
    """llm.generalized_captions_per_image sets n in every request."""
    magic, _ = built()
    assert {r.n for requests in image_requests(magic, 3).values() for r in requests} == {3}


def test_failed_image_keeps_its_own_captions_flagged_and_counted():
    """A failed image carries copies of ITS OWN original captions, is flagged, counted by reason, and its pairs
    are not counted as written pairs in Table 1."""
    magic, _ = built(fail={"img0000"})
    record = magic.images["img0000"]
    assert record.generalized_fallback and record.generalized_captions == record.captions[:1]
    g = magic.stats["generalization"]
    assert g["fallback_to_original"] == 1 and g["failure_reasons"] == {"invalid_json": 1}
    assert magic.stats["generalized_fallback_images"] == 1
    assert magic.stats["pairs"] == 11 and magic.stats["pairs_fallback"] == 1


def test_magic_json_round_trip_with_per_image_captions(tmp_path):
    """save_magic + load_magic keep the mode, every image's own captions and fallback flags."""
    magic, _ = built(fail={"img0003"})
    back = load_magic(save_magic(magic, tmp_path / "magic.json"))
    assert back.model_dump() == magic.model_dump()
    assert back.generalize == "image"
    assert {i: back.generalized_texts(i) for i in back.images} == {i: magic.generalized_texts(i)
                                                                    for i in magic.images}
    assert back.images["img0003"].generalized_fallback


def test_group_mode_stays_available_and_reads_through_generalized_texts():
    """magic.generalize: group pools per l1 node; generalized_texts gives each image its node's captions."""
    magic, gen = built(generalize="group")
    assert magic.generalize == "group" and {r.scope for r in gen.seen} == {"group"}
    for image_id, record in magic.images.items():
        assert magic.generalized_texts(image_id) == magic.nodes[record.node].generalized_captions
    assert not any(r.generalized_captions for r in magic.images.values())


def test_table1_counts_one_pair_per_generalized_caption_written():
    """Table 1's image-caption pairs: one (image, generalized caption) pair per caption written for an image."""
    magic, _ = built()
    assert magic.stats["pairs"] == 12 and magic.stats["original_caption_pairs"] == 24
    assert table1(magic).loc["image-caption pairs", "ours"] == 12


# ------------------------------------------------------------------------------------------------ leakage
def test_leakage_counts_every_level_on_a_hand_made_file():
    """Per level, captions containing their own image's level-k name (whole words, any case, plurals) are
    counted; a name of ANOTHER image's chain does not count; fallback copies are counted apart."""
    magic, _ = tiny_magic(per_group=2, test_fraction=0.5)
    magic.generalize = "image"
    ids = sorted(magic.images)
    for i in ids:
        magic.images[i].generalized_captions = ["people outdoors"]
    # img-00-*: birthday party < celebration < social gathering < human activity
    magic.images[ids[0]].generalized_captions = ["Two BIRTHDAY PARTIES at a celebration", "a calm room"]
    magic.images[ids[1]].generalized_captions = ["a social gathering of friends"]
    magic.images[ids[2]].generalized_captions = ["a birthday party"]  # img-01: a wedding; another chain's name
    magic.images[ids[3]].generalized_captions = ["human activity with a wedding"]
    magic.images[ids[3]].generalized_fallback = True
    leak = leakage(magic)
    written = leak["written"]
    assert leak["unit"] == "image" and written["captions"] == 12 + 1 - 1 and leak["fallback"]["captions"] == 1
    assert {k: v["captions"] for k, v in written["by_level"].items()} == {"l1": 1, "l2": 1, "l3": 1, "l4": 0}
    assert written["by_level"]["l1"]["units"] == 1 and written["any_level"]["captions"] == 2
    assert {k: v["captions"] for k, v in leak["fallback"]["by_level"].items()} == {"l1": 1, "l2": 0, "l3": 0,
                                                                                     "l4": 1}
    train = [i for i in ids[:2] if magic.images[i].split == "train"]
    assert leak["train"]["captions"] == sum(len(magic.images[i].generalized_captions) for i in ids
                                            if magic.images[i].split == "train" and not
                                            magic.images[i].generalized_fallback)
    assert train  # the hand-made split puts one of the two leaking images in train
    table = leakage_table(magic)
    assert list(table.index) == ["l1", "l2", "l3", "l4", "any"]
    assert table.loc["l2", "written captions naming it"] == 1 and table.loc["l4", "fallback copies naming it"] == 1


def test_leakage_in_group_mode_uses_the_node_chain():
    """Group mode: each l1 node's captions are checked against that node's l1..l4 names."""
    magic, _ = tiny_magic(per_group=2)
    for node in magic.nodes_at(1):
        node.generalized_captions = ["people and things"]
    magic.nodes["l1:wedding"].generalized_captions = ["a wedding is a celebration", "cake"]
    leak = leakage(magic)
    assert leak["unit"] == "l1 node"
    by_level = {k: v["captions"] for k, v in leak["written"]["by_level"].items()}
    assert by_level == {"l1": 1, "l2": 1, "l3": 0, "l4": 0} and leak["written"]["captions"] == 5 + 2


# ------------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def world():
    return make_world(images_per_concept=6, seed=3, image_size=16, captions_per_image=5)


def test_offline_per_image_generalizer_never_emits_a_taxonomy_concept_name(world, tmp_path):
    """The offline backend writes each image's caption from the phrases its own captions share; no caption, of
    any image, contains any concept name of the taxonomy at any level (it never sees them)."""
    p = Params.model_validate({"llm": {"backend": "offline"}})
    magic = build_magic(world.dataset, world.ground_truth, p, run_dir=tmp_path,
                        embedder=lambda texts: np.random.default_rng(0).normal(size=(len(texts), 8)),
                        progress=False)
    names = load_taxonomy().all_names()
    texts = [t for i in magic.images for t in magic.generalized_texts(i)]
    assert len(texts) == len(magic.images) and all(texts)
    assert not [(t, n) for t in texts for n in names if mentions_concept(t, n)]
    rows = [json.loads(x) for x in (tmp_path / "abstraction" / "generalized.jsonl").read_text().splitlines()]
    assert len(rows) == len(magic.images) and {r["scope"] for r in rows} == {"image"}
    assert magic.stats["leakage"]["written"]["any_level"]["captions"] == 0


def test_offline_per_image_caption_keeps_what_its_own_captions_share(tmp_path):
    """One image: the phrases at least 2 of its captions share, nothing from another image."""
    reqs = image_requests_for({"a": ["a red kite over a beach", "a kite above the beach with a dog",
                                     "kids on a beach"], "b": ["a cat on a sofa", "a cat sleeping on a sofa"]})
    result = generalize_groups(reqs, Params(), tmp_path, progress=False)
    assert "kite" in result.captions["a"][0] and "beach" in result.captions["a"][0]
    assert "cat" not in result.captions["a"][0] and "cat" in result.captions["b"][0]


def image_requests_for(captions: dict[str, list[str]]) -> list[GroupRequest]:
    return [GroupRequest(i, "concept", ["parent"], caps, 1, scope="image") for i, caps in captions.items()]


def test_engine_summary_counts_names_of_every_level_shown(tmp_path):
    """The LLM_gen summary counts captions containing each level's name the request showed (not only l1)."""
    reqs = [GroupRequest("a", "kite flying", ["beach", "leisure"],
                         ["a kite on a beach", "a red kite over the beach"], 1, scope="image")]
    result = generalize_groups(reqs, Params(), tmp_path, progress=False)
    assert result.summary["captions_mentioning_level"] == {"l1": 0, "l2": 1, "l3": 0}
