"""Category discovery (eval.clustering): k-means of the MAGIC test images per level (cglib/evaluate/clustering.py)."""

from __future__ import annotations

from typing import ClassVar

from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, Scored, image_vectors
from cglib.evaluate.clustering import BENCHMARK, clustering_scores, seen_concepts
from cglib.evaluate.embeddings import Embeddings

PROTOCOL = ("k-means (faiss, one run per eval.seeds) of the test images' embeddings per level, k = the level's "
            "concepts among the test images; clustering accuracy under the Hungarian matching on all images, split "
            "into seen and held-out concepts; CIs are conditional on the matching (cglib/evaluate/clustering.py)")


class Clustering(Benchmark):
    name = BENCHMARK
    absent: ClassVar[dict[str, None]] = {"clustering": None}
    title = "Clustering: do concepts form clusters?"
    switch = "eval.clustering: true; params/related.yaml turns it on"

    def enabled(self, params) -> bool:
        return params.eval.clustering

    def tables(self, results) -> list[tuple[str, object]]:
        labels = "ground_truth" if results.info["items"]["ground_truth"] else "dag"
        return [(f"clustering {metric} against the {labels} concepts (%)", results.table(BENCHMARK, labels, "-", metric))
                for metric in ("accuracy", "accuracy_seen", "accuracy_held_out")]

    def prepare(self, context: EvalContext) -> dict[tuple[str, int], set[str]]:
        """Which test concepts have training images, per label source and level."""
        return seen_concepts(context.magic, context.ground_truth, context.items.levels)

    def score(self, items: dict[tuple[str, int], set[str]], emb: Embeddings, context: EvalContext) -> Scored:
        p = context.params.eval
        scores, info = clustering_scores(context.items, image_vectors(emb, context.items.image_ids), items, p.seeds,
                                         p.bootstrap_unit)
        return Scored(scores, info=info)

    def describe(self, items, per_model: dict[str, dict]) -> dict:
        return {"clustering": {"protocol": PROTOCOL, "per_model": per_model}}
