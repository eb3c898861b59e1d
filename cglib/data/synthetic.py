"""The synthetic world: rendered scenes with templated captions and a known concept hierarchy (the demo's data).

Generative process, for each l1 concept c of the taxonomy (file order) and each image k of c, from a random
generator seeded by (seed, index of c, k), so an image never depends on how many others are drawn:

1. Setting: with probability P_OWN_SETTING one of c's settings (its first-listed setting twice as likely as each
   other), else a setting of one of c's siblings (same l2 parent): settings are characteristic, not decisive.
2. Objects: the number of instances is uniform in [min_objects, max_objects]. Each instance is, with probability
   P_OWN_OBJECT, one of c's objects; else a sibling's object (P_SIBLING_OBJECT, a hard negative) or any object
   of the taxonomy (clutter). Repeated draws of one object type become counts ("two balloons").
3. Layout: every instance gets a side of MIN_SCALE..MAX_SCALE of the image, a position inside the image (a few
   tries to limit overlap), a random mirror and a small brightness change; the background gets a small global
   brightness change. Drawing is in `cglib.data.render`.
4. Captions: `captions_per_image` different templates in plain English that name the objects (a random one is
   sometimes left out, as people do), their counts, sometimes their colours and a spatial relation, and the
   setting: "A red balloon above a cake and two candles in a living room." Captions name only objects,
   colours and settings, never a concept of any level (the taxonomy keeps those vocabularies apart and the
   tests check every caption), so the concept must be inferred, as in MAGIC.

The ground truth of an image is its concept chain [l1, ..., l_levels]. It is returned beside the dataset and is
read only by evaluation and by the explicitly named `oracle` abstraction backend.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from cglib.data.appearance import OBJECTS, SETTINGS
from cglib.data.dataset import CaptionDataset
from cglib.data.render import Placement, render_scene
from cglib.data.taxonomy import Taxonomy, load_taxonomy

P_OWN_SETTING = 0.9
P_OWN_OBJECT = 0.8
P_SIBLING_OBJECT = 0.1  # the remaining 0.1: any object of the taxonomy
MIN_SCALE, MAX_SCALE = 0.2, 0.36
P_COLOUR = 0.35  # chance that a caption names an object's colour
P_LEAVE_ONE_OUT = 0.3  # chance that a caption of a scene with 3+ object types leaves one out
OVERLAP_TRIES = 8

# ---------------------------------------------------------------------------------------------- grammar
_UNITS = {"binoculars": "pair", "skis": "pair", "goggles": "pair", "sunglasses": "pair", "headphones": "pair",
          "fries": "portion", "toast": "slice", "cotton candy": "stick"}
_PLURALS = {"knife": "knives", "child": "children", "fish": "fish", "dice": "dice", "scarf": "scarves",
            "wheat sheaf": "wheat sheaves"}
_COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
_COLOUR_WORDS = {"navy": "navy blue"}


def _plural(noun: str) -> str:
    if noun in _PLURALS:
        return _PLURALS[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def noun_phrase(obj: str, count: int, colour: str | None = None, rng: np.random.Generator | None = None) -> str:
    """English phrase for `count` objects, optionally with their colour: 'a red balloon', 'two pairs of skis'."""
    adjective = f"{_COLOUR_WORDS.get(colour, colour)} " if colour else ""
    unit = _UNITS.get(obj)
    if unit:
        head = f"{unit} of {adjective}{obj}" if count == 1 else f"{_plural(unit)} of {adjective}{obj}"
    else:
        head = f"{adjective}{obj}" if count == 1 else f"{adjective}{_plural(obj)}"
    if count == 1:
        return f"{_article(head)} {head}"
    if count >= 3 and rng is not None and rng.random() < 0.25:
        return f"several {head}"
    return f"{_COUNT_WORDS.get(count, str(count))} {head}"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# Caption templates. {L}: the object list; {S}: the setting with its preposition ("on a tennis court");
# {N}: the setting with an article ("a tennis court"); {first} {rel} {second}: the largest object, a spatial
# relation and another object; {one}: the largest object only; {be}: "is" or "are" (agrees with {L}).
TEMPLATES: tuple[str, ...] = (
    "{L} {S}.",
    "A photo of {L} {S}.",
    "{S}, there {be} {L}.",
    "{N} with {L}.",
    "{first} {rel} {second} {S}.",
    "A picture of {N} showing {L}.",
    "An image of {L}.",
    "{L} can be seen {S}.",
    "A snapshot of {L} {S}.",
    "This is {N} with {L}.",
    "Close-up of {one} {S}.",
    "{L}, photographed {S}.",
    "A view of {N} containing {L}.",
    "Here we see {L} {S}.",
    "Someone took a photo of {L} {S}.",
)


# ------------------------------------------------------------------------------------------------ scenes
@dataclass(frozen=True)
class Scene:
    """What one image shows: its l1 concept, setting, drawn instances (in drawing order) and background shift."""

    concept: str
    setting: str
    placements: tuple[Placement, ...]
    brightness: float = 0.0

    def counts(self) -> dict[str, int]:
        """Instances per object type, in first-drawn order."""
        return dict(Counter(p.obj for p in self.placements))


@dataclass
class World:
    """A rendered synthetic world: the dataset, each image's ground-truth chain, the taxonomy and the scenes."""

    dataset: CaptionDataset
    ground_truth: dict[str, list[str]]
    taxonomy: Taxonomy
    scenes: dict[str, Scene]


