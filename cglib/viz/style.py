"""One look for every figure (colour-blind-safe palette, readable fonts) and one way to save it (PNG + PDF, and the
figure's data beside it: `cglib.figure_data`)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns
from matplotlib.figure import Figure

import cglib
from cglib.figure_data import write_figure_data
from cglib.run import output_path

SUPPORTED_FORMATS = ("png", "pdf", "svg")
# Every figure is drawn at most this wide, in inches: 1,260 px at the series' 150 dpi, inside a 1,300 px page, so
# it is read at its own size with no font shrunk below 8 pt.
PAGE_WIDTH = 8.4


def fit_title(title: str, fig: Figure, fontsize: float) -> str:
    """`title` wrapped onto as many lines as keep it inside `fig`'s width at `fontsize` (a suptitle wider than the
    figure widens the saved image)."""
    return textwrap.fill(title, max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize))))


def apply_style() -> None:
    """Set the project's matplotlib defaults: seaborn 'colorblind' palette, white grid, readable font sizes."""
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update({
        "figure.dpi": 100,
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "legend.fontsize": 9,
        "savefig.bbox": "tight",
        "pdf.fonttype": 42,  # embed TrueType: text in the PDF stays selectable and editable
        "svg.fonttype": "none",
    })


def save_figure(fig: Figure, directory: str | Path, stem: str, formats: Sequence[str] = ("png", "pdf"),
                dpi: int = 150) -> list[Path]:
    """Save `fig` as `directory/stem.<format>` for each format (directory created); return those paths.

    A figure drawn by a `@replottable` function also gets its data beside it (`stem.csv`, `stem.figure.json`,
    arrays in `stem.npz`), from which `cglib figures RUN_DIR --from-data` redraws it."""
    if fig is None:
        raise ValueError(f"no figure to save as {stem!r}: the plot function had nothing to draw and returned None; "
                         "save only a figure that exists (`if fig is not None: save_figure(...)`)")
    if not stem or Path(stem).name != stem or "." in stem:
        raise ValueError(f"stem must be a bare file name without folder or extension, got {stem!r}")
    unknown = sorted(set(formats) - set(SUPPORTED_FORMATS))
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {SUPPORTED_FORMATS}, got {list(formats)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = output_path(directory / f"{stem}.{fmt}")
        fig.savefig(path, format=fmt, dpi=dpi, bbox_inches="tight", metadata={"Creator": f"cglib {cglib.__version__}"})
        paths.append(path)
    write_figure_data(fig, directory, stem)
    return paths
