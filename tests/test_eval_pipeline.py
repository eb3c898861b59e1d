"""`evaluate_run` end to end on tiny_magic with the tiny ViT (real training, real files), the embedding cache,
and HierarCaps on the real 1K test set with the demo model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from prepared_runs import train_all_prepared

from cglib.data.dataset import save_ground_truth
from cglib.evaluate import evaluate_run, load_results, load_scores, paper
from cglib.evaluate.gains import model_roles
from cglib.evaluate.report import METRIC_COLUMNS
from cglib.evaluate.table3 import table3_values
from cglib.magic.files import save_magic
from cglib.run import RunContext, open_run
from tests.factories import tiny_magic

EVAL_FILES = ["results.json", "metrics.csv", "differences.csv", "table3.csv", "table3.md", "gains.csv", "scores.npz"]


def make_run(tmp_path: Path, runs: list[dict], model: str = "cglib-tiny-vit", data: dict | None = None,
             **eval_params) -> RunContext:
    """A run directory holding tiny_magic's captions (with ground truth), magic.json and params."""
    params = {"run": {"name": "tiny", "seed": 0, "device": "cpu", "threads": 1, "output_dir": str(tmp_path)},
              "data": data or {},
              "model": {"name": model, "text_tower": "minilm", "freeze_text": True},
              "train": {"runs": runs, "epochs": 1, "groups_per_batch": 2, "pairs_per_group": 4, "lr": 1.0e-3,
                        "warmup_steps": 1, "pretrain_epochs": 1},
              "eval": {"bootstrap": 200, "seeds": [0, 1], **eval_params}}
    path = tmp_path / "params" / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params))
    run = open_run(path, tmp_path / "run")
    magic, dataset = tiny_magic()
    save_magic(magic, run.stage("magic") / "magic.json")
    dataset.save(run.stage("captions"))
    truth = {i: magic.chain_names(i) for i in magic.images}
    truth["img-00-00"] = ["wedding", "celebration", "social gathering", "human activity"]  # GT may differ
    save_ground_truth(run.stage("captions"), truth)
    return run


def test_zero_shot_evaluation_writes_every_file_and_reuses_its_cache(tmp_path):
    """Zero-shot only: every result file is written, metrics are tidy with CIs, a rerun reads the embedding
    cache and reproduces the same numbers, and load_results reads the files back."""
    from cglib.train import ensure_initial

    run = make_run(tmp_path, runs=[])
    ensure_initial(run)
    first = evaluate_run(run, progress=False)
    out = run.dir / "evaluation"
    for name in EVAL_FILES:
        assert (out / name).is_file(), name
    assert (out / "embeddings" / "zero-shot.magic.npz").is_file()
    m = first.metrics
    assert list(m.columns) == METRIC_COLUMNS
    fc = m[(m["benchmark"] == "forced_choice") & (m["labels"] == "dag") & (m["direction"] == "t2i")]
    assert set(fc["level"]) == {"caption", "generalized", "l1", "l2", "l3", "l4"}
    l1 = fc[fc["level"] == "l1"].iloc[0]
    assert l1["n"] == 12 and l1["n_queries"] == 24 and l1["ci_low"] <= l1["value"] <= l1["ci_high"]
    # tiny_magic's hard negatives are siblings: at l2 every item is excluded, and that is reported
    l2 = fc[fc["level"] == "l2"].iloc[0]
    assert l2["n"] == 0 and l2["n_excluded"] == 24 and np.isnan(l2["value"])
    assert {"gallery", "coco"} <= set(m["benchmark"]) and "ground_truth" in set(m["labels"])
    assert first.info["embeddings_computed"] == {"zero-shot.magic": ["images", "texts"]}

    again = evaluate_run(run, progress=False)
    assert again.info["embeddings_computed"] == {"zero-shot.magic": []}
    pd.testing.assert_frame_equal(first.metrics, again.metrics)

    loaded = load_results(run.dir)
    assert loaded.models == ["zero-shot"]
    np.testing.assert_allclose(loaded.metrics["value"].to_numpy(float), first.metrics["value"].to_numpy(float))
    scores = load_scores(run.dir)
    key = ("forced_choice", "dag", "t2i", "accuracy", "l1")
    assert scores[key]["zero-shot"].values.mean() == pytest.approx(l1["value"])
    assert json.loads((out / "results.json").read_text())["provenance"]["params"]["eval"]["seeds"] == [0, 1]
    # no trained model: every gain row is absent, and table3.md says why
    assert loaded.gains.empty and loaded.gain_notes() == first.gain_notes()
    assert "- MAGIC: absent: needs models fine-tuned on MAGIC" in (out / "table3.md").read_text()