@dataclass(frozen=True)
class ScenePools:
    """What an image of one l1 concept draws from: its own and its siblings' objects and settings."""

    own_objects: tuple[str, ...]
    sibling_objects: tuple[str, ...]
    own_settings: tuple[str, ...]
    setting_weights: tuple[float, ...]
    sibling_settings: tuple[str, ...]
    all_objects: tuple[str, ...]


def scene_pools(taxonomy: Taxonomy, l1: str) -> ScenePools:
    """Own and sibling (same parent; else same grandparent) objects and settings of `l1`."""
    content = taxonomy.scenes[l1]
    sibling_objects: list[str] = []
    sibling_settings: list[str] = []
    for depth in (1, 2):
        relatives = [o for o in taxonomy.l1 if o != l1
                     and taxonomy.chain(o)[depth:depth + 1] == taxonomy.chain(l1)[depth:depth + 1]]
        sibling_objects = sorted({x for o in relatives for x in taxonomy.scenes[o].objects} - set(content.objects))
        sibling_settings = sorted({x for o in relatives for x in taxonomy.scenes[o].settings} - set(content.settings))
        if sibling_objects and sibling_settings:
            break
    weights = np.array([2.0] + [1.0] * (len(content.settings) - 1))
    all_objects = tuple(sorted({o for c in taxonomy.scenes.values() for o in c.objects}))
    return ScenePools(content.objects, tuple(sibling_objects), content.settings,
                      tuple(float(w) for w in weights / weights.sum()), tuple(sibling_settings), all_objects)


