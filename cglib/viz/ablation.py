"""The ablation's figure (`cglib ablate`): per named row a panel of keys x Table 3 columns, each cell the change the
one flipped key makes (flipped minus the run's, points) with its CI written in it, Holm-significant cells marked."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from cglib.figure_data import replottable
from cglib.viz.style import PAGE_WIDTH, fit_title

REUSED_COLOUR = "#eeeeee"
WIDE = 8  # columns up to which a cell's CI keeps one decimal at 6 pt


@replottable
def plot_ablation(cells: pd.DataFrame, title: str = "", measure: str = "flipped minus the run's own") -> Figure:
    """One heat-map panel per row (stacked): keys as rows, Table 3 columns as columns; colour and text the change
    in points with its CI, bold with * where significant after Holm; grey 'reused' where the flip leaves the row
    unchanged ('no items' where the column scores no test image). `cells`: `cglib.evaluate.ablation.ablation_cells`;
    `measure`: what a cell's change is, in each panel's title."""
    rows = list(dict.fromkeys(cells["row"]))
    keys = list(dict.fromkeys(cells["key"]))
    columns = list(dict.fromkeys(cells["column"]))
    trained = cells[cells["trained"].astype(bool)]
    limit = max(1.0, float(np.nanmax(np.abs(trained[["ci_low", "ci_high", "change"]].to_numpy(float))))
                if len(trained) else 1.0)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-limit, vmax=limit)
    cell_h = 0.42
    digits = 1 if len(columns) <= WIDE else 0  # a CI with decimals is wider than a cell of a wide table
    fig, axes = plt.subplots(len(rows), 1, squeeze=False, layout="constrained",
                             figsize=(PAGE_WIDTH, 0.9 + len(rows) * (0.7 + cell_h * len(keys))))
    image = None
    for ax, row in zip(axes[:, 0], rows):
        part = cells[cells["row"] == row].set_index(["key", "column"])
        grid = np.full((len(keys), len(columns)), np.nan)
        for i, key in enumerate(keys):
            for j, column in enumerate(columns):
                if (key, column) in part.index and bool(part.loc[(key, column), "trained"]):
                    grid[i, j] = float(part.loc[(key, column), "change"])
        ax.set_facecolor(REUSED_COLOUR)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu", norm=norm, aspect="auto")
        for i, key in enumerate(keys):
            for j, column in enumerate(columns):
                if (key, column) not in part.index:
                    continue
                c = part.loc[(key, column)]
                if not bool(c["trained"]) or not c["images"]:
                    ax.text(j, i, "reused" if not bool(c["trained"]) else "no items", ha="center", va="center",
                            fontsize=6, color="#777777")
                    continue
                significant = bool(c["significant"])
                text = (f"{c['change']:+.1f}{' *' if significant else ''}\n"
                        f"[{c['ci_low']:+.{digits}f}, {c['ci_high']:+.{digits}f}]")
                dark = abs(float(c["change"])) > 0.6 * limit
                ax.text(j, i, text, ha="center", va="center", fontsize=6, color="white" if dark else "black",
                        fontweight="bold" if significant else "normal")
        ax.set_xticks(range(len(columns)), columns, rotation=35, ha="right", fontsize=7)
        ax.set_yticks(range(len(keys)), [k.removeprefix("train.runs[].") for k in keys], fontsize=7)
        ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(len(keys) + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=1.0)
        ax.grid(which="major", visible=False)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{row}: {measure} (points, CI; * significant after Holm)", fontsize=9,
                     loc="left")
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), shrink=0.6, label="change (points)")
    if title:
        fig.suptitle(fit_title(title, fig, 10), fontsize=10)
    return fig
