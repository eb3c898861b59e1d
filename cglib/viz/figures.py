"""Every figure of a run, rebuilt from its saved results and checkpoints (no retraining): `cglib figures RUN_DIR`.

`VizRun` (viz_run.py) loads what the figures read from `outputs/<run>/` lazily and once (params, magic.json,
captions, test pixels, models, embeddings, UMAP panels). The figure functions below take a `VizRun` and return a
matplotlib figure; notebook 07 and `regenerate_figures` call the same functions. A figure whose inputs do not exist
yet (a partial run) is skipped with its reason printed and counted; figures are written to `figures/` as
`viz.formats` (PNG and PDF by default) in the project style (`cglib.viz.style`), with `figures/manifest.json`
listing what was written and skipped, with provenance.

Every figure drawn by a `@replottable` function also leaves its data beside it (`<stem>.csv`, `<stem>.figure.json`,
arrays in `<stem>.npz`; `cglib.figure_data`), the notebooks' own figures included. `replot_figures` (`cglib figures
RUN_DIR --from-data`) redraws every figure from those files alone: no model, result or params file is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cglib.data.dataset import load_ground_truth
from cglib.data.taxonomy import load_taxonomy
from cglib.evaluate.questions import QUESTIONS
from cglib.evaluate.results import EvalResults, load_results
from cglib.figure_data import SPEC_SUFFIX, data_files, replot, saved_stems
from cglib.run import provenance, write_json
from cglib.search.study import SUMMARY, open_study, workspace
from cglib.viz.attention import (
    plot_attention_heads,
    plot_attention_models,
    vision_transformer,
)
from cglib.viz.compare import (
    difference_takeaway,
    differences_from_reference,
    model_families,
    plot_difference_from_reference,
    plot_gains,
)
from cglib.viz.data_figures import caption_length_figure, image_grid
from cglib.viz.data_figures import taxonomy_figure as draw_taxonomy
from cglib.viz.eval_figures import plot_accuracy_by_level
from cglib.viz.explorer import ConceptExplorer, build_explorer
from cglib.viz.search_figures import NO_IMPORTANCES, history_figure, importance_figure
from cglib.viz.style import apply_style, save_figure
from cglib.viz.training_figures import plot_loss_curves
from cglib.viz.umap_centroids import (
    plot_measured_dual_effect,
    plot_umap_panels,
)

MANIFEST = "manifest.json"
DUAL_EFFECT_TABLE = "07_dual_effect_measured.csv"


from cglib.viz.viz_run import MissingInput, VizRun, require


# ------------------------------------------------------------------------------------------ figures
def umap_figure(vr: VizRun) -> Figure:
    """UMAP of l1 centroids per model (rows image/text), coloured by the `viz.color_level` ancestor."""
    return plot_umap_panels(vr.umap_panels, vr.magic, color_level=vr.params.viz.color_level,
                            label_max=vr.params.viz.label_max)


def dual_effect_figure(vr: VizRun) -> Figure:
    """Measured dual effect: within-group spread vs between-centroid distance per model."""
    return plot_measured_dual_effect(vr.dual_effect, level=1)


def geometry_figure(vr: VizRun, metric: str = "within") -> Figure:
    """What the objectives did to the geometry: each model minus zero-shot in `metric` (within or margin) per level."""
    table = vr.geometry  # first: a run without checkpoints skips this figure, whatever its evaluation holds
    models = _evaluation(vr).info["models"] if (vr.dir / "evaluation" / "results.json").is_file() else []
    what = {"within": "cosine of each test image to its own group's centroid",
            "margin": "margin to the nearest hard-negative group's centroid (ground truth: nearest other group)"}
    return plot_difference_from_reference(
        table, benchmark="geometry", metric=metric, direction="image", families=model_families(models),
        ci=vr.params.eval.ci, title=f"What the objectives did to the geometry: {what[metric]}, each model minus "
        f"zero-shot ({_seeds_phrase(table)}paired {100 * vr.params.eval.ci:.0f}% CI over the images)")


def geometry_takeaway(vr: VizRun, metric: str = "within") -> str:
    """The geometry figure's finding in one sentence (`compare.difference_takeaway`), from the same cells."""
    what = {"within": "Within-group cosine", "margin": "Margin to the nearest hard-negative group"}[metric]
    cells = differences_from_reference(vr.geometry, "geometry", metric, "image", ci=vr.params.eval.ci)
    return difference_takeaway(cells, what)


