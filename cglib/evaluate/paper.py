"""The paper beside us: its Table 3 (all eight rows), its four gain rows as printed, and the rule that gives them.

The paper's "Avg Accuracy Gain w.r.t." rows follow one rule, per column: the relative gain, in percent, of the mean
of the rows that have the factor over the mean of all the rows that lack it, truncated toward zero to one decimal
(4.8957 is printed 4.8, -3.565 is printed -3.5). The factors: MAGIC (fine-tuned on MAGIC), Loss Function (a group
loss, with or without pretraining), Pretraining (textual pretraining) and Best Model (per column, the best row of
that column, over the mean of all the other rows). On the paper's own Table 3 the rule gives 38 of the 40 printed
cells; rounding instead of truncating gives 22. The two it misses: Loss Function at HierarCaps l3 (+0.19 computed,
-2.5 printed) and Pretraining at HierarCaps l4 (-4.69 computed, -3.4 printed).

`paper_gains` applies the rule to any Table 3 whose rows carry roles (`gains.ModelRole`): the paper's (PAPER_ROLES)
or a run's, here to the run's Table 3 as published (table3_as_published.md). The run's other gain rows
(`cglib.evaluate.gains`, gains.csv, table3.md) are OUR definition: differences in points with paired CIs, other
reference sets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cglib.evaluate.gains import GAINS, ModelRole
from cglib.evaluate.report import markdown_table
from cglib.evaluate.table3 import table3_display, table3_values

COLUMNS = ["MAGIC captions", "MAGIC l1", "MAGIC l2", "MAGIC l3", "MAGIC l4",
           "HierarCaps l1", "HierarCaps l2", "HierarCaps l3", "HierarCaps l4", "COCO"]

# The paper's Table 3 (text->image "R@1" as the authors compute it: a 2-way forced choice; percent), row by row.
PAPER_TABLE3 = pd.DataFrame(
    [[69.7, 67.7, 59.7, 56.5, 57.2, 91.1, 93.0, 91.4, 90.5, 96.6],
     [74.2, 68.7, 59.5, 55.9, 57.4, 90.4, 92.9, 91.1, 90.3, 94.1],
     [71.0, 68.0, 59.2, 56.0, 56.6, 91.5, 92.7, 89.7, 84.4, 96.0],
     [70.0, 64.4, 55.1, 52.2, 53.0, 91.4, 91.9, 87.8, 78.6, 94.0],
     [74.1, 70.2, 61.3, 57.3, 58.9, 92.4, 93.6, 92.6, 91.4, 96.8],
     [77.4, 73.6, 61.2, 58.2, 57.6, 91.5, 92.9, 87.0, 83.4, 88.1],
     [74.8, 71.1, 61.7, 57.3, 59.1, 92.8, 93.9, 93.7, 93.6, 96.2],
     [77.2, 73.8, 61.0, 58.6, 57.5, 91.4, 92.9, 87.4, 84.6, 88.0]],
    index=pd.Index(["CLIP", "CLIP fine-tuned", "HierarCaps", "HierarCaps fine-tuned", "CLEAR GLASS centroid",
                    "centroid + pretraining", "CLEAR GLASS pairwise", "pairwise + pretraining"], name="model"),
    columns=COLUMNS)

# The gain rows printed under it (percent, same columns).
PAPER_GAINS = pd.DataFrame(
    [[6.0, 3.6, 0.8, 0.5, 0.6, 0.3, 0.1, -0.6, -0.5, -3.5],
     [6.5, 7.4, 5.0, 4.8, 3.9, 1.0, 0.7, -2.5, 2.6, -3.0],
     [6.9, 7.8, 2.8, 4.5, 0.9, -0.1, -0.1, -4.2, -3.4, -7.9],
     [6.0, 6.8, 3.5, 4.2, 3.8, 1.5, 1.1, 4.6, 8.6, 3.7]],
    index=pd.Index(list(GAINS), name="gain"), columns=COLUMNS)

# What each paper row is, in the roles the gain rows read (the paper's pretraining is the authors' variant, which
# also trains on the l1-l4 names).
PAPER_ROLES = {
    "CLIP": ModelRole("CLIP", False, "none"),
    "CLIP fine-tuned": ModelRole("CLIP fine-tuned", True, "clip", init="CLIP", family="clip"),
    "HierarCaps": ModelRole("HierarCaps", False, "re", init="CLIP", family="text"),
    "HierarCaps fine-tuned": ModelRole("HierarCaps fine-tuned", True, "clip", init="HierarCaps", family="clip"),
    "CLEAR GLASS centroid": ModelRole("CLEAR GLASS centroid", True, "centroid", init="CLIP", family="group"),
    "centroid + pretraining": ModelRole("centroid + pretraining", True, "centroid", "with_concepts", "CLIP",
                                        family="group"),
    "CLEAR GLASS pairwise": ModelRole("CLEAR GLASS pairwise", True, "pairwise", init="CLIP", family="group"),
    "pairwise + pretraining": ModelRole("pairwise + pretraining", True, "pairwise", "with_concepts", "CLIP",
                                        family="group"),
}

# What makes a row "have" each factor of the paper's gain rows (Best Model is chosen per column instead).
FACTORS = {"MAGIC": lambda r: r.fine_tuned_on_magic,
           "Loss Function": lambda r: r.family == "group",
           "Pretraining": lambda r: r.pretrain != "none"}
PAPER_GAIN_LABEL = "Avg Accuracy Gain w.r.t. {} (paper's rule)"
PRINTED_GAIN_LABEL = "paper: Avg Accuracy Gain w.r.t. {}"


def truncate_tenths(values: pd.DataFrame) -> pd.DataFrame:
    """Truncated toward zero to one decimal, as the paper prints its gains (+ 0.0 turns -0.0 into 0.0). The
    rounding to 1e-6 first keeps a value like 4.8 computed as 4.7999999999 from truncating to 4.7."""
    return np.trunc((values * 10).round(6)) / 10 + 0.0


def _paper_rows(table: pd.DataFrame, roles: dict[str, ModelRole]) -> pd.DataFrame:
    """The rows of `table` that enter the paper's gains: every row but zoo and related-method models."""
    unknown = [m for m in table.index if m not in roles]
    if unknown:
        raise ValueError(f"rows {unknown} of the table have no role: pass roles for every row, e.g. "
                         "gains.model_roles(results.info['models']) for a run's table")
    return table.loc[[m for m in table.index if not roles[m].zoo and not roles[m].related]].astype(float)


