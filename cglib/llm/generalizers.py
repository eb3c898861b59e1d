"""The generalization backends of the LLM_gen requests (`cglib.llm.generalize_requests`): `make_generalizer` picks
one by llm.backend (`openai` asks the LLM; `offline`, and `oracle` which has nothing to say about captions, use
`OfflineGeneralizer`, a deterministic counter of the phrases the captions share).

The offline captions are worded by `inflect` ("an hour", "a uniform": the article by sound) and short lists of
this module: mass nouns take no article ("traffic", "water"), plural heads that the conservative concept
canonicalization keeps are made singular here ("skis" -> "ski", "wine glasses" -> "wine glass"), settings of which
there is one take "the" ("in the sky") and times of day none ("at night"). Only the captions' wording uses them:
concept names are canonicalized as before.

Below the engine (`cglib.llm.engine` estimates the generalization requests with these backends, and
`generalize_requests` runs them through the engine), so neither imports the other in a function.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import inflect

from cglib.config import Params
from cglib.llm.base import Backend, GroupRequest, Job, Outcome, Report
from cglib.llm.canonical import INVARIANT, canonicalize
from cglib.llm.openai_backend import OpenAIBackend
from cglib.llm.prompts import load_image_prompt, load_level_prompt

_FUNCTION_WORDS = """
a an the and or but with without of in on at to from by for into onto over under above below behind beside
besides between near next inside outside around through across along up down out off about against among
beneath toward towards while as than then there here this that these those it its it's he she they them
their his her him we our you your i my me who whom which what where when how some any each every all both
several many much few lots lot other another one two three four five six seven eight nine ten couple pair
group bunch is are was were be been being am has have had do does did can could will would may might shall
should very just also not no so too more most together top front side back middle edge area part view
photo picture image scene shot close closeup someone something people person
sitting sits sit standing stands stand holding holds hold looking looks look playing plays play eating eats
eat riding rides ride walking walks walk waiting waits wait lying lies laying lays parked filled covered
topped made shown seen using uses use wearing wears wear carrying carries carry flying flies getting gets
going goes taking takes showing shows watching watches having posing poses placed set stacked
big small large little tiny huge tall short long old young new white black red blue green yellow orange
brown pink purple gray grey dark light bright colorful colourful navy teal beige gold golden silver
striped spotted dotted plain checkered wooden various different same empty full open closed
piece pieces slice slices half halves body kind kinds type types variety assortment
row rows pile piles pairs portion portions
like past doing stopped high ready hit painted run cut throw serve need either grassy see took photographed
"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())
SETTING_WORDS = frozenset({"in", "at", "on", "inside"})
MAX_PHRASE_WORDS = 3
TEMPLATES = ("a scene with {objects}{setting}", "{objects}{setting}", "a photo showing {objects}{setting}",
             "a picture of {objects}{setting}", "{objects} seen together{setting}")
SIZES = (3, 2, 4, 1, 3)


# Uncountable nouns of everyday scenes: a scene with "traffic", "water", "a pizza and food", never "a traffic".
_MASS_NOUNS = """
traffic water grass snow food furniture sand dirt mud gravel hay rice meat bread broccoli cauliflower spinach
lettuce cabbage cheese butter cream sauce soup gravy pasta spaghetti cereal oatmeal dressing frosting icing
chocolate candy fruit produce seafood wine beer coffee tea milk juice luggage baggage equipment gear clothing
laundry foliage scenery graffiti garbage trash rubbish debris lumber wood smoke fog rain sunlight
daylight shade lighting hair fur ice money art artwork asphalt pavement
machinery hardware software wildlife livestock cattle poultry mail weather tennis soccer golf hockey chess music
coral toast popcorn flour sugar salt
"""
MASS_NOUNS = frozenset(_MASS_NOUNS.split())
# Plural heads that concept canonicalization keeps or gets wrong, made singular before it sees them: nouns in -i
# (it leaves every -is word whole: "tennis"), and a few in -us/-ves/-ses it does not list.
PLURAL_HEADS = {"skis": "ski", "taxis": "taxi", "kiwis": "kiwi", "bikinis": "bikini", "martinis": "martini",
                "safaris": "safari", "khakis": "khaki", "rabbis": "rabbi", "yetis": "yeti", "tsunamis": "tsunami",
                "salamis": "salami", "wikis": "wiki", "delis": "deli", "chilis": "chili", "alibis": "alibi",
                "menus": "menu", "emus": "emu", "gnus": "gnu", "tofus": "tofu", "canvases": "canvas",
                "sheaves": "sheaf"}
# "glasses" after one of these is drinking glasses ("wine glasses" -> "wine glass"), not eyewear.
DRINKING_GLASS = frozenset({"wine", "champagne", "juice", "water", "beer", "drinking", "shot", "martini",
                            "cocktail", "milk"})
# Words that canonicalization keeps as they are but that are singular nouns: "a canvas", "a lens".
SINGULAR_IN_S = frozenset({"canvas", "atlas", "bias", "alias", "lens", "series", "species", "cosmos", "texas",
                           "vegas", "kansas", "christmas", "overseas", "whereas", "perhaps", "always"})
