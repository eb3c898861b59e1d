"""Every figure of a run, rebuilt from its saved results and checkpoints (no retraining): `cglib figures RUN_DIR`.

`VizRun` loads what the figures read from `outputs/<run>/` lazily and once (params, magic.json, captions, test
pixels, models, embeddings, UMAP panels). The figure functions below take a `VizRun` and return a matplotlib
figure; notebook 07 and `regenerate_figures` call the same functions. A figure whose inputs do not exist yet
(a partial run) is skipped with its reason printed and counted; figures are written to `figures/` as
`viz.formats` (PNG and PDF by default) in the project style (`cglib.viz.style`), with `figures/manifest.json`
listing what was written and skipped, with provenance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cglib.config import Params, load_params
from cglib.data.dataset import CaptionDataset, load_ground_truth
from cglib.data.image_cache import build_image_cache
from cglib.data.taxonomy import load_taxonomy
from cglib.evaluate.embeddings import Embeddings, EmbeddingStore, pixel_fingerprint
from cglib.evaluate.geometry import geometry_differences, group_geometry
from cglib.evaluate.loading import model_fingerprints
from cglib.evaluate.questions import QUESTIONS
from cglib.evaluate.results import EvalResults, load_results
from cglib.magic.schema import MagicFile, load_magic
from cglib.models import ClipModel
from cglib.run import RunContext, provenance, seed_label, write_json
from cglib.search.study import SUMMARY, open_study, workspace
from cglib.train import ZERO_SHOT, load_trained
from cglib.train.objectives import objective_for
from cglib.viz.attention import (
    choose_attention_images,
    plot_attention_heads,
    plot_attention_models,
    vision_transformer,
)
from cglib.viz.compare import model_families, plot_difference_from_reference, plot_gains
from cglib.viz.data_figures import caption_length_figure, image_grid
from cglib.viz.data_figures import taxonomy_figure as draw_taxonomy
from cglib.viz.eval_figures import plot_accuracy_by_level
from cglib.viz.explorer import ConceptExplorer, build_explorer
from cglib.viz.search_figures import history_figure, importance_figure
from cglib.viz.style import apply_style, save_figure
from cglib.viz.training_figures import plot_loss_curves
from cglib.viz.umap_centroids import (
    GroupEmbeddings,
    UmapPanel,
    _ancestor_or_self,
    configure_numba_cache,
    dual_effect_table,
    embed_groups,
    group_texts,
    plot_measured_dual_effect,
    plot_umap_panels,
    umap_panels,
)

MANIFEST = "manifest.json"
DUAL_EFFECT_TABLE = "07_dual_effect_measured.csv"


class MissingInput(FileNotFoundError):
    """A figure's input does not exist yet (the stage that writes it has not run): the figure is skipped."""


def _require(path: Path, produced_by: str) -> Path:
    if not path.exists():
        raise MissingInput(f"{path} does not exist (written by {produced_by})")
    return path


