"""What the training corrections change (issue #32 item 3, training side): two runs of one params file, trained
corrected and as published, compared cell by cell with paired CIs (`cglib compare-protocols`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cglib.cli import main as cli_main
from cglib.config import load_params
from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.training_changes import training_changes

REPO = Path(__file__).resolve().parent.parent
KEY = ("forced_choice", "dag", "t2i", "accuracy", "l1")


def known_shift(n: int = 400, seeds: int = 2):
    """Model a trained corrected gets a fifth of the items right that trained as published gets wrong; model b
    is the same either way. The as-published run scores 10 images fewer (its items differ)."""
    rng = np.random.default_rng(0)
    units = np.arange(n)
    base = (rng.random((seeds, n)) < 0.6).astype(float)
    better = np.maximum(base, (rng.random(n) < 0.2).astype(float))
    corrected = {KEY: {"a": Scores(better, units), "b": Scores(base, units)}}
    published = {KEY: {"a": Scores(base[:, 10:], units[10:]), "b": Scores(base[:, 10:], units[10:])}}
    metrics = pd.DataFrame([{"model": m, "benchmark": KEY[0], "labels": "dag", "direction": "t2i",
                             "metric": "accuracy", "level": "l1"} for m in "ab"])
    return metrics, corrected, published, base, better


def test_a_known_training_change_is_found_and_an_unchanged_model_is_not():
    metrics, corrected, published, base, better = known_shift()
    changes = training_changes(metrics, corrected, published, resamples=500, ci=0.95, seed=0)
    a, b = (changes[changes["model"] == m].iloc[0] for m in "ab")
    assert (a["column"], a["images"]) == ("MAGIC l1", 390)
    assert a["change"] == pytest.approx(100 * (better[:, 10:].mean() - base[:, 10:].mean()))
    assert a["ci_low"] > 0 and a["significant"]
    assert b["change"] == 0 and not b["significant"]
    assert (changes["p_holm"] >= changes["p_value"]).all()  # Holm over both cells


def run_folder(root: Path, name: str, protocol: str, scores: dict, metrics: pd.DataFrame, **extra) -> Path:
    """A finished run's files that compare-protocols reads: params.yaml, results.json, metrics.csv, scores.npz."""
    folder = root / name
    (folder / "evaluation").mkdir(parents=True)
    params = yaml.safe_load((REPO / "params" / "demo.yaml").read_text())
    params["run"].update(name=name, protocol=protocol)
    params.update(extra)
    (folder / "params.yaml").write_text(yaml.safe_dump(load_params_dict(params)))
    (folder / "evaluation" / "results.json").write_text(json.dumps(
        {"settings": {"bootstrap": 200, "ci": 0.95, "bootstrap_seed": 0}, "models": []}))
    metrics.to_csv(folder / "evaluation" / "metrics.csv", index=False)
    arrays = {}
    for key, models in scores.items():
        for model, s in models.items():
            arrays["|".join([*key, model, "values"])] = s.values
            arrays["|".join([*key, model, "units"])] = s.units
    np.savez(folder / "evaluation" / "scores.npz", **arrays)
    return folder


def load_params_dict(raw: dict) -> dict:
    """The validated params as a run folder stores them (run.protocol filled in)."""
    from cglib.config import Params

    return Params.model_validate(raw).model_dump(mode="json")


def test_the_cli_compares_twin_runs_and_refuses_runs_that_are_not_twins(tmp_path, capsys):
    metrics, corrected, published, _, _ = known_shift(seeds=1)
    ours = run_folder(tmp_path, "demo", "corrected", corrected, metrics)
    theirs = run_folder(tmp_path, "demo_as_published", "as_published", published, metrics)
    assert cli_main(["compare-protocols", str(ours), str(theirs)]) == 0
    written = pd.read_csv(ours / "evaluation" / "training_changes.csv")
    assert list(written["model"]) == ["a", "b"] and written.loc[0, "significant"]
    md = (ours / "evaluation" / "training_changes.md").read_text()
    assert "| a | +" in md and "MAGIC l1" in md and "1 do" in md
    assert cli_main(["compare-protocols", str(theirs), str(ours)]) == 2
    assert "give the corrected run first" in capsys.readouterr().err
    other = run_folder(tmp_path, "other", "as_published", published, metrics,
                       eval={**yaml.safe_load((REPO / "params" / "demo.yaml").read_text())["eval"], "choices": 4})
    assert cli_main(["compare-protocols", str(ours), str(other)]) == 2
    assert "differ in eval.choices besides run.protocol" in capsys.readouterr().err


def test_the_demo_and_its_as_published_twin_differ_only_in_name_and_protocol():
    demo, twin = (yaml.safe_load((REPO / "params" / f).read_text()) for f in ("demo.yaml", "demo_as_published.yaml"))
    assert {k: v for k, v in twin["run"].items() if k not in ("name", "protocol")} == {
        k: v for k, v in demo["run"].items() if k not in ("name", "protocol")}
    assert {k: v for k, v in twin.items() if k != "run"} == {k: v for k, v in demo.items() if k != "run"}
    published = load_params(REPO / "params" / "demo_as_published.yaml")
    assert (published.run.protocol, published.magic.generalize, published.train.tau_inner) == (
        "as_published", "level", 0.07)
    assert published.train.epoch == "groups"  # the demo's budget key stays


def test_notebook_06_finds_a_finished_twin_beside_its_run(tmp_path):
    from cglib.evaluate.training_changes import twin_runs

    demo, twin = tmp_path / "demo", tmp_path / "demo_as_published"
    (demo / "evaluation").mkdir(parents=True)
    (demo / "evaluation" / "scores.npz").write_bytes(b"")
    assert twin_runs(demo, "corrected") is None  # the twin has not run
    (twin / "evaluation").mkdir(parents=True)
    (twin / "evaluation" / "scores.npz").write_bytes(b"")
    assert twin_runs(demo, "corrected") == twin_runs(twin, "as_published") == (demo, twin)
    assert twin_runs(tmp_path / "paper", "as_published") is None
    for name in ("paper", "paper_corrected"):
        (tmp_path / name / "evaluation").mkdir(parents=True)
        (tmp_path / name / "evaluation" / "scores.npz").write_bytes(b"")
    paper = (tmp_path / "paper_corrected", tmp_path / "paper")
    assert twin_runs(tmp_path / "paper", "as_published") == twin_runs(paper[0], "corrected") == paper
