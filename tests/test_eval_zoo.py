"""The benchmark zoo (`eval.zoo`): frozen reference models scored on the trained models' items, skipped when
their weights cannot be loaded, in no gain set; `cglib evaluate-model` on a finished run; params validation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cglib.config import ParamsError, parse_params
from cglib.evaluate.gains import GAIN_COLUMNS, best_model, gain_notes, gain_sets, model_roles
from tests.test_eval_pipeline import make_run

REPO = Path(__file__).resolve().parents[1]
TINY_CLIP = {"name": "cglib-tiny-clip", "text_tower": "open_clip"}


# ------------------------------------------------------------------------------------------- params
def _zoo(*entries: dict, runs: list[dict] | None = None) -> dict:
    return {"train": {"runs": runs or []}, "eval": {"zoo": list(entries)}}


def test_zoo_params_validate_names_and_resolve_paths(tmp_path):
    """Unique names other than zero-shot and the train.runs names, errors naming the key and the fix; relative
    checkpoints resolve against the repo root; an unset text tower is the model's own (open_clip)."""
    params = parse_params(_zoo({"name": "clip-openai", "model": {"name": "ViT-B-32", "pretrained": "openai"}},
                               {"name": "local", "model": {"name": "cglib-tiny-clip", "checkpoint": "w.safetensors"}},
                               {"name": "demo", "model": {"name": "cglib-demo-vit"}}), tmp_path)
    zoo = params.eval.zoo
    assert [z.name for z in zoo] == ["clip-openai", "local", "demo"]
    assert zoo[0].model.text_tower == "open_clip" and zoo[2].model.text_tower == "minilm"
    assert zoo[1].model.checkpoint == tmp_path / "w.safetensors"  # missing here: skipped at evaluation, not here
    assert parse_params({}, tmp_path).eval.zoo == []

    with pytest.raises(ParamsError, match=r"eval.zoo: .*duplicate names \['a'\].*its own name"):
        parse_params(_zoo({"name": "a", "model": TINY_CLIP}, {"name": "a", "model": TINY_CLIP}), tmp_path)
    with pytest.raises(ParamsError, match=r"eval.zoo: .*'zero-shot' is the untrained model's row; rename"):
        parse_params(_zoo({"name": "zero-shot", "model": TINY_CLIP}), tmp_path)
    with pytest.raises(ParamsError, match=r"eval.zoo names \['clip'\] are also train.runs names; rename"):
        parse_params(_zoo({"name": "clip", "model": TINY_CLIP}, runs=[{"name": "clip", "loss": "clip"}]), tmp_path)
    with pytest.raises(ParamsError, match=r"eval.zoo\[0\].model.pretraind: unknown key; did you mean 'pretrained'"):
        parse_params(_zoo({"name": "x", "model": {"name": "ViT-B-32", "pretraind": "openai"}}), tmp_path)
    with pytest.raises(ParamsError, match=r"eval.zoo\[0\].model: required key is missing"):
        parse_params(_zoo({"name": "x"}), tmp_path)
    with pytest.raises(ParamsError, match=r"eval.zoo\[0\].name: String should match pattern"):
        parse_params(_zoo({"name": "a b", "model": TINY_CLIP}), tmp_path)


# -------------------------------------------------------------------------------------------- roles
def _metrics(values: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "benchmark": "forced_choice", "labels": "dag", "direction": "t2i",
                          "metric": "accuracy", "level": "l1", "value": v, "ci_low": v - 0.1, "ci_high": v + 0.1,
                          "n": 10, "exposed_to_eval_strings": False} for m, v in values.items()])


