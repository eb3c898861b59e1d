"""A figure's data saved beside it (`cglib.figure_data`, `save_figure`) and every figure redrawn from those files
alone (`cglib figures RUN_DIR --from-data`): the redrawn figure plots exactly what the first one did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import optuna
import pandas as pd
import pytest
from prepared_runs import train_all_prepared

from cglib.figure_data import load_call, replot, replottable, saved_stems, write_figure_data
from cglib.viz.style import apply_style, save_figure
from tests.factories import tiny_magic

DATA_SUFFIXES = (".csv", ".npz", ".json")


@replottable
def _draw_everything(table: pd.DataFrame, image: np.ndarray, crops: list[np.ndarray], extra: pd.DataFrame | None,
                     names: tuple[str, ...], options: dict) -> plt.Figure:
    fig, ax = plt.subplots()
    ax.plot(table["x"], table["y"])
    return fig


def _mixed_table() -> pd.DataFrame:
    return pd.DataFrame({"x": [1, 2, 3], "y": [0.5, np.nan, 1.5], "name": ["a", "NA", "c"],
                         "flag": [True, False, True], "maybe": [True, np.nan, False], "level": ["l1", "caption", "l2"],
                         "p": pd.Series([0.5, None, 2], dtype=object, index=["p", "q", "r"])},
                        index=pd.Index(["p", "q", "r"], name="key"))


def test_tables_arrays_and_values_come_back_with_their_types(tmp_path):
    """Every argument of a @replottable call comes back equal: a table with an index, text, booleans (with a
    gap) and NaN, an array, a list of arrays of different shapes, None, a tuple (as a list) and a dict."""
    table = _mixed_table()
    image = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    crops = [np.zeros((2, 2)), np.ones((3, 1, 3), dtype=np.float32)]
    fig = _draw_everything(table, image, crops, None, ("a", "b"), {"level": 2, "ci": 0.95})
    paths = write_figure_data(fig, tmp_path, "mixed")
    assert sorted(p.name for p in paths) == ["mixed.csv", "mixed.figure.json", "mixed.npz"]
    function, arguments = load_call(tmp_path / "mixed.figure.json")
    assert function is _draw_everything
    pd.testing.assert_frame_equal(arguments["table"], table)
    assert np.array_equal(arguments["image"], image) and arguments["image"].dtype == np.uint8
    assert [a.shape for a in arguments["crops"]] == [(2, 2), (3, 1, 3)]
    assert arguments["extra"] is None and arguments["names"] == ["a", "b"]
    assert arguments["options"] == {"level": 2, "ci": 0.95}
    assert pd.read_csv(tmp_path / "mixed.csv").columns.tolist()[:3] == ["key", "x", "y"]  # a reader's plain CSV
    plt.close(fig)


def test_an_argument_a_file_cannot_hold_is_refused_by_name(tmp_path):
    fig = _draw_everything(_mixed_table(), np.zeros(2), [np.zeros(1)], None, (), {"model": object()})
    with pytest.raises(TypeError, match="argument 'options' of .*_draw_everything"):
        write_figure_data(fig, tmp_path, "bad")
    plt.close(fig)


def test_a_figure_without_a_recorded_call_saves_images_only(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = save_figure(fig, tmp_path, "plain", formats=("png",))
    assert [p.name for p in paths] == ["plain.png"] and sorted(p.name for p in tmp_path.iterdir()) == ["plain.png"]
    with pytest.raises(ValueError, match="returned None"):
        save_figure(None, tmp_path, "nothing")


def plotted(fig) -> list:
    """What a figure shows, comparable across two drawings: per visible axes its title, line data, scatter
    offsets, patches in data coordinates, images and texts."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out.append(("title", ax.get_title(), ax.get_xlabel(), ax.get_ylabel()))
        out += [np.asarray(line.get_xydata(), float) for line in ax.lines]
        out += [np.asarray(c.get_offsets(), float) for c in ax.collections]
        out += [p.get_patch_transform().transform(p.get_path().vertices) for p in ax.patches]
        out += [np.asarray(im.get_array(), float) for im in ax.images]
        out += [("text", t.get_text()) for t in ax.texts]
    return out


def assert_same_plot(first, second) -> None:
    for fig in (first, second):  # arrows' paths (the subtree's edges) are laid out when drawn
        fig.canvas.draw()
    a, b = plotted(first), plotted(second)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, tuple):
            assert x == y
        else:
            np.testing.assert_allclose(x, y, equal_nan=True, rtol=1e-12, atol=1e-12)


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for value in (0.612, 0.618):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)})
        trial.report(value - 0.01, 0)
        trial.report(value, 1)
        study.tell(trial, value)
    return study


