"""The related-methods profile (params/related.yaml) and the report table of their own tests."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cglib.config import load_params
from cglib.evaluate import report
from cglib.train.inputs import related_methods

REPO = Path(__file__).resolve().parent.parent


def test_related_profile_lists_every_related_method_beside_the_paper_rows():
    """params/related.yaml validates (paths checked) and trains each related method (clip_hn, a memory, MCC, n-gram
    groups) beside plain CLIP and centroid rows on the same synthetic world, with both of their tests on."""
    params = load_params(REPO / "params/related.yaml")
    assert params.run.profile == "related" and params.data.source == "synthetic"
    used = {m for r in params.train.runs for m in related_methods(r)}
    assert len(used) == 4
    assert {"clip", "centroid"} <= {r.loss for r in params.train.runs if not related_methods(r)}
    assert params.eval.keyword_permutation and params.eval.clustering and params.magic.split == "concept"
    assert all(r.text_source == "original" for r in params.train.runs if r.loss == "clip_hn" or r.groups == "ngram")


def test_labels_table_puts_each_label_in_a_column_with_its_chance():
    """labels_table: models x labels of one metric at one level, percent with CIs, n and chance in the header."""
    rows = [{"model": m, "benchmark": "keyword_permutation", "labels": kind, "direction": "i2t", "metric": "accuracy",
             "level": "caption", "value": v, "ci_low": v - 0.05, "ci_high": v + 0.05, "n": n, "chance": 0.5}
            for m, kind, v, n in [("zero-shot", "colour", 0.6, 90), ("zero-shot", "object", 0.7, 100),
                                  ("clip_hn", "colour", 0.8, 90), ("clip_hn", "object", 0.9, 100)]]
    metrics = pd.DataFrame(rows, columns=report.METRIC_COLUMNS)
    table = report.labels_table(metrics, "keyword_permutation", "i2t", "accuracy", "caption")
    assert list(table.index) == ["zero-shot", "clip_hn"]
    assert list(table.columns) == ["colour (n=90, chance 50.0)", "object (n=100, chance 50.0)"]
    assert table.loc["clip_hn", "object (n=100, chance 50.0)"].startswith("90.0 [85.0, 95.0]")