def paper_gain_sets(table: pd.DataFrame, roles: dict[str, ModelRole]) -> dict[str, tuple[list[str], list[str]]]:
    """Per factor gain (MAGIC, Loss Function, Pretraining): (rows that have the factor, rows that lack it)."""
    rows = _paper_rows(table, roles).index
    return {gain: ([m for m in rows if has(roles[m])], [m for m in rows if not has(roles[m])])
            for gain, has in FACTORS.items()}


def best_rows(table: pd.DataFrame, roles: dict[str, ModelRole]) -> pd.Series:
    """Per column, the row with the highest value among the rows that enter the paper's gains."""
    rows = _paper_rows(table, roles)
    return pd.Series({c: rows[c].idxmax() for c in rows.columns if rows[c].notna().sum() > 1}, dtype=object)


def paper_gain_values(table: pd.DataFrame, roles: dict[str, ModelRole] = PAPER_ROLES) -> pd.DataFrame:
    """The paper's rule on `table` (models x columns, percent), not yet truncated: gains x columns, in percent;
    NaN where one side has no row (or no value) in that column."""
    rows = _paper_rows(table, roles)
    out = pd.DataFrame(np.nan, index=pd.Index(list(GAINS), name="gain"), columns=rows.columns)
    for gain, (have, lack) in paper_gain_sets(table, roles).items():
        if have and lack:
            out.loc[gain] = 100 * (rows.loc[have].mean() / rows.loc[lack].mean() - 1)
    for column, best in best_rows(table, roles).items():
        out.loc["Best Model", column] = 100 * (rows.loc[best, column] / rows[column].drop(best).mean() - 1)
    return out


