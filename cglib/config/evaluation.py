"""The sections that read trained models: eval (benchmarks, zoo), viz, search."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cglib.config.base import Section, _unique
from cglib.config.inputs import ModelParams
from cglib.plugins import named

ZERO_SHOT_NAME = "zero-shot"  # the untrained initial model's row name (cglib.evaluate.loading.ZERO_SHOT)
MINILM_CONFIGS = ("cglib-demo-vit", "cglib-tiny-vit")  # cglib configs whose default text tower is MiniLM
# what checks an eval.benchmarks entry (a Benchmark subclass with a name of its own): the evaluation layer's loader,
# named, not imported, so only a file that plugs in a benchmark loads it (its plug-in imports it anyway)
BENCHMARK_LOADER = "cglib.evaluate.benchmarks:load_benchmark"


class ZooModelParams(Section):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="Row name of the zoo model in the results.")
    model: ModelParams = Field(..., description="The model, as the `model` section: an open_clip architecture + "
                               "pretrained tag (e.g. {name: ViT-B-32, pretrained: openai}), a cglib config, a local "
                               "checkpoint (checkpoint: PATH with its architecture), later HF ids. Unset text_tower "
                               "means open_clip except for cglib-demo-vit and cglib-tiny-vit (MiniLM).")

    @model_validator(mode="before")
    @classmethod
    def _own_text_tower(cls, data: Any) -> Any:
        """A reference model keeps its own text tower: an unset text_tower is open_clip (MiniLM for the cglib
        configs built around it)."""
        if isinstance(data, dict) and isinstance(data.get("model"), dict):
            model = data["model"]
            if "text_tower" not in model and model.get("name", "cglib-demo-vit") not in MINILM_CONFIGS:
                data = {**data, "model": {**model, "text_tower": "open_clip"}}
        return data


class EvalParams(Section):
    choices: int = Field(2, ge=2, description="M of the forced-choice protocol (paper: 2).")
    recall_at: list[int] = Field(default_factory=lambda: [1, 5, 10], description="k values for gallery R@k.")
    bootstrap: int = Field(1000, ge=0, description="Bootstrap resamples for confidence intervals (0 = none).")
    ci: float = Field(0.95, gt=0.0, lt=1.0, description="Confidence level.")
    chance_margin: float = Field(
        15.0, ge=0.0, le=100.0, description="Usability floor, in points: when the zero-shot base is less than this "
        "above chance on every caption column (forced choice, text->image), notebook 06 and `cglib report` say first "
        "that Table 3 shows the pipeline, not the method. 15 flags params/hierarcaps.yaml's base (10 points above "
        "chance) and not the demo's (37 points).")
    bootstrap_unit: Literal["image", "group"] = Field(
        "image", description="What the bootstrap resamples on the MAGIC test split: image (test items, for these "
        "concepts) or group (whole l1 groups with their images: wider intervals that also cover concept sampling).")
    seeds: list[int] = Field(default_factory=lambda: [0], description="Evaluation seeds (forced-choice sampling).")
    hierarcaps: bool = Field(False, description="Also evaluate on HierarCaps (needs data.hierarcaps_csv/images).")
    clustering: bool = Field(
        False, description="Also score category discovery: k-means of the MAGIC test images' embeddings per level, "
        "clustering accuracy under Hungarian matching, seen vs held-out concepts (benchmark 'clustering').")
    hierarcaps_include_train: bool = Field(
        False, description="Also score HierarCaps items whose image is in this run's MAGIC train split (the trained "
        "models saw it and its captions); false, the default: HierarCaps is scored on unseen images only, as the "
        "paper presents it, and the count left out is reported.")
    hierarcaps_batch: int = Field(100, ge=2, description="B of the in-batch HierarCaps variant.")
    keyword_permutation: bool = Field(
        False, description="Also score the keyword-permutation test (Rösch et al.): per MAGIC test image and concept "
        "type (colour, object, size, location), does the model prefer its original caption over the caption with "
        "one keyword of that type swapped (chance 50%)? Images without such a keyword are left out and counted.")
    hierarcaps_radii: int = Field(50, ge=2, description="Radius thresholds of the HierarCaps hierarchical metric "
                                  "(its authors use 50).")
    negative_source: Literal["group", "level"] = Field(
        "group", description="Forced-choice negatives: group = hard negatives of the image's l1 group (paper; "
        "a negative with the anchor's text at the level is skipped); level = hard negatives of the image's node at "
        "the evaluated level.")
    fallback_negatives: bool = Field(True, description="Forced choice may draw negatives from the DAG's flagged "
                                     "fallback negative groups (magic.min_hard_negatives), as training does.")
    include_generalized_fallback: bool = Field(
        False, description="Score images whose generalized captions are fallback copies of original captions "
        "(LLM_gen failed) in the generalized-caption column; default false: left out and counted.")
    coco_retrieval: bool = Field(True, description="Caption retrieval on the test split's original captions.")
    batch_size: int = Field(256, ge=1, description="Encoding batch size.")
    benchmarks: list[str] = Field(
        default_factory=list, description="Your own benchmarks, scored after the built-in ones on the same models "
        "and items: each 'package.module:ClassName' of a subclass of cglib.evaluate.benchmarks.Benchmark, importable "
        "where the run runs (an installed package or a folder on PYTHONPATH).")
    zoo: list[ZooModelParams] = Field(
        default_factory=list, description="Frozen reference models scored on the same items as the trained ones "
        "(rows of metrics.csv, differences.csv, Table 3; in no gain set), each {name: ROW, model: {a model "
        "section}}; one whose weights cannot be loaded is skipped with a warning (results.json zoo_skipped).")

    @field_validator("zoo")
    @classmethod
    def _zoo_names(cls, zoo: list[ZooModelParams]) -> list[ZooModelParams]:
        names = _unique([z.name for z in zoo], "eval.zoo")
        if ZERO_SHOT_NAME in names:
            raise ValueError(f"'{ZERO_SHOT_NAME}' is the untrained model's row; rename that eval.zoo entry "
                             "(e.g. clip-openai)")
        return zoo

    @field_validator("benchmarks")
    @classmethod
    def _benchmark_plugins(cls, paths: list[str]) -> list[str]:
        names = [named(BENCHMARK_LOADER)(path).name for path in paths]  # a ValueError says what to fix
        _unique(names, "eval.benchmarks (their names)")
        return paths

    @field_validator("recall_at")
    @classmethod
    def _positive_ks(cls, ks: list[int]) -> list[int]:
        if not ks or any(k < 1 for k in ks):
            raise ValueError(f"recall_at needs at least one k >= 1, got {ks}; e.g. [1, 5, 10]")
        return sorted(set(ks))

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise ValueError(f"seeds must be a non-empty list of distinct non-negative ints, got {seeds}")
        return seeds


class VizParams(Section):
    umap_seed: int = Field(0, ge=0, description="UMAP random_state (same for every panel).")
    umap_neighbors: int = Field(15, ge=2, description="UMAP n_neighbors.")
    color_level: int = Field(2, ge=2, le=8, description="Colour l1 centroids by their ancestor at this level.")
    attention_images: int = Field(4, ge=0, description="Test images in the attention grid.")
    formats: list[Literal["png", "pdf", "svg"]] = Field(default_factory=lambda: ["png", "pdf"], description="Figure formats.")
    dpi: int = Field(150, ge=50, le=600, description="Raster figure resolution.")
    umap_texts: Literal["captions", "generalized"] = Field(
        "captions", description="Texts behind the text centroids: the test images' original captions, or their "
        "l1 groups' generalized captions (group-level, possibly seen in training).")
    trust_neighbors: int = Field(5, ge=1, description="k of the trustworthiness score printed on each UMAP panel.")
    label_max: int = Field(40, ge=0, description="Most l1 names written per UMAP panel (names that would overprint "
                           "another are left out).")
    explorer_top_k: int = Field(5, ge=1, le=50, description="Images per model shown by the concept explorer.")
    models: list[str] | None = Field(
        None, description="Models the UMAP and attention comparisons show side by side (names: zero-shot or train.runs "
        "entries); null = the zero-shot model, the CLIP-loss model and the group-objective model with the best mean "
        "forced-choice accuracy (the first group objective before evaluation).")
    numba_cache_dir: Path | None = Field(None, description="numba compile cache for UMAP; null = $NUMBA_CACHE_DIR "
                                         "or ~/.cache/cglib/numba.")


class IntRange(Section):
    low: int = Field(..., ge=1, description="Smallest value tried.")
    high: int = Field(..., ge=1, description="Largest value tried.")

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high}); set low <= high")
        return self


class FloatRange(Section):
    low: float = Field(..., ge=0, description="Smallest value tried.")
    high: float = Field(..., ge=0, description="Largest value tried.")
    log: bool = Field(False, description="Sample on a log scale (needs low > 0).")

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high}); set low <= high")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range needs low > 0 (got {self.low}); raise low or set log: false")
        return self


class SearchSpace(Section):
    """The paper's Table 2 ranges; a key set to null is not tuned (the train section's value is used)."""

    groups_per_batch: IntRange | None = Field(
        default_factory=lambda: IntRange(low=2, high=10), description="Range of train.groups_per_batch (M; "
        "Table 2: 2-10); null = not tuned.")
    pairs_per_group: IntRange | None = Field(
        default_factory=lambda: IntRange(low=2, high=15), description="Range of train.pairs_per_group (N; "
        "Table 2: 2-15); null = not tuned.")
    lr: FloatRange | None = Field(
        default_factory=lambda: FloatRange(low=1e-10, high=1e-4, log=True), description="Range of train.lr "
        "(Table 2: 1e-10 to 1e-4, log scale); null = not tuned.")
    tau: FloatRange | None = Field(
        default_factory=lambda: FloatRange(low=0.1, high=1.0), description="Range of train.tau (Table 2: "
        "0.1-1); null = not tuned.")
    alpha: FloatRange | None = Field(
        default_factory=lambda: FloatRange(low=0.0, high=1.0), description="Range of train.alpha (Table 2: "
        "0-1); null = not tuned.")

    @model_validator(mode="after")
    def _valid_values(self) -> SearchSpace:
        if self.tau is not None and self.tau.low <= 0:
            raise ValueError("search.space.tau.low must be > 0 (a temperature); e.g. 0.1")
        if self.alpha is not None and self.alpha.high > 1:
            raise ValueError(f"search.space.alpha.high must be <= 1 (a weight), got {self.alpha.high}")
        if self.lr is not None and self.lr.low <= 0:
            raise ValueError("search.space.lr.low must be > 0 (a learning rate); e.g. 1e-10")
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise ValueError("search.space tunes nothing; give at least one range (e.g. lr: {low: 1e-10, "
                             "high: 1e-4, log: true})")
        return self

    def tuned(self) -> dict[str, IntRange | FloatRange]:
        """The tuned keys of the train section and their ranges, in a fixed order."""
        return {k: getattr(self, k) for k in type(self).model_fields if getattr(self, k) is not None}


class SearchParams(Section):
    run: str | None = Field(None, description="The train.runs entry whose training is tuned (its loss, pretrain "
                            "and variant options); null = the first entry with an image-text loss.")
    trials: int = Field(20, ge=1, description="Finished (complete or pruned) trials the study should hold; a "
                        "rerun tops the study up to this count (`cglib search --trials` overrides).")
    storage: str | None = Field(
        None, description="Where the study lives (what makes a search resumable): null = SQLite file "
        "<run>/search/<study_name>.sqlite3 (one worker); 'journal:PATH' = Optuna's journal file (several "
        "processes on one machine); 'postgresql://user@host/db' (workers on many machines share the server; "
        "driver: the `postgres` extra, psycopg 3); 'sqlite:///PATH' or another SQLAlchemy URL with its driver. "
        "Relative paths resolve against the run directory; a password belongs in the URL's environment, never "
        "here (use ${ENV_VAR} in the URL).")
    study_name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$", description="Study name in the storage; "
                                   "null = '<run.name>-<search.run>'.")
    sampler_seed: int = Field(0, ge=0, description="Seed of the TPE sampler (which values are tried).")
    startup_trials: int = Field(5, ge=1, description="Random trials before TPE models the results "
                                "(TPESampler n_startup_trials).")
    space: SearchSpace = Field(default_factory=SearchSpace, description="Ranges tried (the paper's Table 2).")
    objective: Literal["levels", "table3"] = Field(
        "levels", description="What is maximized on the validation split: levels = the mean text->image "
        "forced-choice accuracy over the concept levels l1..l_max; table3 = the mean over Table 3's columns "
        "(generalized caption, original caption, l1..l_max).")
    validation_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of the MAGIC-train images (or "
                                       "concepts, with magic.split: concept) carved out as the validation split, "
                                       "seeded by run.seed; MAGIC test images are never read.")
    epochs: int | None = Field(None, ge=1, description="Image-text epochs per trial; null = train.epochs.")
    groups: int | None = Field(None, ge=2, description="Shrink the search's world to this many l1 groups (a seeded "
                               "draw, each group followed by its hard negatives; training and validation both use "
                               "only them): quick searches such as the demo's; null = every group.")
    pruner_startup_trials: int = Field(3, ge=0, description="Trials that finish before the median pruner stops "
                                       "any (MedianPruner n_startup_trials).")
    pruner_warmup_epochs: int = Field(0, ge=0, description="Epochs of a trial that are never pruned "
                                      "(MedianPruner n_warmup_steps).")
    heartbeat_s: int = Field(60, ge=1, description="Database storages: each worker's heartbeat period; a RUNNING "
                             "trial of a worker silent for twice this long (on any machine) is failed and its values "
                             "run again (by a worker waiting for the study's last trials, if none other).")

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, storage: str | None) -> str | None:
        if storage is None or storage.startswith("journal:") or "://" in storage:
            return storage
        raise ValueError(f"search.storage {storage!r} is neither 'journal:PATH' nor a database URL; use e.g. "
                         "journal:search/study.log, sqlite:///search/study.sqlite3 or postgresql://host/db")
