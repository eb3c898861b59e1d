"""Gallery retrieval on the MAGIC test images (cglib/evaluate/gallery.py): every text type's strings against every
test image, and COCO captions: the same on the test images' original captions."""

from __future__ import annotations

from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, Scored, image_vectors
from cglib.evaluate.embeddings import Embeddings
from cglib.evaluate.gallery import gallery_scores
from cglib.evaluate.items import CAPTIONS, TextField


class Gallery(Benchmark):
    name = "gallery"
    protocol = (
        "Every distinct string of a type queries all test images (text->image) and every test image queries all "
        "distinct strings (image->text); an item is relevant when it carries the query's string (any image "
        "under a concept for concept names). R@k, and for group-level texts precision@k and mAP. Ties rank "
        "against the model.")
    labels: str | None = None  # the rows' labels column: None = each field's own labels

    def prepare(self, context: EvalContext) -> list[TextField]:
        return [f for f in context.items.fields if f.key != "caption"]

    def texts(self, items: list[TextField]) -> list[str]:
        return sorted({t for f in items for texts in f.texts for t in texts})

    def score(self, items: list[TextField], emb: Embeddings, context: EvalContext) -> Scored:
        images = image_vectors(emb, context.items.image_ids)
        out = Scored({})
        for f in items:
            for (direction, metric), ms in gallery_scores(f, images, emb.text_vectors, emb.text_index,
                                                          context.params.eval.recall_at, context.group_ids,
                                                          context.image_units).items():
                out.scores[(self.name, self.labels or f.labels, direction, metric, f.key)] = ms
        return out


class CocoCaptions(Gallery):
    name = "coco"
    protocol = "Original captions of the test images: caption->image and image->caption R@k over the test split."
    labels = CAPTIONS

    def enabled(self, params) -> bool:
        return params.eval.coco_retrieval

    def prepare(self, context: EvalContext) -> list[TextField]:
        return [f for f in context.items.fields if f.key == "caption"]
