"""Checks of notebook 08's exercises: the validation slice and MAGIC test share no image (against
`cglib.search.validation.search_view`, the split every trial reads), and a trial's objective value from its
per-column validation accuracies (against the values the study stored)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import optuna

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, close, difference, passed
from cglib.magic.files import load_magic
from cglib.magic.schema import MagicFile
from cglib.search.validation import search_view

OVERLAP_KEYS = ("validation", "test", "shared")


def _as_id_set(value, key: str) -> set[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise CheckFailed(f"'{key}' is a {type(value).__name__}; return a set of image ids")
    return {str(v) for v in value}


def _overlap_failure(case: str, yours: dict[str, set[str]], validation: set[str], magic: MagicFile) -> CheckFailed:
    test, train = set(magic.split_ids("test")), set(magic.split_ids("train"))
    lines = [f"on {case}:"]
    if yours["validation"] != validation:
        lines.append(f"  'validation': yours holds {len(yours['validation'])} images, the library's slice "
                     f"{len(validation)} ({len(yours['validation'] - validation)} of yours are not in it, "
                     f"{len(validation - yours['validation'])} of its are missing)")
        if yours["validation"] == test:
            lines.append("  hint: these are MAGIC's test images (split 'test' in magic.json); the validation slice "
                         "is the list 'validation_ids' of the study's validation.json")
        elif yours["validation"] == train or validation < yours["validation"]:
            lines.append("  hint: that is MAGIC train (or more of it); the slice is only the part listed under "
                         "'validation_ids' in validation.json")
        else:
            lines.append("  hint: read the ids listed under 'validation_ids' in the validation file you are given")
    if yours["test"] != test:
        lines.append(f"  'test': yours holds {len(yours['test'])} images, MAGIC test {len(test)}")
        lines.append("  hint: MAGIC test is every image of magic.json's 'images' whose 'split' is 'test'"
                     + (" (you read the validation file's ids)" if yours["test"] == validation else ""))
    if yours["shared"] != (yours["validation"] & yours["test"]):
        lines.append(f"  'shared' holds {len(yours['shared'])} ids but your two sets have "
                     f"{len(yours['validation'] & yours['test'])} in common: it is their intersection (&)")
    return CheckFailed("\n".join(lines))


def check_validation_overlap(fn: Callable, magic_path: str | Path, validation_path: str | Path, fraction: float,
                             groups: int | None = None, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(magic_path, validation_path)` -> {"validation", "test", "shared"}: sets of image ids, read from the files.
    It must agree with the library on this run's validation.json and on the slices `search_view` carves from the
    same magic.json with other seeds."""
    magic = load_magic(Path(magic_path))
    seeds = tuple(seeds)
    run_record = json.loads(Path(validation_path).read_text())
    with tempfile.TemporaryDirectory() as folder:
        cases = [(f"this run's validation.json (seed {run_record['seed']})", Path(validation_path))]
        for seed in seeds:
            record = search_view(magic, fraction, seed, groups)[1]
            path = Path(folder) / f"validation-{seed}.json"
            path.write_text(json.dumps(record))
            cases.append((f"the slice search_view carves with seed {seed}", path))
        for case, path in cases:
            validation = set(json.loads(path.read_text())["validation_ids"])
            answer = fn(str(magic_path), str(path))
            if not isinstance(answer, dict) or set(OVERLAP_KEYS) - set(answer):
                got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
                raise CheckFailed(f"return a dict with the keys {', '.join(OVERLAP_KEYS)} (sets of image ids); got "
                                  f"{got}")
            yours = {key: _as_id_set(answer[key], key) for key in OVERLAP_KEYS}
            if (yours["validation"] != validation or yours["test"] != set(magic.split_ids("test"))
                    or yours["shared"] != (yours["validation"] & yours["test"])):
                raise _overlap_failure(case, yours, validation, magic)
            if yours["shared"]:  # the library's guarantee broken: worth a loud message, never expected
                raise CheckFailed(f"on {case}: {len(yours['shared'])} validation images are MAGIC-test images")
    passed("your validation slice and MAGIC test (no image shared)", seeds)


# ------------------------------------------------------------------------------------------- the objective
def by_field_case(seed: int) -> tuple[dict[str, float], str]:
    """Seeded per-column accuracies of a trial: the levels objective, or Table 3's columns, a level left out as
    unscorable now and then."""
    rng = np.random.default_rng(seed)
    objective = "table3" if rng.random() < 0.5 else "levels"
    levels = [f"l{k}" for k in range(1, 5) if k == 1 or rng.random() < 0.8]
    fields = (["generalized", "caption"] if objective == "table3" else []) + levels
    return {f: float(rng.integers(0, 41) / 40) for f in fields}, objective


def _value_hints(yours: float, by_field: dict[str, float]) -> list[str]:
    values = list(by_field.values())
    hints = []
    if close(yours, 100 * float(np.mean(values))):
        hints.append("it is the mean in percent: the objective is a fraction in [0, 1]")
    if close(yours, float(np.median(values))):
        hints.append("that is the median; the objective is the plain mean over the columns")
    levels = [v for k, v in by_field.items() if k.startswith("l")]
    if len(levels) < len(values) and close(yours, float(np.mean(levels))):
        hints.append("that is the mean over the levels only: with search.objective table3 the generalized and "
                     "caption columns count too, each once")
    if not hints:
        hints.append("average every column the trial stored, each with weight 1")
    return hints


def stored_value(trial: optuna.trial.FrozenTrial) -> float:
    """What the study stored for a trial: its value, or, pruned, its last epoch's report."""
    if trial.state == optuna.trial.TrialState.COMPLETE:
        return float(trial.value)
    return float(trial.intermediate_values[max(trial.intermediate_values)])


def check_search_value(fn: Callable, study: optuna.Study, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(by_field)` -> the search objective J from a trial's per-column validation accuracies must equal what the
    study stored for each of its trials (the last epoch's mean), and the mean on seeded columns."""
    seeds = tuple(seeds)
    finished = [t for t in study.get_trials(deepcopy=False) if "validation_by_field" in t.user_attrs
                and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    cases = [(f"trial {t.number} of the study", dict(t.user_attrs["validation_by_field"]), stored_value(t))
             for t in finished]
    for seed in seeds:
        by_field, objective = by_field_case(seed)
        cases.append((f"seeded columns (seed {seed}, search.objective {objective})", by_field,
                      float(np.mean(list(by_field.values())))))
    for case, by_field, expected in cases:
        answer = fn(dict(by_field))
        try:
            yours = float(answer)
        except (TypeError, ValueError):
            raise CheckFailed(f"return one number (a float); got a {type(answer).__name__}") from None
        if not close(yours, expected, rtol=1e-9, atol=1e-12):
            fields = ", ".join(f"{k} {v:.3f}" for k, v in by_field.items())
            raise CheckFailed(f"on {case} ({fields}): {difference(yours, expected)}\n"
                              + "\n".join(f"  hint: {h}" for h in _value_hints(yours, by_field)))
    passed(f"your objective values ({len(finished)} trials of the study and the seeded columns)", seeds)