def test_a_zoo_model_is_in_no_gain_set_and_never_the_best_or_the_base():
    """Even when it scores highest, a zoo model is neither the best model nor a base; it is on no side of a gain."""
    models = [{"name": "zero-shot", "loss": None, "fine_tuned_on_magic": False, "objective": "none", "init": None},
              {"name": "clip", "loss": "clip", "fine_tuned_on_magic": True, "objective": "clip", "init": "zero-shot"},
              {"name": "pairwise", "loss": "pairwise", "fine_tuned_on_magic": True, "objective": "pairwise",
               "init": "zero-shot"},
              {"name": "openai", "loss": None, "fine_tuned_on_magic": False, "objective": "none", "init": None,
               "zoo": True, "spec": {"name": "ViT-B-32", "pretrained": "openai"}}]
    roles = model_roles(models)
    assert roles["openai"].zoo and not roles["openai"].is_base and roles["zero-shot"].is_base
    best = best_model(_metrics({"zero-shot": 0.5, "clip": 0.6, "pairwise": 0.7, "openai": 0.9}), roles)
    assert best == "pairwise"
    sets = gain_sets(roles, best)
    assert sets["MAGIC"][:2] == (["clip", "pairwise"], ["zero-shot"])
    assert sets["Best Model"][:2] == (["pairwise"], ["zero-shot"])
    assert all("openai" not in a + b for a, b, _ in sets.values())
    only_zoo = model_roles([models[0], models[3]])
    assert best_model(_metrics({"zero-shot": 0.5, "openai": 0.9}), only_zoo) is None
    notes = gain_notes(pd.DataFrame(columns=GAIN_COLUMNS), sets, roles, 100, 0.95)
    assert any(n.startswith("Zoo models (openai: frozen reference models") for n in notes)


# ------------------------------------------------------------------------------------------ pipeline
@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    """tiny_magic, the zero-shot tiny ViT + MiniLM (32 px) and a zoo: cglib-tiny-clip at 48 px with a 64-d joint
    space, a local checkpoint (save_weights), and two that cannot load (a missing file, an unknown architecture)."""
    from cglib.config import ModelParams
    from cglib.models import build_model
    from cglib.train import ensure_initial
    from cglib.weights import save_weights

    tmp_path = tmp_path_factory.mktemp("zoo")
    checkpoint = save_weights(build_model(ModelParams(**TINY_CLIP)).model, tmp_path / "local.safetensors")
    zoo = [{"name": "tiny-48", "model": {"name": "cglib-tiny-clip", "embed_dim": 64, "image_size": 48}},
           {"name": "local", "model": {**TINY_CLIP, "checkpoint": str(checkpoint)}},
           {"name": "missing", "model": {**TINY_CLIP, "checkpoint": str(tmp_path / "nowhere.safetensors")}},
           {"name": "unknown", "model": {"name": "NoSuchArch-B-99", "pretrained": "openai"}}]
    run = make_run(tmp_path, runs=[], zoo=zoo)
    ensure_initial(run)
    return run


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def zoo_evaluated(zoo_run):
    """The zoo run evaluated once, with the warnings it logged."""
    from cglib.evaluate import evaluate_run

    records = _Records()
    log = logging.getLogger("cglib.evaluate.pipeline")
    log.addHandler(records)
    try:
        result = evaluate_run(zoo_run, progress=False)
    finally:
        log.removeHandler(records)
    return zoo_run, result, records.messages


