"""Our gain rows under Table 3 (the paper's "Avg Accuracy Gain w.r.t.", by our definition): each model's role (from
results.json `models`), the sets of models each gain compares, the gains in points with paired CIs, their notes and
display.

Our definition is not the paper's rule (`cglib.evaluate.paper.paper_gains`: relative gain of the rows with a factor
over ALL the rows without it, Best Model per column, truncated; table3_as_published.md applies it). Ours compares
like with like and gives each gain a paired CI: Loss Function is the group losses over the CLIP loss (both
fine-tuned on MAGIC), Pretraining the pretrained rows over the same objectives without, Best Model one row (the
highest mean) over the zero-shot model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cglib.evaluate.bootstrap import Scores, set_difference
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.report import model_label, objective_family, signed
from cglib.evaluate.table3 import table3, table3_columns

BASE_MODEL = "zero-shot"
PRETRAIN_MODES = ("none", "leakage_free", "with_concepts")
GAINS = ("MAGIC", "Loss Function", "Pretraining", "Best Model")
GAIN_LABEL = "Avg Accuracy Gain w.r.t. {} (ours)"
GAIN_COLUMNS = ["gain", "column", "benchmark", "labels", "direction", "metric", "level", "models_a", "models_b",
                "mean_a", "mean_b", "difference", "ci_low", "ci_high", "relative", "relative_ci_low",
                "relative_ci_high", "n", "n_seeds", "p_value", "p_holm", "significant"]


@dataclass(frozen=True)
class ModelRole:
    """What a model is, as far as the gain rows need it (saved per model in results.json's `models`).

    fine_tuned_on_magic: trained on this run's MAGIC image-text pairs. objective: the objective of its last
    training phase (`none`: never trained, the base model; `clip`, `pairwise`, `centroid` on MAGIC; `re`: the
    HierarCaps Radial Embedding alignment, not on MAGIC). pretrain: the textual pretraining before the MAGIC
    phase. init: the model its training started from (None for the base). So CLIP zero-shot = (False, none),
    a CLEAR GLASS run = (True, pairwise|centroid, init zero-shot), the HierarCaps model = (False, re), and
    "HierarCaps fine-tuned" = (True, clip, init = the HierarCaps model's name). zoo: a frozen reference model
    (`eval.zoo`, e.g. OpenAI's CLIP next to a run's own base): (False, none) too, but neither the base nor a
    candidate for the best model, and in no gain set.
    """

    name: str
    fine_tuned_on_magic: bool
    objective: str
    pretrain: str = "none"
    init: str | None = None
    exposed: bool = False
    zoo: bool = False
    # trained with a related method (book/stages/06_related_methods.md): a row everywhere, in no gain set
    related: bool = False
    family: str = "none"  # the objective's family (Objective.family): clip, group, text; none for the base

    @property
    def is_base(self) -> bool:
        return self.objective == "none" and not self.fine_tuned_on_magic and self.init is None and not self.zoo


def model_roles(models: Sequence[dict]) -> dict[str, ModelRole]:
    """Each model's role from results.json's `models` list (in order).

    Files written before the role fields existed carry `loss` (None for the zero-shot model) and `pretrain`:
    objective = loss or none, fine-tuned on MAGIC when a loss is set, init = the zero-shot model. Any objective is
    accepted (your own too): the gain rows read its family (`objective_family`), never its name.
    """
    roles = {}
    for m in models:
        loss = m.get("loss")
        objective = m.get("objective", loss or "none")
        pretrain = m.get("pretrain") or "none"
        fine_tuned = bool(m.get("fine_tuned_on_magic", loss is not None))
        init = m.get("init", None if objective == "none" and not fine_tuned else BASE_MODEL)
        family = objective_family(m)
        if family not in ("none", "clip", "group", "text"):
            raise ValueError(f"model {m['name']!r}: objective {objective!r} has family {family!r}, not one of clip, "
                             "group, text (cglib.train.objectives.FAMILIES); fix the objective's `family`")
        if pretrain not in PRETRAIN_MODES:
            raise ValueError(f"model {m['name']!r}: pretrain {pretrain!r} is not one of {', '.join(PRETRAIN_MODES)}")
        roles[m["name"]] = ModelRole(m["name"], fine_tuned, objective, pretrain, init,
                                     bool(m.get("exposed_to_eval_strings", False)), bool(m.get("zoo", False)),
                                     bool(m.get("related")), family)
    return roles


def best_model(metrics: pd.DataFrame, roles: dict[str, ModelRole]) -> str | None:
    """The Table 3 row (other than a base or zoo model) with the highest mean over the Table 3 columns; None if
    none."""
    if not len(metrics):
        return None
    return best_row(table3(metrics)[[c.header for c in table3_columns(metrics)]], roles)


def best_row(table: pd.DataFrame, roles: dict[str, ModelRole]) -> str | None:
    """The row of `table` (models x columns) with the highest mean, among the trained rows of the paper's kind
    (no base, zoo or related-method model); None if none."""
    candidates = [m for m in table.index if m in roles and not roles[m].is_base and not roles[m].zoo
                  and not roles[m].related]
    if not candidates or not len(table.columns):
        return None
    means = table.loc[candidates].astype(float).mean(axis=1, skipna=True)
    return None if means.isna().all() else str(means.idxmax())


def gain_sets(roles: dict[str, ModelRole], best: str | None) -> dict[str, tuple[list[str], list[str], str]]:
    """Per gain: (models averaged on the gaining side, models of the reference side, why absent or '').

    Zoo models (frozen references, `ModelRole.zoo`) and models of the related methods (`ModelRole.related`) enter
    no set: the gains are the paper's, over the paper's rows.
    """
    roles = {n: r for n, r in roles.items() if not r.zoo and not r.related}
    ft = [r for r in roles.values() if r.fine_tuned_on_magic]
    out: dict[str, tuple[list[str], list[str], str]] = {}
    out["MAGIC"] = ([r.name for r in ft], [r.name for r in roles.values() if not r.fine_tuned_on_magic],
                    "needs models fine-tuned on MAGIC and models not fine-tuned on it")
    out["Loss Function"] = ([r.name for r in ft if r.family == "group"],
                            [r.name for r in ft if r.family == "clip"],
                            "needs models fine-tuned with a group loss (pairwise, centroid) and with the CLIP loss")
    plain = {(r.objective, r.init): r.name for r in ft if r.pretrain == "none"}
    pretrained = [r for r in ft if r.pretrain != "none" and (r.objective, r.init) in plain]
    out["Pretraining"] = ([r.name for r in pretrained],
                          list(dict.fromkeys(plain[(r.objective, r.init)] for r in pretrained)),
                          "needs a model with textual pretraining and one with the same objective (and start) "
                          "without it" if any(r.pretrain != "none" for r in ft)
                          else "no model with textual pretraining in this run (train.runs: pretrain)")
    out["Best Model"] = ([best] if best else [], [r.name for r in roles.values() if r.is_base],
                         "needs a trained model and the zero-shot (base) model")
    return {g: (a, b, "" if a and b else why) for g, (a, b, why) in out.items()}


def gain_rows(metrics: pd.DataFrame, scores: dict[tuple[str, ...], dict[str, Scores]],
              roles: dict[str, ModelRole], resamples: int, ci: float, seed: int, stream: str = ""
              ) -> tuple[pd.DataFrame, list[str]]:
    """Our gain rows under Table 3 (the paper's "Avg Accuracy Gain w.r.t.", by our definition), per Table 3
    column, and notes.

    Gains: MAGIC (fine-tuned on MAGIC minus not), Loss Function (group losses, with or without pretraining,
    minus the CLIP loss), Pretraining (textual pretraining minus the same objective without), Best Model
    (the row with the highest mean over the columns minus the zero-shot model). Each gain is the mean of one
    set's values minus the other's, in points (`difference`), and relative to the reference set's mean in %
    (`relative`), both with paired 95% bootstrap CIs over the test images (`set_difference`: the per-item
    `scores` of both sets resampled with the same draws as every other interval of the run, given the same
    `seed`). `mean_a`/`mean_b` are in %. A gain whose sets are empty is absent and a note says why.
    """
    columns = table3_columns(metrics) if len(metrics) else []
    sets = gain_sets(roles, best_model(metrics, roles))
    rows = []
    for gain, (a, b, _) in sets.items():
        if not (a and b):
            continue
        for c in columns:
            by_model = scores.get((c.benchmark, c.labels, c.direction, c.metric, c.level), {})
            sa, sb = [m for m in a if m in by_model], [m for m in b if m in by_model]
            if not (sa and sb):
                continue
            diff, rel = set_difference([by_model[m] for m in sa], [by_model[m] for m in sb], resamples, ci, seed,
                                       stream)
            rows.append({"gain": gain, "column": c.header, "benchmark": c.benchmark, "labels": c.labels,
                         "direction": c.direction, "metric": c.metric, "level": c.level,
                         "models_a": ";".join(sa), "models_b": ";".join(sb),
                         "mean_a": 100 * float(np.mean([by_model[m].mean() for m in sa])),
                         "mean_b": 100 * float(np.mean([by_model[m].mean() for m in sb])),
                         "difference": 100 * diff.value, "ci_low": 100 * diff.low, "ci_high": 100 * diff.high,
                         "relative": 100 * rel.value, "relative_ci_low": 100 * rel.low,
                         "relative_ci_high": 100 * rel.high, "n": diff.n_units, "n_seeds": diff.n_seeds,
                         "p_value": diff.p_value, "significant": diff.significant})
    gains = pd.DataFrame(rows, columns=GAIN_COLUMNS)
    # every gain cell is one family: significant = the CI excludes 0 and Holm's correction over them keeps it
    gains["p_holm"] = holm(gains["p_value"].to_numpy(float))
    survives = gains["p_holm"].le(1 - ci) | gains["p_value"].isna()
    gains["significant"] = gains["significant"].astype(bool) & survives
    return gains, gain_notes(gains, sets, roles, resamples, ci)


def _names(models: Sequence[str], roles: dict[str, ModelRole]) -> str:
    return ", ".join(model_label(m, roles[m].exposed) for m in models)


def gain_notes(gains: pd.DataFrame, sets: dict[str, tuple[list[str], list[str], str]],
               roles: dict[str, ModelRole], resamples: int, ci: float) -> list[str]:
    """How the gain rows were computed, the models entering each mean, and which gains are not significant."""
    what = {"MAGIC": "fine-tuned on MAGIC minus not fine-tuned on it",
            "Loss Function": "group losses, pairwise or centroid with or without pretraining, minus the CLIP loss, "
                             "all fine-tuned on MAGIC",
            "Pretraining": "textual pretraining minus the same objective and start without it",
            "Best Model": "the best row, the highest mean over the Table 3 columns, minus the zero-shot model"}
    notes = [(f"Our gain rows (our definition, not the paper's rule, which table3_as_published.md applies): mean of "
              f"the first set of models minus mean of the second, in points; in parentheses "
              f"relative to the second set's mean (%); {100 * ci:.0f}% paired bootstrap CI over the test images "
              f"({resamples} resamples, both sets resampled together"
              + (f"; hierarchical over the {int(gains['n_seeds'].max())} training seeds, seed k of every model "
                 "together" if len(gains) and gains["n_seeds"].max() > 1 else "")
              + f"); * marks a CI that excludes 0 and survives Holm's correction over the {len(gains)} gain cells.")]
    for gain, (a, b, why) in sets.items():
        if not (a and b):
            notes.append(f"{gain}: absent: {why}.")
            continue
        note = f"{gain} ({what[gain]}): mean of {_names(a, roles)} minus mean of {_names(b, roles)}."
        rows = gains[gains["gain"] == gain]
        unscored = [r["column"] for _, r in rows.iterrows() if not np.isfinite(r["difference"])]
        flat = [r["column"] for _, r in rows.iterrows()
                if np.isfinite(r["difference"]) and r["ci_low"] <= 0 <= r["ci_high"]]
        nominal = [r["column"] for _, r in rows.iterrows() if np.isfinite(r["difference"]) and not r["significant"]
                   and not r["ci_low"] <= 0 <= r["ci_high"]]
        if flat:
            note += f" Not significant (the CI contains 0) at {', '.join(flat)}."
        if nominal:
            note += f" Nominal only (the CI excludes 0, not after Holm's correction) at {', '.join(nominal)}."
        if not flat and not nominal and len(rows) > len(unscored):
            note += " Significant at every scored column."
        if unscored:
            note += f" No scorable item at {', '.join(unscored)}."
        if gain == "Best Model":
            note += (" The best row is chosen on these test items, so this gain is optimistic: its CI does not "
                     "cover the choice.")
        notes.append(note)
    zoo = [r.name for r in roles.values() if r.zoo]
    if zoo:
        notes.append(f"Zoo models ({', '.join(zoo)}: frozen reference models, eval.zoo) are in no gain set: neither "
                     "the base, nor the best model, nor on either side of a gain.")
    return notes


def gains_display(gains: pd.DataFrame) -> pd.DataFrame:
    """Our gain rows laid out as the paper prints its own: one row per gain, 'diff [low, high] (relative %)' per
    column."""
    order = [g for g in GAINS if g in set(gains["gain"])]
    columns = list(dict.fromkeys(gains["column"]))
    out = pd.DataFrame(index=[GAIN_LABEL.format(g) for g in order], columns=columns, dtype=object)
    for _, r in gains.iterrows():
        if not np.isfinite(r["difference"]):
            cell = "-"
        else:
            cell = f"{signed(r['difference'])} [{r['ci_low']:.1f}, {r['ci_high']:.1f}]"
            cell += f" ({signed(r['relative'])}%)" if np.isfinite(r["relative"]) else ""
            cell += " *" if bool(r["significant"]) else ""
        out.loc[GAIN_LABEL.format(r["gain"]), r["column"]] = cell
    out.index.name = "gain"
    return out.fillna("-")