@dataclass
class VizRun:
    """A run directory's inputs to the figures, loaded on first use and kept."""

    dir: Path
    params: Params
    device: str = "cpu"
    progress: bool = True
    missing_models: dict[str, str] = field(default_factory=dict)  # model name -> why it could not be loaded
    embedding_sources: dict[str, str] = field(default_factory=dict)  # model -> evaluation cache / viz cache / computed
    _models: dict[str, ClipModel] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, run_dir: str | Path, progress: bool = True) -> VizRun:
        """Read `run_dir/params.yaml` (input paths are not checked: figures read only the run's own files)."""
        run_dir = Path(run_dir)
        params = load_params(_require(run_dir / "params.yaml", "open_run / any notebook"), check_paths=False)
        return cls(dir=run_dir, params=params, device=_device(params), progress=progress)

    @classmethod
    def from_context(cls, run: RunContext, progress: bool = True) -> VizRun:
        """The same inputs for a notebook's open run."""
        return cls(dir=run.dir, params=run.params, device=run.device(), progress=progress)

    # -------------------------------------------------------------------------------------- data
    @cached_property
    def magic(self) -> MagicFile:
        return load_magic(_require(self.dir / "magic" / "magic.json", "03_magic_dag"))

    @cached_property
    def dataset(self) -> CaptionDataset:
        return CaptionDataset.load(_require(self.dir / "captions" / "dataset.json", "01_captions").parent)

    @cached_property
    def _test_pixels(self) -> tuple[list[str], np.ndarray]:
        """Readable test images (sorted ids) and their uint8 pixels; unreadable ones are counted and reported."""
        ids = self.magic.split_ids("test")
        known = set(self.dataset.image_ids)
        present = [i for i in ids if i in known]
        if len(present) < len(ids):
            print(f"{len(ids) - len(present)} test images of magic.json are not in the captions dataset; left out")
        if self.dataset.pixels is not None:
            return present, self.dataset.subset(present).pixels
        # The same cache as evaluation's (same subset, size and folder), so it is decoded once per run.
        cache = build_image_cache(self.dataset.subset(present), self.params.data.image_cache_size,
                                  self.dir / "cache" / "images", progress=self.progress)
        readable = [i for i in present if i in cache]
        if len(readable) < len(present):
            print(f"{len(present) - len(readable)} test images are unreadable and left out: {dict(cache.skipped)}")
        return readable, cache.get(readable)

    @cached_property
    def _image_source(self) -> str:
        """Content fingerprint of the test pixels (files: path, size, mtime; in-memory: the bytes)."""
        if self.dataset.image_files is not None:
            return pixel_fingerprint(files=[self.dataset.image_files[i] for i in self.test_ids])
        return pixel_fingerprint(pixels=self.test_pixels)

    @property
    def test_ids(self) -> list[str]:
        return self._test_pixels[0]

    @property
    def test_pixels(self) -> np.ndarray:
        return self._test_pixels[1]

    def pixels_of(self, image_ids: Sequence[str]) -> np.ndarray:
        """uint8 pixels of some test images."""
        row = {image_id: r for r, image_id in enumerate(self.test_ids)}
        return self.test_pixels[[row[i] for i in image_ids]]

    # ------------------------------------------------------------------------------------ models
    @property
    def model_names(self) -> list[str]:
        return [ZERO_SHOT] + [r.name for r in self.params.train.runs]

    @property
    def training_seed(self) -> int:
        """The training seed whose models the figures show: the first of train.seeds (Fig. 4 shows them all)."""
        return self.params.train.seeds[0]

    def models(self) -> dict[str, ClipModel]:
        """Every model with a checkpoint (zero-shot first) of the first training seed; the others are listed in
        `missing_models`."""
        for name in self.model_names:
            if name in self._models or name in self.missing_models:
                continue
            try:
                self._models[name] = load_trained(self.params, self.dir, name, device=self.device,
                                                  seed=self.training_seed)
            except FileNotFoundError as exc:
                self.missing_models[name] = str(exc)
        found = {name: self._models[name] for name in self.model_names if name in self._models}
        if not found:
            raise MissingInput(f"no model checkpoint under {self.dir / 'training'} (written by 05_training)")
        return found

    @cached_property
    def embeddings(self) -> list[GroupEmbeddings]:
        """Test-image and text embeddings of every available model (texts: `viz.umap_texts`)."""
        store = EmbeddingStore(self.dir / "cache" / "embeddings", batch_size=self.params.eval.batch_size)
        out = []
        for name, bundle in self.models().items():
            emb = self._from_evaluation_cache(name, bundle)
            if emb is None:
                emb = embed_groups(bundle, name, self.magic, self.test_ids, self.test_pixels, store,
                                   text_source=self.params.viz.umap_texts, image_source=self._image_source)
                self.embedding_sources[name] = "viz cache" if not store.computed[
                    f"{name}.viz-{self.params.viz.umap_texts}"] else "computed"
            out.append(emb)
        return out

    def _from_evaluation_cache(self, name: str, bundle: ClipModel) -> GroupEmbeddings | None:
        """The model's embeddings from evaluation's cache when it holds exactly our test images and all our texts;
        None otherwise."""
        needed, groups = group_texts(self.magic, self.test_ids, self.params.viz.umap_texts)
        emb = self._evaluation_embeddings(name, self.training_seed, lambda: bundle, needed)
        if emb is None:
            return None
        label = seed_label(name, self.training_seed)
        self.embedding_sources[name] = "evaluation cache" if not self._evaluation_store.computed[
            f"{label}.magic"] else "computed"
        return GroupEmbeddings(model=name, images=emb.images, image_groups=[self.magic.images[i].node for i in
                                                                            emb.image_ids],
                               texts=emb.text(needed), text_groups=groups, image_ids=list(emb.image_ids))

    @cached_property
    def _evaluation_store(self) -> EmbeddingStore:
        return EmbeddingStore(self.dir / "evaluation" / "embeddings", batch_size=self.params.eval.batch_size)

    def _evaluation_embeddings(self, name: str, seed: int, load: Callable[[], ClipModel],
                               texts: Sequence[str] = ()) -> Embeddings | None:
        """Model `name`'s embeddings under training seed `seed` from evaluation's cache when it holds exactly our
        test images and `texts`; None otherwise. The cache's keys still verify the weights, ids, pixels and strings:
        evaluation's own ids, strings and tower fingerprints give evaluation's own keys, so a valid entry is read as
        is and a stale one is recomputed (with `load`) into exactly what evaluation itself would write."""
        store = self._evaluation_store
        label = seed_label(name, seed)  # evaluation's cache name for this seed
        path = store.path(label, "magic")
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as cached:
                ids, cached_texts = cached["image_ids"].tolist(), cached["texts"].tolist()
        except (OSError, KeyError, ValueError):
            return None
        if ids != self.test_ids or not set(texts) <= set(cached_texts):
            return None
        fingerprints = model_fingerprints(RunContext(params=self.params, dir=self.dir), name, seed)
        if fingerprints is None:
            return None
        return store.embed(label, "magic", load, ids, self._image_source, lambda: self.test_pixels, cached_texts,
                           fingerprints)

    def seed_images(self, name: str) -> list[np.ndarray]:
        """Test-image embeddings of model `name` under every training seed evaluation embedded it with (the first
        seed's always; a later seed's when evaluation's cache holds it)."""
        out = [next(e.images for e in self.embeddings if e.model == name)]
        for k in self.params.train.seeds[1:]:
            emb = self._evaluation_embeddings(name, k, lambda k=k: load_trained(self.params, self.dir, name,
                                                                                device=self.device, seed=k))
            if emb is None:
                break
            out.append(emb.images)
        return out

    def _metrics(self) -> pd.DataFrame | None:
        path = self.dir / "evaluation" / "metrics.csv"
        return pd.read_csv(path, dtype={"level": str}) if path.is_file() else None

    def compared_models(self) -> list[str]:
        """The models the UMAP and attention comparisons show (`compared_models`), among those with a checkpoint."""
        return compared_models(self.params, list(self.models()), self._metrics())

    def heads_model(self) -> str:
        """The model whose attention heads notebook 07 and `cglib figures` draw: the last of the compared models (by
        default the best group objective), chosen among the params' models (no checkpoint is loaded to name it)."""
        return compared_models(self.params, self.model_names, self._metrics())[-1]

    @cached_property
    def umap_panels(self) -> list[UmapPanel]:
        """UMAP panels of the compared models (same seed), image and text centroids."""
        configure_numba_cache(self.params.viz.numba_cache_dir)
        v = self.params.viz
        chosen = self.compared_models()
        return umap_panels([e for e in self.embeddings if e.model in chosen], seed=v.umap_seed,
                           n_neighbors=v.umap_neighbors, trust_neighbors=v.trust_neighbors)

    @cached_property
    def geometry(self) -> pd.DataFrame:
        """Every model minus the zero-shot model in within-group cosine and hard-negative margin of the test images,
        per level, against the DAG and (synthetic world) the ground truth (`cglib.evaluate.geometry`). With several
        training seeds each image's value is its mean over the seeds every model has embeddings of (seed k against
        seed k, as Fig. 4), and the CIs resample the images."""
        truth = load_ground_truth(self.dir / "captions")
        images = {e.model: self.seed_images(e.model) for e in self.embeddings}
        n_seeds = min(len(v) for v in images.values())
        per_image = {}
        for emb in self.embeddings:
            for level in range(1, self.magic.l_max + 1):
                groups = [_ancestor_or_self(self.magic, g, level) for g in emb.image_groups]
                negatives = {g: self.magic.nodes[g].hard_negatives for g in set(groups)}
                per_image[(emb.model, "dag", f"l{level}")] = _seed_mean(
                    [group_geometry(x, groups, negatives) for x in images[emb.model][:n_seeds]])
                if truth and all(len(truth.get(i, ())) >= level for i in emb.image_ids):
                    named = [truth[i][level - 1] for i in emb.image_ids]
                    per_image[(emb.model, "ground_truth", f"l{level}")] = _seed_mean(
                        [group_geometry(x, named) for x in images[emb.model][:n_seeds]])
        e = self.params.eval
        table = geometry_differences(per_image, resamples=e.bootstrap or 1000, ci=e.ci, seed=self.params.run.seed)
        table["n_seeds"] = n_seeds
        return table

    @cached_property
    def dual_effect(self) -> pd.DataFrame:
        """Within-group spread and between-centroid distance per model, modality and level."""
        return dual_effect_table(self.embeddings, self.magic)

    def attention_image_ids(self) -> list[str]:
        """The `viz.attention_images` test images of the attention grids (groups spread evenly)."""
        readable = set(self.test_ids)
        return [i for i in choose_attention_images(self.magic, self.params.viz.attention_images) if i in readable]

    def save(self, fig: Figure, stem: str, formats: Sequence[str] | None = None) -> list[Path]:
        """Save a figure under `figures/` in `viz.formats` at `viz.dpi`."""
        return save_figure(fig, self.dir / "figures", stem, formats=formats or self.params.viz.formats,
                           dpi=self.params.viz.dpi)


