"""Keyword-permuted hard negatives (Rösch et al., "Enhancing Conceptual Understanding in Multimodal Contrastive
Learning through Hard Negative Samples"): a caption with ONE keyword of a concept type swapped.

Concept types (`KINDS`): colour, object, size, location. Each type has a fixed one-to-one relation on its
vocabulary (a bijection without a fixed point: a cyclic shift of an ordered list, or antonym pairs), so a
permuted caption always differs from the original: "a white cat under an umbrella" -> "a brown cat under an
umbrella". Matching is case-insensitive on whole words, longest phrase first ("navy blue" before "blue", "hot
dog" before "dog", "on top of" before "top"); nouns match in the singular and the plural and keep their number;
"a"/"an" right before a swapped word is corrected; protected phrases (e.g. the synthetic world's setting names,
"baseball field") are never changed. A caption without a keyword of the type gives None.

Where the relations come from: `synthetic_permuter` builds them from the synthetic world itself (its objects,
colour words and the stacked relations above/below; its captions name no size), `coco_permuter` reads the shipped
`cglib/data/keyword_relations.yaml` (COCO's 80 category names, basic colour terms, size adjectives, spatial
prepositions); `permuter_for(params)` picks one by `data.source`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cglib.data.appearance import OBJECTS, SETTINGS
from cglib.data.textures import COLOURS

KINDS: tuple[str, ...] = ("colour", "object", "size", "location")
KEYWORD_FILE = "keyword_relations.yaml"


def english_plural(noun: str) -> str:
    """Regular English plural of the last word of `noun` ('wine glass' -> 'wine glasses', 'pony' -> 'ponies')."""
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and len(noun) > 1 and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


@dataclass(frozen=True)
class Match:
    """One keyword occurrence in a caption: its span, the keyword (singular) and whether it was plural."""

    start: int
    end: int
    keyword: str
    plural: bool


@dataclass
class KeywordPermuter:
    """Swaps one keyword of a concept type through that type's fixed relation (see the module docstring).

    `relations[kind]` maps each keyword (lower case, singular) to its replacement; `plurals[kind]` gives a noun's
    plural (types without number leave it out) and `singulars[kind]` its singular as written when that is not the
    keyword itself ("pair of skis"); `protected` phrases are matched but never changed.
    """

    relations: dict[str, dict[str, str]]
    plurals: dict[str, dict[str, str]] = field(default_factory=dict)
    singulars: dict[str, dict[str, str]] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    source: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        """The concept types it permutes, in KINDS order (every one, a type without keywords included)."""
        return KINDS

    def __post_init__(self) -> None:
        unknown = sorted(set(self.relations) - set(KINDS))
        if unknown:
            raise ValueError(f"keyword relations of unknown concept types {unknown}; use {list(KINDS)}")
        self._surface: dict[str, dict[str, tuple[str, bool] | None]] = {}
        self._pattern: dict[str, re.Pattern | None] = {}
        for kind in KINDS:
            relation = self.relations.setdefault(kind, {})
            check_relation(kind, relation)
            plurals, singulars = self.plurals.get(kind, {}), self.singulars.get(kind, {})
            surface: dict[str, tuple[str, bool] | None] = {p.lower(): None for p in self.protected}
            for word in relation:
                forms = [(singulars.get(word, word), False)]
                if plurals.get(word, word) != forms[0][0]:
                    forms.append((plurals[word], True))
                for form, plural in forms:
                    if surface.get(form) is not None and surface[form] != (word, plural):
                        raise ValueError(f"{kind} keyword form {form!r} belongs to both {surface[form][0]!r} and "
                                         f"{word!r}; remove one of them from the {kind} vocabulary")
                    surface[form] = (word, plural)  # a keyword beats a protected phrase of the same spelling
            self._surface[kind] = surface
            forms = sorted(surface, key=len, reverse=True)  # longest first: "navy blue" before "blue"
            self._pattern[kind] = (re.compile(r"\b(" + "|".join(re.escape(f) for f in forms) + r")\b", re.IGNORECASE)
                                   if relation else None)
        self._cache: dict[tuple[str, str], list[Match]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its match cache (DataLoader workers receive the permuter with each epoch's dataset)."""
        return {**self.__dict__, "_cache": {}}

    def surface(self, kind: str, keyword: str, plural: bool) -> str:
        """How captions write a keyword in the singular or plural ('pair of skis', 'knives')."""
        forms = self.plurals if plural else self.singulars
        return forms.get(_kind(kind), {}).get(keyword, keyword)

    def vocabulary(self, kind: str) -> list[str]:
        """The keywords of one concept type (singular, lower case), sorted."""
        return sorted(self.relations[_kind(kind)])

    def matches(self, caption: str, kind: str) -> list[Match]:
        """Every keyword occurrence of `kind` in `caption`, left to right (protected phrases excluded)."""
        key = (caption, _kind(kind))
        if key not in self._cache:
            pattern = self._pattern[key[1]]
            found = [] if pattern is None else [
                Match(m.start(), m.end(), *self._surface[key[1]][m.group(0).lower()])
                for m in pattern.finditer(caption) if self._surface[key[1]][m.group(0).lower()] is not None]
            if len(self._cache) > 200_000:  # bounded: training scans every pair of every epoch
                self._cache.clear()
            self._cache[key] = found
        return self._cache[key]

    def kinds_in(self, caption: str) -> list[str]:
        """The concept types that have at least one keyword in `caption` (in KINDS order)."""
        return [kind for kind in KINDS if self.matches(caption, kind)]

    def permute(self, caption: str, kind: str, pick: int = 0) -> str | None:
        """`caption` with keyword number `pick % count` of `kind` swapped; None when it has no such keyword."""
        found = self.matches(caption, kind)
        if not found:
            return None
        m = found[pick % len(found)]
        target = self.relations[_kind(kind)][m.keyword]
        word = self.surface(kind, target, m.plural)
        if caption[m.start].isupper():
            word = word[0].upper() + word[1:]
        before = caption[:m.start]
        article = re.search(r"\b(a|an)(\s+)$", before, re.IGNORECASE)
        if article:  # "a red apple" -> "an orange apple": the article agrees with the new word
            new = _article(word)
            new = new.capitalize() if article.group(1)[0].isupper() else new
            before = before[:article.start(1)] + new + article.group(2)
        return before + word + caption[m.end:]


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown concept type {kind!r}; use one of {list(KINDS)}")
    return kind