def _notebook_figures() -> dict:
    """The series' figures drawn by the library's own functions on small real inputs (no training)."""
    from cglib.llm.report import abstraction_figure
    from cglib.magic.plots import draw_subtree, plot_level_distributions, plot_nearest_neighbour_cosines
    from cglib.viz.attention import draw_attention_heads, draw_attention_models
    from cglib.viz.data_figures import caption_length_figure, image_grid
    from cglib.viz.dual_effect import optimize_points, plot_dual_effect
    from cglib.viz.search_figures import history_figure
    from cglib.viz.training_figures import draw_loss_curves
    from cglib.viz.umap_centroids import UmapPanel, plot_measured_dual_effect, plot_umap_panels

    magic, dataset = tiny_magic()
    rng = np.random.default_rng(0)
    chains = {i: [magic.ancestor(r.node, k) if k > 1 else r.node for k in range(1, 5)]
              for i, r in magic.images.items()}
    groups = [n.id for n in magic.nodes_at(1)]
    panels = [UmapPanel(model=m, modality=mod, groups=groups, xy=rng.normal(size=(len(groups), 2)), trust=0.9,
                        trust_k=2, seconds=0.0) for m in ("zero-shot", "clip") for mod in ("image", "text")]
    dual = pd.DataFrame([{"model": m, "modality": mod, "level": lv, "groups": 6, "singleton_groups": 0,
                          "within": w, "between": 0.5, "ratio": w / 0.5}
                         for m, w in (("zero-shot", 0.3), ("clip", 0.2), ("pairwise", 0.1))
                         for mod in ("image", "text") for lv in (1, 2)])
    dual.loc[dual["modality"] == "text", ["within", "between"]] = [0.25, 0.4]  # one frozen text tower
    logs = pd.DataFrame([{"run": run, "phase": phase, "step": s, "loss": 3 - s / 10,
                          "inner": np.nan if run == "clip" else 1 - s / 20, "outer": np.nan if run == "clip" else 2.0}
                         for run in ("clip", "pairwise") for phase in ("train", "pretrain") for s in range(12)
                         if not (run == "clip" and phase == "pretrain")])
    pixels = rng.integers(0, 255, size=(2, 16, 16, 3)).astype(np.uint8)
    return {
        "01_caption_lengths": caption_length_figure(dataset),
        "01_image_grid": image_grid(dataset, n=4, columns=2),
        "02_abstraction": abstraction_figure(chains, 4, chains),
        "03_magic_levels": plot_level_distributions(magic, size_min=2),
        "03_hard_negative_calibration": plot_nearest_neighbour_cosines(magic, 0.5),
        "03_magic_subtree": draw_subtree(magic, magic.nodes_at(3)[0].id, max_per_node=3),
        "04_dual_effect": plot_dual_effect([optimize_points("clip", steps=3), optimize_points("centroid", steps=3)]),
        "05_loss_curves": draw_loss_curves(logs),
        "07_umap_centroids": plot_umap_panels(panels, magic, color_level=2),
        "07_dual_effect_measured": plot_measured_dual_effect(dual),
        "07_attention_models": draw_attention_models(pixels, rng.normal(size=(2, 2, 4, 4)), ["zero-shot", "clip"],
                                                     ["a", "b"], ["cat", "dog"]),
        "07_attention_heads_clip": draw_attention_heads(pixels[0], rng.random(size=(2, 3, 4, 4)), "heads"),
        "search_history": history_figure(_study()),
    }


def test_every_figure_is_redrawn_from_its_data_files_alone(tmp_path, capsys):
    """save_figure leaves each figure's data beside it; copying only the data files (no image) into an empty
    folder and running `cglib figures FOLDER --from-data` gives the same set of figures, the same pictures pixel
    for pixel, each plotting exactly what the first drawing did."""
    from cglib.cli import main as cli_main

    apply_style()
    figures = _notebook_figures()
    for stem, fig in figures.items():
        save_figure(fig, tmp_path / "run" / "figures", stem, formats=("png",))
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in (tmp_path / "run" / "figures").iterdir():
        if path.suffix in DATA_SUFFIXES:
            shutil.copy(path, bare)
    assert saved_stems(bare) == sorted(figures)
    assert cli_main(["figures", str(bare), "--from-data", "--formats", "png"]) == 0
    assert sorted(p.stem for p in bare.glob("*.png")) == sorted(figures)
    for stem in figures:  # the same picture, pixel for pixel
        assert np.array_equal(plt.imread(bare / f"{stem}.png"), plt.imread(tmp_path / "run" / "figures" / f"{stem}.png"))
    for stem, fig in figures.items():
        again = replot(bare / f"{stem}.figure.json")
        assert_same_plot(fig, again)
        plt.close(again)
        plt.close(fig)
    assert "13 figures redrawn from their data, 0 failed" in capsys.readouterr().out