def _seed_mean(per_seed: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """group_geometry's per-image values averaged over training seeds (NaN where a value is undefined: the same
    images in every seed, since the groups are the same)."""
    return {metric: np.mean([values[metric] for values in per_seed], axis=0) for metric in per_seed[0]}


def compared_models(params: Params, available: Sequence[str], metrics: pd.DataFrame | None = None) -> list[str]:
    """`viz.models`, or the zero-shot model, the first CLIP-loss run (no init, no pretraining) and the group-objective
    run with the best mean forced-choice accuracy in `metrics` (text->image, DAG, l1..lL; without metrics the first
    group run); only names in `available`."""
    if params.viz.models:
        return [m for m in params.viz.models if m in available]
    runs = [r for r in params.train.runs if r.name in available]
    family = {r.name: objective_for(r).family for r in runs}
    clip = [r.name for r in runs if family[r.name] == "clip" and r.init is None and r.pretrain == "none"]
    group = [r.name for r in runs if family[r.name] == "group"]
    if metrics is not None and group:
        m = metrics
        rows = m[(m["benchmark"] == "forced_choice") & (m["labels"] == "dag") & (m["direction"] == "t2i")
                 & (m["metric"] == "accuracy") & m["level"].astype(str).str.fullmatch(r"l\d+") & m["model"].isin(group)]
        means = rows.groupby("model")["value"].mean()
        group = sorted(group, key=lambda n: -means.get(n, -1.0))  # stable: ties and unscored keep train.runs order
    return [m for m in (ZERO_SHOT, *clip[:1], *group[:1]) if m in available]


def _device(params: Params) -> str:
    import torch

    if params.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return params.run.device


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
    _require(vr.dir / "evaluation" / "results.json", "06_evaluation")
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
    _require(vr.dir / "training", "05_training")
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
    _require(vr.dir / "captions" / "ground_truth.json", "01_captions, for the synthetic world only")
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
    _require(workspace(vr.params, vr.dir) / SUMMARY, "08_search (or cglib search)")
    return open_study(vr.params, vr.dir)


def search_history_figure(vr: VizRun) -> Figure:
    """Notebook 08: every trial's validation accuracy and the best so far."""
    return history_figure(search_study(vr))


def search_importances_figure(vr: VizRun) -> Figure:
    """Notebook 08: parameter importances of the search (fANOVA, the sampler's seed)."""
    return importance_figure(search_study(vr), seed=vr.params.search.sampler_seed)


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
        plt.close(fig)
        report.seconds[stem] = round(time.perf_counter() - start, 2)
        _say(progress, f"wrote {stem} ({report.seconds[stem]:.1f} s)")
        if stem == STEMS["dual_effect"]:
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


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)