def check_relation(kind: str, relation: dict[str, str]) -> None:
    """Raise ValueError unless `relation` is a bijection of its keywords onto themselves with no fixed point."""
    fixed = sorted(k for k, v in relation.items() if k == v)
    if fixed:
        raise ValueError(f"{kind} relation maps {fixed} to themselves; a permuted caption must differ from the "
                         "original: pair them with another keyword")
    if set(relation.values()) != set(relation) or len(set(relation.values())) != len(relation):
        stray = sorted(set(relation.values()) ^ set(relation))
        raise ValueError(f"{kind} relation is not one-to-one on its vocabulary (unmatched {stray}); use a cyclic "
                         "order or antonym pairs")


def cyclic(words: list[str]) -> dict[str, str]:
    """Each word to the next one, the last to the first (a derangement of two or more distinct words)."""
    if len(set(words)) != len(words) or len(words) == 1:
        raise ValueError(f"a cyclic relation needs distinct words, none or at least two, got {words}")
    return {w: words[(k + 1) % len(words)] for k, w in enumerate(words)}


def pairs(couples: list[list[str]] | list[tuple[str, str]]) -> dict[str, str]:
    """Antonym pairs as a relation both ways: [[left, right]] -> {left: right, right: left}."""
    out: dict[str, str] = {}
    for couple in couples:
        if len(couple) != 2:
            raise ValueError(f"an antonym pair has two words, got {couple}")
        a, b = couple
        if a in out or b in out:
            raise ValueError(f"{a!r} or {b!r} is in two antonym pairs; each word belongs to one pair")
        out[a], out[b] = b, a
    return out


# ------------------------------------------------------------------------------------------- the worlds
def synthetic_permuter() -> KeywordPermuter:
    """Relations of the synthetic world, read from its renderer and caption writer (cglib.data.synthetic)."""
    from cglib.data.synthetic import _COLOUR_WORDS, _UNITS, _plural  # lazy: matplotlib; training imports this

    colours = [_COLOUR_WORDS.get(c, c) for c in sorted(COLOURS)]  # as captions write them: "navy blue"
    objects = sorted(OBJECTS)
    # noun_phrase counts a unit object by its unit ("a pair of skis", "two pairs of skis"): the unit phrase is the
    # written form, so "a balloon" becomes "a pair of skis", not "a skis" (with a colour in between, "a pair of
    # red skis", the phrase does not match: that object is no keyword of that caption)
    singulars = {o: f"{_UNITS[o]} of {o}" for o in objects if o in _UNITS}
    plurals = {o: f"{_plural(_UNITS[o])} of {o}" if o in _UNITS else _plural(o) for o in objects}
    return KeywordPermuter(
        relations={"colour": cyclic(colours), "object": cyclic(objects), "size": {},
                   # _relation: above/below when stacked; next to/beside/near are symmetric (swapping them would
                   # not change the meaning), so they are no keywords
                   "location": pairs([("above", "below")])},
        plurals={"object": plurals}, singulars={"object": singulars}, protected=tuple(sorted(SETTINGS)),  # "baseball field" is no baseball
        source="synthetic world: cglib.data.render OBJECTS and COLOURS, cglib.data.synthetic._relation")


def load_relations(path: Any = None) -> dict[str, Any]:
    """The keyword relation file (default: the shipped cglib/data/keyword_relations.yaml) as a dict."""
    if path is None:
        text = resources.files("cglib.data").joinpath(KEYWORD_FILE).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or "kinds" not in data:
        raise ValueError(f"{path or KEYWORD_FILE} must be a mapping with 'source' and 'kinds' (one entry per "
                         f"concept type: cycle or pairs, optional plurals)")
    return data


def coco_permuter(path: Any = None) -> KeywordPermuter:
    """Relations for COCO captions from the keyword relation file (see its `source`)."""
    data = load_relations(path)
    relations: dict[str, dict[str, str]] = {}
    plurals: dict[str, dict[str, str]] = {}
    for kind, entry in data["kinds"].items():
        if ("cycle" in entry) == ("pairs" in entry):
            raise ValueError(f"{path or KEYWORD_FILE}: kinds.{kind} needs exactly one of 'cycle' (an ordered list) "
                             "or 'pairs' (antonym pairs)")
        relations[kind] = cyclic(list(entry["cycle"])) if "cycle" in entry else pairs(entry["pairs"])
        if entry.get("nouns"):  # count nouns: regular plural unless listed as irregular
            irregular = entry.get("plurals") or {}
            plurals[kind] = {w: irregular.get(w, english_plural(w)) for w in relations[kind]}
    return KeywordPermuter(relations, plurals, protected=tuple(data.get("protected") or ()),
                           source=str(data.get("source", "")))


def permuter_for(params: Any) -> KeywordPermuter:
    """The permuter of a run's captions: the synthetic world's own relations, else the COCO relation file."""
    return synthetic_permuter() if params.data.source == "synthetic" else coco_permuter()