def _seeds_phrase(table: pd.DataFrame) -> str:
    n = int(table["n_seeds"].iloc[0]) if len(table) else 1
    return f"mean over {n} training seeds, seed k against seed k; " if n > 1 else ""


def attention_models_figure(vr: VizRun, level: int = 1) -> Figure:
    """The compared models side by side on the same test images: where each finds the images' l`level` concept."""
    chosen = vr.compared_models()
    models = vr.models()
    for name in chosen:
        vision_transformer(models[name])  # a clear error for non-ViT towers before any work
    ids = vr.attention_image_ids()
    if not ids:
        raise MissingInput("no test images to draw (viz.attention_images is 0 or the test split is empty)")
    return plot_attention_models({name: models[name] for name in chosen}, vr.pixels_of(ids),
                                 [vr.magic.chain_names(i) for i in ids], ids, level=level)


def attention_heads_figure(vr: VizRun, model: str) -> Figure:
    """Class-token attention per layer and head of the first attention image, one model."""
    ids = vr.attention_image_ids()
    if not ids:
        raise MissingInput("no test images to draw (viz.attention_images is 0 or the test split is empty)")
    return plot_attention_heads(vr.models()[model], vr.pixels_of(ids[:1])[0],
                                title=f"{model}: class-token attention of {ids[0]} per layer and head")


def _evaluation(vr: VizRun) -> EvalResults:
    """The run's saved evaluation (results.json, metrics, differences, seeds)."""
    require(vr.dir / "evaluation" / "results.json", "06_evaluation")
    return load_results(vr.dir)


def accuracy_figure(vr: VizRun, benchmark: str = "forced_choice", metric: str = "accuracy") -> Figure:
    """Fig. 4: each model minus the zero-shot model per label source and level (paired CIs, Holm), from
    `evaluation/differences.csv`."""
    results = _evaluation(vr)
    return plot_difference_from_reference(results.differences, benchmark=benchmark, metric=metric,
                                          families=model_families(results.info["models"]),
                                          exposed=_exposed(results.info["models"]), ci=results.info["settings"]["ci"])


def absolute_accuracy_figure(vr: VizRun, benchmark: str = "forced_choice", metric: str = "accuracy") -> Figure:
    """Fig. 4's absolute values by level, one panel per model, from `evaluation/metrics.csv`."""
    results = _evaluation(vr)
    return plot_accuracy_by_level(results.metrics, benchmark=benchmark, metric=metric, seeds=results.seeds,
                                  families=model_families(results.info["models"]))


def gains_figure(vr: VizRun) -> Figure:
    """Notebook 06's questions: the gain rows under Table 3, one panel per gain, from `evaluation/gains.csv`."""
    gains = _evaluation(vr).gains
    if not np.isfinite(gains["difference"].astype(float)).any():
        raise MissingInput("no gain row: the run lacks the models on one side of every gain (table3.md's notes)")
    return plot_gains(gains, QUESTIONS)


def _exposed(models: Sequence[dict]) -> list[str]:
    return [m["name"] for m in models if m.get("exposed_to_eval_strings")]


def loss_curves_figure(vr: VizRun) -> Figure:
    """Training loss curves of every run, from the training logs."""
    require(vr.dir / "training", "05_training")
    return plot_loss_curves(vr.dir)


def caption_lengths_figure(vr: VizRun) -> Figure:
    """Notebook 01: caption lengths of the run's captions dataset."""
    return caption_length_figure(vr.dataset)


def image_grid_figure(vr: VizRun) -> Figure:
    """Notebook 01: random images with a caption (and the ground-truth l1 concept of a synthetic run)."""
    return image_grid(vr.dataset, n=12, columns=4, seed=vr.params.run.seed,
                      ground_truth=load_ground_truth(vr.dir / "captions"))


def taxonomy_figure(vr: VizRun) -> Figure:
    """Notebook 01: the synthetic world's shipped taxonomy (runs with ground-truth chains only)."""
    require(vr.dir / "captions" / "ground_truth.json", "01_captions, for the synthetic world only")
    return draw_taxonomy(load_taxonomy())


def run_explorer(vr: VizRun) -> ConceptExplorer:
    """The concept explorer over the run's models and test images (reusing the computed image embeddings)."""
    return build_explorer(vr.models(), vr.magic, vr.test_ids, vr.test_pixels, top_k=vr.params.viz.explorer_top_k,
                          image_embeddings={e.model: e.images for e in vr.embeddings})


