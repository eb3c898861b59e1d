"""Training figures: loss curves of every run (total, inner, outer, text pretraining) and a group batch grid."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cglib.data.image_cache import ImageCache
from cglib.figure_data import replottable
from cglib.magic.schema import MagicFile
from cglib.train.sampler import GroupBatch
from cglib.viz.style import PAGE_WIDTH, apply_style


def read_logs(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Every `training/<name>/log.csv` of a run directory, by run name (sorted); FileNotFoundError when none."""
    paths = sorted((Path(run_dir) / "training").glob("*/log.csv"))
    if not paths:
        raise FileNotFoundError(f"no training/<name>/log.csv under {run_dir}: run notebook 05_training first")
    return {p.parent.name: pd.read_csv(p) for p in paths}


def _smooth(values: pd.Series) -> pd.Series:
    """Centered rolling mean over about 2% of the steps: per-step losses of small batches are noisy."""
    return values.rolling(max(1, len(values) // 50), min_periods=1, center=True).mean()


LOG_COLUMNS = ["run", "phase", "step", "loss", "inner", "outer"]
TERM_STYLES = {"loss": ("total loss", "C0"), "inner": ("inner term", "C1"), "outer": ("outer term", "C2")}
LOSS_PANELS_PER_ROW = 3  # three panels of 2.7 in at 150 dpi fit a 1,300 px page


def plot_loss_curves(run_dir: str | Path) -> Figure:
    """Small multiples of the per-step training losses: one panel per run (total loss, and the inner and outer
    terms of a group loss; thin: raw, thick: smoothed), and one panel of the text-pretraining losses."""
    logs = read_logs(run_dir)
    table = pd.concat([log.assign(run=name).reindex(columns=LOG_COLUMNS) for name, log in logs.items()],
                      ignore_index=True)
    return draw_loss_curves(table)


@replottable
def draw_loss_curves(logs: pd.DataFrame) -> Figure:
    """The figure of `plot_loss_curves` from the runs' logs in one table (run, phase, step, loss, inner, outer).
    Each run keeps its own y-axis: the objectives' losses have different scales."""
    apply_style()
    runs = list(dict.fromkeys(logs["run"]))
    pretrain = logs[logs["phase"] == "pretrain"]
    n_panels = len(runs) + (1 if len(pretrain) else 0)
    ncols = min(LOSS_PANELS_PER_ROW, n_panels)
    nrows = -(-n_panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.8 * ncols, 2.3 * nrows + 0.6), squeeze=False)
    for ax, run in zip(axes.flat, runs):
        steps = logs[(logs["run"] == run) & (logs["phase"] != "pretrain")]  # train, or re (HierarCaps' RE loss)
        phases = sorted(set(steps["phase"]) - {"train"})
        for column, (label, color) in TERM_STYLES.items():
            values = steps[column]
            if values.notna().sum() == 0:  # the CLIP loss has no inner/outer parts
                continue
            ax.plot(steps["step"], values, color=color, alpha=0.25, linewidth=0.7)
            ax.plot(steps["step"], _smooth(values), color=color, linewidth=1.6, label=label)
        ax.set_title(run + (f" ({', '.join(phases)} phase)" if phases else ""), fontsize=10)
        if steps.empty:
            ax.text(0.5, 0.5, "no training step logged", ha="center", va="center", transform=ax.transAxes)
    if len(pretrain):
        ax = axes.flat[len(runs)]
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        # runs that share one text pretraining log the same curve: one line, every name on it
        curves: dict[tuple, list[str]] = {}
        for run, rows in pretrain.groupby("run", sort=False):
            curves.setdefault(tuple(rows[["step", "loss"]].itertuples(index=False, name=None)), []).append(run)
        for k, (curve, names) in enumerate(curves.items()):
            rows = pd.DataFrame(list(curve), columns=["step", "loss"])
            color = colors[(k + 3) % len(colors)]
            ax.plot(rows["step"], _smooth(rows["loss"]), color=color, linewidth=1.6, label=", ".join(names))
            ax.annotate("\n".join(names) + (" (identical)" if len(names) > 1 else ""),
                        (rows["step"].iloc[-1], _smooth(rows["loss"]).iloc[-1]), fontsize=7, xytext=(-2, 4),
                        textcoords="offset points", ha="right", va="bottom", color=color)
        ax.set_title("text pretraining (text-text loss)", fontsize=10)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    for ax in axes.flat[:n_panels]:
        ax.tick_params(labelsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=9)
    for row in axes:
        row[0].set_ylabel("loss", fontsize=9)
    handles = [Line2D([], [], color=color, linewidth=1.6, label=label) for label, color in TERM_STYLES.values()]
    handles.append(Line2D([], [], color="0.5", alpha=0.35, linewidth=0.7, label="raw per step (thick: smoothed)"))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False, fontsize=9)
    fig.suptitle("Training loss per run (one panel each, own y-axis)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_group_batch(batch: GroupBatch, cache: ImageCache, magic: MagicFile, max_pairs: int = 6) -> Figure:
    """One group batch as an image grid: a row per group (anchor, hard negative or flagged fallback) with a text."""
    n = batch.shape[1]
    cols = min(n, max_pairs)
    rows = pd.DataFrame([{"group": group, "name": magic.nodes[group].name,
                          "role": "anchor" if g == 0 else ("fallback negative" if batch.fallback[g] else
                                                           "hard negative"),
                          "text": texts[0], "image_ids": " ".join(ids[:cols])}
                         for g, (group, ids, texts) in enumerate(zip(batch.groups, batch.image_ids, batch.texts))])
    pixels = np.stack([cache.get(ids[:cols]) for ids in batch.image_ids])
    return draw_group_batch(rows, pixels, batch.index, batch.epoch, pairs=n)


@replottable
def draw_group_batch(rows: pd.DataFrame, pixels: np.ndarray, index: int, epoch: int, pairs: int) -> Figure:
    """The figure of `plot_group_batch`: `rows` (group, name, role, text, image_ids) and the shown images' pixels
    (groups, shown pairs, H, W, 3)."""
    apply_style()
    m, cols = pixels.shape[:2]
    # the images share what the names (left) and texts (right) leave of a 1,300 px page at 150 dpi; the texts
    # reach a little past the figure's edge, hence the 0.4 in kept free
    cell = min(1.2, (PAGE_WIDTH - 0.4 - 3.2) / cols)
    fig, axes = plt.subplots(m, cols, figsize=(cell * cols + 3.2, (cell + 0.15) * m + 0.4), squeeze=False)
    for g, (_, row) in enumerate(rows.iterrows()):
        for k in range(cols):
            ax = axes[g, k]
            ax.imshow(pixels[g, k])
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
        axes[g, 0].set_ylabel(f"{row['name']}\n({row['role']})", rotation=0, ha="right", va="center", fontsize=9)
        axes[g, -1].text(1.08, 0.5, textwrap.fill(f'"{row["text"]}"', 30), transform=axes[g, -1].transAxes,
                         va="center", fontsize=8)
    fig.suptitle(f"group batch {index} of epoch {epoch}: M={m} groups x N={pairs} pairs"
                 + (f" (first {cols} shown)" if cols < pairs else ""), fontsize=11)
    fig.tight_layout()
    fig.subplots_adjust(wspace=0.05)  # images side by side; what tight_layout leaves between them is wasted width
    return fig
