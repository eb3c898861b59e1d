"""What every check shares: the seed sets, the failure it raises, and how it describes numbers and cases."""

from __future__ import annotations

import sys
from collections.abc import Iterable

# The practice seeds are the default of every check; grading runs the same checks on the grading seeds, which the
# notebooks never use, so an answer fitted to the practice cases does not pass by accident.
PRACTICE_SEEDS = (0, 1, 2)
GRADING_SEEDS = (1001, 1002, 1003, 1004, 1005, 1006)


class CheckFailed(AssertionError):
    """A student's answer differs from the library's; the message says where and what to look at."""


def as_scalar(value, name: str) -> float:
    """A returned loss term as a float, or CheckFailed saying why it is not one (a tensor of several values, not a
    number at all)."""
    torch = sys.modules.get("torch")  # a tensor comes only from an imported torch; `cglib book` never imports it
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise CheckFailed(f"'{name}' has shape {tuple(value.shape)}; a loss term is one number: average it over "
                              "every anchor as the equation's 1/(...) sum says (a tensor of shape () or a float)")
        return float(value.detach().double())
    if isinstance(value, (int, float)):
        return float(value)
    raise CheckFailed(f"'{name}' is a {type(value).__name__}; return a number (a 0-d tensor or a float)")


def close(a: float, b: float, rtol: float = 1e-5, atol: float = 1e-7) -> bool:
    return abs(a - b) <= atol + rtol * abs(b)


def difference(yours: float, expected: float) -> str:
    """'yours 1.2345, the library's 2.4690 (off by -1.2345, ratio 0.500)'."""
    ratio = f", ratio {yours / expected:.3f}" if expected != 0 else ""
    return f"yours {yours:.6g}, the library's {expected:.6g} (off by {yours - expected:+.3g}{ratio})"


def ratio_hint(yours: float, expected: float) -> str | None:
    """A sentence when the answer is a simple multiple of the right one: a term halved or doubled."""
    if expected == 0:
        return None
    for factor, words in ((0.5, "exactly half"), (2.0, "exactly twice")):
        if close(yours, factor * expected, rtol=1e-4):
            return (f"it is {words} the library's: look at the normalizing constant (the 1/(2M) or 1/(2MN) in front "
                    "averages *both* directions; one direction alone, or a 1/2 applied twice, gives a factor of 2)")
    return None


def describe_case(case: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items())


def passed(what: str, seeds: Iterable[int]) -> None:
    seeds = tuple(seeds)
    listed = ", ".join(map(str, seeds))
    print(f"Correct: the library agrees with {what} on {len(seeds)} seeded cases (seeds {listed}).")
