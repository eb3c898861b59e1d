"""The shipped `everyday` taxonomy of the offline backend (real photographs), user taxonomy files with
descriptions, the named sources of llm.offline_taxonomy, and the taxonomy-fit measure."""

from __future__ import annotations

from pathlib import Path

import pytest

from cglib.config import Params, load_params
from cglib.data.dataset import CaptionDataset
from cglib.data.taxonomy import SHIPPED_TAXONOMIES, load_taxonomy
from cglib.llm import run_abstraction, taxonomy_fit
from cglib.llm.canonical import canonicalize

REPO = Path(__file__).resolve().parent.parent
USER_TAXONOMY = """
levels: 3
descriptions:
  kitchen cooking: "a person chopping vegetables next to a pan on the stove in a kitchen"
  beach holiday: "people lying on towels under umbrellas on a sandy beach by the sea"
  ski trip: "skiers going down a snowy slope with poles and goggles"
parents:
  kitchen cooking: home life
  beach holiday: leisure travel
  ski trip: leisure travel
  home life: daily life
  leisure travel: daily life
"""


def test_everyday_taxonomy_is_a_tree_of_event_concepts():
    """At least 150 l1 concepts, each with a description and one chain of 4 levels; names unique across levels and
    after canonicalization; fewer nodes at every higher level."""
    taxonomy = load_taxonomy("everyday")
    assert len(taxonomy.l1) >= 150 and not taxonomy.scenes
    assert set(taxonomy.descriptions) == set(taxonomy.l1)
    assert all(len(taxonomy.descriptions[c].split()) >= 6 for c in taxonomy.l1)
    assert all(len(taxonomy.chain(c)) == 4 for c in taxonomy.l1)
    counts = [len(taxonomy.names(level)) for level in range(1, 5)]
    assert counts == sorted(counts, reverse=True) and counts[3] >= 3
    names = taxonomy.all_names()
    assert len({canonicalize(n) for n in names}) == len(names)


def test_user_taxonomy_with_descriptions_drives_the_offline_backend(tmp_path):
    """A user's YAML (levels, parents, descriptions) loads, and the offline backend picks each photo's concept from
    the descriptions and follows the parents."""
    path = tmp_path / "mine.yaml"
    path.write_text(USER_TAXONOMY)
    caps = {"k": ["A man cuts carrots beside a frying pan on the stove."],
            "b": ["Two people relax on beach towels near the water."],
            "s": ["A skier in goggles on a snowy mountain slope."]}
    dataset = CaptionDataset(source="coco", image_ids=list(caps), captions=caps, image_files={})
    params = Params.model_validate({"llm": {"offline_taxonomy": str(path)}, "magic": {"l_max": 3}})
    result = run_abstraction(dataset, params, tmp_path / "run", progress=False)
    assert result.chains == {"k": ["kitchen cooking", "home life", "daily life"],
                             "b": ["beach holiday", "leisure travel", "daily life"],
                             "s": ["ski trip", "leisure travel", "daily life"]}


@pytest.mark.parametrize(("edit", "message"), [
    (("  ski trip: leisure travel\n", "  ski trip: winter\n"), "'ski trip' has a chain of 2 levels"),
    (('  ski trip: "skiers going down a snowy slope with poles and goggles"\n', '  ski trip: ""\n'),
     "'ski trip' needs a description"),
    (("  leisure travel: daily life\n", "  leisure travel: daily life\n  leftover: leisure travel\n"), "'leftover' has a parent but no"),
    (("descriptions:", "descriptionz:"), "no l1 concept"),
])
def test_a_broken_taxonomy_names_the_concept_and_the_file(tmp_path, edit, message):
    path = tmp_path / "broken.yaml"
    path.write_text(USER_TAXONOMY.replace(*edit))
    with pytest.raises(ValueError, match=message) as error:
        load_taxonomy(path)
    assert str(path) in str(error.value)


def test_offline_taxonomy_names_and_paths_validate(tmp_path):
    """llm.offline_taxonomy takes synthetic, everyday or an existing path (checked like other inputs)."""
    assert set(SHIPPED_TAXONOMIES) == {"synthetic", "everyday"}
    params = load_params(REPO / "params" / "hierarcaps.yaml", check_paths=False)
    assert params.llm.offline_taxonomy == "everyday" and load_taxonomy(params.llm.offline_taxonomy).descriptions
    raw = (REPO / "params" / "demo.yaml").read_text().replace("  backend: offline\n",
                                                               "  backend: offline\n  offline_taxonomy: nope.yaml\n")
    path = tmp_path / "demo.yaml"
    path.write_text(raw)
    with pytest.raises(Exception, match="llm.offline_taxonomy: path does not exist"):
        load_params(path)


def test_taxonomy_fit_separates_a_fitting_taxonomy_from_a_poor_one():
    """Photos captioned like the user taxonomy's concepts: its concepts fit every image (own captions closer than
    another image's); a taxonomy of unrelated concepts fits fewer and by a smaller margin."""
    caps = {str(k): [text] for k, text in enumerate([  # one photo per concept: a rival is always another concept
        "a man chopping onions and carrots on a cutting board next to a hot pan",
        "a family sunbathing on towels under a striped umbrella on the sand",
        "skiers in helmets going down a steep snowy slope"])}
    good = taxonomy_fit(caps, load_taxonomy_from_text(USER_TAXONOMY))
    poor = taxonomy_fit(caps, load_taxonomy_from_text(USER_TAXONOMY.replace(
        "a person chopping vegetables next to a pan on the stove in a kitchen", "a red car parked in a garage").replace(
        "people lying on towels under umbrellas on a sandy beach by the sea", "a cat asleep on a sofa").replace(
        "skiers going down a snowy slope with poles and goggles", "an office desk with a laptop")))
    assert good["images"] == 3 and good["fit"] == 1.0 and good["l1_concepts_used"] == 3
    assert poor["mean_margin"] < good["mean_margin"]


def load_taxonomy_from_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.yaml"
        path.write_text(text)
        return load_taxonomy(path)


@pytest.mark.parametrize("profile, taxonomy", [("hierarcaps", "everyday"), ("demo", "synthetic")])
def test_profile_threshold_gives_real_hard_negatives_with_its_embedder(profile, taxonomy):
    """A profile's magic.hard_negative_sim suits its concept embedder: at least a third of its taxonomy's l1
    concepts have a real (threshold) hard negative among the others, so batches are not all fallbacks (at the
    paper's 0.85, MiniLM gives none)."""
    import numpy as np

    from cglib.magic.embedders import embed_names, make_embedder
    from cglib.magic.negatives import hard_negatives

    params = load_params(REPO / "params" / f"{profile}.yaml", check_paths=False)
    names = sorted(load_taxonomy(taxonomy).l1)
    by_name = embed_names(make_embedder(params), names)
    vectors = np.stack([by_name[n] for n in names])
    found = hard_negatives(names, vectors, params.magic.hard_negative_sim)
    assert sum(1 for n in names if found.hard[n]) >= len(names) / 3
    assert not any(hard_negatives(names, vectors, 0.85).hard.values())
