"""Canonical concept names, so that one concept is one node: "The Birthday Parties " -> "birthday party".

Rules, applied in order: Unicode NFKC; lower case; "&" -> "and"; hyphens, underscores and slashes -> spaces;
other punctuation dropped (apostrophes inside words kept: "children's party"); whitespace collapsed; one
leading article (a, an, the) dropped; the LAST word (the head noun of an English noun phrase) singularized.

Singularization is conservative: a wrong merge ("glasses" the eyewear into "glass") is worse than two nodes
for one concept, so words that only look plural stay as they are. Decisions, each covered by a test:
- unchanged: words of at most 3 letters ("bus", "gas"), words ending in -ss (glass, fitness), -us (bus,
  campus, circus), -is (tennis, analysis), and a list of plural-only or uncountable words: news, sports
  ("winter sports" is a field, not many winter sports), athletics, olympics, arts, glasses, clothes,
  series, species, christmas, ...
- irregular: children -> child, men/women -> man/woman (also firemen -> fireman), feet, teeth, mice, geese.
- -ies -> -y (parties, activities), except movie/cookie/pie/... (-ies -> -ie); -ves -> -f/-fe only for a
  listed set (knives, leaves, shelves), else drop "s" (gloves -> glove); -ches/-shes/-xes -> drop "es"
  (beaches, dishes, boxes) except headache, niche, avalanche...; -oes -> -o for a listed set (potatoes,
  tomatoes, heroes), else drop "s" (shoes); -uses -> -us for a listed set (buses, campuses), else drop "s"
  (houses, causes); -zzes -> -z (quizzes); otherwise drop a final "s".
"""

from __future__ import annotations

import re
import unicodedata

ARTICLES = frozenset({"a", "an", "the"})

INVARIANT = frozenset({
    "news", "sports", "athletics", "gymnastics", "olympics", "paralympics", "aerobics", "politics", "physics",
    "mathematics", "economics", "electronics", "ethics", "logistics", "graphics", "linguistics", "genetics",
    "robotics", "mechanics", "statistics", "acoustics", "series", "species", "arts", "humanities", "clothes",
    "glasses", "sunglasses", "eyeglasses", "goggles", "binoculars", "scissors", "pliers", "tongs", "tweezers",
    "pants", "jeans", "shorts", "trousers", "leggings", "tights", "overalls", "pajamas", "pyjamas",
    "headquarters", "barracks", "crossroads", "means", "premises", "surroundings", "outdoors", "indoors",
    "belongings", "savings", "remains", "thanks", "goods", "christmas", "canvas", "atlas", "bias", "alias",
    "overseas", "texas", "vegas", "kansas", "lens", "chaos", "cosmos", "ethos", "kudos", "diabetes", "herpes",
    "rabies", "measles", "mumps", "billiards", "darts", "checkers", "dominoes", "whereas", "perhaps", "always",
})
IRREGULAR = {"children": "child", "men": "man", "feet": "foot", "teeth": "tooth", "mice": "mouse",
             "geese": "goose", "oxen": "ox", "cacti": "cactus", "fungi": "fungus", "quizzes": "quiz"}
NOT_MEN_PLURAL = frozenset({"omen", "amen", "semen", "specimen", "stamen", "abdomen", "hymen", "ramen"})
IE_SINGULAR = frozenset({"movie", "cookie", "pie", "tie", "lie", "brownie", "zombie", "hippie", "calorie",
                         "selfie", "smoothie", "goalie", "rookie", "hoodie", "prairie", "genie", "auntie",
                         "budgie", "veggie", "birdie", "collie", "beanie", "sortie", "boogie", "newbie",
                         "pixie", "junkie", "indie", "lingerie", "menagerie", "eyrie"})
VES_SINGULAR = {"wolves": "wolf", "leaves": "leaf", "knives": "knife", "shelves": "shelf", "lives": "life",
                "wives": "wife", "loaves": "loaf", "calves": "calf", "halves": "half", "scarves": "scarf",
                "thieves": "thief", "elves": "elf", "selves": "self", "hooves": "hoof", "wharves": "wharf",
                "midwives": "midwife", "housewives": "housewife", "bookshelves": "bookshelf"}
CHES_SINGULAR_E = frozenset({"headache", "ache", "niche", "cache", "avalanche", "moustache", "mustache",
                             "quiche", "creche", "cliche", "microfiche"})
OES_TO_O = frozenset({"potatoes", "tomatoes", "heroes", "volcanoes", "mangoes", "echoes", "torpedoes",
                      "mosquitoes", "buffaloes", "cargoes", "tornadoes", "vetoes", "embargoes"})
USES_TO_US = frozenset({"buses", "campuses", "circuses", "viruses", "bonuses", "octopuses", "cactuses",
                        "walruses", "choruses", "statuses", "geniuses", "focuses", "minibuses", "hippopotamuses",
                        "census", "censuses", "syllabuses", "apparatuses", "surpluses", "abacuses"})

_SEPARATORS = re.compile(r"[-_/\u2010-\u2015]+")
_DROP = re.compile(r"[^\w\s']+")
_SPACES = re.compile(r"\s+")


def singularize(word: str) -> str:
    """Singular of one lower-case English noun, conservatively (see the module docstring for the rules)."""
    if len(word) <= 3 or "'" in word or not word.isalpha() or word in INVARIANT:
        return IRREGULAR.get(word, word)
    if word in IRREGULAR:
        return IRREGULAR[word]
    if word.endswith("men") and word not in NOT_MEN_PLURAL:
        return word[:-3] + "man"
    if word.endswith(("ss", "us", "is")) or not word.endswith("s"):
        return word
    if word.endswith("ies"):
        return word[:-1] if word[:-1] in IE_SINGULAR else word[:-3] + "y"
    if word.endswith("ves"):
        return VES_SINGULAR.get(word, word[:-1])
    if word.endswith(("ches", "shes")):
        return word[:-1] if word[:-1] in CHES_SINGULAR_E else word[:-2]
    if word.endswith(("xes", "sses", "zzes")):
        return word[:-3] if word.endswith("zzes") else word[:-2]
    if word.endswith("oes"):
        return word[:-2] if word in OES_TO_O else word[:-1]
    if word.endswith("uses"):
        return word[:-2] if word in USES_TO_US else word[:-1]
    return word[:-1]


def canonicalize(name: str) -> str:
    """Canonical form of a concept name: lower case, no articles or punctuation, singular head noun."""
    text = unicodedata.normalize("NFKC", str(name)).lower()
    text = text.replace("\u2019", "'").replace("&", " and ")
    text = _SEPARATORS.sub(" ", text)
    text = _DROP.sub(" ", text).replace("_", " ")
    words = [w.strip("'") for w in _SPACES.split(text)]
    words = [w for w in words if w]
    if len(words) > 1 and words[0] in ARTICLES:
        words = words[1:]
    if not words:
        return ""
    words[-1] = singularize(words[-1])
    return " ".join(words)
