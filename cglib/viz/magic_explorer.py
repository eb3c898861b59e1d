"""An ipywidgets explorer of the MAGIC DAG: pick a level and a node; see its chain, parents with counts, children,
images, captions, generalized captions and hard negatives.

`describe_node` and `node_html` are plain functions (tested headless); the widget only wires dropdowns to them
and draws sample images with matplotlib into an `Output`, so it also builds and updates without a browser.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from cglib.data.dataset import CaptionDataset
from cglib.magic.schema import MagicFile


def describe_node(magic: MagicFile, node: str, max_images: int = 6, max_captions: int = 8) -> dict:
    """Everything the explorer shows about one node, as plain data."""
    n = magic.nodes[node]
    chain, current = [node], n
    while current.primary_parent:
        chain.append(current.primary_parent)
        current = magic.nodes[current.primary_parent]
    images = magic.images_of(node)
    captions = [c for i in images[:max_images] for c in magic.images[i].captions][:max_captions]
    return {
        "id": node, "name": n.name, "level": n.level, "n_images": n.n_images,
        "n_train": len(magic.images_of(node, "train")), "n_test": len(magic.images_of(node, "test")),
        "chain": [magic.nodes[c].name for c in chain],
        "parents": sorted(n.parents.items(), key=lambda kv: (-kv[1], kv[0])), "primary_parent": n.primary_parent,
        "children": magic.children(node), "merged_from": n.merged_from,
        "images": images[:max_images], "captions": captions,
        "generalized_captions": n.generalized_captions, "generalized_fallback": n.generalized_fallback,
        "hard_negatives": [(m, n.negative_similarity[m]) for m in n.hard_negatives],
        "fallback_negatives": [(m, n.negative_similarity[m]) for m in n.fallback_negatives],
    }


def _items(values: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in values) + "</ul>" if values else "<i>none</i>"


def node_html(info: dict) -> str:
    """An HTML summary of `describe_node`'s result."""
    e = html.escape
    parents = ", ".join(f"{e(p)} ({c}{', primary' if p == info['primary_parent'] else ''})"
                        for p, c in info["parents"]) or "none (top level)"
    hard = [f"{m} (cos {s:.3f})" for m, s in info["hard_negatives"]]
    fallback = [f"{m} (cos {s:.3f}, fallback)" for m, s in info["fallback_negatives"]]
    flag = " <b>(LLM_gen failed: original captions)</b>" if info["generalized_fallback"] else ""
    return (f"<h4>{e(info['id'])}: {info['n_images']} images ({info['n_train']} train, {info['n_test']} test)</h4>"
            f"<p><b>chain</b>: {' &rarr; '.join(e(c) for c in info['chain'])}</p>"
            f"<p><b>parents</b>: {parents}</p>"
            f"<p><b>children</b> (primary): {e(', '.join(info['children'])) or 'none'}</p>"
            f"<p><b>merged from</b>: {e(', '.join(info['merged_from'])) or 'none'}</p>"
            f"<p><b>generalized captions</b>{flag}:</p>{_items(info['generalized_captions'])}"
            f"<p><b>hard negatives</b>:</p>{_items(hard + fallback)}"
            f"<p><b>captions of the first images</b>:</p>{_items(info['captions'])}")


class MagicExplorer(widgets.VBox):
    """Level and node dropdowns -> node summary (HTML) and a strip of its images (when a dataset is given)."""

    def __init__(self, magic: MagicFile, dataset: CaptionDataset | None = None, max_images: int = 6) -> None:
        self.magic, self.dataset, self.max_images = magic, dataset, max_images
        levels = [k for k in range(1, magic.l_max + 1) if magic.nodes_at(k)]
        self.level = widgets.Dropdown(options=[(f"l{k}", k) for k in levels], value=levels[0], description="level")
        self.node = widgets.Dropdown(description="node", layout=widgets.Layout(width="480px"))
        self.summary = widgets.HTML()
        self.pictures = widgets.Output()
        self.level.observe(lambda change: self._fill_nodes(), names="value")
        self.node.observe(lambda change: self.show(change["new"]), names="value")
        super().__init__([widgets.HBox([self.level, self.node]), self.summary, self.pictures])
        self._fill_nodes()

    def _fill_nodes(self) -> None:
        nodes = sorted(self.magic.nodes_at(self.level.value), key=lambda n: (-n.n_images, n.id))
        self.node.options = [(f"{n.name} ({n.n_images})", n.id) for n in nodes]
        if nodes:
            self.node.value = nodes[0].id

    def show(self, node: str | None) -> dict | None:
        """Display one node (also callable directly, e.g. headless); returns its description."""
        if node is None:
            return None
        info = describe_node(self.magic, node, max_images=self.max_images)
        self.summary.value = node_html(info)
        self.pictures.clear_output(wait=True)
        if self.dataset is not None and info["images"]:
            fig, axes = plt.subplots(1, len(info["images"]), figsize=(1.6 * len(info["images"]), 1.8), squeeze=False)
            for ax, image_id in zip(axes[0], info["images"]):
                ax.imshow(self.dataset.load_image(image_id))
                ax.set_title(f"{image_id}\n{self.magic.images[image_id].split}", fontsize=7)
                ax.axis("off")
            with self.pictures:
                display(fig)
            plt.close(fig)
        return info


def magic_explorer(magic: MagicFile, dataset: CaptionDataset | None = None, max_images: int = 6) -> MagicExplorer:
    """The MAGIC DAG explorer widget (pass the dataset to see images)."""
    return MagicExplorer(magic, dataset, max_images=max_images)
