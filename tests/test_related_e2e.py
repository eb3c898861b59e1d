"""The related methods (params/related.yaml's runs and tests) through notebooks 04-06 on the shared shrunken run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cglib.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_related_rows_train_and_are_scored_beside_the_paper_rows(small_run, tmp_path):
    """Every train.runs entry of params/related.yaml trains (tiny ViT, one seed) on the shared run's MAGIC, and
    evaluation scores each of them with the paper's protocol (a Table 3 row) and with both related tests
    (keyword permutation per type, clustering per level); notebooks 04-06 run headless without an error cell and
    06 shows both tests; the related rows enter no gain set."""
    related = yaml.safe_load((REPO / "params/related.yaml").read_text())
    params = yaml.safe_load((small_run / "params.yaml").read_text())
    params["model"].update(name="cglib-tiny-vit", text_tower="minilm", freeze_text=True)
    params["train"].update(runs=related["train"]["runs"], seeds=[0])
    params["train"]["base"]["corpus"] = "none"
    params["search"]["run"] = None
    params["ngram"] = {**related["ngram"], "min_images": 5}  # the shrunken world has 8 images per concept
    params["eval"].update(bootstrap=20, keyword_permutation=True, clustering=True)
    path = tmp_path / "params" / "related.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(params))
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    assert cli_main(["run", str(path), "--out", str(run), "--only", "04,05,06"]) == 0

    manifest = json.loads((run / "run.json").read_text())
    assert all(n["status"] == "ok" for n in manifest["notebooks"])
    names = [r["name"] for r in related["train"]["runs"]]
    table3 = pd.read_csv(run / "evaluation" / "table3.csv")
    assert set(names) <= set(table3.iloc[:, 0])
    metrics = pd.read_csv(run / "evaluation" / "metrics.csv")
    for benchmark in ("keyword_permutation", "clustering"):
        scored = set(metrics.loc[metrics["benchmark"] == benchmark, "model"])
        assert {"zero-shot", *names} <= scored, benchmark
    kinds = set(metrics.loc[metrics["benchmark"] == "keyword_permutation", "labels"])
    assert {"colour", "object", "location"} <= kinds
    results = json.loads((run / "evaluation" / "results.json").read_text())
    related_rows = {m["name"] for m in results["models"] if m.get("related")}
    assert related_rows == {"clip_hn", "centroid_memory", "ngram_centroid", "ngram_mcc"}
    gains = pd.read_csv(run / "evaluation" / "gains.csv")
    for column in ("models_a", "models_b"):
        assert not any(name in str(cell).split(";") for cell in gains[column] for name in related_rows)
    hn = json.loads((run / "training" / "clip_hn" / "summary.json").read_text())["hard_negatives"]
    assert hn["pairs"] == hn["with_hard_negative"] + hn["pairs_without_keyword"] + hn["pairs_without_other_text"]
    assert (run / "magic" / "ngram.json").is_file()

    executed = json.loads((run / "notebooks" / "06_evaluation.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   + "".join(o.get("data", {}).get("text/markdown", ""))  # the tables' captions
                   for c in executed["cells"] for o in c.get("outputs", []))
    assert "clustering accuracy_held_out" in text and "colour (n=" in text
