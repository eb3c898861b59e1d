"""Tables and figures of notebook 01: dataset statistics, an image grid with captions, the concept taxonomy.

Works for any `CaptionDataset` (synthetic world, COCO, HierarCaps); the taxonomy views are for the synthetic
world, whose ground-truth hierarchy is known.
"""

from __future__ import annotations

import textwrap
from collections import Counter

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cglib.data.dataset import CaptionDataset, ImageLoadError
from cglib.data.taxonomy import Taxonomy
from cglib.figure_data import replottable
from cglib.viz.style import PAGE_WIDTH, fit_title


def caption_statistics(dataset: CaptionDataset) -> dict:
    """Counts of images and captions, captions per image, caption length in words, vocabulary and skipped items."""
    per_image = np.array([len(dataset.captions[i]) for i in dataset.image_ids])
    words = [c.split() for i in dataset.image_ids for c in dataset.captions[i]]
    lengths = np.array([len(w) for w in words])
    vocabulary = {w.strip(".,;:!?\"'()").lower() for ws in words for w in ws}
    return {
        "source": dataset.source,
        "images": len(dataset),
        "captions": int(per_image.sum()),
        "captions_per_image": {"min": int(per_image.min()), "mean": float(per_image.mean()),
                               "max": int(per_image.max())},
        "caption_words": {"min": int(lengths.min()), "mean": float(lengths.mean()),
                          "median": float(np.median(lengths)), "max": int(lengths.max())},
        "vocabulary": len(vocabulary - {""}),
        "skipped": {reason: int(n) for reason, n in sorted(dataset.skipped.items())},
    }


def statistics_table(stats: dict) -> pd.DataFrame:
    """`caption_statistics` as a two-column table (quantity, value) for display."""
    rows = [("source", stats["source"]), ("images", stats["images"]), ("captions", stats["captions"])]
    rows += [(f"captions per image ({k})", round(v, 2)) for k, v in stats["captions_per_image"].items()]
    rows += [(f"caption words ({k})", round(v, 2)) for k, v in stats["caption_words"].items()]
    rows.append(("vocabulary (distinct words)", stats["vocabulary"]))
    rows += [(f"skipped: {reason}", n) for reason, n in stats["skipped"].items()] or [("skipped", 0)]
    return pd.DataFrame(rows, columns=["quantity", "value"])


def caption_length_figure(dataset: CaptionDataset) -> Figure:
    """Histogram of caption lengths in words."""
    lengths = pd.DataFrame([{"image_id": i, "words": len(c.split())} for i in dataset.image_ids
                            for c in dataset.captions[i]])
    return draw_caption_lengths(lengths, dataset.source)


@replottable
def draw_caption_lengths(lengths: pd.DataFrame, source: str) -> Figure:
    """Histogram of the `words` column (one row per caption), one bar per length."""
    words = lengths["words"].to_numpy(int)
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.hist(words, bins=np.arange(words.min(), words.max() + 2) - 0.5)
    ax.set_xlabel("words per caption")
    ax.set_ylabel("captions")
    ax.set_title(f"Caption length ({source}, {len(words):,} captions)")
    return fig


def sample_ids(dataset: CaptionDataset, n: int, seed: int = 0) -> list[str]:
    """`n` image ids drawn without replacement, reproducibly, in dataset order."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(dataset), size=min(n, len(dataset)), replace=False))
    return [dataset.image_ids[r] for r in rows]


def image_grid(dataset: CaptionDataset, n: int = 12, columns: int = 4, seed: int = 0,
               ground_truth: dict[str, list[str]] | None = None, caption_width: int = 30,
               caption_lines: int = 3) -> Figure:
    """A grid of `n` random images, each with its first caption (and its ground-truth l1 concept when given)."""
    rows, images = [], []
    for image_id in sample_ids(dataset, n, seed):
        try:
            images.append(np.asarray(dataset.load_image(image_id)))
            readable = True
        except ImageLoadError:
            readable = False
        rows.append({"image_id": image_id, "caption": dataset.captions[image_id][0], "readable": readable,
                     "label": ground_truth[image_id][0] if ground_truth is not None else ""})
    return draw_image_grid(pd.DataFrame(rows), images, dataset.source, columns=columns,
                           labelled=ground_truth is not None, caption_width=caption_width,
                           caption_lines=caption_lines)


@replottable
def draw_image_grid(shown: pd.DataFrame, images: list[np.ndarray], source: str, columns: int = 4,
                    labelled: bool = False, caption_width: int = 30, caption_lines: int = 3) -> Figure:
    """The grid of `image_grid`: `shown` has one row per cell (image_id, caption, readable, label); `images` holds
    the readable ones' pixels in the same order."""
    rows = int(np.ceil(len(shown) / columns))
    width = min(2.8, PAGE_WIDTH / columns)  # the grid fits a 1,300 px page at 150 dpi
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, (width + 0.7) * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    pixels = iter(images)
    for ax, (_, row) in zip(axes.ravel(), shown.iterrows()):
        if not row["readable"]:
            ax.text(0.5, 0.5, f"{row['image_id']}\n(unreadable)", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.imshow(next(pixels), interpolation="nearest")
        lines = textwrap.wrap(row["caption"], caption_width)
        caption = "\n".join(lines[:caption_lines]) + (" ..." if len(lines) > caption_lines else "")
        ax.set_title(caption, fontsize=8, loc="left")
        if labelled:
            ax.text(0.02, 0.02, row["label"], transform=ax.transAxes, fontsize=8, color="white",
                    bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.5, "edgecolor": "none"})
    skipped = int((~shown["readable"].astype(bool)).sum())
    fig.suptitle(fit_title(f"{source}: {len(shown)} random images with one caption each"
                           + (" (label: ground-truth l1 concept, never in a caption)" if labelled else "")
                           + (f"; {skipped} unreadable" if skipped else ""), fig, 10), fontsize=10)
    fig.tight_layout()
    return fig