PLURAL_ONLY = INVARIANT - SINGULAR_IN_S  # "binoculars", "jeans", "news": no article
# Settings of which a scene has one: "in the sky", "in the air", "on the ground".
ONE_OF_A_KIND = frozenset({"sky", "air", "ground", "ocean", "sea", "sun", "moon", "wind", "distance",
                           "background", "foreground", "horizon", "dark", "open", "countryside", "wild"})
# Times of day take no article: "at night".
TIMES_OF_DAY = frozenset({"night", "nighttime", "daytime", "dusk", "dawn", "sunset", "sunrise", "noon",
                          "midnight", "twilight"})


@lru_cache(maxsize=1)
def _inflect() -> inflect.engine:
    return inflect.engine()


def _head(phrase: str) -> str:
    return phrase.rsplit(" ", 1)[-1]


@lru_cache(maxsize=1 << 16)  # inflect checks its argument types on every call: a phrase is worded once
def _article(phrase: str) -> str:
    """The phrase as one item of a list: plural-only and mass nouns bare, else "a"/"an" chosen by sound."""
    if _head(phrase) in PLURAL_ONLY or _head(phrase) in MASS_NOUNS:  # "binoculars", "traffic": no article
        return phrase
    return _inflect().a(phrase)


def _setting(phrase: str, preposition: str) -> str:
    """The setting after its preposition: "at night", "in the sky", "on the grass", "in a kitchen"."""
    head = _head(phrase)
    if head in TIMES_OF_DAY or head in PLURAL_ONLY:  # "at night", "in jeans"
        return f" {preposition} {phrase}"
    if head in ONE_OF_A_KIND or head in MASS_NOUNS:
        return f" {preposition} the {phrase}"
    return f" {preposition} {_article(phrase)}"


def _singular_head(words: list[str]) -> list[str]:
    """The run with a plural head that canonicalization would keep made singular ("skis" -> "ski")."""
    head = words[-1]
    if head == "glasses" and len(words) > 1 and words[-2] in DRINKING_GLASS:
        head = "glass"
    return [*words[:-1], PLURAL_HEADS.get(head, head)]


NOUNS_IN_ING = frozenset({"building", "ceiling", "clothing", "painting", "wedding", "evening", "morning", "icing",
                          "frosting", "stuffing", "railing", "awning", "sibling", "pudding", "bedding", "dumpling",
                          "seasoning", "topping", "filling", "landing", "crossing", "lightning", "earring",
                          "stocking", "sculpting", "offering", "gathering", "opening"})


HEAD_NOUNS_AFTER_NOUN = frozenset({"light", "lights", "lot", "lots", "piece", "pieces", "slice", "slices"})
CAN_NOUNS = frozenset({"watering", "trash", "garbage", "soda", "beer", "paint", "tin", "oil"})  # "a watering can"


def _is_verb_ing(token: str) -> bool:
    return len(token) > 5 and token.endswith("ing") and token not in NOUNS_IN_ING


def caption_phrases(caption: str) -> list[tuple[str, str]]:
    """(phrase, preposition) for each run of content words; the preposition is "in"/"at"/"on"/"inside" when
    one stands right before the run (a setting candidate), else "".

    Runs end at function words, punctuation and (inside a run) -ing verbs ("a dog sleeping"); a run's
    first word may end in -ing ("living room"), but an -ing verb alone is no phrase ("a man skiing"). "light",
    "lot", "piece" and "slice" right after a content word are its head noun ("traffic light", "parking lot",
    "chess piece"), elsewhere function words ("light blue", "a lot of", "a piece of cake"); so is "can" after
    "watering", "trash"... Phrases keep at most the last 3 words, head singularized.
    """
    tokens = re.findall(r"[a-z]+|[,.;:!?()]", caption.lower())
    phrases: list[tuple[str, str]] = []
    run: list[str] = []
    last_function = ""
    prep = ""

    def close() -> None:
        phrase = canonicalize(" ".join(_singular_head(run[-MAX_PHRASE_WORDS:])))
        if len(phrase) >= 3 and not (len(run) == 1 and _is_verb_ing(run[0])):
            phrases.append((phrase, prep))
        run.clear()

    for tok in [*tokens, "."]:
        if run and (tok in HEAD_NOUNS_AFTER_NOUN or (tok in ("can", "cans") and run[-1] in CAN_NOUNS)):
            run.append(tok)
            continue
        boundary = tok in FUNCTION_WORDS or not tok.isalpha() or (run and _is_verb_ing(tok))
        if boundary:
            if run:
                close()
            if tok not in ("a", "an", "the"):
                last_function = tok
            continue
        if not run:
            prep = last_function if last_function in SETTING_WORDS else ""
        run.append(tok)
    return phrases


@dataclass
class SharedPhrases:
    """Phrases of a group ranked by how many captions contain them (objects) and the most shared setting."""

    objects: list[tuple[str, int]]
    settings: list[tuple[str, str, int]]  # phrase, its usual preposition, captions


