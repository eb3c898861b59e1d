"""An ipywidgets explorer: pick a concept at any level, see each model's top test images, then the attention of one.

The query is the concept's name, as in evaluation (names never appear in captions). A retrieved image is a
hit when the concept lies on its chain in the DAG (its ancestor at that level). Figures are drawn with
matplotlib into `Output` widgets, so the explorer also builds (and its methods run) without a browser.
Headless runs (papermill, `cglib run`; see `cglib.frontend`) build no widget at all and show a static
rendering of the first concept (retrieval grid and attention maps as images); live, the widget is shown.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display
from matplotlib.figure import Figure

from cglib.encoding import encode_images, encode_texts
from cglib.frontend import explorer_mimebundle, figure_png, headless, png_img_tag
from cglib.magic.schema import MagicFile
from cglib.models import ClipModel
from cglib.viz.attention import extract_attention, overlay, vision_transformer


class ConceptExplorer:
    """Level and concept dropdowns -> top-k test images per model; image dropdown -> its attention maps.

    Live it is a widget (`.widget`); headless (`interactive=False`, or `headless()` when None) it builds no
    widget and opens no comm. Displaying it leaves a static rendering of what it shows (HTML with the grid and
    the attention maps inlined) for readers without a kernel; a live front end shows the widget instead.
    """

    def __init__(self, models: dict[str, ClipModel], magic: MagicFile, image_ids: Sequence[str], pixels: np.ndarray,
                 top_k: int = 5, image_embeddings: dict[str, np.ndarray] | None = None,
                 interactive: bool | None = None) -> None:
        if not models:
            raise ValueError("the explorer needs at least one model; load them with VizRun.models()")
        if len(pixels) != len(image_ids):
            raise ValueError(f"{len(pixels)} pixel rows for {len(image_ids)} image ids; pass them aligned")
        self.models = dict(models)
        self.magic = magic
        self.image_ids = list(image_ids)
        self.pixels = pixels
        self.top_k = min(top_k, len(self.image_ids))
        given = image_embeddings or {}
        self.image_embeddings = {name: given[name] if name in given else encode_images(bundle, pixels)
                                 for name, bundle in self.models.items()}
        self._row = {image_id: row for row, image_id in enumerate(self.image_ids)}
        self.results: dict[str, list[tuple[str, float, bool]]] = {}
        self.concept: str | None = None
        self.figure: Figure | None = None  # the last retrieval grid
        self.grid_png: bytes | None = None  # the last retrieval grid and attention figure, for static renderings
        self.attention_png: bytes | None = None
        self.interactive = (not headless()) if interactive is None else interactive
        self.widget: widgets.VBox | None = None
        if not self.interactive:
            concepts = self.concepts(1)
            if concepts:
                self.show_concept(concepts[0][1])
                model, hits = next(iter(self.results.items()))
                self.show_attention(model, hits[0][0])
            return

        self.level = widgets.Dropdown(options=[(f"l{k}", k) for k in range(1, magic.l_max + 1)], value=1,
                                      description="level")
        self.concept_box = widgets.Dropdown(description="concept", layout=widgets.Layout(width="420px"))
        self.image_box = widgets.Dropdown(description="image", layout=widgets.Layout(width="420px"))
        self.retrieval_out = widgets.Output()
        self.attention_out = widgets.Output()
        self.level.observe(lambda change: self._fill_concepts(change["new"]), names="value")
        self.concept_box.observe(lambda change: change["new"] and self.show_concept(change["new"]), names="value")
        self.image_box.observe(lambda change: change["new"] and self.show_attention(*change["new"]), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.level, self.concept_box]), self.retrieval_out,
                                    self.image_box, self.attention_out])
        self._fill_concepts(1)

    # --------------------------------------------------------------------------------------- logic
    def concepts(self, level: int) -> list[tuple[str, str]]:
        """(label, node id) of the concepts at `level` with at least one of the explorer's images under them."""
        ours = set(self.image_ids)
        out = []
        for node in self.magic.nodes_at(level):
            n = sum(1 for i in self.magic.images_of(node.id) if i in ours)
            if n:
                out.append((f"{node.name} ({n} images)", node.id))
        return out

    def is_hit(self, image_id: str, node: str) -> bool:
        """Whether `node` lies on the image's chain (its l1 node's ancestor at the node's level)."""
        level = self.magic.nodes[node].level
        return self.magic.ancestor(self.magic.images[image_id].node, level) == node

    def retrieve(self, node: str) -> dict[str, list[tuple[str, float, bool]]]:
        """Per model, the top-k images for the concept name: (image id, cosine, hit)."""
        name = self.magic.nodes[node].name
        results = {}
        for model, bundle in self.models.items():
            query = encode_texts(bundle, [name])[0]
            scores = self.image_embeddings[model] @ query
            order = np.argsort(-scores, kind="stable")[: self.top_k]
            results[model] = [(self.image_ids[r], float(scores[r]), self.is_hit(self.image_ids[r], node))
                              for r in order]
        return results

    # ------------------------------------------------------------------------------------- drawing
    def show_concept(self, node: str) -> Figure:
        """Retrieve for `node`, draw the grid (rows: models) and offer the retrieved images for attention."""
        self.concept = node
        self.results = self.retrieve(node)
        fig, axes = plt.subplots(len(self.models), self.top_k, figsize=(1.7 * self.top_k, 1.9 * len(self.models)),
                                 squeeze=False)
        for r, (model, hits) in enumerate(self.results.items()):
            for c, (image_id, score, hit) in enumerate(hits):
                ax = axes[r, c]
                ax.imshow(self.pixels[self._row[image_id]])
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(f"{'hit' if hit else 'miss'} {score:.2f}", fontsize=8,
                             fontweight="bold" if hit else "normal")
            axes[r, 0].set_ylabel(model, fontsize=9)
        fig.suptitle(f"top {self.top_k} test images for '{self.magic.nodes[node].name}' "
                     f"(l{self.magic.nodes[node].level})", fontsize=10)
        fig.tight_layout()
        self.figure, self.grid_png = fig, figure_png(fig)
        if self.widget is not None:
            self._show(self.retrieval_out, self.grid_png)
            _select_first(self.image_box, [(f"{model}: {image_id}", (model, image_id))
                                           for model, hits in self.results.items() for image_id, _, _ in hits])
        plt.close(fig)
        return fig

    def show_attention(self, model: str, image_id: str) -> Figure:
        """Rollout and the concept-conditioned patch map of one image under one model (ViT towers only)."""
        bundle = self.models[model]
        image = self.pixels[self._row[image_id]]
        fig, axes = plt.subplots(1, 3, figsize=(6.6, 2.5))
        axes[0].imshow(image)
        axes[0].set_title(image_id, fontsize=8)
        axes[0].set_xticks([])
        axes[0].set_yticks([])
        try:
            vision_transformer(bundle)
        except (TypeError, ValueError) as exc:
            for ax in axes[1:]:
                ax.axis("off")
            axes[1].text(0, 0.5, str(exc), fontsize=7, wrap=True)
        else:
            maps = extract_attention(bundle, image[None])
            overlay(axes[1], image, maps.rollout()[0], title="rollout")
            name = self.magic.nodes[self.concept].name if self.concept else self.magic.chain_names(image_id)[0]
            heat = maps.text_maps(encode_texts(bundle, [name])[0])[0]
            overlay(axes[2], image, heat, title=f"'{name}'")
        fig.suptitle(f"{model}: chain {' > '.join(self.magic.chain_names(image_id))}", fontsize=9)
        fig.tight_layout()
        self.attention_png = figure_png(fig)
        if self.widget is not None:
            self._show(self.attention_out, self.attention_png)
        plt.close(fig)
        return fig

    def _fill_concepts(self, level: int) -> None:
        _select_first(self.concept_box, self.concepts(level))

    @staticmethod
    def _show(out: widgets.Output, png: bytes) -> None:
        out.clear_output(wait=True)
        with out:
            display(Image(data=png))

    # ------------------------------------------------------------------------------ static rendering
    def static_html(self) -> str:
        """What the explorer shows, as self-contained HTML (retrieval grid and attention maps inlined)."""
        note = ("<p><i>Concept explorer, static view of one concept (pick levels, concepts and images in a live "
                "Jupyter session).</i></p>")
        if self.concept is None:
            return note + "<p>No concept has an image among the explorer's images.</p>"
        node = self.magic.nodes[self.concept]
        parts = [note, f"<h4>{html.escape(node.id)}: top {self.top_k} images per model</h4>"]
        if self.grid_png:
            parts.append(png_img_tag(self.grid_png, f"retrieval for {node.name}"))
        if self.attention_png:
            parts.append(png_img_tag(self.attention_png, "attention maps"))
        return "<div>" + "".join(parts) + "</div>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return explorer_mimebundle(f"ConceptExplorer(concept={self.concept!r}, models={list(self.models)})", self.static_html(), self.widget)


def _select_first(box: widgets.Dropdown, options: list) -> None:
    """Replace a dropdown's options and select the first, so its observer runs (ipywidgets 8 leaves None)."""
    box.value = None
    box.options = options
    if options:
        box.value = options[0][1]


def build_explorer(models: dict[str, ClipModel], magic: MagicFile, image_ids: Sequence[str], pixels: np.ndarray,
                   top_k: int = 5, image_embeddings: dict[str, np.ndarray] | None = None,
                   interactive: bool | None = None) -> ConceptExplorer:
    """The concept explorer over the given models and (test) images; `interactive=None` follows `headless()`."""
    return ConceptExplorer(models, magic, image_ids, pixels, top_k=top_k, image_embeddings=image_embeddings,
                           interactive=interactive)
