"""The synthetic world: taxonomy structure, renderer, captions, determinism, dataset interface, notebook-01 views."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import matplotlib
import numpy as np
import pytest

from cglib.config import Params
from cglib.data.appearance import OBJECTS, SETTINGS
from cglib.data.dataset import CaptionDataset, load_ground_truth, save_ground_truth
from cglib.data.render import Placement, background, icon_sprite, render_scene
from cglib.data.synthetic import (
    TEMPLATES,
    check_drawable,
    leaked_concept_names,
    make_world,
    noun_phrase,
    write_captions,
)
from cglib.data.taxonomy import SceneContent, Taxonomy, load_taxonomy
from cglib.magic.sources import load_captions
from cglib.viz import data_figures

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def taxonomy() -> Taxonomy:
    return load_taxonomy()


@pytest.fixture(scope="module")
def world():
    return make_world(images_per_concept=6, seed=0)


def _siblings(taxonomy: Taxonomy, l1: str) -> list[str]:
    return [o for o in taxonomy.l1 if o != l1 and taxonomy.parents[o] == taxonomy.parents[l1]]


# ------------------------------------------------------------------------------------------ taxonomy
def test_levels_shrink_like_table_1(taxonomy):
    """At least 40 l1 under at least 8 l4 branches, and every level has fewer nodes than the one below."""
    sizes = [len(taxonomy.names(level)) for level in range(1, taxonomy.levels + 1)]
    assert taxonomy.levels == 4
    assert sizes[0] >= 40 and sizes[-1] >= 8
    assert all(a > b for a, b in itertools.pairwise(sizes)), sizes


def test_every_l1_reaches_exactly_one_top_concept(taxonomy):
    """Each l1 has a chain of exactly 4 names ending in an l4 name; names are unique across levels."""
    tops = set(taxonomy.names(4))
    for l1 in taxonomy.l1:
        chain = taxonomy.chain(l1)
        assert len(chain) == 4 and chain[-1] in tops and len(set(chain)) == 4
    assert len(taxonomy.level_of) == sum(len(taxonomy.names(lvl)) for lvl in range(1, 5))
    # every parent above l1 has at least one child, i.e. no dangling names in `parents`
    assert set(taxonomy.parents) <= set(taxonomy.level_of)


def test_hierarchy_is_shared_like_a_real_one(taxonomy):
    """Several l1 per l2 on average, and most l2 have siblings (a hierarchy, not a set of chains)."""
    l2_children = Counter(taxonomy.parents[l1] for l1 in taxonomy.l1)
    assert np.mean(list(l2_children.values())) >= 2.0
    assert sum(n >= 2 for n in l2_children.values()) >= 0.8 * len(l2_children)


def test_siblings_share_objects_and_settings(taxonomy):
    """Hard negatives exist: most l1 share an object with a sibling, many share a setting, objects recur."""
    share_object = share_setting = 0
    for l1 in taxonomy.l1:
        sibling_objects = {o for s in _siblings(taxonomy, l1) for o in taxonomy.scenes[s].objects}
        sibling_settings = {o for s in _siblings(taxonomy, l1) for o in taxonomy.scenes[s].settings}
        share_object += bool(sibling_objects & set(taxonomy.scenes[l1].objects))
        share_setting += bool(sibling_settings & set(taxonomy.scenes[l1].settings))
    n = len(taxonomy.l1)
    assert share_object >= 0.8 * n, f"only {share_object}/{n} l1 share an object with a sibling"
    assert share_setting >= 0.4 * n, f"only {share_setting}/{n} l1 share a setting with a sibling"
    uses = Counter(o for c in taxonomy.scenes.values() for o in c.objects)
    shared_slots = sum(n for n in uses.values() if n >= 2) / sum(uses.values())
    assert shared_slots >= 0.4, f"only {shared_slots:.0%} of object mentions are of objects used by 2+ concepts"


def test_every_taxonomy_object_and_setting_is_drawable(taxonomy):
    """The renderer has an icon for every object and a background for every setting the taxonomy names."""
    check_drawable(taxonomy)
    broken = Taxonomy(levels=1, parents={}, scenes={"x": SceneContent(("moonbase",), ("flux capacitor",))})
    with pytest.raises(ValueError, match="flux capacitor"):
        check_drawable(broken)


# ------------------------------------------------------------------------------------------ renderer
def test_at_least_60_distinct_object_icons(taxonomy):
    """>= 60 object types; no two icons render alike (mean absolute difference over colour and alpha)."""
    objects = sorted({o for c in taxonomy.scenes.values() for o in c.objects})
    assert len(objects) >= 60
    sprites = {o: icon_sprite(o, 16) for o in objects}
    flat = np.stack([np.concatenate([c.ravel(), 255 * a.ravel()]) for c, a in sprites.values()])
    for i, name in enumerate(objects):
        alpha = sprites[name][1]
        assert 0.1 < alpha.mean() < 0.95, f"icon '{name}' covers {alpha.mean():.0%} of its box"
        distance = np.abs(flat - flat[i]).mean(axis=1)
        distance[i] = np.inf
        closest = objects[int(distance.argmin())]
        assert distance.min() > 1.0, f"icons '{name}' and '{closest}' are nearly identical"


def test_settings_render_distinct_backgrounds(taxonomy):
    """Every setting has its own background (no two identical)."""
    names = sorted({s for c in taxonomy.scenes.values() for s in c.settings})
    images = np.stack([background(s, 64).astype(np.int16) for s in names])
    for i, name in enumerate(names):
        diff = np.abs(images - images[i]).mean(axis=(1, 2, 3))
        diff[i] = np.inf
        assert diff.min() > 2.0, f"background of '{name}' equals '{names[int(diff.argmin())]}'"


def test_images_show_their_objects(world):
    """uint8 (n, 64, 64, 3); every placement lies inside the image and changes the pixels under its icon."""
    pixels = world.dataset.pixels
    assert pixels.dtype == np.uint8 and pixels.shape == (len(world.dataset), 64, 64, 3)
    for image_id in world.dataset.image_ids[::7]:
        scene = world.scenes[image_id]
        assert 2 <= len(scene.placements) <= 5
        empty = render_scene(scene.setting, [], 64, scene.brightness).astype(np.int16)
        for p in scene.placements:
            assert 0 <= p.x and 0 <= p.y and p.x + p.size <= 64 and p.y + p.size <= 64
            alone = render_scene(scene.setting, [p], 64, scene.brightness).astype(np.int16)
            alpha = icon_sprite(p.obj, p.size)[1][:, ::-1] if p.flip else icon_sprite(p.obj, p.size)[1]
            under = np.abs(alone - empty)[p.y:p.y + p.size, p.x:p.x + p.size].sum(axis=2)[alpha > 0.5]
            assert (under > 0).mean() > 0.5 and under.mean() > 15, f"'{p.obj}' is invisible on {scene.setting}"
        full = render_scene(scene.setting, scene.placements, 64, scene.brightness)
        np.testing.assert_array_equal(full, pixels[world.dataset.image_ids.index(image_id)])


def test_render_rejects_out_of_bounds_placement():
    """A placement leaving the image is an error, not a silent crop."""
    with pytest.raises(ValueError, match="leaves"):
        render_scene("beach", [Placement("crab", 60, 10, 16)], 64)


# ------------------------------------------------------------------------------------------ captions
def test_captions_never_name_a_concept(taxonomy):
    """Over the whole taxonomy no caption contains a concept name of any level (whole word, any case)."""
    world = make_world(images_per_concept=12, seed=3, captions_per_image=8)
    captions = [c for cs in world.dataset.captions.values() for c in cs]
    assert len(captions) == len(taxonomy.l1) * 12 * 8
    assert leaked_concept_names(captions, taxonomy) == Counter()
    # ... and no word source of a caption (objects, settings, template text) contains one either
    names = re.compile(r"\b(" + "|".join(map(re.escape, taxonomy.all_names())) + r")\b", re.IGNORECASE)
    vocabulary = list(OBJECTS) + list(SETTINGS) + list(TEMPLATES)
    assert [v for v in vocabulary if names.search(v)] == []


def test_leak_detector_finds_names():
    """The detector matches concept names as whole words in any case, and nothing else."""
    tax = load_taxonomy()
    found = leaked_concept_names(["A Birthday Party with cake", "birthday partying", "sporty kids", "Sport!"], tax)
    assert found == Counter({"birthday party": 1, "sport": 1})


def test_captions_name_objects_and_setting(world):
    """Every caption names at least one drawn object; most name the setting; captions of an image differ."""
    named_setting = 0
    for image_id in world.dataset.image_ids:
        scene, captions = world.scenes[image_id], world.dataset.captions[image_id]
        assert len(captions) == 5 and len(set(captions)) == 5
        for caption in captions:
            assert any(o in caption for o in scene.counts()), caption
            named_setting += scene.setting in caption
    assert named_setting >= 0.75 * world.dataset.n_captions


def test_captions_per_image_is_respected():
    """captions_per_image captions per image, distinct, also beyond the number of templates."""
    for n in (1, 7, 20):
        world = make_world(images_per_concept=2, seed=1, captions_per_image=n)
        assert all(len(c) == n and len(set(c)) == n for c in world.dataset.captions.values())


def test_caption_grammar():
    """Counts, plurals, pairs and articles read as English."""
    assert noun_phrase("knife", 2) == "two knives"
    assert noun_phrase("apple", 1) == "an apple"
    assert noun_phrase("binoculars", 1, "black") == "a pair of black binoculars"
    assert noun_phrase("skis", 3) == "three pairs of skis"
    assert noun_phrase("balloon", 2, "navy") == "two navy blue balloons"
    assert noun_phrase("party hat", 4) == "four party hats"


def test_relation_caption_follows_layout():
    """'above'/'below' in a caption agree with the drawn positions."""
    from cglib.data.synthetic import Scene

    scene = Scene("birthday party", "living room",
                  (Placement("cake", 20, 2, 20), Placement("balloon", 20, 40, 14)))
    captions = []
    for seed in range(40):
        captions += write_captions(scene, np.random.default_rng(seed), 15)
    relations = [c for c in captions if " above " in c or " below " in c]
    assert relations and all("cake above" in c.lower() for c in relations), relations[:3]


# ------------------------------------------------------------------------------------------ the world
def test_same_seed_same_world_other_seed_other_world():
    """Deterministic from the seed: same pixels, captions and truth; another seed gives other ones."""
    a, b = make_world(3, seed=7), make_world(3, seed=7)
    np.testing.assert_array_equal(a.dataset.pixels, b.dataset.pixels)
    assert a.dataset.captions == b.dataset.captions and a.ground_truth == b.ground_truth
    c = make_world(3, seed=8)
    assert not np.array_equal(a.dataset.pixels, c.dataset.pixels)
    assert sum(a.dataset.captions[i] != c.dataset.captions[i] for i in a.dataset.image_ids) > 0.9 * len(c.dataset)


def test_an_image_does_not_depend_on_how_many_are_drawn():
    """Image k of concept c is the same whatever images_per_concept is (per-image seeds)."""
    small, large = make_world(2, seed=4), make_world(3, seed=4)
    np.testing.assert_array_equal(small.dataset.pixels[:2], large.dataset.pixels[:2])
    np.testing.assert_array_equal(small.dataset.pixels[2:4], large.dataset.pixels[3:5])


def test_world_layout_and_ground_truth(world, taxonomy):
    """Ids syn-000000.. in concept order, one chain l1..l4 per image, images_per_concept per l1."""
    ds = world.dataset
    assert ds.source == "synthetic" and ds.image_ids[0] == "syn-000000" and ds.image_ids[-1] == f"syn-{len(ds) - 1:06d}"
    assert len(ds) == 6 * len(taxonomy.l1)
    assert Counter(chain[0] for chain in world.ground_truth.values()) == Counter({l1: 6 for l1 in taxonomy.l1})
    for image_id in ds.image_ids:
        assert world.ground_truth[image_id] == taxonomy.chain(world.scenes[image_id].concept)


def test_objects_mostly_come_from_the_concept(taxonomy):
    """About 80% of drawn instances are the concept's own objects; the rest are distractors (not 0, not most)."""
    world = make_world(10, seed=2)
    own = total = 0
    for scene in world.scenes.values():
        for p in scene.placements:
            own += p.obj in taxonomy.scenes[scene.concept].objects
            total += 1
    assert 0.75 <= own / total <= 0.92, own / total


