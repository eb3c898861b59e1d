"""The benchmark protocol: what `evaluate_run` asks of every benchmark, built in or plugged in (`eval.benchmarks`).

A benchmark prepares its items once per evaluation (independent of the models, so every model is scored on
identical items), scores one model's embeddings of them, and describes them for results.json. Its metric rows are
keyed (benchmark, labels, direction, metric, level), the columns of metrics.csv; a score is a `MetricScores` (the
per-query values and their bootstrap units, and the chance level).

By default a benchmark scores the MAGIC test images (`EvalContext.items`, in `items.image_ids` order) against the
texts it asks for (`texts`); one with images of its own returns them from `images` (HierarCaps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cglib.evaluate.embeddings import Embeddings
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.items import MagicItems

Key = tuple[str, str, str, str, str]  # benchmark, labels, direction, metric, level


@dataclass
class EvalContext:
    """What a benchmark may read to prepare its items: the run, its MAGIC file and the MAGIC test items."""

    run: Any  # cglib.run.RunContext
    magic: Any  # cglib.magic.schema.MagicFile
    ground_truth: dict[str, list[str]] | None
    items: MagicItems
    image_size: Callable[[], int]  # the run's model input size (loads the zero-shot model on first call)
    progress: bool = True

    @property
    def params(self):
        return self.run.params

    @property
    def group_ids(self) -> np.ndarray:
        """Each test image's l1 group as an integer (the order of `items.image_ids`)."""
        return np.unique(np.asarray(self.items.groups), return_inverse=True)[1]

    @property
    def image_units(self) -> np.ndarray:
        """What the bootstrap resamples for an image-level query (eval.bootstrap_unit): the image or its l1 group."""
        return self.group_ids if self.params.eval.bootstrap_unit == "group" else np.arange(len(self.items.image_ids))


@dataclass
class ImageSet:
    """Images a benchmark scores instead of the MAGIC test images, with the texts to embed next to them."""

    name: str  # its embedding cache under evaluation/embeddings/
    ids: list[str]
    pixels: Callable[[], np.ndarray]
    source: str  # a fingerprint of the pixels' content (part of the cache key)
    texts: list[str]


@dataclass
class Scored:
    """One model's scores on one benchmark: the metric rows, optional per-evaluation-seed values of some rows
    (results.json per_seed) and optional facts about this model's scoring (passed to `describe`)."""

    scores: dict[Key, MetricScores]
    per_seed: dict[Key, list[float]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def image_vectors(emb: Embeddings, image_ids: list[str]) -> np.ndarray:
    """The embeddings of `image_ids`, in that order."""
    return emb.images[np.array([emb.image_index[i] for i in image_ids])]


class Benchmark:
    """Subclass this and override what your benchmark needs; `prepare` and `score` are required.

    `name` is the benchmark column of its rows (a benchmark may use several, e.g. hierarcaps_batch); `protocol`,
    when set, is its entry in results.json `protocol` (how it is scored, in words); `absent` are the results.json
    entries written when it is off (so files of runs with and without it have the same keys).
    """

    name: str = ""
    protocol: str = ""
    absent: ClassVar[dict[str, None]] = {}
    title: str = ""  # its heading in notebook 06's "other benchmarks" section (default: `name`)
    switch: str = ""  # how a run turns it on, said where a run leaves it off

    def enabled(self, params) -> bool:
        """Whether this run scores it (built-ins: their eval.* switch; a plug-in listed in eval.benchmarks: yes)."""
        return True

    def tables(self, results: Any) -> list[tuple[str, Any]]:
        """What notebook 06 shows of it under "other benchmarks", as (caption, table) pairs read from `results`
        (the run's `EvalResults`). Default: one table of models x levels (mean [CI]) per labels, direction and
        metric of its rows."""
        rows = results.metrics[results.metrics["benchmark"] == self.name]
        kinds = rows[["labels", "direction", "metric"]].drop_duplicates().itertuples(index=False)
        return [(f"{metric} ({labels}, {direction})", results.table(self.name, labels, direction, metric))
                for labels, direction, metric in kinds]

    def prepare(self, context: EvalContext) -> Any:
        """The items to score, once per evaluation, the same for every model."""
        raise NotImplementedError(f"{type(self).__name__}.prepare(context) must return the items to score")

    def texts(self, items: Any) -> list[str]:
        """Texts this benchmark needs embedded with the MAGIC test images (a benchmark with its own images puts
        them in its `ImageSet` instead)."""
        return []

    def images(self, items: Any, context: EvalContext, size: int | None) -> ImageSet | None:
        """Its own images at input size `size` (None: the run's model's), or None: it scores the MAGIC test images."""
        return None

    def score(self, items: Any, emb: Embeddings, context: EvalContext) -> Scored:
        """One model's scores: `emb` holds its embeddings of the images (the MAGIC test images, or `images`) and
        of the texts."""
        raise NotImplementedError(f"{type(self).__name__}.score(items, emb, context) must return a Scored")

    def excluded(self, items: Any, per_model: dict[str, dict]) -> dict[Key, int | dict[str, int]]:
        """Queries left out of each metric row (metrics.csv n_excluded): a count, or one per model name.
        `per_model`: each model label's `Scored.info`."""
        return {}

    def exposure(self, items: Any) -> str:
        """Why every trained model has seen this benchmark's items ('' when it has not), for its rows' exposure."""
        return ""

    def describe(self, items: Any, per_model: dict[str, dict]) -> dict:
        """What results.json says about the items (counts, exclusions): top-level entries; 'items' and 'settings'
        are merged into those sections."""
        return {}
