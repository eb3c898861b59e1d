"""The classroom profile (params/classroom.yaml) runs the whole series, solutions included, and every stage still
leaves its artefacts: captions, l1-l4 chains, the MAGIC DAG, the trained weights of the three losses, Table 3 with
its confidence intervals, the UMAP and the attention maps. Its time is measured by benchmarks/bench_classroom.py,
never asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from safetensors import safe_open

from cglib.cli import main as cli_main
from cglib.config import load_params
from cglib.pipeline import default_notebook_dir, discover_notebooks

REPO = Path(__file__).resolve().parent.parent
THREE_LOSSES = {"clip": "clip", "pairwise": "pairwise", "centroid": "centroid"}


def test_the_profile_validates_and_trains_the_three_losses_once():
    params = load_params(REPO / "params/classroom.yaml")
    assert {r.name: r.loss for r in params.train.runs} == THREE_LOSSES
    assert params.train.seeds == [0]
    assert params.eval.bootstrap > 0, "Table 3 must keep its confidence intervals"


def test_a_notebooks_cpu_time_counts_its_kernel(tmp_path, capsys):
    """run.json's cpu_s is the kernel's CPU too, not only the runner's: a cell that spins for 1.5 s of CPU makes
    its notebook cost at least that, and `cglib run` prints the per-notebook table."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cells = ['params_path = ""\nrun_dir = ""',
             "import time\nstart = time.process_time()\nwhile time.process_time() - start < 1.5:\n    pass"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "cglib", "display_name": "Python (cglib)", "language": "python"}
    nbformat.write(nb, notebooks / "01_spin.ipynb")
    params = tmp_path / "p.yaml"
    params.write_text("run:\n  name: spin\n  threads: 1\n")
    out = tmp_path / "run"
    assert cli_main(["run", str(params), "--notebooks", str(notebooks), "--out", str(out)]) == 0
    (spin,) = json.loads((out / "run.json").read_text())["notebooks"]
    assert spin["cpu_s"] >= 1.5, spin
    assert "01_spin.ipynb" in capsys.readouterr().out.split("Finished 1 notebooks")[1]


@pytest.mark.slow
def test_every_notebook_finished_with_its_wall_and_cpu_time(classroom_run):
    manifest = json.loads((classroom_run / "run.json").read_text())
    expected = [p.name for p in discover_notebooks(default_notebook_dir())]
    assert manifest["status"] == "ok"
    assert [n["name"] for n in manifest["notebooks"]] == expected and len(expected) == 10
    for notebook in manifest["notebooks"]:
        assert notebook["status"] == "ok", notebook
        assert notebook["duration_s"] > 0 and notebook["cpu_s"] > 0, notebook
    # the kernel's CPU is counted, not only the runner's: training alone takes seconds of CPU
    training = next(n for n in manifest["notebooks"] if n["name"].startswith("05_"))
    assert training["cpu_s"] > 5, training


@pytest.mark.slow
def test_captions_chains_and_the_magic_dag(classroom_run):
    dataset = json.loads((classroom_run / "captions/dataset.json").read_text())
    assert len(dataset["image_ids"]) > 0 and all(dataset["captions"][i] for i in dataset["image_ids"])
    records = [json.loads(line) for line in (classroom_run / "abstraction/chains.jsonl").read_text().splitlines()]
    chains = [r["chain"] for r in records if r["status"] == "ok"]
    assert len(chains) == len(dataset["image_ids"]), "an image without its l1-l4 chain"
    assert all(len(chain) == 4 for chain in chains), chains[0]
    magic = json.loads((classroom_run / "magic/magic.json").read_text())
    per_level = magic["stats"]["nodes_per_level"]
    assert all(per_level[f"l{k}"] > 1 for k in range(1, 5)), per_level
    splits = {image["split"] for image in magic["images"].values()}
    assert splits == {"train", "test"}, splits
    assert all(image["generalized_captions"] for image in magic["images"].values()), "LLM_gen (one per image)"
    l1 = [node for node in magic["nodes"].values() if node["level"] == 1]
    assert sum(bool(node["hard_negatives"]) for node in l1) > len(l1) / 2, "most l1 groups need a hard negative"


@pytest.mark.slow
def test_the_three_losses_left_trained_weights(classroom_run):
    for name in THREE_LOSSES:
        weights = classroom_run / "training" / name / "final.safetensors"
        with safe_open(str(weights), framework="pt") as f:
            assert len(list(f.keys())) > 0, weights


@pytest.mark.slow
def test_table3_has_every_model_with_confidence_intervals(classroom_run):
    table = pd.read_csv(classroom_run / "evaluation/table3.csv")
    assert {"zero-shot", *THREE_LOSSES} <= set(table["model"])
    columns = [c for c in table.columns if c.endswith(" ci_low")]
    assert columns, table.columns
    for low in columns:
        value, high = low.removesuffix(" ci_low"), low.replace("ci_low", "ci_high")
        finite = table[[low, value, high]].dropna()
        assert len(finite) == len(table), f"{value}: a model without a CI"
        assert (finite[low] <= finite[value]).all() and (finite[value] <= finite[high]).all(), value
        assert (finite[low] < finite[high]).any(), f"{value}: every interval has zero width"


@pytest.mark.slow
def test_the_umap_and_attention_figures(classroom_run):
    figures = classroom_run / "figures"
    for stem in ("07_umap_centroids", "07_attention_models"):
        assert (figures / f"{stem}.png").stat().st_size > 10_000, stem
    assert list(figures.glob("07_attention_heads_*.png"))


PAGE_PX = 1300  # the series' figures are read at their own size on a page this wide
SERIES_DPI = 150  # viz.dpi's default: the demo's figures are saved at it


def figures_too_wide(figures: Path, dpi: int) -> dict[str, int]:
    """Each PNG under `figures` wider than PAGE_PX, or than PAGE_PX would be at SERIES_DPI when the run saved at
    another dpi: name -> its width in px at SERIES_DPI."""
    from PIL import Image

    widths = {p.name: round(Image.open(p).size[0] * SERIES_DPI / dpi) for p in sorted(figures.glob("*.png"))}
    return {name: width for name, width in widths.items() if width > PAGE_PX}


@pytest.mark.slow
def test_every_figure_fits_a_1300_px_page(classroom_run):
    """Every figure the series saves is at most 1,300 px wide, at the run's dpi and at the series' 150 dpi."""
    figures = classroom_run / "figures"
    dpi = load_params(classroom_run / "params.yaml").viz.dpi
    assert len(list(figures.glob("*.png"))) >= 20
    assert figures_too_wide(figures, dpi) == {}