@pytest.mark.slow
def test_trained_models_are_compared_on_identical_items(tmp_path):
    """Two trained runs and the zero-shot model: same items for every model (same n per row), paired
    differences for every pair, exposure marked for the run pretrained on concept names, Table 3 and Fig. 4
    regenerated from the saved files alone."""

    from cglib.viz.eval_figures import plot_accuracy_by_level

    run = make_run(tmp_path, runs=[{"name": "clip", "loss": "clip"},
                                   {"name": "pairwise", "loss": "pairwise", "pretrain": "with_concepts"}])
    train_all_prepared(run, progress=False)
    result = evaluate_run(run, progress=False)
    m = result.metrics
    assert result.models == ["zero-shot", "clip", "pairwise"]
    per_key = m.groupby(["benchmark", "labels", "direction", "metric", "level"])["n_queries"].nunique()
    assert (per_key == 1).all()  # every model scored on the same queries
    assert m[m["model"] == "pairwise"]["exposed_to_eval_strings"].all()
    assert not m[m["model"] == "clip"]["exposed_to_eval_strings"].any()
    pairs = set(map(tuple, result.differences[["model_a", "model_b"]].to_numpy()))
    assert pairs == {("clip", "zero-shot"), ("pairwise", "zero-shot"), ("pairwise", "clip")}
    # the frozen-tower models share text embeddings; the pretrained text tower gets its own
    computed = result.info["embeddings_computed"]
    assert computed["clip.magic"] == ["images"] and computed["pairwise.magic"] == ["images", "texts"]
    assert any("pairwise vs clip" in s for s in result.info["reading"])

    loaded = load_results(run.dir)
    md = (run.dir / "evaluation" / "table3.md").read_text()
    assert "pairwise †" in md and "95% bootstrap CI" in md
    assert list(loaded.table3.index) == ["zero-shot", "clip", "pairwise"]
    # roles saved per model; the gain rows under Table 3 from them and the per-item scores
    roles = {m["name"]: (m["fine_tuned_on_magic"], m["objective"], m["pretrain"], m["init"])
             for m in loaded.info["models"]}
    assert roles == {"zero-shot": (False, "none", "none", None), "clip": (True, "clip", "none", "zero-shot"),
                     "pairwise": (True, "pairwise", "with_concepts", "zero-shot")}
    assert set(loaded.gains["gain"]) == {"MAGIC", "Loss Function", "Best Model"}
    pd.testing.assert_frame_equal(loaded.gains, result.gains, check_dtype=False)
    assert "| Avg Accuracy Gain w.r.t. MAGIC (ours) |" in md and "Pretraining: absent" in md
    # both protocols in one run: Table 3 as the authors scored it beside the paper's rows, same models and columns
    assert list(loaded.table3_published.index) == list(loaded.table3.index)
    assert list(loaded.table3_published.columns) == list(loaded.table3.columns)
    published = m[m["benchmark"] == "forced_choice_published"]
    assert set(published["level"]) == set(m[m["benchmark"] == "forced_choice"]["level"])
    assert (published["chance"] == 0.5).all()
    md_published = (run.dir / "evaluation" / "table3_as_published.md").read_text()
    assert "| paper: CLEAR GLASS pairwise |" in md_published and "2-way, as published, chance 50.0%" in md_published
    assert "TIES GO TO THE ANCHOR" in md_published
    # the gain rows by the paper's rule on this table as published, each beside the paper's printed row; the rows
    # enter by role: pairwise (pretrained, a group loss) over zero-shot and clip for Loss Function and Pretraining
    by_rule = paper.paper_gains(table3_values(loaded.table3_published), model_roles(loaded.info["models"]))
    values = table3_values(loaded.table3_published)
    expected = 100 * (values.loc["pairwise"] / values.loc[["zero-shot", "clip"]].mean() - 1)
    pd.testing.assert_series_equal(by_rule.loc["Loss Function"], paper.truncate_tenths(expected.to_frame().T).iloc[0],
                                   check_names=False)
    pd.testing.assert_series_equal(by_rule.loc["Pretraining"], by_rule.loc["Loss Function"], check_names=False)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in md_published.splitlines() if line.startswith("| ")}
    l1 = next(i for i, h in enumerate(rows["| model"]) if h.startswith("MAGIC l1 ("))
    assert rows["| Avg Accuracy Gain w.r.t. MAGIC (paper's rule)"][l1] == f"{by_rule.loc['MAGIC', 'MAGIC l1']:+.1f}%"
    assert rows["| paper: Avg Accuracy Gain w.r.t. MAGIC"][l1] == "+3.6%"
    assert "## Gain rows by the paper's rule" in md_published
    # what the evaluation corrections change: every column with its published twin, the same on reload
    assert set(loaded.protocol_changes["column"]) == set(loaded.table3.columns[loaded.table3.columns.isin(
        [c for c in loaded.table3.columns if not c.endswith((" ci_low", " ci_high", " n", " chance"))
         and c not in ("exposed_to_eval_strings", "seeds")])])
    assert (loaded.protocol_changes["models"] == 3).all() and "## What the evaluation corrections change" in md_published
    fig = plot_accuracy_by_level(pd.read_csv(run.dir / "evaluation" / "metrics.csv"))
    assert [a.get_title() for a in fig.axes if a.get_visible()] == ["zero-shot", "clip", "pairwise †"]
    assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["scored against the MAGIC DAG (magic.json)",
                                                                       "scored against the world's ground truth"]
    from cglib.viz.compare import model_families, plot_difference_from_reference

    fig = plot_difference_from_reference(loaded.differences, families=model_families(loaded.info["models"]),
                                         exposed=["pairwise"])
    assert {t.get_text() for t in fig.axes[0].get_yticklabels()} == {"clip", "pairwise †"}


