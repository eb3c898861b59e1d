"""The usability floor: is the zero-shot base far enough above chance on the caption columns for Table 3 to say
anything about the objectives?

A base that can hardly match an image with its own caption gives fine-tuning nothing to build on: the rows
then differ by noise around chance, whatever the objective. With `params/hierarcaps.yaml` the base scores 60% and
59% in a 2-way choice (chance 50%) and every fine-tune scores below it. `chance_floor` reads the saved metrics;
notebook 05 shows `floor_message` as soon as the base is trained (`evaluate_base`), and notebook 06 and
`cglib report` put it first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cglib.evaluate.loading import ZERO_SHOT

# Table 3's caption columns: the level in metrics.csv and the column's name
CAPTION_COLUMNS = {"generalized": "MAGIC captions", "caption": "COCO captions"}


@dataclass(frozen=True)
class ChanceFloor:
    """The base's accuracy and the chance level (%) per caption column, and whether all sit within `margin`."""

    base: str
    columns: dict[str, tuple[float, float]]  # column name -> (base accuracy %, chance %)
    margin: float

    @property
    def near_chance(self) -> bool:
        return all(value - chance < self.margin for value, chance in self.columns.values())

    def message(self, why: str = "") -> str:
        """What the reader must know before the table (markdown): a warning when the base is near chance, else
        one sentence saying how far above chance it is."""
        scores = " and ".join(f"{value:.1f}% on {column} (chance {chance:.1f}%)"
                              for column, (value, chance) in self.columns.items())
        if not self.near_chance:
            lowest = min(value - chance for value, chance in self.columns.values())
            return (f"The {self.base} base scores {scores}: at least {lowest:.1f} points above chance, clear of "
                    f"the usability floor ({self.margin:g} points, `eval.chance_margin`).")
        return (f"**Read this first: the {self.base} base is near chance.** It scores {scores}: less than "
                f"{self.margin:g} points above chance (`eval.chance_margin`). A base that can hardly match an image "
                "with its own caption gives fine-tuning nothing to build on, so the rows below differ by noise "
                "around chance: this table shows that the pipeline runs, not what the objectives do."
                + (f" Why: {why}." if why else ""))


def chance_floor(metrics: pd.DataFrame, margin: float, base: str = ZERO_SHOT) -> ChanceFloor | None:
    """The base's text->image forced-choice accuracy against the DAG on the caption columns, from metrics.csv;
    None when the table has no such row (no evaluation, or no base)."""
    rows = metrics[(metrics["model"] == base) & (metrics["benchmark"] == "forced_choice")
                   & (metrics["labels"] == "dag") & (metrics["direction"] == "t2i")
                   & (metrics["metric"] == "accuracy") & metrics["level"].astype(str).isin(list(CAPTION_COLUMNS))]
    rows = rows.dropna(subset=["value", "chance"])
    if rows.empty:
        return None
    columns = {CAPTION_COLUMNS[str(r["level"])]: (100 * float(r["value"]), 100 * float(r["chance"]))
               for _, r in rows.iterrows()}
    return ChanceFloor(base, dict(sorted(columns.items(), key=lambda kv: list(CAPTION_COLUMNS.values()).index(kv[0]))),
                       margin)


def base_origin(run_dir: str | Path) -> str:
    """Where the base of training seed 0 comes from, in words, from `training/initial.json` ('' when unknown)."""
    path = Path(run_dir) / "training" / "initial.json"
    try:
        base = json.loads(path.read_text(encoding="utf-8")).get("base")
    except (OSError, ValueError):
        return ""
    if not base:
        return ""
    return (f"the base is a model trained from scratch by notebook 05 with the CLIP loss on {base['images']} "
            f"images of a {base['corpus']} corpus ({base['captions']} captions, {base['epochs']} epochs), and its "
            "caption accuracy says that was too little") if {"images", "corpus", "captions", "epochs"} <= set(base) else ""


def floor_message(metrics: pd.DataFrame, margin: float, run_dir: str | Path) -> str:
    """The floor's message (markdown) for the zero-shot rows of `metrics`, with where the run's base came from."""
    floor = chance_floor(metrics, margin)
    return floor.message(base_origin(run_dir)) if floor else "no caption column scored for the zero-shot model"