def taxonomy_graph(taxonomy: Taxonomy) -> nx.DiGraph:
    """The taxonomy as a directed graph parent -> child, with each node's `level` attribute."""
    graph = nx.DiGraph()
    for name, level in taxonomy.level_of.items():
        graph.add_node(name, level=level)
    for child, parent in taxonomy.parents.items():
        if child in taxonomy.level_of:
            graph.add_edge(parent, child)
    return graph


def taxonomy_text_tree(taxonomy: Taxonomy) -> str:
    """The taxonomy as an indented text tree from the top level down, l1 leaves listed on their parent's line."""
    graph = taxonomy_graph(taxonomy)
    lines: list[str] = []

    def walk(node: str, depth: int) -> None:
        children = list(graph.successors(node))
        if children and all(graph.nodes[c]["level"] == 1 for c in children):
            lines.append(f"{'    ' * depth}{node} (l2): {', '.join(children)}")
            return
        lines.append(f"{'    ' * depth}{node} (l{graph.nodes[node]['level']})")
        for child in children:
            walk(child, depth + 1)

    for top in taxonomy.names(taxonomy.levels):
        walk(top, 0)
    return "\n".join(lines)


def level_counts(taxonomy: Taxonomy, ground_truth: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """Nodes per level and, with ground truth, images per node (mean, min, max), as in the paper's Table 1."""
    rows = []
    per_level = [Counter(chain[lvl] for chain in ground_truth.values()) if ground_truth else None
                 for lvl in range(taxonomy.levels)]
    for level in range(1, taxonomy.levels + 1):
        row: dict = {"level": f"l{level}", "nodes": len(taxonomy.names(level))}
        counts = per_level[level - 1]
        if counts:
            sizes = np.array([counts.get(name, 0) for name in taxonomy.names(level)])
            row.update({"images per node (mean)": round(float(sizes.mean()), 1), "min": int(sizes.min()),
                        "max": int(sizes.max())})
        rows.append(row)
    return pd.DataFrame(rows)


def taxonomy_figure(taxonomy: Taxonomy) -> Figure:
    """The taxonomy drawn left (l1) to right (top level); every parent sits at the mean height of its children."""
    graph = taxonomy_graph(taxonomy)
    leaves = [n for top in taxonomy.names(taxonomy.levels) for n in nx.dfs_preorder_nodes(graph, top)
              if graph.nodes[n]["level"] == 1]
    pos = {leaf: (1.0, -float(i)) for i, leaf in enumerate(leaves)}
    for level in range(2, taxonomy.levels + 1):
        for node in taxonomy.names(level):
            ys = [pos[c][1] for c in graph.successors(node)]
            pos[node] = (float(level), float(np.mean(ys)))
    tops = taxonomy.names(taxonomy.levels)
    nodes = pd.DataFrame([{"name": node, "level": graph.nodes[node]["level"],
                           "parent": taxonomy.parents.get(node, ""), "x": x, "y": y,
                           "top": tops.index(taxonomy.chain(next(leaf for leaf in leaves
                                                                 if node in taxonomy.chain(leaf)))[-1])}
                          for node, (x, y) in pos.items()])
    return draw_taxonomy(nodes)


@replottable
def draw_taxonomy(nodes: pd.DataFrame) -> Figure:
    """The drawing of `taxonomy_figure` from its node table (name, level, parent, x, y, top: index of the
    top-level ancestor, which picks the colour)."""
    levels = int(nodes["level"].max())
    n_leaves = int((nodes["level"] == 1).sum())
    at = {row["name"]: (row["x"], row["y"]) for _, row in nodes.iterrows()}
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 0.2 * n_leaves + 1.0))
    for _, row in nodes.iterrows():
        if row["parent"] in at:
            (x0, y0), (x1, y1) = at[row["parent"]], at[row["name"]]
            ax.plot([x0, x1], [y0, y1], color="#999999", linewidth=0.8, zorder=1)
    palette = plt.get_cmap("tab10")
    for _, row in nodes.iterrows():
        # An opaque label box hides the edge under the label, so edges seem to leave from the label's end.
        ax.text(row["x"], row["y"], row["name"], fontsize=8, va="center", ha="left",
                color=palette(int(row["top"]) % 10), zorder=3,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    for level in range(1, levels + 1):
        ax.text(level, 1.2, f"l{level} ({int((nodes['level'] == level).sum())} nodes)", fontsize=10,
                fontweight="bold", ha="left", va="bottom")
    ax.set_xlim(0.9, levels + 0.9)
    ax.set_ylim(-n_leaves, 2.5)
    ax.axis("off")
    ax.set_title("Ground-truth concept taxonomy of the synthetic world")
    fig.tight_layout()
    return fig
