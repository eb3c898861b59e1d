"""End to end: the whole notebook series through `cglib run` (papermill, the users' path), on the classroom profile
(the session's run of the whole series, which the course's, the classroom's and the book's tests also read), and
the demo's own code paths (its Table 3 rows, two training seeds, PDF figures) on that run continued from training."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import demo_code_paths

from cglib.config import deep_merge
from cglib.pipeline import default_notebook_dir, discover_notebooks

REPO = Path(__file__).resolve().parent.parent


def assert_rows_trained_and_scored_with_their_own_weights(out: Path, runs: list[dict]) -> None:
    """Every train.runs row left its weights and its Table 3 row; each is scored with its own weights: a run that
    trained only the text projection (RE, textual pretraining) must not be served the zero-shot model's cached text
    embeddings."""
    table3 = (out / "evaluation/table3.md").read_text()
    for run_spec in runs:
        assert (out / "training" / run_spec["name"] / "final.safetensors").is_file()
        assert f"| {run_spec['name']}" in table3, run_spec["name"]
        summary = json.loads((out / "training" / run_spec["name"] / "summary.json").read_text())
        text_phase = run_spec.get("loss") == "re" or run_spec.get("pretrain", "none") != "none"
        assert summary["text_phase_trained"] == ("projection" if text_phase else None), run_spec["name"]
        own, zero_shot = (np.load(out / "evaluation" / "embeddings" / f"{m}.magic.npz")
                          for m in (run_spec["name"], "zero-shot"))
        assert not np.array_equal(own["text_vectors"], zero_shot["text_vectors"]) or run_spec["loss"] != "re"
        assert not (np.array_equal(own["text_vectors"], zero_shot["text_vectors"])
                    and np.array_equal(own["images"], zero_shot["images"])), run_spec["name"]
    # both evaluation protocols in one run: the authors' (beside the paper's rows) and the corrected Table 3
    published = (out / "evaluation" / "table3_as_published.md").read_text()
    assert all(f"| {r['name']}" in published for r in runs) and "| paper: CLIP |" in published


def assert_no_error_cells(out: Path, names: list[str]) -> None:
    """Executed notebooks carry outputs and no error cells."""
    for name in names:
        executed = nbformat.read(out / "notebooks" / name, as_version=4)
        errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, name


@pytest.mark.slow
def test_the_series_runs_end_to_end(classroom_run):
    """Every numbered notebook runs headless; each stage leaves its documented files; notebook 09 trains your own
    objective beside the run's rows."""
    params = yaml.safe_load((REPO / "params/classroom.yaml").read_text())
    out = classroom_run

    manifest = json.loads((out / "run.json").read_text())
    expected = [p.name for p in discover_notebooks(default_notebook_dir())]
    assert [n["name"] for n in manifest["notebooks"]] == expected
    assert all(n["status"] == "ok" for n in manifest["notebooks"])
    assert manifest["git_commit"] is None or len(manifest["git_commit"]) >= 40

    for relative in ["captions/dataset.json", "captions/ground_truth.json", "abstraction/chains.jsonl",
                     "magic/magic.json", "magic/magic.graphml", "training/initial.safetensors",
                     "evaluation/metrics.csv", "evaluation/table3.md"]:
        assert (out / relative).is_file(), relative
    base = json.loads((out / "training/initial.json").read_text())["base"]  # the zero-shot row is the base
    assert base["corpus"] == "synthetic" and base["captions_naming_a_concept"] == 0
    assert base["epoch_losses"][-1] < base["epoch_losses"][0]
    assert_rows_trained_and_scored_with_their_own_weights(out, params["train"]["runs"])
    # notebook 09: your own objective (defined in the notebook) trained beside clip and centroid, in Table 3
    trial = out / "own_objective"
    own = json.loads((trial / "training" / "triplet" / "summary.json").read_text())
    assert own["objective"] == "centroid_triplet" and own["objective_family"] == "group" and own["steps"] > 0
    assert json.loads((trial / "training" / "clip" / "summary.json").read_text())["spec_hash"] == \
        json.loads((out / "training" / "clip" / "summary.json").read_text())["spec_hash"]  # reused, not retrained
    # the triplet, and the exercise's own objective (the solution passes the property checks, so it trains too)
    assert set(pd.read_csv(trial / "evaluation" / "table3.csv").iloc[:, 0]) == {"zero-shot", "clip", "centroid",
                                                                                  "triplet", "yours"}
    assert (trial / "figures" / "09_fig4_your_objective.png").is_file()
    assert_no_error_cells(out, expected)  # the source notebooks stay clean: tests/test_foundation.py


@pytest.mark.slow
@pytest.mark.full  # `make test-full` only (book/tests.md)
def test_the_demo_rows_seeds_and_figure_formats_run(demo_paths_run):
    """The demo's code paths that the classroom profile leaves out, on training, evaluation and visualization
    (05-07): every kind of Table 3 row (RE, init, pretraining, the three losses), two training seeds (each with its
    own base and runs, the hierarchical bootstrap), every figure also as PDF."""
    params = deep_merge(yaml.safe_load((REPO / "params/classroom.yaml").read_text()), demo_code_paths())
    out = demo_paths_run
    runs = params["train"]["runs"]

    manifest = json.loads((out / "run.json").read_text())
    names = ["05_training.ipynb", "06_evaluation.ipynb", "07_visualization.ipynb"]
    assert [n["name"] for n in manifest["notebooks"]] == names
    assert all(n["status"] == "ok" for n in manifest["notebooks"])
    assert {"re", "clip", "pairwise", "centroid"} <= {r["loss"] for r in runs}
    assert any(r.get("init") for r in runs) and any(r.get("pretrain") for r in runs)
    assert_rows_trained_and_scored_with_their_own_weights(out, runs)
    # training seed 1: its own base and runs under training/seed1/
    for run_spec in runs:
        assert (out / "training" / "seed1" / run_spec["name"] / "final.safetensors").is_file()
    assert json.loads((out / "training/seed1/initial.json").read_text())["training_seed"] == 1
    metrics = pd.read_csv(out / "evaluation" / "metrics.csv")
    assert (metrics["n_seeds"] == 2).all() and (out / "evaluation" / "seeds.csv").is_file()
    assert "| seeds |" in (out / "evaluation" / "table3.md").read_text()
    figures = list((out / "figures").glob("*.png"))
    assert len(figures) >= 8 and all(f.with_suffix(".pdf").is_file() for f in figures)
    assert_no_error_cells(out, names)