def shared_phrases(captions: list[str]) -> SharedPhrases:
    """Count phrases over captions (each caption once); a phrase mostly after in/at/on is a setting.

    A multi-word phrase also counts for its head noun ("a birthday cake is a cake"); a head and its longer
    phrase are then reported once: the longer one when it accounts for at least half of the head's count.
    """
    df: Counter = Counter()
    preps: dict[str, Counter] = {}
    for caption in captions:
        found = caption_phrases(caption)
        heads = {p.rsplit(" ", 1)[-1] for p, _ in found if " " in p}
        df.update({p for p, _ in found} | heads)
        for p, prep in found:
            preps.setdefault(p, Counter())[prep] += 1
    settings = []
    for p, counter in preps.items():
        located = sum(n for k, n in counter.items() if k)
        if located * 2 >= sum(counter.values()):
            prep = max((k for k in counter if k), key=lambda k: (counter[k], k == "in"))
            settings.append((p, prep, df[p]))
    settings.sort(key=lambda x: (-x[2], x[0]))
    setting_names = {p for p, _, _ in settings}
    setting_heads = {p.rsplit(" ", 1)[-1] for p in setting_names}
    ranked = sorted(((p, n) for p, n in df.items() if p not in setting_names and p not in setting_heads),
                    key=lambda kv: (-kv[1], kv[0]))
    objects: list[tuple[str, int]] = []
    for phrase, n in ranked:
        longer = max((m for q, m in ranked if q.endswith(" " + phrase)), default=0)
        if " " not in phrase and longer * 2 >= n:
            continue  # represented by its longer phrase
        if " " in phrase and any(q == phrase.rsplit(" ", 1)[-1] for q, _ in objects):
            continue  # its head was kept instead
        objects.append((phrase, n))
    return SharedPhrases(objects=objects, settings=settings)


def offline_generalize(captions: list[str], n: int) -> tuple[list[str], dict[str, Any]]:
    """`n` deterministic captions from the phrases most captions share (no concept name involved)."""
    found = shared_phrases(captions)
    min_share = max(2, math.ceil(0.1 * len(captions)))  # shared: by at least 2 captions and 10% of them
    shared_objects = [p for p, k in found.objects if k >= min_share][:6]
    top_setting = next(((p, prep) for p, prep, k in found.settings if k >= min_share), None)
    weak = not shared_objects
    if weak:  # nothing is shared: use the most frequent phrases anyway, and say so in the meta
        shared_objects = [p for p, _ in found.objects[:3]] or ["everyday object"]  # "an everyday object"
    setting = _setting(top_setting[0], top_setting[1]) if top_setting else ""
    out: list[str] = []
    for j in range(n * 4):
        if len(out) == n:
            break
        size = min(SIZES[j % len(SIZES)], len(shared_objects))
        start = (j // len(TEMPLATES)) % len(shared_objects)
        picked = (shared_objects[start:] + shared_objects[:start])[:size]
        listed = ", ".join(_article(p) for p in picked[:-1])
        listed = f"{listed} and {_article(picked[-1])}" if listed else _article(picked[-1])
        text = TEMPLATES[j % len(TEMPLATES)].format(objects=listed, setting=setting)
        if text not in out:
            out.append(text)
    duplicates = n - len(out)
    out += [out[k % len(out)] for k in range(duplicates)]  # too few distinct phrasings: repeat, counted
    return out, {"shared_objects": shared_objects, "setting": top_setting[0] if top_setting else None, "weak": weak,
                 "duplicates": duplicates}


class OfflineGeneralizer(Backend):
    """Generalized captions from shared phrases; deterministic, no network, never sees the concept name."""

    name = "offline"
    model = "shared-phrases-v2"  # v2: grammatical wording (articles, mass nouns, -i plurals)
    prompt_version = None
    streaming = False

    def payload(self, task: GroupRequest) -> dict:
        body = {"captions": list(task.captions), "n": task.n}
        if task.scope == "level":  # it cannot use the level's concept: level k gets the k-th phrasing instead
            return {**body, "scope": task.scope, "level": task.level}
        return body if task.scope == "group" else {**body, "scope": task.scope}  # group keys as before

    async def run(self, jobs: list[Job], report: Report) -> None:
        for job in jobs:
            n, skip = job.payload["n"], job.payload.get("level", 1) - 1
            captions, meta = offline_generalize(job.payload["captions"], skip + n)
            report(job, Outcome(ok=True, value=captions[skip:], meta=meta))


def make_generalizer(params: Params, run_dir: Path, scope: str = "group") -> Backend:
    """The generalization backend for llm.backend (oracle falls back to the offline generalizer).

    Per-image and per-level requests carry their own prompt version (llm.generalize_image_prompt_version,
    llm.generalize_level_prompt_version) in the cache key and in every row, so changing the concept prompts
    does not ask for them again.
    """
    if params.llm.backend == "openai":
        backend = OpenAIBackend(params, work_dir=Path(run_dir) / "abstraction" / "batches")
        if scope == "image":
            backend.prompt_version = load_image_prompt(params.llm.generalize_image_prompt_version).version
        elif scope == "level":
            backend.prompt_version = load_level_prompt(params.llm.generalize_level_prompt_version).version
        return backend
    return OfflineGeneralizer()
