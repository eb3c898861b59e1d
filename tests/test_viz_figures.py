"""Figure regeneration: every figure of a finished run is rebuilt from saved files; a partial run is skipped
figure by figure with reasons, never crashing; a broken input fails only its own figure."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import yaml
from prepared_runs import train_all_prepared

from cglib.magic.files import save_magic
from cglib.run import open_run
from cglib.viz.figures import (
    DUAL_EFFECT_TABLE,
    MANIFEST,
    STEMS,
    FigureFailures,
    VizRun,
    build_figures,
    regenerate_figures,
)
from tests.factories import tiny_magic

PARAMS = {
    "run": {"name": "tiny", "device": "cpu", "threads": 1},
    "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip"},
    "train": {"runs": [{"name": "clip", "loss": "clip"}], "epochs": 1, "pairs_per_group": 4, "warmup_steps": 0,
              "lr": 1.0e-4, "pretrain_epochs": 0},
    "eval": {"bootstrap": 0, "seeds": [0]},
    "viz": {"attention_images": 2, "formats": ["png", "pdf"]},
}
MODELS = ("zero-shot", "clip")


def _run_with_data(root: Path, params: dict = PARAMS):
    """A run directory holding params, magic.json and the captions dataset (stages 01-03 done)."""
    params_path = root / "params" / "tiny.yaml"
    params_path.parent.mkdir(parents=True)
    params_path.write_text(yaml.safe_dump(params))
    run = open_run(params_path, root / "run")
    magic, dataset = tiny_magic()
    save_magic(magic, run.stage("magic") / "magic.json")
    dataset.save(run.stage("captions"))
    return run


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real, finished tiny run: trained with cglib.train and evaluated with cglib.evaluate (no fakes)."""
    from cglib.evaluate.pipeline import evaluate_run


    run = _run_with_data(tmp_path_factory.mktemp("finished"))
    train_all_prepared(run, progress=False)
    evaluate_run(run, progress=False)
    return run.dir


def _expected_stems() -> list[str]:
    stems = [STEMS[k] for k in ("caption_lengths", "image_grid", "loss_curves", "accuracy", "accuracy_absolute",
                                "gallery", "gallery_absolute", "gains", "umap", "dual_effect", "attention_models",
                                "geometry_within", "geometry_margin")]
    return stems + [STEMS["attention_heads"].format(model="clip")]  # the last compared model's only


@pytest.mark.slow
def test_cli_regenerates_every_figure_of_a_finished_run(finished_run, capsys):
    """`cglib figures RUN_DIR` writes PNG and PDF of every figure (the taxonomy is skipped: tiny_magic has no
    ground truth), the dual-effect table and a manifest with provenance, and exits 0."""
    from cglib.cli import main as cli_main

    eval_cache = {p: p.stat().st_mtime_ns for p in (finished_run / "evaluation" / "embeddings").glob("*.npz")}
    assert len(eval_cache) == len(MODELS)
    assert cli_main(["figures", str(finished_run)]) == 0
    assert {p: p.stat().st_mtime_ns for p in eval_cache} == eval_cache  # evaluation's cache read, never rewritten
    figures = finished_run / "figures"
    for stem in _expected_stems():
        for fmt in ("png", "pdf"):
            path = figures / f"{stem}.{fmt}"
            assert path.is_file() and path.stat().st_size > 1000, path
    manifest = json.loads((figures / MANIFEST).read_text())
    assert set(manifest["skipped"]) == {STEMS["taxonomy"], STEMS["search_history"], STEMS["search_importances"]}
    assert manifest["failed"] == {} and manifest["missing_models"] == {}
    assert manifest["provenance"]["params"]["viz"]["attention_images"] == 2
    table = (figures / DUAL_EFFECT_TABLE).read_text().splitlines()
    assert table[0].startswith("model,modality,level") and len(table) == 1 + 2 * 2 * 4  # models x modality x level
    assert f"skipped {STEMS['taxonomy']}" in capsys.readouterr().out


@pytest.mark.slow
def test_umap_panels_of_a_run_are_reproducible(finished_run):
    """Embeddings come from evaluation's cache; two loads of the same run give identical UMAP panels (same
    seed), image row then text row, zero-shot first."""
    vr = VizRun.open(finished_run, progress=False)
    first = [p.xy.copy() for p in vr.umap_panels]
    assert vr.embedding_sources == dict.fromkeys(MODELS, "evaluation cache")
    again = VizRun.open(finished_run, progress=False)
    assert all((a == b.xy).all() for a, b in zip(first, again.umap_panels))
    assert [(p.model, p.modality) for p in vr.umap_panels] == [(m, mod) for mod in ("image", "text") for m in MODELS]


def test_partial_run_skips_figures_with_reasons(tmp_path, capsys):
    """Before training: data figures are written, every model, training and evaluation figure is skipped with a
    printed reason, and nothing raises."""
    run = _run_with_data(tmp_path)
    report = build_figures(run.dir, formats=["png"])
    written = {p.name for p in report.written if p.suffix == ".png"}
    assert written == {f"{STEMS['caption_lengths']}.png", f"{STEMS['image_grid']}.png"}
    assert f"{STEMS['image_grid']}.figure.json" in {p.name for p in report.written}  # and their data
    assert report.failed == {}
    expected_skips = (set(_expected_stems()) - {STEMS["caption_lengths"], STEMS["image_grid"]}
                      | {STEMS["taxonomy"], STEMS["search_history"], STEMS["search_importances"]})
    assert set(report.skipped) == expected_skips
    assert "05_training" in report.skipped[STEMS["umap"]]
    assert "06_evaluation" in report.skipped[STEMS["accuracy"]]
    assert "08_search" in report.skipped[STEMS["search_history"]]
    out = capsys.readouterr().out
    assert f"{len(expected_skips)} skipped (missing inputs)" in out
    assert regenerate_figures(run.dir, formats=["png"], progress=False)  # same run through the CLI's entry point


