"""The paper beside us: its Table 3 (all eight rows) and its four gain rows as printed, and which of those gains
our definitions (`cglib.evaluate.gains`) reproduce from the paper's own table.

The paper defines its "Avg Accuracy Gain w.r.t." rows only as "without vs. with" MAGIC, a group loss,
pretraining and the best model. Applied to the paper's Table 3, our definitions give its MAGIC row (relative
gain of the set means, within rounding) but not the other three (e.g. Pretraining at MAGIC captions: 3.8%
computed, 6.9% printed). `gain_definition_search` tries every split of the eight rows into a gaining and a
reference set under three measures, to say how close any such definition comes.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np
import pandas as pd

from cglib.evaluate.gains import GAINS, ModelRole, best_row, gain_sets
from cglib.evaluate.report import markdown_table
from cglib.evaluate.table3 import table3_display

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

# What each paper row is, in the roles our gain rows read (the paper's pretraining is the authors' variant, which
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

Measure = Literal["relative", "points", "relative_pairs"]
MEASURES: dict[str, str] = {
    "relative": "relative gain of the set means, mean(A) / mean(B) - 1 (ours)",
    "points": "difference of the set means, mean(A) - mean(B), in points",
    "relative_pairs": "mean over the pairs (a, b) of a / b - 1",
}
# The paper's table and gains are printed to 0.1: a recomputed gain within this of the printed one reproduces it.
TOLERANCE = 0.15


def _gains(x: np.ndarray, a: np.ndarray, b: np.ndarray, measure: str) -> np.ndarray:
    """The gain of row set(s) `a` over `b` (0/1 masks over the rows of `x`, one set per row of `a` and `b`)."""
    mean_a = a @ x / a.sum(axis=1, keepdims=True)
    mean_b = b @ x / b.sum(axis=1, keepdims=True)
    if measure == "relative":
        return 100 * (mean_a / mean_b - 1)
    if measure == "points":
        return mean_a - mean_b
    return 100 * (mean_a * (b @ (1 / x)) / b.sum(axis=1, keepdims=True) - 1)  # mean_ij x_i/x_j = mean x * mean 1/x


def _mask(names: list[str]) -> np.ndarray:
    return PAPER_TABLE3.index.isin(names).astype(float)[None, :]


def paper_gains_by_our_definitions(measure: Measure = "relative") -> pd.DataFrame:
    """Our gain rows (cglib.evaluate.gains: the same sets of models) computed from the paper's Table 3."""
    x = PAPER_TABLE3.to_numpy(float)
    best = best_row(PAPER_TABLE3, PAPER_ROLES)
    rows = {gain: _gains(x, _mask(a), _mask(b), measure)[0]
            for gain, (a, b, _) in gain_sets(PAPER_ROLES, best).items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=COLUMNS).rename_axis("gain")


def gain_definition_search(tolerance: float = TOLERANCE, table: pd.DataFrame = PAPER_TABLE3,
                           printed: pd.DataFrame = PAPER_GAINS) -> pd.DataFrame:
    """For each printed gain row, the definition that reproduces the most of its columns (then: with the smallest
    largest error) among every split of the table's rows into a gaining set A, a reference set B and rows left out
    (3^8 assignments for the paper's eight), under each of MEASURES."""
    x, names = table.to_numpy(float), np.array(table.index)
    sides = np.array(list(itertools.product((0, 1, 2), repeat=len(names))))
    sides = sides[(sides == 1).any(axis=1) & (sides == 2).any(axis=1)]
    a, b = (sides == 1).astype(float), (sides == 2).astype(float)
    gains = {measure: _gains(x, a, b, measure) for measure in MEASURES}
    rows = []
    for gain in printed.index:
        target = printed.loc[gain].to_numpy(float)
        best = None
        for measure, values in gains.items():
            error = np.abs(values - target)
            matched, worst = (error <= tolerance).sum(axis=1), error.max(axis=1)
            k = int(np.lexsort((worst, -matched))[0])  # most columns reproduced, then the smallest worst error
            if best is None or (matched[k], -worst[k]) > (best[0], -best[1]):
                best = (int(matched[k]), float(worst[k]), measure, k)
        matched, worst, measure, k = best
        rows.append({"gain": gain, "columns_reproduced": matched, "max_error": worst, "measure": measure,
                     "models_a": "; ".join(names[sides[k] == 1]), "models_b": "; ".join(names[sides[k] == 2])})
    return pd.DataFrame(rows).set_index("gain")


def paper_gain_check(tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Per printed gain row: our definition's largest deviation from it on the paper's own table, whether it
    reproduces the row (every column within `tolerance`), and the closest definition any split of the rows gives."""
    ours = paper_gains_by_our_definitions()
    error = (ours - PAPER_GAINS).abs()
    search = gain_definition_search(tolerance)
    out = pd.DataFrame({"ours_columns_reproduced": (error <= tolerance).sum(axis=1),
                        "ours_max_error": error.max(axis=1)})
    out["reproduced"] = out["ours_columns_reproduced"] == len(COLUMNS)
    search = search.rename(columns=lambda c: f"closest_{c}")
    return out.join(search).rename_axis("gain")


def paper_beside_ours() -> pd.DataFrame:
    """The printed gain rows and ours recomputed from the paper's table, interleaved (for notebook 06)."""
    ours = paper_gains_by_our_definitions()
    frames = {("printed", g): PAPER_GAINS.loc[g] for g in GAINS} | {("ours", g): ours.loc[g] for g in GAINS}
    table = pd.DataFrame(frames).T.round(1)
    return table.reindex([(kind, g) for g in GAINS for kind in ("printed", "ours")])


def table3_as_published_markdown(table: pd.DataFrame, protocols: dict[str, str], choices: int,
                                 changes: list[str] = ()) -> str:
    """table3_as_published.md: this run's Table 3 under the authors' protocol, the paper's rows as printed under
    it (the columns both have), what the protocol is, then `changes` (protocols.protocol_changes_markdown)."""
    display = table3_display(table)
    printed = PAPER_TABLE3.reindex(columns=display.columns).map(lambda v: "-" if pd.isna(v) else f"{v:.1f}")
    printed.index = [f"paper: {name}" for name in printed.index]
    both = pd.concat([display, printed.astype(object)]).fillna("-")
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
    return "\n".join(["# Table 3 as published (the authors' evaluation protocol), with the paper's rows", "",
                      markdown_table(both), "", *[f"- {n}" for n in notes], *([""] + list(changes) if changes else []),
                      ""])