def test_zoo_models_are_scored_on_the_same_items_and_unloadable_ones_skipped(zoo_evaluated):
    """The two loadable zoo models are rows of metrics, differences, Table 3 and results.json on the zero-shot
    model's items (same n and queries everywhere), at their own input size; the two others are warned about,
    listed in zoo_skipped and under table3.md; a rerun reads every embedding from the cache; Fig. 4 draws them."""
    from cglib.evaluate import evaluate_run, load_results
    from cglib.viz.eval_figures import plot_accuracy_by_level

    zoo_run, result, warned = zoo_evaluated
    assert result.models == ["zero-shot", "tiny-48", "local"]
    skipped = result.info["zoo_skipped"]
    assert set(skipped) == {"missing", "unknown"}
    assert "nowhere.safetensors" in skipped["missing"] and "NoSuchArch-B-99" in skipped["unknown"]
    assert any("'missing' skipped" in w and "nowhere.safetensors" in w for w in warned)
    assert any("'unknown' skipped" in w for w in warned)

    m = result.metrics
    assert set(m["model"]) == {"zero-shot", "tiny-48", "local"}
    per_key = m.groupby(["benchmark", "labels", "direction", "metric", "level"])[["n", "n_queries"]].nunique()
    assert (per_key == 1).all().all()  # every model on the same items and queries
    fc = m[(m["benchmark"] == "forced_choice") & (m["labels"] == "dag") & (m["direction"] == "t2i")
           & (m["level"] == "l1")].set_index("model")
    assert (fc["n"] == 12).all() and not fc["exposed_to_eval_strings"].any() and (fc["exposure"] == "").all()
    pairs = set(map(tuple, result.differences[["model_a", "model_b"]].to_numpy()))
    assert {("tiny-48", "zero-shot"), ("local", "zero-shot")} <= pairs
    assert list(result.table3.index) == ["zero-shot", "tiny-48", "local"]
    roles = {m["name"]: (m.get("zoo", False), m["fine_tuned_on_magic"], m["objective"]) for m in result.info["models"]}
    assert roles == {"zero-shot": (False, False, "none"), "tiny-48": (True, False, "none"),
                     "local": (True, False, "none")}
    assert next(m for m in result.info["models"] if m["name"] == "tiny-48")["spec"]["image_size"] == 48
    # the 48 px model saw the same in-memory test pixels, resized by the model; 64-d embeddings
    emb = np.load(zoo_run.dir / "evaluation" / "embeddings" / "tiny-48.magic.npz")
    assert emb["images"].shape == (12, 64)

    md = (zoo_run.dir / "evaluation" / "table3.md").read_text()
    assert "| tiny-48 |" in md and "| local |" in md and "Zoo (frozen reference models" in md
    assert "Zoo model missing skipped, not scored" in md and "Zoo model unknown skipped" in md
    assert "Zoo models (tiny-48, local: frozen reference models, eval.zoo) are in no gain set" in md
    assert result.gains.empty  # no trained model: the zoo does not make a gain appear
    saved = json.loads((zoo_run.dir / "evaluation" / "results.json").read_text())
    assert set(saved["zoo_skipped"]) == {"missing", "unknown"}
    assert load_results(zoo_run.dir).models == ["zero-shot", "tiny-48", "local"]

    again = evaluate_run(zoo_run, progress=False)
    assert again.info["embeddings_computed"] == {"zero-shot.magic": [], "tiny-48.magic": [], "local.magic": []}
    pd.testing.assert_frame_equal(result.metrics, again.metrics)

    fig = plot_accuracy_by_level(pd.read_csv(zoo_run.dir / "evaluation" / "metrics.csv"))
    assert {"zero-shot", "tiny-48", "local"} <= {ax.get_title() for ax in fig.axes}


def test_zoo_cache_key_holds_the_spec(tmp_path):
    """Same weights, another spec (activation): the cached embeddings are not reused."""
    from cglib.config import ModelParams
    from cglib.evaluate.loading import zoo_fingerprints
    from cglib.models import build_model

    spec = ModelParams(**TINY_CLIP)
    bundle = build_model(spec)
    other = spec.model_copy(update={"force_activation": "quick_gelu"})
    assert zoo_fingerprints(bundle, spec) == zoo_fingerprints(bundle, spec)
    a, b = zoo_fingerprints(bundle, spec), zoo_fingerprints(bundle, other)
    assert a[0] != b[0] and a[1] != b[1]


