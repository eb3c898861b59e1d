"""Figures and tables of a MAGIC dataset: images per node by level, the merge log, and a drawing of a subtree."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cglib.figure_data import replottable
from cglib.magic.calibration import level_thresholds, nearest_neighbour_cosines
from cglib.magic.schema import MagicFile


def plot_level_distributions(magic: MagicFile, size_min: int | None = None) -> Figure:
    """Nodes per level, then one panel per level: histogram of images per node (log scale), with the size_min
    line; at most 3 panels a row."""
    nodes = pd.DataFrame([{"level": k, "node": n.id, "n_images": n.n_images} for k in range(1, magic.l_max + 1)
                          for n in magic.nodes_at(k)], columns=["level", "node", "n_images"])
    return draw_level_distributions(nodes, magic.l_max, size_min)


@replottable
def draw_level_distributions(nodes: pd.DataFrame, l_max: int, size_min: int | None = None) -> Figure:
    """The figure of `plot_level_distributions` from one row per node (level, node, n_images)."""
    levels = list(range(1, l_max + 1))
    cols = min(3, len(levels) + 1)  # three 2.8 in panels fit a 1,300 px page at 150 dpi
    rows = -(-(len(levels) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.ravel()[len(levels) + 1:]:
        fig.delaxes(ax)  # an empty cell of the grid; the figure keeps one axes per panel
    axes = axes.ravel()
    counts = [int((nodes["level"] == k).sum()) for k in levels]
    axes[0].bar([f"l{k}" for k in levels], counts, color="C0")
    axes[0].set(title="nodes per level", ylabel="nodes")
    for ax, k in zip(axes[1:], levels):
        sizes = nodes.loc[nodes["level"] == k, "n_images"].to_numpy(int)
        bins = np.logspace(0, np.log10(max(2, sizes.max(initial=1)) + 1), 20)
        ax.hist(np.maximum(sizes, 1), bins=bins, color=f"C{k}")
        ax.set_xscale("log")
        ax.set_title(f"l{k}: {len(sizes)} nodes, median {np.median(sizes) if len(sizes) else 0:.0f}", fontsize=11)
        ax.set_xlabel("images per node")
        if size_min:
            ax.axvline(size_min, color="k", ls="--", lw=1)
    for ax in axes[cols::cols]:  # the first panel of every later row (the first row's is the bar chart)
        ax.set_ylabel("nodes")
    fig.tight_layout()
    return fig


def merge_log(magic: MagicFile) -> pd.DataFrame:
    """Merges and removals in order: level, action, node, into (merges), images, similarity, round."""
    rows = [{"level": m.level, "action": "merge", "node": m.source, "into": m.target, "images": m.n_images,
             "similarity": round(m.similarity, 3), "round": m.round} for m in magic.merges]
    rows += [{"level": r.level, "action": "remove", "node": r.node, "into": "", "images": r.n_images,
              "similarity": None if r.similarity is None else round(r.similarity, 3), "round": None,
              "best match": r.best_match} for r in magic.removals]
    columns = ["level", "action", "node", "into", "images", "similarity", "round", "best match"]
    return pd.DataFrame(rows, columns=columns).sort_values(["level", "action"], kind="stable").reset_index(drop=True)


def subtree(magic: MagicFile, root: str, max_per_node: int = 6) -> nx.DiGraph:
    """The nodes under `root` along primary parents (largest `max_per_node` children of each node), with
    every edge among them (non-primary ones too, flagged)."""
    keep, frontier = {root}, [root]
    while frontier:
        node = frontier.pop()
        children = sorted(magic.children(node), key=lambda c: (-magic.nodes[c].n_images, c))[:max_per_node]
        keep.update(children)
        frontier += children
    graph = nx.DiGraph()
    for n in keep:
        node = magic.nodes[n]
        graph.add_node(n, level=node.level, name=node.name, n_images=node.n_images)
    for n in keep:
        for parent, count in magic.nodes[n].parents.items():
            if parent in keep:
                graph.add_edge(n, parent, count=count, primary=parent == magic.nodes[n].primary_parent)
    return graph


def _level_layout(magic: MagicFile, graph: nx.DiGraph, root: str) -> dict[str, tuple[float, float]]:
    """Rows by level (root on top); each row ordered by its primary parent's position, so edges rarely cross."""
    order = {root: 0}
    pos = {root: (0.5, float(magic.nodes[root].level))}
    for level in range(magic.nodes[root].level - 1, 0, -1):
        row = sorted((n for n, lvl in graph.nodes(data="level") if lvl == level),
                     key=lambda n: (order.get(magic.nodes[n].primary_parent, 0), -magic.nodes[n].n_images, n))
        for k, n in enumerate(row):
            order[n] = k
            pos[n] = ((k + 0.5) / len(row), float(level))
    return pos