def save_dual_effect_table(vr: VizRun) -> Path:
    """Write the measured dual-effect table as CSV beside the figures."""
    path = vr.dir / "figures" / DUAL_EFFECT_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    vr.dual_effect.to_csv(path, index=False)
    return path


def search_study(vr: VizRun):
    """Notebook 08's Optuna study, loaded from its storage (search.json marks a search that has run)."""
    require(workspace(vr.params, vr.dir) / SUMMARY, "08_search (or cglib search)")
    return open_study(vr.params, vr.dir)


def search_history_figure(vr: VizRun) -> Figure:
    """Notebook 08: every trial's validation accuracy and the best so far."""
    return history_figure(search_study(vr))


def search_importances_figure(vr: VizRun) -> Figure:
    """Notebook 08: parameter importances of the search (fANOVA, the sampler's seed)."""
    fig = importance_figure(search_study(vr), seed=vr.params.search.sampler_seed)
    if fig is None:
        raise MissingInput(NO_IMPORTANCES)
    return fig


# File stems follow the notebooks' `NN_name` convention, so a regeneration overwrites the notebooks' own files.
STEMS = {"caption_lengths": "01_caption_lengths", "image_grid": "01_image_grid", "taxonomy": "01_taxonomy",
         "loss_curves": "05_loss_curves", "accuracy": "06_fig4_accuracy_by_level",
         "accuracy_absolute": "06_fig4_absolute_by_level", "gallery": "06_gallery_r1_by_level",
         "gallery_absolute": "06_gallery_r1_absolute", "gains": "06_gains",
         "umap": "07_umap_centroids", "dual_effect": "07_dual_effect_measured",
         "attention_models": "07_attention_models", "geometry_within": "07_geometry_within",
         "geometry_margin": "07_geometry_margin", "attention_heads": "07_attention_heads_{model}",
         "search_history": "search_history", "search_importances": "search_importances"}  # 08's own names


def figure_jobs(vr: VizRun) -> list[tuple[str, Callable[[], Figure]]]:
    """(file stem, builder) of every figure of the run, in a fixed order."""
    jobs: list[tuple[str, Callable[[], Figure]]] = [
        (STEMS["caption_lengths"], lambda: caption_lengths_figure(vr)),
        (STEMS["image_grid"], lambda: image_grid_figure(vr)),
        (STEMS["taxonomy"], lambda: taxonomy_figure(vr)),
        (STEMS["loss_curves"], lambda: loss_curves_figure(vr)),
        (STEMS["accuracy"], lambda: accuracy_figure(vr)),
        (STEMS["accuracy_absolute"], lambda: absolute_accuracy_figure(vr)),
        (STEMS["gallery"], lambda: accuracy_figure(vr, "gallery", "R@1")),
        (STEMS["gallery_absolute"], lambda: absolute_accuracy_figure(vr, "gallery", "R@1")),
        (STEMS["gains"], lambda: gains_figure(vr)),
        (STEMS["umap"], lambda: umap_figure(vr)),
        (STEMS["dual_effect"], lambda: dual_effect_figure(vr)),
        (STEMS["attention_models"], lambda: attention_models_figure(vr)),
        (STEMS["geometry_within"], lambda: geometry_figure(vr, "within")),
        (STEMS["geometry_margin"], lambda: geometry_figure(vr, "margin")),
        (STEMS["search_history"], lambda: search_history_figure(vr)),
        (STEMS["search_importances"], lambda: search_importances_figure(vr)),
    ]
    focus = vr.heads_model()
    jobs.append((STEMS["attention_heads"].format(model=focus), lambda: _for_model(vr, focus, attention_heads_figure)))
    return jobs


def _for_model(vr: VizRun, name: str, build: Callable[[VizRun, str], Figure]) -> Figure:
    if name not in vr.models():
        raise MissingInput(vr.missing_models.get(name, f"model {name} has no checkpoint"))
    return build(vr, name)


# ------------------------------------------------------------------------------------- regeneration
@dataclass
class FigureReport:
    """What a regeneration wrote, skipped (missing inputs) and failed on (anything else)."""

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class FigureFailures(RuntimeError):
    """Some figures failed for a reason other than a missing input; the others were still written."""


