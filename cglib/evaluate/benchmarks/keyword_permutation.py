"""The keyword-permutation test (Rösch et al.): does a model prefer an image's true caption over the same caption
with one keyword of a concept type swapped? Per type, chance is 50%.

For each evaluation seed, MAGIC test image and concept type (cglib.data.permute.KINDS), a generator seeded by
(seed, type, image position) picks one of the image's captions that hold a keyword of the type and one keyword
occurrence in it; the item is correct when cos(image, caption) > cos(image, permuted caption) (a tie is wrong,
as in the forced choice). The choice depends on the seeds and the items only, so every model is scored on identical texts. An image
none of whose captions has a keyword of a type is left out of that type and counted (`PermutationItems.counts`).
Scores pool the seeds as the forced choice does: one query per (seed, image), resampled by the image's unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cglib.data.permute import KINDS, KeywordPermuter, permuter_for
from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, Key, Scored, image_vectors
from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.embeddings import Embeddings
from cglib.evaluate.gallery import I2T, MetricScores
from cglib.evaluate.report import labels_table

BENCHMARK = "keyword_permutation"
LEVEL = "caption"
STREAM = 21  # generator stream, apart from the forced choice's


@dataclass
class PermutationItems:
    """Per concept type and evaluation seed: the image rows scored, their original and permuted captions."""

    rows: dict[str, list[np.ndarray]] = field(default_factory=dict)
    originals: dict[str, list[list[str]]] = field(default_factory=dict)
    permuted: dict[str, list[list[str]]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    relations: str = ""

    def texts(self) -> list[str]:
        """Every original and permuted caption of the items (what the text tower must embed), sorted."""
        return sorted({t for by_kind in (self.originals, self.permuted) for seeds in by_kind.values()
                       for texts in seeds for t in texts})

    def key(self, kind: str) -> Key:
        """The metric key of one concept type: (benchmark, labels, direction, metric, level)."""
        return BENCHMARK, kind, I2T, "accuracy", LEVEL

    def excluded(self, kind: str) -> int:
        """(seed, image) queries of a type left out because the image has no keyword of it."""
        return self.counts[kind]["without_keyword"] * len(self.rows[kind])


def permutation_items(captions: list[tuple[str, ...]] | tuple[tuple[str, ...], ...], permuter: KeywordPermuter,
                      seeds: list[int]) -> PermutationItems:
    """The items of every type and seed for images whose captions are `captions[i]` (see the module docstring)."""
    out = PermutationItems(relations=permuter.source)
    for k, kind in enumerate(KINDS):
        usable = [[c for c in caps if permuter.matches(c, kind)] for caps in captions]
        rows = np.array([i for i, u in enumerate(usable) if u], dtype=np.int64)
        out.counts[kind] = {"images": int(rows.size), "without_keyword": len(captions) - int(rows.size)}
        out.rows[kind], out.originals[kind], out.permuted[kind] = [], [], []
        for seed in seeds:
            originals, permuted = [], []
            for i in rows:
                u = np.random.default_rng([seed, STREAM, k, int(i)]).random(2)
                caption = usable[i][int(u[0] * len(usable[i]))]
                originals.append(caption)
                permuted.append(permuter.permute(caption, kind, int(u[1] * len(permuter.matches(caption, kind)))))
            out.rows[kind].append(rows)
            out.originals[kind].append(originals)
            out.permuted[kind].append(permuted)
    return out


def permutation_scores(items: PermutationItems, images: np.ndarray, text_vectors: np.ndarray,
                       text_index: dict[str, int], image_units: np.ndarray) -> dict[tuple, MetricScores]:
    """Per type: 1 where the image is closer to its original caption than to the permuted one (a tie: 0)."""
    out = {}
    for kind in KINDS:
        values, units = [], []
        for rows, originals, permuted in zip(items.rows[kind], items.originals[kind], items.permuted[kind],
                                             strict=True):
            if not rows.size:
                continue
            pair_rows = np.array([[text_index[a], text_index[b]] for a, b in zip(originals, permuted, strict=True)])
            # one einsum for both captions, so identical vectors give identical similarities (a tie: wrong)
            sims = np.einsum("nd,nkd->nk", images[rows], text_vectors[pair_rows])
            values.append((sims[:, 0] > sims[:, 1]).astype(np.float64))
            units.append(image_units[rows])
        scores = Scores(np.concatenate(values) if values else np.zeros(0),
                        np.concatenate(units) if units else np.zeros(0, np.int64))
        out[items.key(kind)] = MetricScores(scores, 0.5)
    return out


class KeywordPermutation(Benchmark):
    name = BENCHMARK
    title = "Keyword permutation: does the model read the words?"
    switch = "eval.keyword_permutation: true; params/related.yaml turns it on"

    def enabled(self, params) -> bool:
        return params.eval.keyword_permutation

    def tables(self, results) -> list[tuple[str, object]]:
        coverage = results.info["items"]["keyword_permutation"]["per_type"]
        counts = ", ".join(f"{kind} {c['images']} (without one: {c['without_keyword']})"
                           for kind, c in coverage.items())
        caption = f"image to text accuracy, true caption against one keyword swapped; test images per type: {counts}"
        return [(caption, labels_table(results.metrics, BENCHMARK, "i2t", "accuracy", "caption"))]

    def prepare(self, context: EvalContext) -> PermutationItems:
        return permutation_items(context.items.field("caption").texts, permuter_for(context.params),
                                 context.params.eval.seeds)

    def texts(self, items: PermutationItems) -> list[str]:
        return items.texts()

    def score(self, items: PermutationItems, emb: Embeddings, context: EvalContext) -> Scored:
        return Scored(permutation_scores(items, image_vectors(emb, context.items.image_ids), emb.text_vectors,
                                         emb.text_index, context.image_units))

    def excluded(self, items: PermutationItems, per_model: dict[str, dict]) -> dict[Key, int]:
        return {items.key(kind): items.excluded(kind) for kind in items.counts}

    def describe(self, items: PermutationItems, per_model: dict[str, dict]) -> dict:
        return {"settings": {"keyword_permutation": True},
                "items": {"keyword_permutation": {"relations": items.relations, "per_type": items.counts}}}
