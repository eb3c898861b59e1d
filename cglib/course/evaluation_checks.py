"""Checks of notebook 06's exercises: the forced-choice scorer (ties are wrong) against `score_forced_choice`, and
the paired bootstrap interval of a difference between two models against `paired_difference`, on seeded cases; and
of notebook 09's reading of a new row: Holm's correction against `cglib.evaluate.multiplicity.holm`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, describe_case, passed
from cglib.evaluate.bootstrap import Scores, confidence_intervals, paired_difference
from cglib.evaluate.forced_choice import ForcedChoiceSet, score_forced_choice
from cglib.evaluate.multiplicity import holm

# --- the forced choice --------------------------------------------------------------------------------------------

DIMENSIONS = 8  # unit vectors with four entries of +-1/2: every dot product is a multiple of 1/4, exact in any order


def _unit_vectors(count: int, rng: np.random.Generator, pool: int) -> np.ndarray:
    """`count` unit vectors drawn from `pool` distinct ones, so some rows repeat (identical embeddings tie)."""
    distinct = np.zeros((pool, DIMENSIONS))
    for row in distinct:
        row[rng.choice(DIMENSIONS, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    return distinct[rng.integers(pool, size=count)]


def forced_choice_case(seed: int) -> tuple[ForcedChoiceSet, np.ndarray, np.ndarray, dict[str, int], dict]:
    """Seeded items with ties: image and text vectors from small pools (repeated embeddings), and some items whose
    negative carries the anchor's own image row or text (what the corrected sampler forbids, so the scorer must
    still count it wrong)."""
    rng = np.random.default_rng([seed, 8])
    choices, n_items, n_images, n_texts = int(rng.choice([2, 3, 4])), int(rng.integers(20, 40)), 24, 30
    image_vectors = _unit_vectors(n_images, rng, pool=12)
    text_vectors = _unit_vectors(n_texts, rng, pool=15)
    texts = [f"text {k}" for k in range(n_texts)]
    anchors = rng.integers(n_images, size=n_items)
    negative_images = rng.integers(n_images, size=(n_items, choices - 1))
    anchor_texts = [texts[k] for k in rng.integers(n_texts, size=n_items)]
    negative_texts = [[texts[k] for k in row] for row in rng.integers(n_texts, size=(n_items, choices - 1))]
    for item in rng.choice(n_items, n_items // 5, replace=False):  # the anchor's own image and text as a negative
        negative_images[item, -1] = anchors[item]
        negative_texts[item][-1] = anchor_texts[item]
    fc = ForcedChoiceSet(field="l1", labels="dag", seed=seed, choices=choices, anchors=anchors,
                         anchor_texts=anchor_texts, negative_images=negative_images, negative_texts=negative_texts,
                         n_items=n_items)
    return fc, image_vectors, text_vectors, {t: k for k, t in enumerate(texts)}, {"M": choices, "items": n_items}


def _correctness(values, name: str, n: int) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (n,):
        raise CheckFailed(f"{name} has shape {array.shape}; return one value per item, shape ({n},): 1.0 (or True) "
                          "where the item is answered right, 0.0 where not")
    return array.astype(np.float64)


def _tie_scores(fc: ForcedChoiceSet, image_vectors, text_vectors, text_index) -> tuple[np.ndarray, np.ndarray]:
    """Per item, the query's score of its own candidate minus the best negative's (0 is a tie), for t2i and i2t."""
    anchor_text = text_vectors[[text_index[t] for t in fc.anchor_texts]]
    anchor_image = image_vectors[fc.anchors]
    own = (anchor_text * anchor_image).sum(axis=1)
    best_image = np.einsum("nd,nmd->nm", anchor_text, image_vectors[fc.negative_images]).max(axis=1)
    negative_text = text_vectors[[[text_index[t] for t in row] for row in fc.negative_texts]]
    best_text = np.einsum("nd,nmd->nm", anchor_image, negative_text).max(axis=1)
    return own - best_image, own - best_text


def check_forced_choice(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(fc, image_vectors, text_vectors, text_index)` -> (text_to_image, image_to_text), per-item correctness,
    must equal `score_forced_choice` (ties wrong) on every seeded case."""
    seeds = tuple(seeds)
    for seed in seeds:
        fc, images, texts, text_index, case = forced_choice_case(seed)
        answer = fn(fc, images.copy(), texts.copy(), dict(text_index))
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            raise CheckFailed("return two arrays, (text_to_image, image_to_text), each with one 0/1 value per item")
        yours = [_correctness(a, name, fc.anchors.size) for a, name in zip(answer, ("text_to_image", "image_to_text"))]
        expected = score_forced_choice(fc, images, texts, text_index)
        margins = _tie_scores(fc, images, texts, text_index)
        for k, direction in enumerate(("text_to_image", "image_to_text")):
            wrong = np.flatnonzero(yours[k] != expected[k])
            if not wrong.size:
                continue
            ties_right = (margins[k] >= 0).astype(np.float64)
            lines = [(f"{direction} differs on {wrong.size} of {fc.anchors.size} items of the case "
                      f"{describe_case(case)} (seed {seed}); first: item {wrong[0]}, yours {yours[k][wrong[0]]:g}, "
                      f"the library's {expected[k][wrong[0]]:g}")]
            if np.array_equal(yours[k], expected[1 - k]) and not np.array_equal(expected[0], expected[1]):
                lines.append("  hint: your two directions are swapped: text->image asks the anchor's TEXT which of "
                             "the M images is its own; image->text asks the anchor's IMAGE which of the M texts")
            elif np.array_equal(yours[k], ties_right):
                lines.append(f"  hint: all {wrong.size} are exactly at a tie (the anchor's score equals the best "
                             "negative's, e.g. a negative with the anchor's own text): ties count as WRONG, so the "
                             "anchor must score strictly above every negative (argmax picks the first of equal "
                             "scores, the anchor, and counts the tie as right)")
            else:
                lines.append("  hint: the score is the dot product of the (unit) vectors; an item is right when its "
                             "own candidate scores strictly above the BEST of its M-1 negatives (all of them, each "
                             "with its own image row in fc.negative_images and its own text in fc.negative_texts)")
            raise CheckFailed("\n".join(lines))
    passed("your forced-choice scorer (both directions, ties wrong)", seeds)