@pytest.mark.slow
def test_hierarcaps_real_data_with_the_demo_model(tmp_path, shared_data):
    """The 1K HierarCaps test set with the demo model's random image tower and MiniLM text tower: 1,000 items,
    repeated level-1/2 strings handled, retrieval near chance, the hierarchy metric's Kendall tau from the
    pretrained text side well above 0 (general texts sit nearer the empty string)."""
    from cglib.train import ensure_initial

    data = {"hierarcaps_csv": str(shared_data / "hierarcaps" / "hierarcaps_test.csv"),
            "hierarcaps_images": str(shared_data / "hierarcaps" / "test_imgs")}
    run = make_run(tmp_path, runs=[], model="cglib-demo-vit", data=data, hierarcaps=True, hierarcaps_batch=10,
                   bootstrap=300)
    ensure_initial(run)
    result = evaluate_run(run, progress=False)
    m = result.metrics.set_index(["benchmark", "direction", "metric", "level"])
    assert result.info["hierarcaps"]["n_items"] == 1000
    retrieval = m.loc[("hierarcaps", "t2i", "R@1", "l1")]
    assert retrieval["n"] == 1000 and retrieval["value"] < 0.05
    batch = m.loc[("hierarcaps_batch", "t2i", "R@1", "l4")]
    assert batch["ci_low"] <= 0.1 + 0.05 and batch["chance"] == pytest.approx(0.1, abs=0.01)
    # level 1 strings repeat, so a random pick among 10 hits more often than 1/10
    assert m.loc[("hierarcaps_batch", "t2i", "R@1", "l1")]["chance"] > 0.1
    tau = m.loc[("hierarcaps_hierarchy", "-", "kendall_tau", "all")]
    assert tau["ci_low"] > 0.2
    # the authors' 2-way columns: against one item drawn from all 1,000 (rarely itself), near chance here
    published = m.loc[("hierarcaps_published", "t2i", "accuracy", "l4")]
    assert published["n"] == 1000 and published["chance"] == pytest.approx(0.5, abs=0.01)
    # one record per CSV row, its level-4 text the concept: every drawn concept is found, no item skipped
    unmatched = result.info["hierarcaps"]["published_unmatched"]
    assert unmatched and set(unmatched.values()) == {0}
    assert 0.35 < published["value"] < 0.7
    assert [c for c in result.table3_published.columns if c.startswith("HierarCaps l") and " " not in c[11:]] == \
        ["HierarCaps l1", "HierarCaps l2", "HierarCaps l3", "HierarCaps l4"]
    print("\nHierarCaps, demo model (random image tower, MiniLM text):")
    print(result.metrics[result.metrics["benchmark"].str.startswith("hierarcaps")
                         & (result.metrics["metric"].isin(["R@1", "precision", "recall", "kendall_tau"]))]
          [["benchmark", "direction", "metric", "level", "value", "ci_low", "ci_high", "chance"]].to_string())