def test_cglib_evaluate_model_on_a_finished_run(zoo_evaluated, tmp_path, capsys):
    """`cglib evaluate-model`: results under evaluation/models/NAME/ with the zero-shot model for reference (its
    cached embeddings reused), the Table 3 row printed; a checkpoint path uses the run's architecture; exit 2 for
    a folder that is not a run or a bad spec, 1 for a model that cannot be loaded."""
    from cglib.cli import main

    zoo_run = zoo_evaluated[0]
    params = str(zoo_run.params_path)
    run_dir = str(zoo_run.dir)
    code = main(["evaluate-model", params, "--model", "{name: cglib-tiny-clip, embed_dim: 32}", "--name", "tiny32",
                 "--run-dir", run_dir, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    folder = zoo_run.dir / "evaluation" / "models" / "tiny32"
    for name in ("metrics.csv", "table3.md", "results.json", "differences.csv"):
        assert (folder / name).is_file(), name
    assert "| tiny32 |" in out and "| zero-shot |" in out
    metrics = pd.read_csv(folder / "metrics.csv")
    assert set(metrics["model"]) == {"zero-shot", "tiny32"}
    assert (metrics.groupby(["benchmark", "labels", "direction", "metric", "level"])["n"].nunique() == 1).all()
    main_metrics = pd.read_csv(zoo_run.dir / "evaluation" / "metrics.csv")
    key = ["benchmark", "labels", "direction", "metric", "level"]
    zs = metrics[metrics["model"] == "zero-shot"].merge(main_metrics[main_metrics["model"] == "zero-shot"], on=key)
    np.testing.assert_allclose(zs["value_x"], zs["value_y"])  # the same items as the run's evaluation
    info = json.loads((folder / "results.json").read_text())
    assert info["embeddings_computed"]["zero-shot.magic"] == []  # the run's own cache
    assert [m["name"] for m in info["models"]] == ["zero-shot", "tiny32"]

    initial = zoo_run.dir / "training" / "initial.safetensors"
    assert main(["evaluate-model", params, "--model", str(initial), "--run-dir", run_dir, "--quiet"]) == 0
    row = pd.read_csv(zoo_run.dir / "evaluation" / "models" / "initial" / "table3.csv", index_col="model")
    assert row.loc["initial", "MAGIC l1"] == pytest.approx(row.loc["zero-shot", "MAGIC l1"])  # the same weights
    capsys.readouterr()

    assert main(["evaluate-model", params, "--model", "{name: cglib-tiny-clip}", "--run-dir",
                 str(tmp_path), "--quiet"]) == 2
    assert "is not a finished run folder" in capsys.readouterr().err
    assert main(["evaluate-model", params, "--model", "{pretraind: openai}", "--run-dir", run_dir]) == 2
    assert "did you mean 'pretrained'" in capsys.readouterr().err
    assert main(["evaluate-model", params, "--model", "ViT-B-32", "--run-dir", run_dir]) == 2
    assert "pass a mapping like" in capsys.readouterr().err
    assert main(["evaluate-model", params, "--model", "{name: NoSuchArch-B-99}", "--run-dir", run_dir,
                 "--quiet"]) == 1
    assert "could not be loaded" in capsys.readouterr().err
    assert not (zoo_run.dir / "evaluation" / "models" / "NoSuchArch-B-99").exists()
    assert main(["evaluate-model", params, "--model", str(tmp_path / "gone.safetensors"), "--run-dir", run_dir,
                 "--quiet"]) == 1
    assert "checkpoint not found" in capsys.readouterr().err


def test_file_images_are_fed_at_the_zoo_models_own_size(tmp_path):
    """Image files: the zero-shot model reads the run's image cache at 32 px, a 48 px zoo model one built at 48 px
    (both kept under cache/images), on the same items; HierarCaps (synthetic-format files) likewise."""
    from PIL import Image

    from cglib.data.coco_export import write_synthetic_coco
    from cglib.data.dataset import CaptionDataset
    from cglib.evaluate import evaluate_run
    from cglib.train import ensure_initial

    synth = write_synthetic_coco(tmp_path / "synth", images_per_concept=1, image_size=32, captions_per_image=1,
                                 hierarcaps_per_concept=1, workers=1)
    data = {"hierarcaps_csv": str(synth.hierarcaps_csv), "hierarcaps_images": str(synth.hierarcaps_images)}
    run = make_run(tmp_path, runs=[], data=data, hierarcaps=True, hierarcaps_batch=5,
                   zoo=[{"name": "tiny-48", "model": {"name": "cglib-tiny-clip", "image_size": 48}}])
    ensure_initial(run)
    memory = CaptionDataset.load(run.dir / "captions")
    folder = tmp_path / "images"
    folder.mkdir()
    files = {}
    for image_id, pixels in zip(memory.image_ids, memory.pixels):
        files[image_id] = folder / f"{image_id}.png"
        Image.fromarray(pixels).save(files[image_id])
    CaptionDataset(source="coco", image_ids=memory.image_ids, captions=memory.captions,
                   image_files=files).save(run.dir / "captions")
    result = evaluate_run(run, progress=False)
    assert result.models == ["zero-shot", "tiny-48"] and result.info["zoo_skipped"] == {}
    sizes = sorted(p.name.split("px-")[0] for p in (run.dir / "cache" / "images").iterdir() if "px-" in p.name)
    assert sizes.count("32") == 2 and sizes.count("48") == 2  # MAGIC and HierarCaps caches at each size
    hc = result.metrics[result.metrics["benchmark"] == "hierarcaps_batch"]
    assert set(hc["model"]) == {"zero-shot", "tiny-48"} and (hc.groupby("level")["n"].nunique() == 1).all()
    assert result.info["embeddings_computed"]["tiny-48.hierarcaps"] == ["images", "texts"]
    m = result.metrics
    assert (m.groupby(["benchmark", "labels", "direction", "metric", "level"])["n"].nunique() == 1).all()
    l1 = m[(m["benchmark"] == "forced_choice") & (m["labels"] == "dag") & (m["level"] == "l1")]
    assert l1["n"].eq(12).all() and set(l1["model"]) == {"zero-shot", "tiny-48"}
