"""Figures of a hyper-parameter search (notebook 08): optimization history, per-epoch validation with pruning,
parameter importances, and the chosen values beside the paper's Table 2. Plain matplotlib on Optuna's records."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import optuna
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from optuna.trial import TrialState

from cglib.figure_data import replottable

MIN_ACCURACY_SPAN = 0.10  # the y-axis spans at least 10 points, so a sub-point difference looks as small as it is
NO_IMPORTANCES = "parameter importances need at least 2 complete trials with different accuracies"


def history_figure(study: optuna.Study) -> Figure:
    """Left: each finished trial's validation accuracy (pruned trials at their last reported epoch) and the best
    so far. Right: validation accuracy after each epoch per trial, pruned trials dashed, where the pruner stopped."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        state = "complete" if t.state == TrialState.COMPLETE else "pruned"
        rows += [{"trial": t.number, "state": state, "value": t.value, "epoch": epoch, "validation": v}
                 for epoch, v in sorted(t.intermediate_values.items())]
        if not t.intermediate_values:
            rows.append({"trial": t.number, "state": state, "value": t.value, "epoch": np.nan, "validation": np.nan})
    columns = ["trial", "state", "value", "epoch", "validation"]
    return draw_history(pd.DataFrame(rows, columns=columns).astype({"value": float, "epoch": float,
                                                                    "validation": float}))


def honest_limits(values: np.ndarray, span: float = MIN_ACCURACY_SPAN) -> tuple[float, float]:
    """y-limits around `values` at least `span` wide, inside [0, 1] (accuracies)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return 0.0, 1.0
    low, high = float(values.min()), float(values.max())
    pad = max(span - (high - low), 0.0) / 2 + 0.1 * (high - low)
    low, high = max(0.0, low - pad), min(1.0, high + pad)
    if high - low < span:  # clipped at 0 or 1: widen on the other side
        low, high = (0.0, max(high, span)) if low == 0.0 else (min(low, 1.0 - span), 1.0)
    return low, high


@replottable
def draw_history(trials: pd.DataFrame) -> Figure:
    """The figure of `history_figure` from one row per trial and reported epoch (trial, state, value, epoch,
    validation): integer ticks, and a y-range at least 10 points wide, so that equal or nearly equal trials look
    as close as they are."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.4))
    per_trial = trials.groupby("trial", sort=True).agg(state=("state", "first"), value=("value", "first"))
    last = trials.dropna(subset=["epoch"]).sort_values("epoch").groupby("trial")["validation"].last()
    complete = per_trial[per_trial["state"] == "complete"]
    pruned = per_trial[(per_trial["state"] == "pruned") & per_trial.index.isin(last.index)]
    left.scatter(complete.index, complete["value"], color="C0", label="complete", zorder=3)
    if len(pruned):
        left.scatter(pruned.index, last.reindex(pruned.index), color="C3", marker="x", label="pruned (last epoch)",
                     zorder=3)
    if len(complete):
        left.step(complete.index, np.maximum.accumulate(complete["value"].to_numpy(float)), where="post", color="C1",
                  label="best so far")
    left.set(xlabel="trial", ylabel="validation accuracy (forced choice)", title="Optimization history")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    for trial, rows in trials.dropna(subset=["epoch"]).groupby("trial"):
        pruned_trial = per_trial.loc[trial, "state"] == "pruned"
        style = {"color": "C3", "linestyle": "--"} if pruned_trial else {"color": "C0", "alpha": 0.6}
        right.plot(rows["epoch"], rows["validation"], marker="o", markersize=3, **style)
    right.set(xlabel="epoch", ylabel="validation accuracy", title="Per-epoch validation (dashed: pruned)")
    values = np.concatenate([trials["value"].to_numpy(float), trials["validation"].to_numpy(float)])
    for ax in (left, right):
        ax.set_ylim(*honest_limits(values))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def importances(study: optuna.Study, seed: int = 0) -> pd.Series | None:
    """fANOVA importance of each tuned key for the objective over the complete trials; None with fewer than 2 or
    when they all reached the same accuracy (no variance to explain)."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2 or len({t.value for t in complete}) < 2:
        return None
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    return pd.Series(optuna.importance.get_param_importances(study, evaluator=evaluator), name="importance")


def importance_figure(study: optuna.Study, seed: int = 0) -> Figure | None:
    """Horizontal bars of `importances`; None when there is nothing to explain yet (`NO_IMPORTANCES` says why)."""
    values = importances(study, seed)
    if values is None:
        return None
    return draw_importances(values.rename_axis("parameter").reset_index())


@replottable
def draw_importances(importances: pd.DataFrame) -> Figure:
    """The figure of `importance_figure` from its table (parameter, importance)."""
    values = importances.set_index("parameter")["importance"].sort_values()
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(values) + 1.2))
    ax.barh(values.index, values.to_numpy(), color="C0")
    ax.set(xlabel="fANOVA importance (share of the objective's variance)", title="Parameter importances")
    fig.tight_layout()
    return fig


def table2_frame(summary: dict[str, Any]) -> pd.DataFrame:
    """The paper's Table 2 (range, reported value) beside the range searched here and the chosen value."""
    frame = pd.DataFrame(summary["table2"]).set_index("parameter")
    frame.columns = ["paper range", "paper value", "searched range", "chosen here"]
    return frame