# --- the paired bootstrap interval --------------------------------------------------------------------------------

def paired_case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Two models' 0/1 scores on the same queries, correlated as paired models are, grouped in units (test images)
    holding 1 to 6 queries each, so resampling queries instead of units, or averaging unit means, shows."""
    rng = np.random.default_rng([seed, 9])
    n_units = int(rng.integers(30, 80))
    counts = rng.integers(1, 7, size=n_units)
    labels = rng.choice(10_000, n_units, replace=False)  # unit labels need not be 0..U-1
    units = np.repeat(labels, counts)
    units = units[rng.permutation(units.size)]
    difficulty = {u: rng.random() for u in labels}
    a = np.array([rng.random() < 0.3 + 0.6 * difficulty[u] for u in units], dtype=np.float64)
    b = np.where(rng.random(units.size) < 0.25, 1 - a, a)
    case = {"queries": units.size, "units": n_units, "resamples": int(rng.choice([200, 400])),
            "ci": float(rng.choice([0.9, 0.95])), "seed": int(rng.integers(100))}
    return a, b, units, case


def _interval(answer) -> tuple[float, float, float]:
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        raise CheckFailed("return three numbers, (difference, low, high): the mean of a minus the mean of b and "
                          "the interval's ends")
    return tuple(float(x) for x in answer)


def _same(yours, expected, rtol: float = 1e-9) -> bool:
    return np.allclose(yours, expected, rtol=rtol, atol=1e-12)


def _near(yours, expected) -> bool:
    """Equal up to the float32 arithmetic the library's bootstrap uses (for recognising a slip, not for passing)."""
    return _same(yours, expected, rtol=1e-5)


