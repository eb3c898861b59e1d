"""Figures of a hyper-parameter search (notebook 08): optimization history, per-epoch validation with pruning,
parameter importances, and the chosen values beside the paper's Table 2. Plain matplotlib on Optuna's records."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import optuna
import pandas as pd
from matplotlib.figure import Figure
from optuna.trial import TrialState


def history_figure(study: optuna.Study) -> Figure:
    """Left: each finished trial's validation accuracy (pruned trials at their last reported epoch) and the best
    so far. Right: validation accuracy after each epoch per trial, pruned trials dashed, where the pruner stopped."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.intermediate_values]
    left.scatter([t.number for t in complete], [t.value for t in complete], color="C0", label="complete", zorder=3)
    left.scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                 color="C3", marker="x", label="pruned (last epoch reported)", zorder=3)
    if complete:
        ordered = sorted(complete, key=lambda t: t.number)
        left.step([t.number for t in ordered], np.maximum.accumulate([t.value for t in ordered]), where="post",
                  color="C1", label="best so far")
    left.set(xlabel="trial", ylabel="validation accuracy (mean forced choice)", title="Optimization history")
    left.legend(fontsize=8)
    for t in trials:
        if not t.intermediate_values:
            continue
        epochs = sorted(t.intermediate_values)
        pruned_trial = t.state == TrialState.PRUNED
        style = {"color": "C3", "linestyle": "--"} if pruned_trial else {"color": "C0", "alpha": 0.6}
        right.plot(epochs, [t.intermediate_values[e] for e in epochs], marker="o", markersize=3, **style)
    right.set(xlabel="epoch", ylabel="validation accuracy", title="Per-epoch validation (dashed: pruned)")
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


def importance_figure(study: optuna.Study, seed: int = 0) -> Figure:
    """Horizontal bars of `importances` (a note instead when there is nothing to explain yet)."""
    values = importances(study, seed)
    fig, ax = plt.subplots(figsize=(6, 3))
    if values is None:
        ax.text(0.5, 0.5, "parameter importances need at least 2 complete trials\nwith different accuracies",
                ha="center", va="center")
        ax.set_axis_off()
        return fig
    values = values.sort_values()
    ax.barh(values.index, values.to_numpy(), color="C0")
    ax.set(xlabel="fANOVA importance (share of the objective's variance)", title="Parameter importances")
    fig.tight_layout()
    return fig


def table2_frame(summary: dict[str, Any]) -> pd.DataFrame:
    """The paper's Table 2 (range, reported value) beside the range searched here and the chosen value."""
    frame = pd.DataFrame(summary["table2"]).set_index("parameter")
    frame.columns = ["paper range", "paper value", "searched range", "chosen here"]
    return frame
