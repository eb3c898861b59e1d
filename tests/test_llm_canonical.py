"""Concept canonicalization: one concept is one node, and words that only look plural are left alone."""

from __future__ import annotations

import pytest

from cglib.data.taxonomy import load_taxonomy
from cglib.llm.canonical import canonicalize

CASES = [
    ("The Birthday Parties ", "birthday party"),
    ("  a   Wedding. ", "wedding"),
    ("An Apple Picking", "apple picking"),
    ("Food-Preparation", "food preparation"),
    ("food_preparation", "food preparation"),
    ("Food & Drink", "food and drink"),
    ('"Celebration"', "celebration"),
    ("Cultural Heritage!", "cultural heritage"),
    ("Activities", "activity"),
    ("Movies", "movie"),
    ("Cookies", "cookie"),
    ("Knives", "knife"),
    ("Gloves", "glove"),
    ("Children", "child"),
    ("Firemen", "fireman"),
    ("Women", "woman"),
    ("Dishes", "dish"),
    ("Beaches", "beach"),
    ("Boxes", "box"),
    ("Headaches", "headache"),
    ("Potatoes", "potato"),
    ("Shoes", "shoe"),
    ("Buses", "bus"),
    ("Houses", "house"),
    ("Quizzes", "quiz"),
    ("Holidays", "holiday"),
    ("Dog Shows", "dog show"),
    ("children's parties", "children's party"),
    ("Tennis Matches", "tennis match"),
]
UNCHANGED = ["glass", "grass", "bus", "gas", "tennis", "news", "sports", "winter sports", "water sport", "fitness",
             "business", "campus", "circus", "analysis", "christmas", "olympics", "athletics", "glasses", "clothes",
             "series", "species", "performing arts", "lens", "chaos", "mathematics", "physics", "jeans",
             "surroundings", "wildlife", "omen", "abdomen", "dress", "chess", "octopus", "iris"]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_canonical_form(raw: str, expected: str) -> None:
    """Case, whitespace, punctuation, leading articles and plural heads are normalised as documented."""
    assert canonicalize(raw) == expected


@pytest.mark.parametrize("word", UNCHANGED)
def test_words_that_only_look_plural_are_kept(word: str) -> None:
    """glass/bus/tennis/news/sports and similar words are not 'singularized' into other words."""
    assert canonicalize(word) == word
    assert canonicalize(word.title()) == word


@pytest.mark.parametrize("raw", [c for c, _ in CASES] + UNCHANGED)
def test_idempotent(raw: str) -> None:
    """Canonicalizing twice changes nothing (a canonical name is a fixed point)."""
    once = canonicalize(raw)
    assert canonicalize(once) == once


def test_empty_and_article_only() -> None:
    """Whitespace and punctuation give an empty name; a lone article is kept rather than emptied."""
    assert canonicalize("   ") == ""
    assert canonicalize("...") == ""
    assert canonicalize("The") == "the"


def test_shipped_taxonomy_names_are_canonical() -> None:
    """Every name of the shipped taxonomy is already canonical, so offline chains and ground truth compare as is."""
    tax = load_taxonomy()
    changed = {n: canonicalize(n) for n in tax.all_names() if canonicalize(n) != n}
    assert changed == {}
