"""Checks of notebook 04's exercises: the centroid loss (Eqs. 5-8), the pairwise inner term (Eqs. 1 and 3) and the
dual-effect measurement, each against `cglib.losses` and `cglib.viz.dual_effect`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from cglib.course.feedback import (
    PRACTICE_SEEDS,
    CheckFailed,
    as_scalar,
    close,
    describe_case,
    difference,
    passed,
    ratio_hint,
)
from cglib.losses import centroid_group_loss, pairwise_group_loss
from cglib.viz.dual_effect import optimize_points

TERMS = ("outer", "inner", "loss")


def loss_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A seeded batch (M, N, L) in float64 with group structure and features of uneven length (so a missing L2
    normalization shows), and settings where tau != tau' and alpha != 1/2 (so swapping either shows)."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    M, N, L = pick([2, 3, 4, 5]), pick([2, 3, 4]), pick([3, 5, 8, 16])
    tau, tau_inner = pick([(0.1, 0.5), (0.07, 0.2), (0.3, 0.05), (0.2, 0.9)])
    alpha = pick([0.3, 0.7, 0.8])
    direction = torch.randn(M, 1, L, generator=gen, dtype=torch.float64)

    def features():
        noisy = direction + 0.8 * torch.randn(M, N, L, generator=gen, dtype=torch.float64)
        return noisy * (0.5 + 2 * torch.rand(M, N, 1, generator=gen, dtype=torch.float64))  # uneven lengths

    image, text = features(), features()
    return image, text, {"M": M, "N": N, "L": L, "tau": tau, "tau_inner": tau_inner, "alpha": alpha}


def _returned_terms(answer, names: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(answer, dict) or set(names) - set(answer):
        got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        raise CheckFailed(f"return a dict with the keys {', '.join(names)} (as centroid_group_loss(..., "
                          f"return_parts=True) does); got {got}")
    return {name: as_scalar(answer[name], name) for name in names}


def _centroid_diagnosis(term: str, yours: float, image, text, case: dict) -> list[str]:
    """Plausible mistakes recognised by value: temperatures swapped, alpha on the wrong term, a factor of 2."""
    hints = []
    tau, tau_inner, alpha = case["tau"], case["tau_inner"], case["alpha"]
    swapped = centroid_group_loss(image, text, tau_inner, tau, alpha, return_parts=True)
    if close(yours, float(swapped[term]), rtol=1e-4):
        hints.append("it equals the library's with tau and tau' swapped: Eq. 6 (outer, centroids against centroids) "
                     "divides by tau, Eq. 7 (inner, each feature against the centroids) by tau'")
    if term == "loss":
        reversed_weights = centroid_group_loss(image, text, tau, tau_inner, alpha, alpha_on="outer")
        if close(yours, float(reversed_weights), rtol=1e-4):
            hints.append("it equals (1 - alpha) * inner + alpha * outer: Eq. 8 puts alpha on the inner term")
    reference = centroid_group_loss(image, text, tau, tau_inner, alpha, return_parts=True)
    hint = ratio_hint(yours, float(reference[term]))
    if hint:
        hints.append(hint)
    return hints


def _term_failure(what: str, term: str, yours: float, expected: float, matching: list[str], case: dict,
                  hints: list[str]) -> CheckFailed:
    lines = [f"{what}: the {term!r} term differs on the case {describe_case(case)}:",
             f"  {difference(yours, expected)}"]
    if matching:
        lines.append(f"  these terms match: {', '.join(matching)}; the mistake is in {term!r} alone")
    lines += [f"  hint: {h}" for h in hints]
    if not hints:
        lines.append("  hint: check that every feature is L2-normalized first, that the centroids are means over the "
                     "N pairs of a group, and that the softmax runs over the M groups (the denominator's sum over g')")
    return CheckFailed("\n".join(lines))


def check_centroid_loss(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(image, text, tau, tau_inner, alpha)` -> {"loss", "inner", "outer"} must match
    `centroid_group_loss(..., return_parts=True)` (Eqs. 5-8) on every seeded case."""
    for seed in seeds:
        image, text, case = loss_case(seed)
        answer = fn(image.clone(), text.clone(), case["tau"], case["tau_inner"], case["alpha"])
        yours = _returned_terms(answer, TERMS)
        reference = centroid_group_loss(image, text, case["tau"], case["tau_inner"], case["alpha"], return_parts=True)
        expected = {term: float(reference[term]) for term in TERMS}
        matching = [t for t in TERMS if close(yours[t], expected[t])]
        for term in TERMS:  # the outer and inner terms first: a wrong term makes the total wrong too
            if term not in matching:
                raise _term_failure("centroid loss (Eqs. 5-8)", term, yours[term], expected[term], matching, case,
                                    _centroid_diagnosis(term, yours[term], image, text, case))
    passed("your centroid loss (outer Eq. 6, inner Eq. 7, total Eq. 8)", seeds)