def test_hierarcaps_leaves_out_images_the_models_trained_on(tmp_path):
    """HierarCaps is unseen data: by default items whose image is in MAGIC's train split are left out of every
    HierarCaps number and counted; eval.hierarcaps_include_train: true scores them, with the caution note."""
    from cglib.data.coco_export import write_synthetic_coco
    from cglib.evaluate.benchmarks.hierarcaps import HierarCaps, load_hierarcaps_items
    from cglib.evaluate.table3 import hierarcaps_items_note

    written = write_synthetic_coco(tmp_path / "coco", images_per_concept=1, hierarcaps_per_concept=1)
    data = {"hierarcaps_csv": str(written.hierarcaps_csv), "hierarcaps_images": str(written.hierarcaps_images)}
    magic, _ = tiny_magic()
    stems = sorted(p.stem for p in written.hierarcaps_images.iterdir())
    train = [r for r in magic.images.values() if r.split == "train"][:5]
    test = [r for r in magic.images.values() if r.split == "test"][:3]
    # five HierarCaps photos are MAGIC training images, three are MAGIC test images, the rest never in the run
    records = {stem: r.model_copy(update={"id": stem}) for stem, r in zip(stems, train + test)}
    seen_magic = magic.model_copy(update={"images": records})
    for include, expected in ((False, len(stems) - 5), (True, len(stems))):
        run = make_run(tmp_path / str(include), runs=[], data=data, hierarcaps=True, hierarcaps_batch=4,
                       hierarcaps_include_train=include)
        hc = load_hierarcaps_items(run, seen_magic, 32, progress=False)
        assert len(hc.items) == len(hc.images.ids) == expected
        assert hc.overlap == {"any": 8, "train": 5}
        assert set(stems[:5]).isdisjoint(hc.images.ids) != include
        described = HierarCaps().describe(hc, {})["hierarcaps"]
        assert described["published_unmatched"] == {str(seed): 0 for seed in run.params.eval.seeds}
        assert all(len(draw.texts) == expected for draw in hc.published.values())
        note = hierarcaps_items_note(described)
        if include:
            assert "5 of them on images in this run's MAGIC train split" in note and "compare with care" in note
        else:
            assert f"{expected} items scored, all on images unseen in training; 5 left out" in note
            assert "fewer than 400" in note

    all_train = magic.model_copy(update={"images": {s: train[0].model_copy(update={"id": s}) for s in stems}})
    run = make_run(tmp_path / "all", runs=[], data=data, hierarcaps=True, hierarcaps_batch=4)
    with pytest.raises(ValueError, match="none is unseen; raise magic.test_fraction"):
        load_hierarcaps_items(run, all_train, 32, progress=False)
