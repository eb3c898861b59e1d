"""Training figures: loss curves of every run (total, inner, outer, text pretraining) and a group batch grid."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from cglib.data.image_cache import ImageCache
from cglib.magic.schema import MagicFile
from cglib.train.sampler import GroupBatch
from cglib.viz.style import apply_style


def read_logs(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Every `training/<name>/log.csv` of a run directory, by run name (sorted); FileNotFoundError when none."""
    paths = sorted((Path(run_dir) / "training").glob("*/log.csv"))
    if not paths:
        raise FileNotFoundError(f"no training/<name>/log.csv under {run_dir}: run notebook 05_training first")
    return {p.parent.name: pd.read_csv(p) for p in paths}


def _smooth(values: pd.Series) -> pd.Series:
    """Centered rolling mean over about 2% of the steps: per-step losses of small batches are noisy."""
    return values.rolling(max(1, len(values) // 50), min_periods=1, center=True).mean()


def plot_loss_curves(run_dir: str | Path) -> Figure:
    """Per-step training loss of each run (thin: raw, thick: smoothed) with its inner and outer terms."""
    apply_style()
    logs = read_logs(run_dir)
    pretrain = {name: log[log["phase"] == "pretrain"] for name, log in logs.items()}
    pretrain = {name: log for name, log in pretrain.items() if len(log)}
    panels = ["total loss", "inner term", "outer term"] + (["text pretraining (text-text loss)"] if pretrain else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    axes = axes[0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, log) in enumerate(logs.items()):
        color = colors[k % len(colors)]
        steps = log[log["phase"] == "train"]
        for ax, column in zip(axes[:3], ("loss", "inner", "outer")):
            values = steps[column]
            if values.notna().sum() == 0:  # the CLIP loss has no inner/outer parts
                continue
            ax.plot(steps["step"], values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps["step"], _smooth(values), color=color, linewidth=1.8, label=name)
        if name in pretrain:
            rows = pretrain[name]
            axes[3].plot(rows["step"], rows["loss"], color=color, alpha=0.25, linewidth=0.8)
            axes[3].plot(rows["step"], _smooth(rows["loss"]), color=color, linewidth=1.8, label=name)
    for ax, title in zip(axes, panels):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        if ax.lines:
            ax.legend(frameon=False)
        else:
            ax.text(0.5, 0.5, "no run with this term", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_ylabel("loss")
    fig.tight_layout()
    return fig


def plot_group_batch(batch: GroupBatch, cache: ImageCache, magic: MagicFile, max_pairs: int = 8) -> Figure:
    """One group batch as an image grid: a row per group (anchor, hard negative or flagged fallback) with a text."""
    apply_style()
    m, n = batch.shape
    cols = min(n, max_pairs)
    fig, axes = plt.subplots(m, cols, figsize=(1.3 * cols + 3.2, 1.45 * m), squeeze=False)
    for g, (group, ids, texts) in enumerate(zip(batch.groups, batch.image_ids, batch.texts)):
        role = "anchor" if g == 0 else ("fallback negative" if batch.fallback[g] else "hard negative")
        pixels = cache.get(ids[:cols])
        for k in range(cols):
            ax = axes[g, k]
            ax.imshow(pixels[k])
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
        axes[g, 0].set_ylabel(f"{magic.nodes[group].name}\n({role})", rotation=0, ha="right", va="center",
                              fontsize=9)
        axes[g, -1].text(1.08, 0.5, textwrap.fill(f'"{texts[0]}"', 34), transform=axes[g, -1].transAxes,
                         va="center", fontsize=8)
    fig.suptitle(f"group batch {batch.index} of epoch {batch.epoch}: M={m} groups x N={n} pairs"
                 + (f" (first {cols} shown)" if cols < n else ""), fontsize=11)
    fig.tight_layout()
    return fig
