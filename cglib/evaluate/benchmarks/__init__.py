"""Benchmarks as plug-ins: every benchmark `evaluate_run` scores is a `Benchmark` (base.py); the built-in ones in
`BUILT_IN` order (the order of the rows of every result file), then a run's own from `eval.benchmarks`
("package.module:ClassName", imported by `load_benchmark`)."""

from __future__ import annotations

from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, ImageSet, Key, Scored, image_vectors
from cglib.evaluate.benchmarks.clustering import Clustering
from cglib.evaluate.benchmarks.forced_choice import ForcedChoice, ForcedChoicePublished
from cglib.evaluate.benchmarks.gallery import CocoCaptions, Gallery
from cglib.evaluate.benchmarks.hierarcaps import HierarCaps
from cglib.evaluate.benchmarks.keyword_permutation import KeywordPermutation
from cglib.plugins import load_plugin

__all__ = ["BUILT_IN", "Benchmark", "EvalContext", "ImageSet", "Key", "Scored", "benchmarks_for", "image_vectors",
           "load_benchmark", "other_benchmarks"]

# the benchmarks notebook 06 gives sections of their own (Table 3, Fig. 4, gallery, COCO, Appendix A)
OWN_SECTIONS = ("forced_choice", "gallery", "coco", "forced_choice_published")

BUILT_IN: tuple[type[Benchmark], ...] = (ForcedChoice, Gallery, CocoCaptions, Clustering, KeywordPermutation,
                                         HierarCaps, ForcedChoicePublished)


def load_benchmark(path: str) -> type[Benchmark]:
    """The Benchmark subclass at `path` ("package.module:ClassName"); ValueError saying what to fix otherwise."""
    cls = load_plugin(path, Benchmark, "benchmark", "subclass it and override prepare and score")
    if cls.prepare is Benchmark.prepare or cls.score is Benchmark.score:
        raise ValueError(f"benchmark {path!r}: {cls.__name__} must override prepare(context) and "
                         "score(items, emb, context)")
    if not cls.name or cls.name in {b.name for b in BUILT_IN}:
        raise ValueError(f"benchmark {path!r}: {cls.__name__}.name must be set and differ from the built-in "
                         f"benchmarks ({', '.join(b.name for b in BUILT_IN)})")
    return cls


def benchmarks_for(params) -> list[Benchmark]:
    """Every benchmark a run knows, on or off: the built-in ones, then eval.benchmarks in their order."""
    return [cls() for cls in BUILT_IN] + [load_benchmark(path)() for path in params.eval.benchmarks]


def other_benchmarks(params, results) -> tuple[list[tuple[str, list[tuple[str, object]]]], list[str]]:
    """Notebook 06's "other benchmarks": (title, its (caption, table) pairs) for every benchmark this run scored
    beyond those with sections of their own, plug-ins included; and, for each one the run leaves off, a line naming
    the switch that turns it on."""
    scored = set(results.metrics["benchmark"])
    shown, off = [], []
    for benchmark in benchmarks_for(params):
        if benchmark.name in OWN_SECTIONS:
            continue
        if benchmark.enabled(params) and benchmark.name in scored:
            shown.append((benchmark.title or benchmark.name, benchmark.tables(results)))
        elif not benchmark.enabled(params):
            off.append(f"{benchmark.title or benchmark.name}: off ({benchmark.switch or 'list it in eval.benchmarks'})")
    return shown, off
