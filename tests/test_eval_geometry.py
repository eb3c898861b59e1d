"""What the objectives did to the geometry: the within-group cosine and the hard-negative margin against a hand
computation on toy embeddings, and the paired change from the zero-shot model."""

from __future__ import annotations

import numpy as np
import pytest

from cglib.evaluate.geometry import geometry_differences, group_geometry, paired_change

S = np.sqrt(0.5)


def test_within_and_margin_match_a_hand_computation():
    """Group a = {e1, (e1+e2)/sqrt2}, b = {e2, e3}, c = {-e1} (a group of one). Image 0 (e1): the centroid of the
    rest of a is (e1+e2)/sqrt2, cosine sqrt(.5); b's centroid is (e2+e3)/sqrt2, cosine 0 to e1; c's is -e1, cosine
    -1. With hard negatives a -> [b] the margin is sqrt(.5) - 0; with every other group too (max(0, -1) = 0)."""
    x = np.array([[1.0, 0, 0], [S, S, 0], [0, 1.0, 0], [0, 0, 1.0], [-1.0, 0, 0]])
    groups = ["a", "a", "b", "b", "c"]
    hard = group_geometry(x, groups, {"a": ["b"], "b": ["a", "zzz"], "c": []})
    np.testing.assert_allclose(hard["within"][:4], [S, S, 0.0, 0.0], atol=1e-12)
    assert np.isnan(hard["within"][4]) and np.isnan(hard["margin"][4])  # a group of one; no negative present
    centroid_a = np.array([1 + S, S, 0]) / np.linalg.norm([1 + S, S, 0])
    # image 1 ((e1+e2)/sqrt2): within = cos to e1 = S, to b's centroid 0.5; image 2 (e2): within = cos(e2, e3) = 0,
    # nearest hard negative a: cos(e2, centroid of a); image 3 (e3): 0 - 0
    np.testing.assert_allclose(hard["margin"][:4], [S, S - 0.5, -centroid_a[1], 0.0], atol=1e-12)
    every = group_geometry(x, groups)
    np.testing.assert_allclose(every["margin"][0], S - 0.0, atol=1e-12)  # b (0) beats c (-1)
    assert np.isnan(every["margin"][4])  # within is NaN for a group of one
    np.testing.assert_allclose(group_geometry(3.0 * x, groups)["within"][:4], every["within"][:4])  # scale-free


def test_paired_change_and_the_differences_table():
    """The change is the mean paired difference over rows both define, its CI brackets it, a constant shift has
    p = 0, no change p = 1; the table holds each non-reference model x labels x level x metric, sign a - b."""
    base = np.array([0.1, 0.2, np.nan, 0.4])
    d, low, high, p, n = paired_change(base + 0.05, base, resamples=200, ci=0.95, seed=0)
    assert n == 3 and d == pytest.approx(0.05) and low == pytest.approx(0.05) and high == pytest.approx(0.05)
    assert p == 0.0 and paired_change(base, base, 200, 0.95, 0)[3] == 1.0
    x = np.array([[1.0, 0, 0], [S, S, 0], [0, 1.0, 0], [0, 0, 1.0]])
    groups = ["a", "a", "b", "b"]
    tight = np.array([[1.0, 0, 0], [0.99, 0.141, 0], [0, 1.0, 0], [0, 0.99, 0.141]])
    per_image = {("zero-shot", "dag", "l1"): group_geometry(x, groups),
                 ("centroid", "dag", "l1"): group_geometry(tight, groups)}
    table = geometry_differences(per_image, resamples=200)
    assert list(table["metric"]) == ["within", "margin"] and set(table["model_a"]) == {"centroid"}
    within = table.iloc[0]
    assert within["difference"] > 0.25 and within["model_b"] == "zero-shot" and within["benchmark"] == "geometry"