def check_paired_interval(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(a, b, units, resamples, ci, seed)` -> (difference, low, high) must equal `paired_difference` on the
    same scores (one training seed) on every seeded case."""
    seeds = tuple(seeds)
    for seed in seeds:
        a, b, units, case = paired_case(seed)
        yours = _interval(fn(a.copy(), b.copy(), units.copy(), case["resamples"], case["ci"], case["seed"]))
        settings = (case["resamples"], case["ci"], case["seed"])
        library = paired_difference(Scores(a, units), Scores(b, units), *settings)
        expected = (library.value, library.low, library.high)
        if _same(yours, expected):
            continue
        lines = [f"the paired interval differs on the case {describe_case(case)} (seed {seed}):",
                 (f"  yours {yours[0]:+.4f} [{yours[1]:+.4f}, {yours[2]:+.4f}], the library's "
                  f"{expected[0]:+.4f} [{expected[1]:+.4f}, {expected[2]:+.4f}]")]
        by_query = paired_difference(Scores(a, np.arange(units.size)), Scores(b, np.arange(units.size)), *settings)
        labels, inverse = np.unique(units, return_inverse=True)
        unit_means = np.bincount(inverse, a - b) / np.bincount(inverse)
        by_unit_mean = paired_difference(Scores(unit_means, np.arange(labels.size)),
                                         Scores(np.zeros(labels.size), np.arange(labels.size)), *settings)
        each = confidence_intervals([Scores(a, units), Scores(b, units)], *settings)
        if not np.isclose(yours[0], expected[0], rtol=1e-9):
            hint = "the difference itself is the plain mean of a - b over all queries, before any resampling"
        elif _near(yours, (by_query.value, by_query.low, by_query.high)):
            hint = ("you resampled queries; the unit is the test image (`units`): its queries are not independent, "
                    "so a resample draws whole units, with all their queries")
        elif _near(yours[1:], (by_unit_mean.low, by_unit_mean.high)):
            hint = ("a resample's estimate is (sum of the drawn units' differences) / (number of the drawn units' "
                    "queries), not the mean of unit means: a unit with more queries weighs more")
        elif _near(yours[1:], (each[0].low - each[1].low, each[0].high - each[1].high)):
            hint = ("the difference of two intervals' ends is not the interval of the difference: subtract a - b "
                    "per query first (paired: both models resampled with the same draws), then take percentiles")
        else:
            hint = ("draw with resample_weights(number of units, resamples, seed), units numbered 0..U-1 in sorted "
                    "order of their labels (np.unique(..., return_inverse=True)); the ends are np.quantile of the "
                    "resampled differences at (1 - ci) / 2 and 1 - (1 - ci) / 2")
        lines.append(f"  hint: {hint}")
        raise CheckFailed("\n".join(lines))
    passed("your paired bootstrap interval (units resampled, both models with the same draws)", seeds)


# --- Holm's correction (notebook 09: reading your row) -------------------------------------------------------------

def holm_case(seed: int) -> np.ndarray:
    """Seeded p-values of one family: a few small ones among large ones, ties, and NaNs (cells without a p-value)."""
    rng = np.random.default_rng([seed, 9])
    m = int(rng.integers(5, 16))
    p = np.where(rng.random(m) < 0.4, rng.uniform(0, 0.02, m), rng.uniform(0, 1, m))
    p[rng.choice(m, 2, replace=False)] = p[0]  # a tie
    p[rng.choice(m, int(rng.integers(0, 3)), replace=False)] = np.nan
    return np.round(p, 6)


def _adjusted(fn: Callable, p: np.ndarray) -> np.ndarray:
    out = fn(p.copy())
    try:
        out = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"return the adjusted p-values as an array of numbers, got {type(out).__name__}") from None
    if out.shape != p.shape:
        raise CheckFailed(f"the adjusted p-values have shape {out.shape}, the p-values {p.shape}: one adjusted "
                          "value per input, in the input's order (NaN where the input is NaN)")
    return out


def _holm_slip(p: np.ndarray, yours: np.ndarray) -> str:
    """A sentence naming the classic mistake the answer matches, or a generic hint."""
    finite = np.isfinite(p)
    m = int(finite.sum())
    if not np.array_equal(np.isfinite(yours), finite):
        return ("NaN in must be NaN out, and a NaN is not part of the family: a cell without a p-value is not "
                "tested, so it is not counted in m either")
    bonferroni = np.minimum(1.0, m * p[finite])
    if np.allclose(yours[finite], bonferroni):
        return ("that is Bonferroni (every p-value times m); Holm multiplies the i-th smallest by (m - i + 1), "
                "so only the smallest is multiplied by m")
    if np.allclose(yours[finite], np.minimum(1.0, len(p) * p[finite])):
        return "that is Bonferroni with the NaNs counted in m: multiply by the number of finite p-values only"
    order = np.argsort(p[finite], kind="stable")
    step = np.minimum(1.0, (m - np.arange(m)) * p[finite][order])
    unsorted = np.empty(m)
    unsorted[order] = step
    if np.allclose(yours[finite], unsorted):
        return ("the step-down is missing: an adjusted p-value may never fall below that of a smaller p-value "
                "(take the running maximum in sorted order)")
    if np.allclose(yours[finite], np.maximum.accumulate(step)):
        return "these are the right values in sorted order: put each back at its cell's position"
    if np.nanmax(yours) > 1:
        return "an adjusted p-value is a probability: cap (m - i + 1) p at 1 before the running maximum"
    return "sort the finite p-values, scale the i-th smallest by (m - i + 1), cap at 1, take the running maximum"


def check_holm(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(p_values)` against `cglib.evaluate.multiplicity.holm` on seeded families with ties and NaNs, then on a
    family of one and a family of NaNs only."""
    seeds = tuple(seeds)
    cases = [(f"seed {s}", holm_case(s)) for s in seeds]
    cases += [("a single p-value", np.array([0.03])), ("NaNs only", np.array([np.nan, np.nan]))]
    for label, p in cases:
        yours, expected = _adjusted(fn, p), holm(p)
        if not np.allclose(yours, expected, rtol=1e-12, atol=1e-12, equal_nan=True):
            wrong = int(np.flatnonzero(~np.isclose(yours, expected, rtol=1e-12, atol=1e-12, equal_nan=True))[0])
            raise CheckFailed(f"{label} (m = {int(np.isfinite(p).sum())} finite p-values): at position {wrong}, "
                              f"p = {p[wrong]:.6g}, yours {yours[wrong]:.6g}, the library's {expected[wrong]:.6g}. "
                              f"{_holm_slip(p, yours)}")
    passed("your Holm correction", seeds)