def test_loss_curves_plot_the_saved_table(tmp_path):
    """The loss-curve panels' raw lines are the saved CSV's rows, run by run."""
    apply_style()
    fig = _notebook_figures()["05_loss_curves"]
    save_figure(fig, tmp_path, "05_loss_curves", formats=("png",))
    saved = pd.read_csv(tmp_path / "05_loss_curves.csv")
    panel = next(ax for ax in fig.axes if ax.get_title() == "pairwise")
    rows = saved[(saved["run"] == "pairwise") & (saved["phase"] == "train")]
    np.testing.assert_allclose(panel.lines[0].get_xydata(), rows[["step", "loss"]].to_numpy(float))
    assert json.loads((tmp_path / "05_loss_curves.figure.json").read_text())["function"] == (
        "cglib.viz.training_figures:draw_loss_curves")
    plt.close(fig)


def test_redone_figures_read_at_1300_px(tmp_path):
    """Every figure of the series fits a 1,300 px page at its 150 dpi; the search history spans at least 10
    points of accuracy with integer trial ticks; the measured dual effect keeps its legend out of the panels
    and says which models' text points coincide; the attention comparison shares one colour scale."""
    from PIL import Image

    apply_style()
    figures = _notebook_figures()
    widths = {}
    for stem, fig in figures.items():
        save_figure(fig, tmp_path, stem, formats=("png",), dpi=150)
        widths[stem] = Image.open(tmp_path / f"{stem}.png").size[0]
    assert max(widths.values()) <= 1300, {stem: w for stem, w in widths.items() if w > 1300}
    history = figures["search_history"].axes[0]
    low, high = history.get_ylim()
    assert high - low >= 0.1 - 1e-9
    assert all(float(t).is_integer() for t in history.get_xticks())
    dual = figures["07_dual_effect_measured"]
    assert all(ax.get_legend() is None for ax in dual.axes) and dual.legends
    said = " ".join(t.get_text() for t in dual.texts)
    assert "zero-shot, clip, pairwise" in said and "same text tower" in said
    attention = figures["07_attention_models"]
    scales = {im.get_clim() for ax in attention.axes[:-1] for im in ax.images[1:]}
    assert len(scales) == 1 and attention.axes[-1].get_ylabel() == "patch cosine to the concept name"
    for fig in figures.values():
        plt.close(fig)


def test_importances_with_nothing_to_explain_are_no_figure():
    """Two complete trials with the same accuracy: no figure (None), and `cglib figures` skips it with the
    reason."""
    from cglib.viz.search_figures import NO_IMPORTANCES, importance_figure

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for _ in range(2):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)})
        study.tell(trial, 0.6)
    assert importance_figure(study) is None
    assert "at least 2 complete trials" in NO_IMPORTANCES


@pytest.mark.slow
def test_a_finished_runs_figures_are_redrawn_from_their_data(tmp_path):
    """Every figure `cglib figures` rebuilds from a real finished run (trained and evaluated) leaves its data,
    and the copy of those files alone redraws each one plotting exactly what the rebuild did."""
    from cglib.evaluate.pipeline import evaluate_run
    from cglib.viz.figures import VizRun, build_figures, figure_jobs, replot_figures
    from tests.test_viz_figures import _run_with_data

    run = _run_with_data(tmp_path / "finished")
    train_all_prepared(run, progress=False)
    evaluate_run(run, progress=False)
    report = build_figures(run.dir, progress=False)
    assert not report.failed
    written = {p.stem for p in report.written if p.suffix == ".png"}
    assert {Path(p.name[: -len(".figure.json")]).name for p in report.written
            if p.name.endswith(".figure.json")} == written
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in (run.dir / "figures").iterdir():
        if path.suffix in DATA_SUFFIXES and path.name != "manifest.json":
            shutil.copy(path, bare)
    redrawn = replot_figures(bare, formats=("png",), progress=False)
    assert not redrawn.failed and {p.stem for p in redrawn.written} == written
    vr = VizRun.open(run.dir, progress=False)
    apply_style()
    for stem, build in figure_jobs(vr):
        if stem in written:
            first, again = build(), replot(bare / f"{stem}.figure.json")
            assert_same_plot(first, again)
            plt.close(first)
            plt.close(again)
