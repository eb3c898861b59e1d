"""An ipywidgets explorer of the MAGIC DAG: pick a level and a node; see its chain, parents with counts, children,
images, captions, generalized captions and hard negatives.

`describe_node` and `node_html` are plain functions (tested headless); the widget only wires dropdowns to them
and draws sample images with matplotlib into an `Output`, so it also builds and updates without a browser.
Headless runs (papermill, `cglib run`; see `cglib.frontend`) build no widget and show the static rendering.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import Image, display

from cglib.data.dataset import CaptionDataset
from cglib.frontend import explorer_mimebundle, figure_png, headless, png_img_tag
from cglib.magic.schema import MagicFile


def describe_node(magic: MagicFile, node: str, max_images: int = 6, max_captions: int = 8,
                  max_generalized: int = 2) -> dict:
    """Everything the explorer shows about one node, as plain data.

    `image_generalized` lists, for the first images, the generalized captions that pair with each
    (`MagicFile.generalized_texts`, at most `max_generalized` each): per image when `magic.generalize` is
    "image" (the node's own list is then empty), the l1 group's otherwise (shown for nodes above l1 only).
    """
    n = magic.nodes[node]
    chain, current = [node], n
    while current.primary_parent:
        chain.append(current.primary_parent)
        current = magic.nodes[current.primary_parent]
    images = magic.images_of(node)
    captions = [c for i in images[:max_images] for c in magic.images[i].captions][:max_captions]
    per_image = magic.per_image or n.level > 1
    image_generalized = [(i, magic.generalized_texts(i)[:max_generalized], magic.images[i].generalized_fallback
                          if magic.per_image else magic.nodes[magic.images[i].node].generalized_fallback)
                         for i in images[:max_images]] if per_image else []
    return {
        "id": node, "name": n.name, "level": n.level, "n_images": n.n_images,
        "n_train": len(magic.images_of(node, "train")), "n_test": len(magic.images_of(node, "test")),
        "chain": [magic.nodes[c].name for c in chain],
        "parents": sorted(n.parents.items(), key=lambda kv: (-kv[1], kv[0])), "primary_parent": n.primary_parent,
        "children": magic.children(node), "merged_from": n.merged_from,
        "images": images[:max_images], "captions": captions,
        "generalized_captions": n.generalized_captions, "generalized_fallback": n.generalized_fallback,
        "generalize": magic.generalize, "image_generalized": image_generalized,
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
    per_image = [f"{i}: " + " | ".join(texts) + (" (LLM_gen failed: original captions)" if failed else "")
                 for i, texts, failed in info.get("image_generalized", []) if texts]
    # image mode keeps generalized captions on the images: an empty node-level list says nothing there
    node_level = (f"<p><b>generalized captions</b>{flag}:</p>{_items(info['generalized_captions'])}"
                  if info["generalized_captions"] or info.get("generalize", "group") == "group" else "")
    per_image_html = (f"<p><b>generalized captions of its first images</b> ({e(info.get('generalize', 'group'))} "
                      f"mode):</p>{_items(per_image)}" if info.get("image_generalized") else "")
    return (f"<h4>{e(info['id'])}: {info['n_images']} images ({info['n_train']} train, {info['n_test']} test)</h4>"
            f"<p><b>chain</b>: {' &rarr; '.join(e(c) for c in info['chain'])}</p>"
            f"<p><b>parents</b>: {parents}</p>"
            f"<p><b>children</b> (primary): {e(', '.join(info['children'])) or 'none'}</p>"
            f"<p><b>merged from</b>: {e(', '.join(info['merged_from'])) or 'none'}</p>"
            f"{node_level}{per_image_html}"
            f"<p><b>hard negatives</b>:</p>{_items(hard + fallback)}"
            f"<p><b>captions of the first images</b>:</p>{_items(info['captions'])}")


class MagicExplorer:
    """Level and node dropdowns -> node summary (HTML) and a strip of its images (when a dataset is given).

    Live (a Jupyter front end is attached) it is a widget; headless (`cglib.frontend.headless()`) it builds no
    widget and opens no comm. Either way, displaying it also leaves a static rendering of the node shown (HTML
    with the image strip inlined) for readers without a kernel; a live front end shows the widget instead.
    """

    def __init__(self, magic: MagicFile, dataset: CaptionDataset | None = None, max_images: int = 6,
                 interactive: bool | None = None) -> None:
        self.magic, self.dataset, self.max_images = magic, dataset, max_images
        self.interactive = (not headless()) if interactive is None else interactive
        self.levels = [k for k in range(1, magic.l_max + 1) if magic.nodes_at(k)]
        if not self.levels:
            raise ValueError("magic.json has no node to explore; rebuild it with notebook 03")
        self.info: dict | None = None
        self.strip_png: bytes | None = None
        self.widget: widgets.VBox | None = None
        if not self.interactive:
            self.show(self.node_options(self.levels[0])[0][1])
            return
        self.level = widgets.Dropdown(options=[(f"l{k}", k) for k in self.levels], value=self.levels[0],
                                      description="level")
        self.node = widgets.Dropdown(description="node", layout=widgets.Layout(width="480px"))
        self.summary = widgets.HTML()
        self.pictures = widgets.Output()
        self.level.observe(lambda change: self._fill_nodes(), names="value")
        self.node.observe(lambda change: self.show(change["new"]), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.level, self.node]), self.summary, self.pictures])
        self._fill_nodes()

    def node_options(self, level: int) -> list[tuple[str, str]]:
        """(label, node id) of one level's nodes, largest first."""
        nodes = sorted(self.magic.nodes_at(level), key=lambda n: (-n.n_images, n.id))
        return [(f"{n.name} ({n.n_images})", n.id) for n in nodes]

    def _fill_nodes(self) -> None:
        options = self.node_options(self.level.value)
        self.node.options = options
        if options:
            self.node.value = options[0][1]

    def show(self, node: str | None) -> dict | None:
        """Display one node (also callable directly, e.g. headless); returns its description."""
        if node is None:
            return None
        info = describe_node(self.magic, node, max_images=self.max_images)
        self.info, self.strip_png = info, None
        if self.dataset is not None and info["images"]:
            fig, axes = plt.subplots(1, len(info["images"]), figsize=(1.6 * len(info["images"]), 1.8), squeeze=False)
            for ax, image_id in zip(axes[0], info["images"]):
                ax.imshow(self.dataset.load_image(image_id))
                ax.set_title(f"{image_id}\n{self.magic.images[image_id].split}", fontsize=7)
                ax.axis("off")
            self.strip_png = figure_png(fig)
            plt.close(fig)
        if self.widget is not None:
            self.summary.value = node_html(info)
            self.pictures.clear_output(wait=True)
            if self.strip_png is not None:
                with self.pictures:
                    display(Image(data=self.strip_png))
        return info

    def static_html(self) -> str:
        """The node shown, as self-contained HTML (summary, then the image strip inlined)."""
        assert self.info is not None  # set in __init__
        strip = png_img_tag(self.strip_png, f"images of {self.info['id']}") if self.strip_png else ""
        note = ("<p><i>MAGIC explorer, static view of one node (pick levels and nodes in a live Jupyter "
                "session).</i></p>")
        return f"<div>{note}{node_html(self.info)}{strip}</div>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return explorer_mimebundle(f"MagicExplorer(node={self.info['id'] if self.info else None!r})", self.static_html(), self.widget)


def magic_explorer(magic: MagicFile, dataset: CaptionDataset | None = None, max_images: int = 6,
                   interactive: bool | None = None) -> MagicExplorer:
    """The MAGIC DAG explorer (pass the dataset to see images); `interactive=None` follows `headless()`."""
    return MagicExplorer(magic, dataset, max_images=max_images, interactive=interactive)
