"""What a run's figures read, loaded lazily and once from `outputs/<run>/` (`VizRun`): params, magic.json, captions,
test pixels, models, embeddings (evaluation's cache first), UMAP panels, the geometry table, and which models the
comparisons show (`compared_models`). `cglib.viz.figures` draws from it; notebook 07 opens one.
"""

from __future__ import annotations

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
from cglib.evaluate.embeddings import Embeddings, EmbeddingStore, pixel_fingerprint
from cglib.evaluate.geometry import geometry_differences, group_geometry
from cglib.evaluate.loading import model_fingerprints
from cglib.magic.files import load_magic
from cglib.magic.schema import MagicFile
from cglib.models import ClipModel
from cglib.run import RunContext, seed_label
from cglib.train import ZERO_SHOT, load_trained
from cglib.train.objectives import objective_for
from cglib.viz.attention import (
    choose_attention_images,
)
from cglib.viz.style import save_figure
from cglib.viz.umap_centroids import (
    GroupEmbeddings,
    UmapPanel,
    _ancestor_or_self,
    configure_numba_cache,
    dual_effect_table,
    embed_groups,
    group_texts,
    umap_panels,
)


class MissingInput(FileNotFoundError):
    """A figure's input does not exist yet (the stage that writes it has not run): the figure is skipped."""


def require(path: Path, produced_by: str) -> Path:
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
        params = load_params(require(run_dir / "params.yaml", "open_run / any notebook"), check_paths=False)
        return cls(dir=run_dir, params=params, device=_device(params), progress=progress)

    @classmethod
    def from_context(cls, run: RunContext, progress: bool = True) -> VizRun:
        """The same inputs for a notebook's open run."""
        return cls(dir=run.dir, params=run.params, device=run.device(), progress=progress)

    # -------------------------------------------------------------------------------------- data
    @cached_property
    def magic(self) -> MagicFile:
        return load_magic(require(self.dir / "magic" / "magic.json", "03_magic_dag"))

    @cached_property
    def dataset(self) -> CaptionDataset:
        return CaptionDataset.load(require(self.dir / "captions" / "dataset.json", "01_captions").parent)

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

    @cached_property
    def _metrics(self) -> pd.DataFrame | None:
        """evaluation/metrics.csv, read once (the compared models and the heads model both rank by it)."""
        path = self.dir / "evaluation" / "metrics.csv"
        return pd.read_csv(path, dtype={"level": str}) if path.is_file() else None

    def compared_models(self) -> list[str]:
        """The models the UMAP and attention comparisons show (`compared_models`), among those with a checkpoint."""
        return compared_models(self.params, list(self.models()), self._metrics)

    def heads_model(self) -> str:
        """The model whose attention heads notebook 07 and `cglib figures` draw: the last of the compared models (by
        default the best group objective), chosen among the params' models (no checkpoint is loaded to name it)."""
        return compared_models(self.params, self.model_names, self._metrics)[-1]

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
