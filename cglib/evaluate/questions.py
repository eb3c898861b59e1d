"""Notebook 06's questions, answered from the run's own gain rows (gains.csv): does fine-tuning on MAGIC help, do
the group losses beat the CLIP loss and at which columns, does textual pretraining help, how far is the best model
from the base (does it beat it). Each answer is a sentence with the numbers and Holm's significance filled in, never fixed text."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cglib.evaluate.report import signed

QUESTIONS = {"MAGIC": "Does fine-tuning on MAGIC help?",
             "Loss Function": "Do the group losses beat the CLIP loss, and at which columns?",
             "Pretraining": "Does textual pretraining help?",
             "Best Model": "Does the best model beat the zero-shot base?"}


def answer(gains: pd.DataFrame, gain: str) -> str:
    """One question's answer from the gain rows of `gain` (points, paired CI, Holm over all gain cells)."""
    rows = gains[(gains["gain"] == gain) & np.isfinite(gains["difference"].astype(float))]
    question = QUESTIONS[gain]
    if rows.empty:
        return f"{question} Not answerable in this run: it lacks the models on one side (see the gain notes)."
    up = [r["column"] for _, r in rows.iterrows() if r["significant"] and r["difference"] > 0]
    down = [r["column"] for _, r in rows.iterrows() if r["significant"] and r["difference"] < 0]
    verdict = ("Yes" if up and not down else "No: it hurts" if down and not up else "Mixed" if up
               else "No evidence either way")
    best = rows.loc[rows["difference"].astype(float).idxmax()]
    text = (f"{question} {verdict}. Over the {len(rows)} Table 3 columns the difference averages "
            f"{signed(rows['difference'].astype(float).mean())} points (largest {signed(best['difference'])} "
            f"[{best['ci_low']:.1f}, {best['ci_high']:.1f}] at {best['column']}); ")
    if up or down:
        text += (f"significant after Holm's correction up at {', '.join(up) or 'no column'} and down at "
                 f"{', '.join(down) or 'no column'}")
    else:
        text += "no column survives Holm's correction over the gain cells"
    return text + f" ({', '.join(rows['models_a'].iloc[0].split(';'))} vs {', '.join(rows['models_b'].iloc[0].split(';'))})."


def answers(gains: pd.DataFrame) -> list[str]:
    """Every question's answer, in QUESTIONS order."""
    return [answer(gains, gain) for gain in QUESTIONS]
