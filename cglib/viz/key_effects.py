"""The twins' key-effects figure (`cglib compare-protocols` with both twins ablated): the ablation's heat map, one
panel per ablated row, its lines the twins' change and then each key alone in either twin, all read as the key
corrected minus as published (`cglib.evaluate.key_effects`)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from cglib.figure_data import replottable
from cglib.viz.ablation import plot_ablation

SOURCE_LABELS = {"twins": "", "in_as_published": " (alone, as-published run)",
                 "in_corrected": " (alone, corrected run)"}


@replottable
def plot_key_effects(effects: pd.DataFrame, title: str = "") -> Figure:
    """Heat map per row: lines 'all keys (the twins)', then per key its change alone in the as-published run and in
    the corrected run (sign turned); columns Table 3's; text the change and CI, * where its family's Holm keeps it.
    `effects`: `cglib.evaluate.key_effects.key_effects`."""
    lines = effects.assign(key=[k.removeprefix("train.") + SOURCE_LABELS[s]
                                for k, s in zip(effects["key"], effects["source"])],
                           trained=True, images=1)
    return plot_ablation(lines, title, measure="the key corrected minus as published")