def test_compared_models_default_to_base_clip_and_best_group_objective():
    """The demo's runs: zero-shot, clip (not hierarcaps_ft, which starts elsewhere) and the group objective with the
    best mean forced-choice accuracy at l1..l4 (the first group run before evaluation); viz.models overrides, an
    unknown name is a params error naming the choices."""
    from cglib.config import ParamsError, load_params
    from cglib.viz.viz_run import compared_models

    demo = Path(__file__).parents[1] / "params" / "demo.yaml"
    params = load_params(demo, check_paths=False)
    names = ["zero-shot", *(r.name for r in params.train.runs)]
    assert compared_models(params, names) == ["zero-shot", "clip", "pairwise"]
    metrics = pd.DataFrame([{"model": m, "benchmark": "forced_choice", "labels": "dag", "direction": "t2i",
                             "metric": "accuracy", "level": lv, "value": 0.9 if m == "centroid_pretrain" else 0.6}
                            for m in names for lv in ("l1", "l2", "caption")])
    metrics.loc[(metrics["model"] == "pairwise") & (metrics["level"] == "caption"), "value"] = 1.0  # not a level
    assert compared_models(params, names, metrics) == ["zero-shot", "clip", "centroid_pretrain"]
    assert compared_models(params, ["zero-shot", "pairwise"], metrics) == ["zero-shot", "pairwise"]
    chosen = load_params(demo, check_paths=False, overrides={"viz": {"models": ["centroid", "zero-shot"]}})
    assert compared_models(chosen, names) == ["centroid", "zero-shot"]
    with pytest.raises(ParamsError, match=r"viz.models names \['cnetroid'\].*pick from"):
        load_params(demo, check_paths=False, overrides={"viz": {"models": ["cnetroid"]}})


def test_empty_run_dir_is_a_clear_error(tmp_path):
    """A folder without params.yaml is not a run: the error says which file is missing."""
    with pytest.raises(FileNotFoundError, match="params.yaml"):
        regenerate_figures(tmp_path)


def test_a_broken_input_fails_its_figure_only(tmp_path):
    """Evaluation files without rows fail the five evaluation figures; the other figures are still written, then
    FigureFailures names the failed ones."""
    run = _run_with_data(tmp_path)
    evaluation = run.stage("evaluation")
    (evaluation / "metrics.csv").write_text("model,benchmark,labels,direction,metric,level,value,exposure\n")
    (evaluation / "differences.csv").write_text("model_a,model_b,benchmark,labels,direction,metric,level\n")
    (evaluation / "table3.csv").write_text("model\n")
    (evaluation / "results.json").write_text("{}")
    with pytest.raises(FigureFailures, match=STEMS["accuracy"]):
        regenerate_figures(run.dir, formats=["png"], progress=False)
    assert (run.dir / "figures" / f"{STEMS['image_grid']}.png").is_file()
    manifest = json.loads((run.dir / "figures" / MANIFEST).read_text())
    assert set(manifest["failed"]) == {STEMS[k] for k in ("accuracy", "accuracy_absolute", "gallery",
                                                          "gallery_absolute", "gains")}
    # the CLI turns it into exit code 1 naming the figure, and 2 for a folder that is not a run
    from cglib.cli import main as cli_main

    assert cli_main(["figures", str(run.dir), "--formats", "png"]) == 1
    assert cli_main(["figures", str(tmp_path / "not-a-run")]) == 2


@pytest.mark.slow
def test_geometry_averages_the_training_seeds_seed_k_against_seed_k(tmp_path):
    """With train.seeds [0, 1], the geometry figure's table averages each image's value over both seeds (read from
    evaluation's cache, nothing recomputed): its within-group change equals the mean over seeds of each seed's
    change from that seed's zero-shot model, computed here by hand from the cached embeddings."""
    from cglib.evaluate.geometry import group_geometry
    from cglib.evaluate.pipeline import evaluate_run
    from cglib.viz.figures import geometry_takeaway as vf_geometry_takeaway

    run = _run_with_data(tmp_path, {**PARAMS, "train": {**PARAMS["train"], "seeds": [0, 1]}})
    train_all_prepared(run, progress=False)
    evaluate_run(run, progress=False)
    cached = {p: p.stat().st_mtime_ns for p in (run.dir / "evaluation" / "embeddings").glob("*.npz")}
    vr = VizRun.open(run.dir, progress=False)
    table = vr.geometry
    assert {p: p.stat().st_mtime_ns for p in cached} == cached
    row = table.query("model_a == 'clip' and labels == 'dag' and level == 'l1' and metric == 'within'").iloc[0]
    assert row["n_seeds"] == 2

    def within(label: str) -> np.ndarray:
        with np.load(run.dir / "evaluation" / "embeddings" / f"{label}.magic.npz") as f:
            ids, images = f["image_ids"].tolist(), f["images"]
        return group_geometry(images, [vr.magic.images[i].node for i in ids])["within"]

    by_hand = np.mean([within("clip") - within("zero-shot"), within("clip@seed1") - within("zero-shot@seed1")],
                      axis=0)
    assert row["difference"] == pytest.approx(np.nanmean(by_hand), abs=1e-9)
    assert vf_geometry_takeaway(vr, "within").startswith("Within-group cosine: ")