def draw_subtree(magic: MagicFile, root: str, max_per_node: int = 6) -> Figure:
    """Draw a subtree level by level (root on top): edge width ~ supporting images, minority edges dashed."""
    graph = subtree(magic, root, max_per_node)
    pos = _level_layout(magic, graph, root)
    nodes = pd.DataFrame([{"node": n, **graph.nodes[n], "x": pos[n][0], "y": pos[n][1]} for n in graph])
    edges = pd.DataFrame([{"child": u, "parent": v, **graph.edges[u, v]} for u, v in graph.edges],
                         columns=["child", "parent", "count", "primary"])
    return draw_subtree_tables(nodes, edges, root, magic.l_max)


@replottable
def draw_subtree_tables(nodes: pd.DataFrame, edges: pd.DataFrame, root: str, l_max: int) -> Figure:
    """The figure of `draw_subtree` from its node table (node, level, name, n_images, x, y) and edge table
    (child, parent, count, primary)."""
    graph = nx.DiGraph()
    for _, row in nodes.iterrows():
        graph.add_node(row["node"], level=int(row["level"]), name=row["name"], n_images=int(row["n_images"]))
    for _, row in edges.iterrows():
        graph.add_edge(row["child"], row["parent"], count=int(row["count"]), primary=bool(row["primary"]))
    pos = {row["node"]: (float(row["x"]), float(row["y"])) for _, row in nodes.iterrows()}
    root_level, root_images = graph.nodes[root]["level"], graph.nodes[root]["n_images"]
    widest = max(sum(1 for _, lvl in graph.nodes(data="level") if lvl == k) for k in range(1, l_max + 1))
    # at most 8.4 in wide (1,260 px at 150 dpi); names wrap to keep a crowded row's labels apart
    fig, ax = plt.subplots(figsize=(min(8.4, max(6.0, 1.4 * widest)), 1.6 * (root_level + 1)))
    top = max(c for _, _, c in graph.edges(data="count")) if graph.number_of_edges() else 1
    for primary, style in ((True, "solid"), (False, "dashed")):
        edges = [(u, v) for u, v, p in graph.edges(data="primary") if p == primary]
        nx.draw_networkx_edges(graph, pos, edgelist=edges, ax=ax, style=style, arrows=True, arrowsize=8,
                               width=[0.5 + 3.0 * graph.edges[e]["count"] / top for e in edges],
                               edge_color="0.35" if primary else "C3")
    sizes = [120 + 600 * np.sqrt(graph.nodes[n]["n_images"] / max(1, root_images)) for n in graph]
    colours = [f"C{graph.nodes[n]['level']}" for n in graph]
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_size=sizes, node_color=colours, alpha=0.85)
    labels = {n: f"{textwrap.fill(graph.nodes[n]['name'], 14)}\n({graph.nodes[n]['n_images']})" for n in graph}
    nx.draw_networkx_labels(graph, pos, labels=labels, ax=ax, font_size=8)
    ax.set_title(textwrap.fill(f"subtree of {root} (images in brackets; dashed red: minority parent edges)", 80),
                 fontsize=11)
    ax.axis("off")
    fig.tight_layout()
    return fig