def paper_gains(table: pd.DataFrame, roles: dict[str, ModelRole] = PAPER_ROLES) -> pd.DataFrame:
    """The paper's four gain rows from `table` (models x columns, percent) by the paper's rule, truncated to one
    decimal as printed. `roles` says what each row is (default: the paper's eight rows); zoo and related-method
    rows enter no set."""
    return truncate_tenths(paper_gain_values(table, roles))


def paper_rule_check() -> pd.DataFrame:
    """Each of the 40 printed gain cells beside the rule applied to the paper's own Table 3: the exact value, it
    truncated (as the rule prints it) and rounded, and whether the truncated value is the printed one."""
    exact = paper_gain_values(PAPER_TABLE3)
    out = pd.DataFrame({"printed": PAPER_GAINS.stack(), "computed": exact.stack(),
                        "truncated": truncate_tenths(exact).stack(), "rounded": exact.round(1).stack()})
    out["reproduced"] = np.isclose(out["truncated"], out["printed"], rtol=0, atol=1e-9)
    return out.rename_axis(["gain", "column"])


def paper_row(name: str, roles: dict[str, ModelRole]) -> str | None:
    """The row of the paper's Table 3 that a model of this role stands for (None: no such row, e.g. a zoo model
    or an objective of your own). Read from roles, never from the model's name."""
    r = roles[name]
    if r.zoo or r.related:
        return None
    if r.is_base:
        return "CLIP"
    if not r.fine_tuned_on_magic:
        return "HierarCaps" if r.family == "text" else None
    if r.family == "clip":
        start = roles.get(r.init) if r.init else None
        return "HierarCaps fine-tuned" if start is not None and start.family == "text" else "CLIP fine-tuned"
    if r.family == "group" and r.objective in ("centroid", "pairwise"):
        return f"{r.objective} + pretraining" if r.pretrain != "none" else f"CLEAR GLASS {r.objective}"
    return None


def paper_gain_notes(table: pd.DataFrame, roles: dict[str, ModelRole]) -> list[str]:
    """What the paper's rule compared on `table`: the rows on each side of each gain, the paper's rows this table
    has no counterpart of (its reference set is then the rows the table has), and each column's best row."""
    label = {m: f"{m} ({paper_row(m, roles)})" if paper_row(m, roles) not in (None, m) else m for m in roles}
    present = {paper_row(m, roles) for m in _paper_rows(table, roles).index}
    notes = []
    for gain, (have, lack) in paper_gain_sets(table, roles).items():
        paper_have, paper_lack = paper_gain_sets(PAPER_TABLE3, PAPER_ROLES)[gain]
        if not (have and lack):
            notes.append(f"{gain}: absent: this table has no row {'with' if not have else 'without'} the factor.")
            continue
        note = f"{gain}: mean of {', '.join(label[m] for m in have)} over mean of {', '.join(label[m] for m in lack)}."
        missing = [m for m in paper_have + paper_lack if m not in present]
        if missing:
            note += (f" The paper's sets also hold {', '.join(missing)}, which this table has no row for: "
                     "each mean is over the rows it has.")
        notes.append(note)
    best = best_rows(table, roles)
    if len(best):
        by_row = {m: [c for c in best.index if best[c] == m] for m in dict.fromkeys(best)}
        notes.append("Best Model: per column, the best row of that column over the mean of all the other rows; "
                     "best: " + "; ".join(f"{label[m]} at {', '.join(cols)}" for m, cols in by_row.items()) + ".")
    return notes


