"""Checks of notebook 00's exercises: how many training steps one epoch takes, for the library's pairs epoch and
for the authors' epoch, each against `cglib.train.epochs` (`PairsEpoch`, `PublishedPairsEpoch`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, passed
from cglib.train.epochs import PairsEpoch, PublishedPairsEpoch


def epoch_case(seed: int) -> tuple[dict[str, int], dict[str, list[str]], int, int]:
    """Seeded group sizes (some below N, some exact multiples of N, some not), hard negatives per group (some
    groups with fewer than M-1, some listing a group that is itself dropped), N and M."""
    rng = np.random.default_rng(seed)
    n, m = int(rng.choice([3, 4, 5, 8])), int(rng.choice([2, 3, 4]))
    groups = [f"concept {k}" for k in range(int(rng.integers(6, 12)))]
    sizes = {}
    for k, group in enumerate(groups):
        kind = k % 3  # one group in three below N, one an exact multiple, one not
        sizes[group] = (int(rng.integers(1, n)) if kind == 0 else n * int(rng.integers(1, 4)) if kind == 1
                        else n * int(rng.integers(1, 4)) + int(rng.integers(1, n)))
    hard = {g: [h for h in groups if h != g and rng.random() < 0.35] for g in groups}
    return sizes, hard, n, m


def pairs_of(sizes: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
    """`size` distinct (image, text) pairs per group, as the epochs take them."""
    return {g: [(f"{g}/image {i}", f"caption of {g}/image {i}") for i in range(size)] for g, size in sizes.items()}


def library_pairs_epoch(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Steps of the library's pairs epoch and the pairs repeated to fill the short last chunks."""
    epoch = PairsEpoch(pairs_of(sizes), n, seed=0)
    return {"steps": len(epoch), "repeats": sum(anchor.padded for anchor in epoch.plan(0))}


def _as_count(value, what: str) -> int:
    if isinstance(value, (bool, float)) or not isinstance(value, (int, np.integer)):
        raise CheckFailed(f"'{what}' is {value!r} ({type(value).__name__}); a number of steps or pairs is a whole "
                          "number: use integer arithmetic (// and a ceiling as -(-a // b)), not /")
    return int(value)


def check_pairs_epoch(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(sizes, n)` -> {"steps", "repeats"} must match the library's pairs epoch (`PairsEpoch`): one step per
    chunk of N pairs of a group, a short last chunk filled up with repeats of the group's other pairs."""
    for seed in seeds:
        sizes, _, n, _ = epoch_case(seed)
        answer = fn(dict(sizes), n)
        if not isinstance(answer, dict) or {"steps", "repeats"} - set(answer):
            raise CheckFailed("return a dict with the keys 'steps' and 'repeats'; got "
                              f"{sorted(answer) if isinstance(answer, dict) else type(answer).__name__}")
        yours = {key: _as_count(answer[key], key) for key in ("steps", "repeats")}
        expected = library_pairs_epoch(sizes, n)
        if yours == expected:
            continue
        case = f"N={n}, {len(sizes)} groups of sizes {list(sizes.values())}"
        lines = [f"pairs epoch on {case}: yours {yours}, the library's {expected}"]
        total = sum(sizes.values())
        if yours["steps"] == sum(s // n for s in sizes.values()):
            lines.append("  hint: your steps drop each group's incomplete last chunk (floor division): the pairs "
                         "epoch keeps it and fills it up to N, so every pair is seen (the authors' epoch drops it)")
        elif yours["steps"] == -(-total // n):
            lines.append("  hint: you cut all pairs together into chunks of N; a chunk never mixes groups, so count "
                         "the chunks of each group (a ceiling per group) and add them up")
        elif yours["steps"] == len(sizes):
            lines.append("  hint: that is one step per group (train.epoch: groups); the pairs epoch has one step "
                         "per chunk of N pairs")
        if yours["steps"] == expected["steps"] and yours["repeats"] != expected["repeats"]:
            lines.append("  hint: the steps are right; a group's repeats are what its last chunk lacks to reach N "
                         "(zero when the size is a multiple of N), summed over the groups")
        raise CheckFailed("\n".join(lines))
    passed("your pairs-epoch step and repeat counts", seeds)


def check_published_epoch(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(sizes, hard, n, m)` -> the number of steps of the authors' epoch, as `PublishedPairsEpoch` counts
    them: complete chunks of N only, of the concepts kept after the two-pass hard-negative rule."""
    for seed in seeds:
        sizes, hard, n, m = epoch_case(seed)
        yours = _as_count(fn(dict(sizes), {g: list(h) for g, h in hard.items()}, n, m), "steps")
        published = PublishedPairsEpoch(pairs_of(sizes), n, m, hard, seed=0)
        expected = len(published)
        if yours == expected:
            continue
        complete = {g: s // n for g, s in sizes.items()}
        one_pass = sum(c for g, c in complete.items() if c and len(hard[g]) >= m - 1)
        lines = [(f"authors' epoch with N={n}, M={m}, {len(sizes)} concepts: yours {yours} steps, the library's "
                 f"{expected} ({len(published.kept)} concepts kept: {published.dropped})")]
        if yours == sum(complete.values()):
            lines.append("  hint: you kept every concept; a concept needs M-1 hard negatives to form a batch, and "
                         "the authors drop those that have fewer")
        elif yours == one_pass:
            lines.append("  hint: you counted each concept's listed hard negatives; the authors count only those "
                         "that are themselves in the lookup (concepts with a complete chunk and M-1 listed "
                         "negatives), so a second pass drops some more")
        elif yours == sum(-(-s // n) for s in sizes.values()):
            lines.append("  hint: an incomplete last chunk is DROPPED in the authors' epoch (floor division)")
        raise CheckFailed("\n".join(lines))
    passed("your count of the authors' epoch", seeds)
