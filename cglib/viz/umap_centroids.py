"""UMAP of l1 group centroids and the measured dual effect (paper Fig. 2) on real embeddings.

Inputs are test-split images and texts only. Texts are, by default, the test images' own original captions
(`viz.umap_texts: captions`); `generalized` uses the l1 nodes' generalized captions instead (one set per group,
not split-specific: the training stage may have seen them). A group's centroid is the mean of its unit
embeddings, renormalised, so cosine geometry is kept throughout.

Image and text centroids get separate maps (the modality gap would split a joint map into two blobs). Panels
share one UMAP seed (`viz.umap_seed`) and each is rotated onto the first model's by orthogonal Procrustes (a
similarity transform, so neighbourhoods and trustworthiness are unchanged), which makes panels comparable by eye.
UMAP with `random_state` is single-threaded and its first call compiles numba code: `configure_numba_cache`
points numba's on-disk cache at `~/.cache/cglib/numba` (or `NUMBA_CACHE_DIR`, or `viz.numba_cache_dir`) so later
processes reuse what can be cached; umap's parallel kernels are not cacheable and compile in every new process.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cglib.evaluate.embeddings import EmbeddingStore, pixel_fingerprint
from cglib.figure_data import replottable
from cglib.magic.schema import MagicFile
from cglib.models import ClipModel
from cglib.viz.compare import PANELS_PER_ROW

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def configure_numba_cache(directory: str | Path | None = None) -> Path:
    """Point numba's compile cache at `directory` (default: $NUMBA_CACHE_DIR, else ~/.cache/cglib/numba)."""
    if directory is None:
        directory = os.environ.get("NUMBA_CACHE_DIR") or Path(
            os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cglib" / "numba"
    path = Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    if "numba" in sys.modules:  # numba reads the variable at import; set the live config as well
        import numba

        numba.config.CACHE_DIR = str(path)
    return path


# ---------------------------------------------------------------------------------------- embeddings
@dataclass
class GroupEmbeddings:
    """Unit embeddings of one model's test images and texts, with the l1 group of every row."""

    model: str
    images: np.ndarray  # (n, D)
    image_groups: list[str]
    texts: np.ndarray  # (m, D)
    text_groups: list[str]
    image_ids: list[str] = field(default_factory=list)

    def of(self, modality: str) -> tuple[np.ndarray, list[str]]:
        """(embeddings, l1 group per row) of 'image' or 'text'."""
        if modality == "image":
            return self.images, self.image_groups
        if modality == "text":
            return self.texts, self.text_groups
        raise ValueError(f"modality must be 'image' or 'text', got {modality!r}")


def group_texts(magic: MagicFile, image_ids: Sequence[str], text_source: str) -> tuple[list[str], list[str]]:
    """(texts, l1 group per text): the images' original captions, or their generalized captions (read through
    `MagicFile.generalized_texts`: each image's own, or once per group with magic.generalize: group)."""
    texts, groups = [], []
    if text_source == "captions":
        for image_id in image_ids:
            record = magic.images[image_id]
            texts += record.captions
            groups += [record.node] * len(record.captions)
    elif text_source == "generalized":
        if magic.per_image:  # each image's own captions
            sources = list(image_ids)
        else:  # one set per group: the texts of the group's first image (all its images share them)
            first: dict[str, str] = {}
            for image_id in image_ids:
                first.setdefault(magic.images[image_id].node, image_id)
            sources = list(first.values())
        for image_id in sources:
            captions = magic.generalized_texts(image_id)
            texts += captions
            groups += [magic.images[image_id].node] * len(captions)
    else:
        raise ValueError(f"text_source must be 'captions' or 'generalized', got {text_source!r}")
    return texts, groups


def embed_groups(bundle: ClipModel, name: str, magic: MagicFile, image_ids: Sequence[str], pixels: np.ndarray,
                 store: EmbeddingStore, text_source: str = "captions", image_source: str | None = None
                 ) -> GroupEmbeddings:
    """Encode images (uint8 rows of `pixels`, aligned with `image_ids`) and their texts with one model.

    Embeddings go through evaluation's `EmbeddingStore` (domain `viz-<text_source>`): cached on disk under keys
    that hash the towers' weights, the image ids and pixels, and the strings, so a rerun (the notebook, then
    `cglib figures`) computes nothing, and models sharing a frozen text tower encode the texts once.
    `image_source` fingerprints the pixels (default: their bytes)."""
    if len(pixels) != len(image_ids):
        raise ValueError(f"{len(pixels)} pixel rows for {len(image_ids)} image ids; pass them aligned")
    texts, text_groups = group_texts(magic, image_ids, text_source)
    source = image_source or pixel_fingerprint(pixels=pixels)
    emb = store.embed(name, f"viz-{text_source}", lambda: bundle, list(image_ids), source, lambda: pixels, texts)
    return GroupEmbeddings(model=name, images=emb.images, image_groups=[magic.images[i].node for i in image_ids],
                           texts=emb.text(texts), text_groups=text_groups, image_ids=list(image_ids))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def group_centroids(embeddings: np.ndarray, groups: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(sorted group ids, renormalised mean embedding per group)."""
    names = sorted(set(groups))
    index = {g: k for k, g in enumerate(names)}
    rows = np.array([index[g] for g in groups])
    sums = np.zeros((len(names), embeddings.shape[1]), dtype=np.float64)
    np.add.at(sums, rows, embeddings)
    return names, _unit(sums).astype(np.float32)


# ------------------------------------------------------------------------------------------------ UMAP
def umap_layout(points: np.ndarray, seed: int, n_neighbors: int = 15) -> np.ndarray:
    """2-d UMAP (cosine metric, fixed random_state: single-threaded and reproducible) of (n, D) points."""
    n = len(points)
    if n < 4:
        raise ValueError(f"UMAP needs at least 4 points, got {n}; there are too few test groups to draw")
    configure_numba_cache(os.environ.get("NUMBA_CACHE_DIR"))
    import umap

    reducer = umap.UMAP(n_components=2, n_neighbors=max(2, min(n_neighbors, n - 1)), metric="cosine",
                        random_state=seed, init="spectral" if n > 10 else "random")
    with warnings.catch_warnings():
        # umap warns that random_state disables parallelism: that is the reproducibility we asked for
        warnings.filterwarnings("ignore", message=".*n_jobs value 1 overridden.*")
        warnings.filterwarnings("ignore", message=".*random_state.*")
        return np.asarray(reducer.fit_transform(points), dtype=np.float64)


def trust_score(points: np.ndarray, layout: np.ndarray, n_neighbors: int = 5) -> tuple[float, int]:
    """sklearn trustworthiness (cosine in the original space) and the k used (k < n/2, as sklearn requires)."""
    from sklearn.manifold import trustworthiness

    k = max(1, min(n_neighbors, (len(points) - 1) // 2))
    return float(trustworthiness(points, layout, n_neighbors=k, metric="cosine")), k


def procrustes_align(layout: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Rotate/reflect, scale and shift `layout` onto `reference` (rows correspond); distances keep their ratios."""
    from scipy.linalg import orthogonal_procrustes

    a = layout - layout.mean(0)
    b = reference - reference.mean(0)
    rotation, _ = orthogonal_procrustes(a, b)
    scale = np.linalg.norm(b) / max(np.linalg.norm(a), 1e-12)
    return a @ rotation * scale + reference.mean(0)


@dataclass
class UmapPanel:
    """One model's 2-d map of its l1 group centroids of one modality."""

    model: str
    modality: str  # 'image' or 'text'
    groups: list[str]  # l1 id per point
    xy: np.ndarray  # (groups, 2)
    trust: float
    trust_k: int
    seconds: float  # time of the UMAP fit (the first one in a process includes numba compilation)


def umap_panels(embeddings: Sequence[GroupEmbeddings], seed: int, n_neighbors: int = 15, trust_neighbors: int = 5,
                modalities: Sequence[str] = ("image", "text"), align: bool = True) -> list[UmapPanel]:
    """One UMAP per model and modality of the l1 centroids, same seed, each aligned to the first model's panel.

    Image and text centroids get separate maps: CLIP's modality gap would otherwise split one joint map into
    two distant blobs and hide the structure inside each."""
    panels: list[UmapPanel] = []
    for modality in modalities:
        reference: UmapPanel | None = None
        for emb in embeddings:
            groups, points = group_centroids(*emb.of(modality))
            start = time.perf_counter()
            xy = umap_layout(points, seed, n_neighbors)
            seconds = time.perf_counter() - start
            trust, k = trust_score(points, xy, trust_neighbors)
            if align and reference is not None and reference.groups == groups:
                xy = procrustes_align(xy, reference.xy)
            panel = UmapPanel(model=emb.model, modality=modality, groups=groups, xy=xy, trust=trust, trust_k=k,
                              seconds=seconds)
            reference = reference or panel
            panels.append(panel)
    return panels


def _ancestor_or_self(magic: MagicFile, node: str, level: int) -> str:
    try:
        return magic.ancestor(node, level)
    except ValueError:  # chain stops early: colour by the highest ancestor it has
        current = magic.nodes[node]
        while current.primary_parent is not None:
            current = magic.nodes[current.primary_parent]
        return current.id


def readable_labels(xy: np.ndarray, limit: int, width: float = 0.22, height: float = 0.06) -> list[int]:
    """Rows to label: greedily, in row order, points whose name box (about `width` x `height` of the panel,
    to the right of the point) would not overprint a name already placed; at most `limit` of them."""
    span = np.where(np.ptp(xy, axis=0) > 0, np.ptp(xy, axis=0), 1.0)
    unit = xy / span
    chosen: list[int] = []
    for k, point in enumerate(unit):
        if len(chosen) >= limit:
            break
        if all(abs(point[0] - unit[c][0]) >= width or abs(point[1] - unit[c][1]) >= height for c in chosen):
            chosen.append(k)
    return chosen


UMAP_WIDTH = 8.6  # inches: at 150 dpi the panels of a row fit a 1,300 px page


def plot_umap_panels(panels: Sequence[UmapPanel], magic: MagicFile, color_level: int = 2,
                     label_max: int = 60) -> Figure:
    """Grid of UMAP panels (image centroids, then text centroids; one panel per model, at most 4 a row). A point's
    colour is its ancestor one level above `color_level` (a handful of colours) and its marker tells the
    `color_level` ancestors under the same colour apart; up to `label_max` l1 names per panel, where they do not
    overprint, each written towards the panel's centre so that it stays inside."""
    if not panels:
        raise ValueError("no UMAP panels to draw; compute them with umap_panels() first")
    parent_level = color_level + 1 if color_level < magic.l_max else None
    rows = []
    for panel in panels:
        for g, (x, y) in zip(panel.groups, panel.xy):
            cls = _ancestor_or_self(magic, g, color_level)
            parent = _ancestor_or_self(magic, g, parent_level) if parent_level else cls
            rows.append({"model": panel.model, "modality": panel.modality, "group": g, "name": magic.nodes[g].name,
                         "class": cls, "class_name": magic.nodes[cls].name, "parent": parent,
                         "parent_name": magic.nodes[parent].name, "x": float(x), "y": float(y)})
    meta = pd.DataFrame([{"model": p.model, "modality": p.modality, "trust": p.trust, "trust_k": p.trust_k}
                         for p in panels])
    return draw_umap_panels(pd.DataFrame(rows), meta, color_level=color_level, label_max=label_max,
                            parent_level=parent_level)


def _umap_styles(points: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """(colour, marker) per class: one colour per parent, markers in turn among a parent's classes (and, past
    the palette, shifted so that two parents sharing a colour never share a marker)."""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    parents = sorted(set(points["parent_name"]))
    style = {}
    for p, parent in enumerate(parents):
        classes = sorted(set(points.loc[points["parent_name"] == parent, "class"]),
                         key=lambda c: points.loc[points["class"] == c, "class_name"].iloc[0])
        for k, cls in enumerate(classes):
            style[cls] = (colours[p % len(colours)], MARKERS[(k + p // len(colours)) % len(MARKERS)])
    return style


@replottable
def draw_umap_panels(points: pd.DataFrame, panels: pd.DataFrame, color_level: int = 2, label_max: int = 60,
                     parent_level: int | None = 3) -> Figure:
    """The figure of `plot_umap_panels` from its tables: `points` (model, modality, group, name, class,
    class_name, parent, parent_name, x, y) and `panels` (model, modality, trust, trust_k)."""
    models = list(dict.fromkeys(panels["model"]))
    modalities = list(dict.fromkeys(panels["modality"]))
    style = _umap_styles(points)
    ncols = min(PANELS_PER_ROW, len(models))
    rows_per_modality = -(-len(models) // ncols)
    side = min(4.4, UMAP_WIDTH / ncols)
    fig, axes = plt.subplots(len(modalities) * rows_per_modality, ncols,
                             figsize=(side * ncols, side * len(modalities) * rows_per_modality + 0.8), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)  # panels of a short last row stay blank
    for _, panel in panels.iterrows():
        at = models.index(panel["model"])
        ax = axes[modalities.index(panel["modality"]) * rows_per_modality + at // ncols, at % ncols]
        ax.set_visible(True)
        mine = points[(points["model"] == panel["model"]) & (points["modality"] == panel["modality"])]
        xy = mine[["x", "y"]].to_numpy(float)
        for cls, part in mine.groupby("class", sort=False):  # one scatter per class: single points are slow
            ax.scatter(part["x"], part["y"], s=30, marker=style[cls][1], color=style[cls][0], edgecolors="white",
                       linewidths=0.4)
        ax.margins(0.06)
        ax.set_xticks([])
        ax.set_yticks([])
        middle = xy.mean(axis=0) if len(xy) else np.zeros(2)
        # a name box of 8.5 pt is about 1.2 x 0.33 in; as a share of the panel, so small panels label fewer points
        for k in readable_labels(xy, label_max, width=1.2 / side, height=0.33 / side):
            right, top = xy[k, 0] > middle[0], xy[k, 1] > middle[1]
            ax.annotate(mine["name"].iloc[k], xy[k], fontsize=8.5, alpha=0.85, textcoords="offset points",
                        xytext=(-3 if right else 3, -3 if top else 3), ha="right" if right else "left",
                        va="top" if top else "bottom", annotation_clip=True)
        ax.set_title(f"{panel['model']}: {panel['modality']} centroids\ntrustworthiness {panel['trust']:.2f} "
                     f"(k={int(panel['trust_k'])})", fontsize=10)
    classes = points.drop_duplicates("class").sort_values(["parent_name", "class_name"])
    handles = [Line2D([], [], linestyle="", marker=style[r["class"]][1], color=style[r["class"]][0],
                      label=r["class_name"] if parent_level is None or r["class_name"] == r["parent_name"]
                      else f"{r['class_name']} ({r['parent_name']})") for _, r in classes.iterrows()]
    ncol = min(len(handles), 3)
    title = (f"colour: l{parent_level} ancestor, marker: l{color_level} ancestor under it" if parent_level
             else f"colour: l{color_level} ancestor")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8,
               frameon=False, title=title, title_fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------- dual effect
def spread_and_separation(embeddings: np.ndarray, groups: Sequence[str]) -> dict[str, float]:
    """Within-group spread (mean over groups with >= 2 members of the mean cosine distance to the group's
    centroid) and separation (mean cosine distance between group centroids)."""
    names, centroids = group_centroids(embeddings, groups)
    index = {g: k for k, g in enumerate(names)}
    rows = np.array([index[g] for g in groups])
    dist = 1.0 - np.sum(_unit(embeddings) * centroids[rows], axis=1)
    sizes = np.bincount(rows, minlength=len(names))
    per_group = np.bincount(rows, weights=dist, minlength=len(names)) / np.maximum(sizes, 1)
    multi = sizes >= 2
    within = float(per_group[multi].mean()) if multi.any() else float("nan")
    pairs = list(combinations(range(len(names)), 2))
    sims = centroids @ centroids.T
    between = float(np.mean([1.0 - sims[a, b] for a, b in pairs])) if pairs else float("nan")
    return {"groups": len(names), "singleton_groups": int((~multi).sum()), "within": within, "between": between,
            "ratio": within / between if between > 0 else float("nan")}


def dual_effect_table(embeddings: Sequence[GroupEmbeddings], magic: MagicFile,
                      levels: Sequence[int] | None = None) -> pd.DataFrame:
    """Per model, modality and level: within-group spread, between-centroid distance and their ratio."""
    levels = list(levels) if levels is not None else list(range(1, magic.l_max + 1))
    rows = []
    for emb in embeddings:
        for modality in ("image", "text"):
            x, l1 = emb.of(modality)
            for level in levels:
                groups = [_ancestor_or_self(magic, g, level) for g in l1]
                rows.append({"model": emb.model, "modality": modality, "level": level,
                             **spread_and_separation(x, groups)})
    return pd.DataFrame(rows)


def coincident_points(rows: pd.DataFrame, x: str, y: str, digits: int = 6) -> list[list[str]]:
    """Models whose points (x, y) are the same to `digits` decimals, one list per shared spot of 2 or more."""
    spots = rows.groupby([rows[x].round(digits), rows[y].round(digits)], sort=False)["model"].apply(list)
    return [models for models in spots if len(models) > 1]


@replottable
def plot_measured_dual_effect(table: pd.DataFrame, level: int = 1) -> Figure:
    """Left: within-group spread against between-centroid distance at `level`, one point per model and
    modality (lower-right is tighter groups further apart). Right: the ratio per level and model. One legend
    (colour: model, marker: modality) under both panels; models whose text points coincide (their text tower
    is the same: frozen, or shared) are said to, on the panel and under the figure."""
    if table.empty:
        raise ValueError("the dual-effect table is empty; compute it with dual_effect_table() first")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    models = list(dict.fromkeys(table["model"]))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8.6, 3.6))
    at = table[table["level"] == level]
    for k, model in enumerate(models):
        for modality, marker in (("image", "o"), ("text", "^")):
            row = at[(at["model"] == model) & (at["modality"] == modality)]
            if row.empty:
                continue
            ax.scatter(row["between"], row["within"], color=colours[k % len(colours)], marker=marker, s=50,
                       edgecolors="white", linewidths=0.5)
        ratio = table[(table["model"] == model) & (table["modality"] == "image")].sort_values("level")
        ax2.plot(ratio["level"], ratio["ratio"], marker="o", color=colours[k % len(colours)])
    shared = coincident_points(at[at["modality"] == "text"], "between", "within")
    for group in shared:
        spot = at[(at["modality"] == "text") & (at["model"] == group[0])].iloc[0]
        ax.annotate(f"text points of {len(group)} models\non one spot", (spot["between"], spot["within"]),
                    xytext=(0.5, 0.92), textcoords="axes fraction", ha="center", va="top", fontsize=8,
                    arrowprops={"arrowstyle": "->", "color": "0.3", "linewidth": 0.8})
    ax.set_xlabel(f"between-centroid cosine distance (l{level})")
    ax.set_ylabel(f"within-group distance to centroid (l{level})")
    ax.set_title("Dual effect: spread vs separation", fontsize=11)
    ax.margins(0.12)
    ax2.set_xlabel("level")
    ax2.set_ylabel("within / between (images)")
    ax2.set_xticks(sorted(table["level"].unique()))
    ax2.set_title("Lower = tighter groups, further apart", fontsize=11)
    handles = [Line2D([], [], color=colours[k % len(colours)], marker="s", linestyle="", label=model)
               for k, model in enumerate(models)]
    handles += [Line2D([], [], color="0.3", marker=m, linestyle="", label=f"{modality} centroids")
                for m, modality in (("o", "image"), ("^", "text"))]
    legend = fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=8,
                        frameon=False)
    if shared:
        said = "; ".join(", ".join(group) for group in shared)
        note = (f"Text points that coincide: {said}. These models encode texts with the same text tower (frozen "
                "in training, or shared), so their text centroids are identical.")
        fig.text(0.5, 0.0, textwrap.fill(note, 130), ha="center", va="top", fontsize=8,
                 transform=fig.transFigure)
        legend.set_bbox_to_anchor((0.5, -0.03 - 0.03 * (len(note) // 130 + 1)), transform=fig.transFigure)
    fig.tight_layout()
    return fig


def dual_effect_summary(table: pd.DataFrame, level: int = 1, modality: str = "image",
                        baseline: str = "zero-shot") -> list[str]:
    """One sentence per model: how its within-group spread and between-centroid distance changed vs `baseline`."""
    rows = table[(table["level"] == level) & (table["modality"] == modality)].set_index("model")
    if baseline not in rows.index:
        return [f"no {baseline} row at l{level} ({modality}); nothing to compare against"]
    base = rows.loc[baseline]
    lines = []
    for model, row in rows.drop(index=baseline).iterrows():
        lines.append(f"{model}: within-group spread {row['within']:.3g} ({row['within'] / base['within'] - 1:+.0%} vs "
                     f"{baseline}), between-centroid distance {row['between']:.3g} "
                     f"({row['between'] / base['between'] - 1:+.0%}), ratio {row['ratio']:.3g} "
                     f"(was {base['ratio']:.3g})")
    return lines