def build_figures(run_dir: str | Path, formats: Sequence[str] | None = None, progress: bool = True) -> FigureReport:
    """Rebuild every figure of a run that its saved inputs allow; return what was written, skipped, failed."""
    import matplotlib.pyplot as plt

    vr = VizRun.open(run_dir, progress=progress)
    apply_style()
    report = FigureReport()
    jobs = figure_jobs(vr)
    for stem, build in jobs:
        start = time.perf_counter()
        try:
            fig = build()
        except FileNotFoundError as exc:  # MissingInput, or a loader's own "not found": a partial run
            report.skipped[stem] = str(exc)
            _say(progress, f"skipped {stem}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - one broken figure must not stop the others; reported below
            report.failed[stem] = f"{type(exc).__name__}: {exc}"
            _say(progress, f"FAILED {stem}: {type(exc).__name__}: {exc}")
            continue
        report.written += vr.save(fig, stem, formats)
        report.written += data_files(vr.dir / "figures", stem)
        plt.close(fig)
        report.seconds[stem] = round(time.perf_counter() - start, 2)
        _say(progress, f"wrote {stem} ({report.seconds[stem]:.1f} s)")
        if stem == STEMS["dual_effect"] and not (vr.dir / "figures" / DUAL_EFFECT_TABLE).is_file():
            report.written.append(save_dual_effect_table(vr))
    write_json(vr.dir / "figures" / MANIFEST, {
        "written": [str(p.relative_to(vr.dir)) for p in report.written], "skipped": report.skipped,
        "failed": report.failed, "seconds": report.seconds, "missing_models": vr.missing_models,
        "provenance": provenance(vr.params)})
    n_figures = len(jobs) - len(report.skipped) - len(report.failed)
    _say(progress, f"{n_figures} figures written ({len(report.written)} files), {len(report.skipped)} skipped "
                   f"(missing inputs), {len(report.failed)} failed")
    return report


def regenerate_figures(run_dir: str | Path, formats: Sequence[str] | None = None, progress: bool = True) -> list[Path]:
    """Rebuild every figure of a run from saved results and checkpoints; skipped figures are printed and
    counted; raise FigureFailures (after writing all others) when a figure fails for another reason."""
    report = build_figures(run_dir, formats=formats, progress=progress)
    if report.failed:
        lines = "\n".join(f"  {stem}: {why}" for stem, why in report.failed.items())
        raise FigureFailures(f"{len(report.failed)} figures failed ({len(report.written)} files were written):\n"
                             f"{lines}")
    return report.written


def replot_figures(figures_dir: str | Path, formats: Sequence[str] = ("png", "pdf"), dpi: int = 150,
                   progress: bool = True) -> FigureReport:
    """Redraw every figure under `figures_dir` from its saved data alone (`<stem>.figure.json` and the files it
    names), over the figure's images in `formats`; a figure whose data cannot be read or drawn is reported as
    failed and the others are still drawn."""
    import matplotlib.pyplot as plt

    figures_dir = Path(figures_dir)
    stems = saved_stems(figures_dir)
    if not stems:
        raise FileNotFoundError(f"no *{SPEC_SUFFIX} under {figures_dir}: the figures were saved without their data "
                                "(by a cglib before figure data existed); run `cglib figures RUN_DIR` once to "
                                "rebuild them from the run's results and write their data")
    apply_style()
    report = FigureReport()
    for stem in stems:
        start = time.perf_counter()
        try:
            fig = replot(figures_dir / f"{stem}{SPEC_SUFFIX}")
            report.written += save_figure(fig, figures_dir, stem, formats=formats, dpi=dpi)
        except Exception as exc:  # noqa: BLE001 - one unreadable figure must not stop the others; reported below
            kept = [f"{stem}.{fmt}" for fmt in formats if (figures_dir / f"{stem}.{fmt}").is_file()]
            report.failed[stem] = f"{type(exc).__name__}: {exc}; " + (
                f"the earlier {' and '.join(kept)} are kept as they were" if kept else "no earlier image of it exists")
            _say(progress, f"FAILED {stem}: {report.failed[stem]}")
            continue
        plt.close(fig)
        report.seconds[stem] = round(time.perf_counter() - start, 2)
        _say(progress, f"redrew {stem} ({report.seconds[stem]:.1f} s)")
    _say(progress, f"{len(stems) - len(report.failed)} figures redrawn from their data, {len(report.failed)} failed")
    return report


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)

