"""The usability floor: a zero-shot base within `eval.chance_margin` points of chance on the caption columns is
called out first (notebook 06, `cglib report`), with the numbers and where the base came from."""

from __future__ import annotations

import json

import pandas as pd

from cglib.config.evaluation import EvalParams
from cglib.evaluate import report
from cglib.evaluate.floor import base_origin, chance_floor, floor_message
from cglib.report import build_report


def base_metrics(magic: float, coco: float) -> pd.DataFrame:
    """The base and a fine-tune on the two caption columns (2-way choice, chance 50%) and l1."""
    rows = []
    for model, shift in (("zero-shot", 0.0), ("clip", -0.08)):
        for level, value in (("generalized", magic), ("caption", coco), ("l1", 0.55)):
            rows.append({"model": model, "benchmark": "forced_choice", "labels": "dag", "direction": "t2i",
                         "metric": "accuracy", "level": level, "value": value + shift, "ci_low": value - 0.05,
                         "ci_high": value + 0.05, "n": 400, "n_queries": 400, "n_excluded": 0, "n_seeds": 1,
                         "chance": 0.5, "exposed_to_eval_strings": False, "exposure": ""})
    return pd.DataFrame(rows, columns=report.METRIC_COLUMNS)


def test_a_base_at_chance_is_called_out_with_its_numbers():
    """hierarcaps.yaml's case (60% and 59%, chance 50%) is under the default floor of 15 points; the message
    names both columns, the margin and the consequence. The demo's case (87%) is clear of it, and says by how much."""
    assert EvalParams().chance_margin == 15.0
    floor = chance_floor(base_metrics(0.60, 0.59), EvalParams().chance_margin)
    assert floor.near_chance and list(floor.columns) == ["MAGIC captions", "COCO captions"]
    text = floor.message("a reason")
    assert "60.0% on MAGIC captions (chance 50.0%) and 59.0% on COCO captions (chance 50.0%)" in text
    assert "less than 15 points above chance" in text and "not what the objectives do" in text
    assert text.startswith("**Read this first") and text.endswith("Why: a reason.")
    clear = chance_floor(base_metrics(0.87, 0.86), 15.0)
    assert not clear.near_chance and "at least 36.0 points above chance, clear of" in clear.message()
    assert not chance_floor(base_metrics(0.60, 0.70), 15.0).near_chance  # one caption column clear is enough
    assert chance_floor(base_metrics(0.6, 0.6).query("model != 'zero-shot'"), 15.0) is None


def test_report_says_it_first_and_names_the_base(tmp_path):
    """`cglib report` of a run whose base is at chance: the warning opens the index, before Table 3, with the
    base's training corpus from training/initial.json; a run with a clear base shows no warning."""
    run = tmp_path / "run"
    (run / "evaluation").mkdir(parents=True)
    (run / "training").mkdir()
    (run / "params.yaml").write_text("run: {name: floor}\neval: {chance_margin: 12}\n", encoding="utf-8")
    base_metrics(0.60, 0.59).to_csv(run / "evaluation" / "metrics.csv", index=False)
    (run / "evaluation" / "table3.md").write_text("# Table 3 (regenerated)\n\n| model | MAGIC l1 |\n|---|---|\n"
                                                  "| zero-shot | 55.0 |\n", encoding="utf-8")
    (run / "training" / "initial.json").write_text(json.dumps({"base": {
        "corpus": "hierarcaps", "images": 600, "captions": 3000, "epochs": 5}}), encoding="utf-8")
    assert "on 600 images of a hierarcaps corpus (3000 captions, 5 epochs)" in base_origin(run)
    index = build_report(run).index.read_text(encoding="utf-8")
    assert "Read this first: the zero-shot base is near chance." in index and "less than 12 points" in index
    assert index.index("Read this first") < index.index("Table 3") and "600 images" in index
    base_metrics(0.87, 0.86).to_csv(run / "evaluation" / "metrics.csv", index=False)
    assert "Read this first" not in build_report(run).index.read_text(encoding="utf-8")


def test_notebook_05_scores_the_base_alone_and_notebook_06_reuses_its_embeddings(tmp_path):
    """`evaluate_base` (notebook 05, before fine-tuning): the zero-shot rows alone in evaluation/base/, the floor's
    message read from them; `evaluate_run` later reads the base's cached embeddings (file untouched) and gives the
    zero-shot model the same numbers."""
    from test_eval_pipeline import make_run

    from cglib.evaluate import evaluate_base, evaluate_run
    from cglib.train import ensure_initial

    run = make_run(tmp_path, runs=[])
    ensure_initial(run)
    base = evaluate_base(run, progress=False)
    assert (run.dir / "evaluation" / "base" / "metrics.csv").is_file()
    assert not (run.dir / "evaluation" / "metrics.csv").exists()  # notebook 06's results are not written yet
    assert set(base.metrics["model"]) == {"zero-shot"}
    floor = chance_floor(base.metrics, 15.0)
    value, _chance = floor.columns["MAGIC captions"]
    message = floor_message(base.metrics, 15.0, run.dir)
    assert message == floor.message(base_origin(run.dir)) and f"{value:.1f}% on MAGIC captions" in message
    cache = run.dir / "evaluation" / "embeddings" / "zero-shot.magic.npz"
    stamp = cache.stat().st_mtime_ns
    full = evaluate_run(run, progress=False)
    assert cache.stat().st_mtime_ns == stamp
    keys = ["benchmark", "labels", "direction", "metric", "level"]
    pd.testing.assert_frame_equal(base.metrics.set_index(keys)[["value", "n"]],
                                  full.metrics.query("model == 'zero-shot'").set_index(keys)[["value", "n"]])