def test_levels_argument_truncates_chains():
    """levels=2 gives chains [l1, l2]; more levels than the taxonomy has is an error."""
    world = make_world(2, seed=0, levels=2)
    assert all(len(chain) == 2 for chain in world.ground_truth.values())
    with pytest.raises(ValueError, match="levels"):
        make_world(2, seed=0, levels=5)


def test_bad_arguments_are_explained():
    """Nonsense sizes fail with a message naming the argument."""
    with pytest.raises(ValueError, match="min_objects"):
        make_world(2, seed=0, min_objects=4, max_objects=3)
    with pytest.raises(ValueError, match="image_size"):
        make_world(2, seed=0, image_size=8)


def test_other_image_sizes():
    """Image size is configurable: 32 and 96 px render with objects inside the image."""
    for size in (32, 96):
        world = make_world(1, seed=0, image_size=size)
        assert world.dataset.pixels.shape[1:] == (size, size, 3)
        assert all(p.x + p.size <= size and p.y + p.size <= size for s in world.scenes.values() for p in s.placements)


def test_dataset_and_ground_truth_round_trip(world, tmp_path):
    """The world survives CaptionDataset.save/load and save/load_ground_truth unchanged."""
    world.dataset.save(tmp_path)
    save_ground_truth(tmp_path, world.ground_truth)
    loaded = CaptionDataset.load(tmp_path)
    assert loaded.image_ids == world.dataset.image_ids and loaded.captions == world.dataset.captions
    np.testing.assert_array_equal(loaded.pixels, world.dataset.pixels)
    assert loaded.meta == world.dataset.meta and loaded.source == "synthetic"
    assert load_ground_truth(tmp_path) == world.ground_truth


