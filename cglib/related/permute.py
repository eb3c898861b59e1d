"""Moved to `cglib.data.permute` (evaluation's keyword-permutation benchmark uses it too, and evaluation does not
import cglib.related); this name stays until cglib.train imports it from there."""

from cglib.data.permute import (  # noqa: F401
    KINDS,
    KeywordPermuter,
    coco_permuter,
    cyclic,
    pairs,
    permuter_for,
    synthetic_permuter,
)