def paper_gains_display(table: pd.DataFrame, roles: dict[str, ModelRole]) -> pd.DataFrame:
    """This table's gain rows by the paper's rule, each followed by the paper's printed row (same columns, '-'
    where the paper has none): '+6.0%' cells."""
    ours, printed = paper_gains(table, roles), PAPER_GAINS.reindex(columns=table.columns)
    frames = {}
    for gain in GAINS:
        frames[PAPER_GAIN_LABEL.format(gain)] = ours.loc[gain]
        frames[PRINTED_GAIN_LABEL.format(gain)] = printed.loc[gain]
    return pd.DataFrame(frames).T.map(lambda v: "-" if pd.isna(v) else f"{v + 0.0:+.1f}%")


def table3_as_published_markdown(table: pd.DataFrame, protocols: dict[str, str], choices: int,
                                 roles: dict[str, ModelRole], changes: list[str] = ()) -> str:
    """table3_as_published.md: this run's Table 3 under the authors' protocol, the paper's rows as printed under
    it (the columns both have), then the gain rows by the paper's rule on this table, each beside the paper's
    printed row; what the protocol is, what the rule compared (`roles`: each row's role), then `changes`
    (protocols.protocol_changes_markdown)."""
    display = table3_display(table)
    printed = PAPER_TABLE3.reindex(columns=display.columns).map(lambda v: "-" if pd.isna(v) else f"{v:.1f}")
    printed.index = [f"paper: {name}" for name in printed.index]
    values = table3_values(table)
    gains = paper_gains_display(values, roles).reindex(columns=display.columns)
    both = pd.concat([display, printed.astype(object), gains.astype(object)]).fillna("-")
    both.index.name = "model"
    both = both.rename(columns={h: f"{h} ({p})" for h, p in protocols.items()})
    notes = [
        (f"Text->image accuracy in %, scored as the authors' code scored it (their EvaluationDataset and "
        f"evaluate_scores; {choices}-way): each image with the FIRST of its texts of a type; its negative "
        "concepts drawn WITH replacement from its l1 group's hard negatives, each bringing the concept's FIRST test "
        "image and that image's first text; no check that a negative's text differs from the anchor's (at l2-l4 "
        "they often share it); TIES GO TO THE ANCHOR. HierarCaps: their HierarcapsEvaluationDataset's draws on "
        "Python's generator seeded per evaluation seed: each item against items whose concepts were drawn at load "
        "time with replacement from all items, itself included, each found as the first item with that level-4 "
        "text; an item whose drawn concept matches none is skipped and counted (results.json: "
        "hierarcaps.published_unmatched)."),
        ("These columns are comparable with the paper's in protocol only: the paper's rows are OpenAI's CLIP "
        "ViT-B/32 and its fine-tunes on COCO's photos; this run's rows are its own models on its own data. "
        "Compare the pattern across columns and rows, not the levels."),
        ("Table 3 (table3.md) scores the same models with the corrected protocol (distinct negatives, no identical "
        "texts, ties wrong); the difference between the two tables is what the evaluation corrections change."),
    ]
    rule = [
        ("The paper's rule, per column: the relative gain (%) of the mean of the rows that have the factor over "
         "the mean of all the rows that lack it, truncated toward zero to one decimal; Best Model: the best row of "
         "the column over the mean of all the other rows. It gives 38 of the paper's 40 printed cells from the "
         "paper's own rows (not Loss Function at HierarCaps l3, nor Pretraining at HierarCaps l4)."),
        ("Rows enter by their role (fine-tuned on MAGIC, objective family, pretraining), not by name; zoo and "
         "related-method rows enter no set. No CI: for intervals see our gain rows in table3.md (gains.csv), a "
         "different definition (differences in points with paired CIs; other reference sets)."),
        *paper_gain_notes(values, roles),
    ]
    return "\n".join(["# Table 3 as published (the authors' evaluation protocol), with the paper's rows", "",
                      markdown_table(both), "", *[f"- {n}" for n in notes], "",
                      "## Gain rows by the paper's rule (this run's rows above, beside the paper's printed rows)", "",
                      *[f"- {n}" for n in rule], *([""] + list(changes) if changes else []), ""])