def test_load_captions_from_params():
    """`load_captions` builds the world from data.synthetic and magic.l_max."""
    params = Params.model_validate({"data": {"synthetic": {"images_per_concept": 2, "captions_per_image": 3}},
                                    "magic": {"l_max": 3}})
    dataset, truth = load_captions(params)
    assert len(dataset) == 2 * len(load_taxonomy().l1)
    assert all(len(c) == 3 for c in dataset.captions.values())
    assert all(len(chain) == 3 for chain in truth.values())


# ------------------------------------------------------------------------------------------ notebook 01 views
def test_statistics_and_views(world, taxonomy):
    """Statistics count what is there; the text tree and level table cover every node; figures draw."""
    stats = data_figures.caption_statistics(world.dataset)
    assert stats["images"] == len(world.dataset) and stats["captions"] == 5 * len(world.dataset)
    assert stats["captions_per_image"] == {"min": 5, "mean": 5.0, "max": 5} and stats["skipped"] == {}
    assert 5 <= stats["caption_words"]["mean"] <= 25
    assert len(data_figures.statistics_table(stats)) >= 9
    tree = data_figures.taxonomy_text_tree(taxonomy)
    assert all(name in tree for name in taxonomy.all_names())
    table = data_figures.level_counts(taxonomy, world.ground_truth)
    assert table["nodes"].tolist() == [len(taxonomy.names(lvl)) for lvl in range(1, 5)]
    assert table["images per node (mean)"].iloc[0] == 6.0
    grid = data_figures.image_grid(world.dataset, n=6, columns=3, ground_truth=world.ground_truth)
    assert sum(ax.has_data() for ax in grid.axes) == 6
    tree_fig = data_figures.taxonomy_figure(taxonomy)
    assert len([t for t in tree_fig.axes[0].texts]) == len(taxonomy.all_names()) + taxonomy.levels
    data_figures.caption_length_figure(world.dataset)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_taxonomy_rejects_empty_scene():
    """An l1 concept without objects or settings is an error naming it."""
    with pytest.raises(ValueError, match="'empty'"):
        Taxonomy(levels=1, parents={}, scenes={"empty": SceneContent(settings=("beach",), objects=())})