def check_pairwise_inner(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(image, text, tau, tau_inner)` -> the pairwise inner term (Eq. 3, with the centroid of Eq. 1) must match
    `pairwise_group_loss(..., return_parts=True)["inner"]` on every seeded case."""
    for seed in seeds:
        image, text, case = loss_case(seed)
        case = {k: v for k, v in case.items() if k != "alpha"}
        yours = as_scalar(fn(image.clone(), text.clone(), case["tau"], case["tau_inner"]), "inner")
        expected = float(pairwise_group_loss(image, text, case["tau"], case["tau_inner"], return_parts=True)["inner"])
        if close(yours, expected):
            continue
        hints = []
        if close(yours, float(pairwise_group_loss(image, text, case["tau_inner"], case["tau"],
                                                  return_parts=True)["inner"]), rtol=1e-4):
            hints.append("it equals the library's with tau and tau' swapped: the inner term divides by tau'")
        if close(yours, float(pairwise_group_loss(image, text, case["tau"], case["tau_inner"], normalize_products=True,
                                                  return_parts=True)["inner"]), rtol=1e-4):
            hints.append("it equals the authors' code variant (normalize_products=True), which normalizes each "
                         "product I*T before averaging; the paper's Eq. 1 averages the raw products of unit features")
        hint = ratio_hint(yours, expected)
        if hint:
            hints.append(hint)
        raise _term_failure("pairwise inner term (Eq. 3)", "inner", yours, expected, [], case, hints or [
            ("normalize I and T first; the centroid mu_g is the mean of the N^2 products I_gi * T_gj of group g "
            "(Eq. 1); each product's cosine with every mu_g' goes through a softmax over the M groups at tau'; "
            "average over all M N^2 products")])
    passed("your pairwise inner term (Eq. 3)", seeds)


DUAL_EFFECT_SETTINGS = ((0.1, 0.3), (0.5, 0.3), (0.1, 0.9), (0.5, 0.9))  # (tau', alpha): each raised alone, then both
DUAL_EFFECT_COLUMNS = ("spread_factor", "separation_factor")


def dual_effect_factors(loss: str, tau: float, tau_inner: float, alpha: float, seed: int) -> dict[str, float]:
    """The library's measurement: within-group spread and separation after optimizing `loss` on the toy, as
    factors of their start."""
    geometry = optimize_points(loss, tau=tau, tau_inner=tau_inner, alpha=alpha, seed=seed).geometry()
    return {"spread_factor": geometry["within_group_spread_after"] / geometry["within_group_spread_before"],
            "separation_factor": geometry["separation_after"] / geometry["separation_before"]}


def check_dual_effect_table(table, loss: str, tau: float, seed: int) -> None:
    """`table`: one row per (tau_inner, alpha) of DUAL_EFFECT_SETTINGS (a pandas DataFrame indexed by those pairs)
    with the columns spread_factor and separation_factor, measured with `optimize_points(loss, ...)`."""
    missing = [s for s in DUAL_EFFECT_SETTINGS if s not in set(table.index)]
    if missing:
        raise CheckFailed(f"rows missing for (tau_inner, alpha) = {missing}; index the table by the pairs of "
                          f"DUAL_EFFECT_SETTINGS {DUAL_EFFECT_SETTINGS}")
    absent = [c for c in DUAL_EFFECT_COLUMNS if c not in table.columns]
    if absent:
        raise CheckFailed(f"columns missing: {absent}; each is a factor of its start (after / before)")
    for setting in DUAL_EFFECT_SETTINGS:
        expected = dual_effect_factors(loss, tau, *setting, seed=seed)
        for column in DUAL_EFFECT_COLUMNS:
            yours = float(table.loc[[setting], column].iloc[0])
            if not close(yours, expected[column], rtol=1e-3):
                hint = ("a factor below 1 where the library's is above (or the reverse): divide after by before, "
                        "not before by after" if close(yours, 1 / expected[column], rtol=1e-3)
                        else f"optimize {loss!r} with tau={tau}, this row's tau' and alpha and seed={seed}, and divide "
                             "the geometry's value after by its value before")
                raise CheckFailed(f"{column} at tau'={setting[0]}, alpha={setting[1]}: "
                                  f"{difference(yours, expected[column])}\n  hint: {hint}")
    print(f"Correct: the library agrees with your dual-effect table ({loss} loss, tau={tau}, seed {seed}).")