def _place(sizes: list[int], image_size: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Top-left corners inside the image, each the least-overlapping of a few random tries."""
    boxes: list[tuple[int, int, int]] = []
    for s in sizes:
        best, best_overlap = (0, 0), None
        for _ in range(OVERLAP_TRIES):
            x, y = (int(v) for v in rng.integers(0, image_size - s + 1, size=2))
            overlap = sum(max(0, min(x + s, bx + bs) - max(x, bx)) * max(0, min(y + s, by + bs) - max(y, by))
                          for bx, by, bs in boxes)
            if best_overlap is None or overlap < best_overlap:
                best, best_overlap = (x, y), overlap
            if overlap <= 0.15 * s * s:
                break
        boxes.append((best[0], best[1], s))
    return [(x, y) for x, y, _ in boxes]


def sample_scene(taxonomy: Taxonomy, l1: str, rng: np.random.Generator, image_size: int = 64,
                 min_objects: int = 2, max_objects: int = 5, pools: ScenePools | None = None) -> Scene:
    """Draw the setting, objects and layout of one image of concept `l1` (the generative process above)."""
    pools = pools or scene_pools(taxonomy, l1)
    all_objects = pools.all_objects
    if pools.sibling_settings and rng.random() >= P_OWN_SETTING:
        setting = pools.sibling_settings[rng.integers(len(pools.sibling_settings))]
    else:
        setting = pools.own_settings[rng.choice(len(pools.own_settings), p=pools.setting_weights)]
    n = int(rng.integers(min_objects, max_objects + 1))
    objects = []
    for u in rng.random(n):
        if u < P_OWN_OBJECT or (u < P_OWN_OBJECT + P_SIBLING_OBJECT and not pools.sibling_objects):
            pool = pools.own_objects
        elif u < P_OWN_OBJECT + P_SIBLING_OBJECT:
            pool = pools.sibling_objects
        else:
            pool = all_objects
        objects.append(pool[rng.integers(len(pool))])
    lo, hi = max(3, round(MIN_SCALE * image_size)), max(3, round(MAX_SCALE * image_size))
    sizes = [int(s) for s in rng.integers(lo, hi + 1, size=n)]
    corners = _place(sizes, image_size, rng)
    flips = rng.random(n) < 0.5
    shades = rng.uniform(0.85, 1.1, size=n)
    placements = tuple(Placement(o, x, y, s, bool(f), float(round(h, 3)))
                       for o, (x, y), s, f, h in zip(objects, corners, sizes, flips, shades))
    return Scene(l1, setting, placements, float(round(rng.uniform(-12, 12), 2)))


# ---------------------------------------------------------------------------------------------- captions
def _relation(scene: Scene, a: str, b: str, rng: np.random.Generator) -> str:
    """'above' / 'below' when the first instances of a and b are clearly stacked, else a 'next to' synonym."""
    pa = next(p for p in scene.placements if p.obj == a)
    pb = next(p for p in scene.placements if p.obj == b)
    dy = (pb.y + pb.size / 2) - (pa.y + pa.size / 2)
    dx = (pb.x + pb.size / 2) - (pa.x + pa.size / 2)
    if abs(dy) > 0.6 * max(pa.size, pb.size) and abs(dy) > abs(dx):
        return "above" if dy > 0 else "below"
    return ("next to", "beside", "near")[rng.integers(3)]


def write_captions(scene: Scene, rng: np.random.Generator, n: int = 5) -> list[str]:
    """`n` captions of the scene from different templates (templates repeat only when n > len(TEMPLATES))."""
    counts = scene.counts()
    largest = max(counts, key=lambda o: max(p.size for p in scene.placements if p.obj == o))
    setting = SETTINGS[scene.setting]
    order = [int(i) for i in rng.permutation(len(TEMPLATES))]
    if len(counts) < 2:  # the relation template needs two object types
        order.remove(TEMPLATES.index("{first} {rel} {second} {S}."))
    captions: list[str] = []
    attempts = 0
    while len(captions) < n and attempts < 10 * n:
        template = TEMPLATES[order[(len(captions) + attempts) % len(order)]]
        attempts += 1

        def phrase(obj: str) -> str:
            colour = OBJECTS[obj].colour if rng.random() < P_COLOUR else None
            return noun_phrase(obj, counts[obj], colour, rng)

        types = [o for o in counts if o != largest]
        rng.shuffle(types)
        if len(counts) >= 3 and rng.random() < P_LEAVE_ONE_OUT:
            types = types[:-1]
        listed = [largest, *types] if rng.random() < 0.5 else [*types, largest]
        article = setting.article if setting.article == "the" else ("the" if rng.random() < 0.3
                                                                    else _article(scene.setting))
        first_phrase = phrase(listed[0])
        fields = {
            "L": _join([first_phrase] + [phrase(o) for o in listed[1:]]),
            "be": "is" if counts[listed[0]] == 1 else "are",
            "S": f"{setting.prep} {article} {scene.setting}",
            "N": f"{article} {scene.setting}",
            "one": phrase(largest),
        }
        if "{first}" in template:
            fields["first"] = phrase(largest)
            fields["second"] = phrase(types[0])
            fields["rel"] = _relation(scene, largest, types[0], rng)
        text = template.format(**fields)
        text = text[0].upper() + text[1:]
        if text not in captions:
            captions.append(text)
    return captions


def leaked_concept_names(captions: list[str], taxonomy: Taxonomy) -> Counter:
    """How often each concept name (any level) occurs in `captions` as whole words, case-insensitive."""
    names = sorted(taxonomy.all_names(), key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)
    found: Counter = Counter()
    for caption in captions:
        found.update(m.lower() for m in pattern.findall(caption))
    return found


# ------------------------------------------------------------------------------------------------- world
def check_drawable(taxonomy: Taxonomy) -> None:
    """Raise ValueError naming every object or setting of the taxonomy that the renderer cannot draw."""
    objects = {o for c in taxonomy.scenes.values() for o in c.objects}
    settings = {s for c in taxonomy.scenes.values() for s in c.settings}
    missing_objects = sorted(objects - set(OBJECTS))
    missing_settings = sorted(settings - set(SETTINGS))
    if missing_objects or missing_settings:
        raise ValueError(f"taxonomy names things the renderer cannot draw: objects {missing_objects}, settings "
                         f"{missing_settings}; add them to cglib/data/appearance.py (_OBJECT_TABLE, _SETTING_TABLE)")


def make_world(images_per_concept: int, seed: int, image_size: int = 64, captions_per_image: int = 5,
               min_objects: int = 2, max_objects: int = 5, levels: int = 4,
               taxonomy: Taxonomy | None = None) -> World:
    """Render `images_per_concept` captioned images of every l1 concept; ids 'syn-000000'... in concept order."""
    if images_per_concept < 1 or captions_per_image < 1:
        raise ValueError(f"images_per_concept ({images_per_concept}) and captions_per_image ({captions_per_image}) "
                         "must be at least 1")
    if not 1 <= min_objects <= max_objects:
        raise ValueError(f"need 1 <= min_objects ({min_objects}) <= max_objects ({max_objects})")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if image_size < 16:
        raise ValueError(f"image_size must be at least 16 px, got {image_size}")
    taxonomy = taxonomy or load_taxonomy()
    if not 1 <= levels <= taxonomy.levels:
        raise ValueError(f"levels ({levels}) must be between 1 and the taxonomy's {taxonomy.levels}; "
                         "set magic.l_max accordingly")
    check_drawable(taxonomy)
    pools = {l1: scene_pools(taxonomy, l1) for l1 in taxonomy.l1}
    n = len(taxonomy.l1) * images_per_concept
    pixels = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    image_ids: list[str] = []
    captions: dict[str, list[str]] = {}
    ground_truth: dict[str, list[str]] = {}
    scenes: dict[str, Scene] = {}
    for ci, l1 in enumerate(taxonomy.l1):
        chain = taxonomy.chain(l1)[:levels]
        for k in range(images_per_concept):
            rng = np.random.default_rng([seed, ci, k])
            scene = sample_scene(taxonomy, l1, rng, image_size, min_objects, max_objects, pools[l1])
            row = len(image_ids)
            image_id = f"syn-{row:06d}"
            pixels[row] = render_scene(scene.setting, scene.placements, image_size, scene.brightness)
            image_ids.append(image_id)
            captions[image_id] = write_captions(scene, rng, captions_per_image)
            ground_truth[image_id] = list(chain)
            scenes[image_id] = scene
    meta = {"generator": "cglib.data.synthetic", "seed": seed, "images_per_concept": images_per_concept,
            "image_size": image_size, "captions_per_image": captions_per_image, "min_objects": min_objects,
            "max_objects": max_objects, "levels": levels, "l1_concepts": len(taxonomy.l1),
            "p_own_object": P_OWN_OBJECT, "p_sibling_object": P_SIBLING_OBJECT, "p_own_setting": P_OWN_SETTING}
    dataset = CaptionDataset(source="synthetic", image_ids=image_ids, captions=captions, pixels=pixels, meta=meta)
    return World(dataset=dataset, ground_truth=ground_truth, taxonomy=taxonomy, scenes=scenes)