def generalized_examples(magic: MagicFile, n_nodes: int = 3, n_captions: int = 3) -> pd.DataFrame:
    """Original captions beside generalized captions for the largest l1 nodes (per image with generalize: image:
    each row is one image, its first caption and its own first generalized caption)."""
    nodes = sorted(magic.nodes_at(1), key=lambda n: (-n.n_images, n.id))[:n_nodes]
    rows = []
    for n in nodes:
        image_ids = magic.images_of(n.id)[:n_captions]
        originals = [magic.images[i].captions[0] for i in image_ids if magic.images[i].captions]
        if magic.per_image:
            for i in image_ids:
                texts = magic.generalized_texts(i)
                rows.append({"node": n.name, "image": i, "original caption": magic.images[i].captions[0],
                             "generalized caption": texts[0] if texts else "",
                             "fallback": magic.images[i].generalized_fallback})
            continue
        for k in range(n_captions):
            rows.append({"node": n.name, "original caption": originals[k] if k < len(originals) else "",
                         "generalized caption": n.generalized_captions[k] if k < len(n.generalized_captions) else "",
                         "fallback": n.generalized_fallback})
    return pd.DataFrame(rows)


def negatives_table(magic: MagicFile, level: int = 1, n_nodes: int = 10) -> pd.DataFrame:
    """Per node of one level (largest first): its hard negatives with cosines, and fallbacks flagged."""
    nodes = sorted(magic.nodes_at(level), key=lambda n: (-n.n_images, n.id))[:n_nodes]
    rows = [{"node": n.name, "images": n.n_images,
             "hard negatives": ", ".join(f"{magic.nodes[m].name} ({n.negative_similarity[m]:.2f})"
                                         for m in n.hard_negatives),
             "fallback negatives": ", ".join(f"{magic.nodes[m].name} ({n.negative_similarity[m]:.2f})"
                                             for m in n.fallback_negatives)} for n in nodes]
    return pd.DataFrame(rows)


def plot_nearest_neighbour_cosines(magic: MagicFile, threshold: float | str | None = None) -> Figure:
    """One panel per level: each node's nearest-neighbour cosine (calibration.py), the level's hard-negative
    threshold drawn on it, and the share of nodes with a real hard negative in the title (at most 2 panels a
    row)."""
    table = nearest_neighbour_cosines(magic)
    thresholds = level_thresholds(magic, threshold)
    return draw_nearest_neighbour_cosines(
        table, pd.DataFrame({"level": list(thresholds), "threshold": list(thresholds.values())}))


@replottable
def draw_nearest_neighbour_cosines(table: pd.DataFrame, thresholds: pd.DataFrame) -> Figure:
    """The figure of `plot_nearest_neighbour_cosines` from `calibration.nearest_neighbour_cosines`' table and
    the threshold per level (level, threshold)."""
    thresholds = dict(zip(thresholds["level"].astype(int), thresholds["threshold"].astype(float)))
    levels = sorted(table["level"].unique())
    cols = min(2, len(levels))  # two 4.1 in panels fit a 1,300 px page at 150 dpi, titles unshrunk
    rows = -(-len(levels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.1 * cols, 2.5 * rows), squeeze=False, sharex=True)
    for ax, level in zip(axes.ravel(), levels):
        part = table[table["level"] == level]
        cos = part["nn_cosine"].dropna().to_numpy(float)
        ax.hist(cos, bins=np.linspace(min(-0.1, cos.min(initial=0.0)), 1.0, 23), color=f"C{level}")
        threshold = thresholds[level]
        ax.axvline(threshold, color="k", ls="--", lw=1)  # the threshold: nodes right of it have a hard negative
        ax.set(title=f"l{level}: {100 * part['has_hard_negative'].mean():.0f}% of {len(part)} above {threshold:.2f}",
               xlabel="nearest-neighbour cosine")
    for ax in axes.ravel()[len(levels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("nodes")
    fig.suptitle("hard negatives: each node's most similar same-level node; dashed: magic.hard_negative_sim",
                 fontsize=10)
    fig.tight_layout()
    return fig
