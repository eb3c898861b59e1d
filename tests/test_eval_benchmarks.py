"""Benchmarks as plug-ins: the built-in registry's order is the order of the result rows, a benchmark defined
outside cglib (eval.benchmarks: 'module:Class') is scored like a built-in one, and a bad plug-in path is a params
error that says what to fix."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from cglib.config import ParamsError, parse_params
from cglib.evaluate import evaluate_run
from cglib.evaluate.benchmarks import BUILT_IN, other_benchmarks
from tests.test_eval_pipeline import make_run

# An outside benchmark: how far each test image's embedding is from the mean image embedding (a per-image value,
# bootstrapped like any other row), and a count for results.json.
OUTSIDE = textwrap.dedent('''
    import numpy as np

    from cglib.evaluate.benchmarks import Benchmark, Scored, image_vectors
    from cglib.evaluate.bootstrap import Scores
    from cglib.evaluate.gallery import MetricScores


    class Spread(Benchmark):
        name = "spread"
        protocol = "cosine of each test image to the mean test image"

        def prepare(self, context):
            return list(context.items.image_ids)

        def score(self, items, emb, context):
            images = image_vectors(emb, items)
            values = images @ images.mean(axis=0)
            return Scored({("spread", "images", "-", "cosine_to_mean", "all"):
                           MetricScores(Scores(values, np.arange(len(items))), float("nan"))})

        def describe(self, items, per_model):
            return {"spread": {"n_images": len(items)}, "items": {"spread_images": len(items)}}


    class NotABenchmark:
        name = "nope"
''')


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    """A module `my_benchmarks` on sys.path, not in cglib."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "my_benchmarks.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(folder))
    yield "my_benchmarks"
    sys.modules.pop("my_benchmarks", None)


def test_built_in_benchmarks_keep_their_order():
    """The registry's order is the order of the rows in every result file."""
    assert [b.name for b in BUILT_IN] == ["forced_choice", "gallery", "coco", "clustering", "keyword_permutation",
                                          "hierarcaps", "forced_choice_published"]


def test_an_outside_benchmark_is_scored_like_a_built_in_one(tmp_path, outside_module):
    """eval.benchmarks: ['my_benchmarks:Spread'] adds its rows (after the built-in ones, with CIs and paired
    differences), its protocol and its description to results.json; the built-in rows come in registry order."""
    from cglib.train import ensure_initial

    run = make_run(tmp_path, runs=[], clustering=True, benchmarks=[f"{outside_module}:Spread"])
    ensure_initial(run)
    result = evaluate_run(run, progress=False)
    m = result.metrics
    assert list(dict.fromkeys(m["benchmark"])) == ["forced_choice", "gallery", "coco", "clustering",
                                                   "forced_choice_published", "spread"]
    row = m[m["benchmark"] == "spread"].iloc[0]
    assert (row["labels"], row["metric"], row["n"]) == ("images", "cosine_to_mean", 12)
    assert row["ci_low"] <= row["value"] <= row["ci_high"]
    saved = json.loads((run.dir / "evaluation" / "results.json").read_text())
    assert saved["spread"] == {"n_images": 12} and saved["items"]["spread_images"] == 12
    assert saved["protocol"]["spread"].startswith("cosine of each test image")
    assert saved["hierarcaps"] is None  # a built-in benchmark that is off still has its (empty) entry
    # notebook 06's "other benchmarks": the scored ones with their tables (a plug-in's by default: models x levels
    # per metric), then the ones left off with the switch that turns each on
    shown, off = other_benchmarks(run.params, result)
    assert [title for title, _ in shown] == ["Clustering: do concepts form clusters?", "spread"]
    (caption, table), = dict(shown)["spread"]
    assert caption == "cosine_to_mean (images, -)" and list(table.index) == list(result.models)
    assert len(dict(shown)["Clustering: do concepts form clusters?"]) == 3
    assert off == [("Keyword permutation: does the model read the words?: off (eval.keyword_permutation: true; "
                   "params/related.yaml turns it on)"),
                   "HierarCaps: off (eval.hierarcaps: true; params/hierarcaps.yaml is the real-data profile)"]


def test_a_bad_plug_in_path_names_the_fix(tmp_path, outside_module):
    """Params validation imports every eval.benchmarks entry: a malformed path, a missing module or class, a class
    that is no Benchmark, a name clash are errors of eval.benchmarks that say what to do."""
    def check(paths: list[str], message: str) -> None:
        with pytest.raises(ParamsError, match=message):
            parse_params({"eval": {"benchmarks": paths}}, tmp_path)

    check(["my_benchmarks.Spread"], r"eval.benchmarks.*write it as 'package.module:ClassName'")
    check(["no_such_module_xyz:Spread"], r"eval.benchmarks.*cannot import module 'no_such_module_xyz'.*PYTHONPATH")
    check([f"{outside_module}:Sprad"], r"eval.benchmarks.*has no 'Sprad'; check the class name")
    check([f"{outside_module}:NotABenchmark"], r"eval.benchmarks.*not a subclass of .*Benchmark; subclass it")
    check([f"{outside_module}:Spread", f"{outside_module}:Spread"], r"eval.benchmarks.*duplicate names \['spread'\]")
    assert parse_params({"eval": {"benchmarks": [f"{outside_module}:Spread"]}}, tmp_path).eval.benchmarks == [
        f"{outside_module}:Spread"]
