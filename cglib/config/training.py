"""The train section: the runs (each an objective with its options), the base model's training, the schedule."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from cglib.config.base import Section, _unique
from cglib.config.objectives import ObjectiveSpec, objective_spec, trained_by
from cglib.plugins import named

# train.callbacks entries are checked by the training layer's loader (plain Python: no torch at validation)
CALLBACK_LOADER = "cglib.train.callbacks:load_callback"

# train.runs[i] keys that became options of the objectives that read them (train.runs[i].options)
MOVED_RUN_KEYS = {"alpha_on": "pairwise, centroid, memory_centroid", "tau_inner": "pairwise, centroid, memory_centroid",
                  "alpha": "pairwise, centroid, memory_centroid", "normalize_products": "pairwise",
                  "memory_momentum": "centroid, memory_centroid", "released": "re"}


class TrainRunParams(Section):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="Model name in results (e.g. clip, pairwise).")
    loss: str = Field(
        ..., description="Objective (cglib/train/objectives/, one module each): clip, pairwise, centroid (on MAGIC "
        "image-text batches), re (HierarCaps' Radial Embedding alignment of the text tower alone, on its options.data; "
        "the Table 3 HierarCaps row), or one of the related methods: clip_hn (Rosch et al.: CLIP with "
        "keyword-permuted hard negatives: each image's caption with one colour, object, size or location word "
        "swapped replaces one negative of its image->text row; pairs without such a word keep their row, counted "
        "in the summary's hard_negatives; best with text_source: original), mcc (C3: CLIP's InfoNCE + "
        "options.weight x a SupCon loss between the images of each group, seen through a trainable head of the "
        "group's concept-name embedding) or memory_centroid (centroid with options.memory_momentum). Your own objective: "
        "package.module:ClassName, a subclass of cglib.train.objectives.Objective.")
    groups: Literal["magic", "ngram"] = Field(
        "magic", description="Which groups batches are drawn from: magic (the run's MAGIC l1 nodes) or ngram "
        "(caption n-grams shared by enough MAGIC-train images, magic/ngram.json, built by "
        "cglib.magic.ngram.build_ngram_groups; no generalized captions, so the run needs text_source: original).")
    init: str | None = Field(
        None, description="Starting weights: null = the initial (zero-shot) weights; else the name of an earlier "
        "entry of train.runs whose final weights this run starts from (e.g. HierarCaps fine-tuned: loss clip, "
        "init the re run). A run inherits its init's exposure to evaluation strings.")
    pretrain: Literal["none", "leakage_free", "with_concepts"] = Field(
        "none", description="Textual alignment pretraining: none; leakage_free (captions vs generalized captions); "
        "with_concepts (the authors' variant, also vs l1-l4 names: exposed to evaluation strings). In a params "
        "file, true means train.pretrain_targets (the protocol's targets) and false none.")
    text_source: Literal["generalized", "original"] | None = Field(
        None, description="Override train.text_source for this run (null = train.text_source): original trains on "
        "each image's own captions, e.g. a baseline whose hard negatives rewrite caption keywords.")
    tau: float | None = Field(None, gt=0, description="Override train.tau for this run (null = train.tau).")
    options: Any = Field(
        default_factory=dict, description="The objective's own options, checked by its Options model (cglib/train/"
        "objectives): the group losses (pairwise, centroid, memory_centroid): tau_inner, alpha (null = train's), "
        "alpha_on, pairwise's normalize_products, centroid's memory_momentum; loss re: data, epochs, batch_size, "
        "lr, w_mean, w_minimax, w_reg, released; loss mcc: weight, hidden; your own objective: what its Options "
        "declares. `cglib params` lists each built-in objective's.")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Run-entry keys that became options of one objective: the error names where each went."""
        moved = [key for key in (data if isinstance(data, dict) else {}) if key in MOVED_RUN_KEYS]
        if moved:
            name = data.get("name", "?")
            raise ValueError(f"run {name!r}: these keys are now options of its objective: "
                             + "; ".join(f"{key} -> options.{key} ({MOVED_RUN_KEYS[key]})" for key in moved)
                             + " (see `cglib params`)")
        return data

    @field_validator("loss")
    @classmethod
    def _known_objective(cls, loss: str) -> str:
        """A built-in objective's name or an importable `package.module:ClassName` (the error names the fix)."""
        objective_spec(loss)
        return loss

    @model_validator(mode="after")
    def _objective_accepts_entry(self) -> TrainRunParams:
        """The objective's own rules for its run entries (cglib/train/objectives), and n-gram groups' rule."""
        objective = self.objective_spec()
        # the objective's options, validated by its own model (errors name the key and the objective)
        given = self.options.model_dump() if isinstance(self.options, BaseModel) else (self.options or {})
        try:
            options = objective.Options.model_validate(given)
        except ValidationError as exc:
            problems = "; ".join(f"options.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            known = ", ".join(objective.Options.model_fields) or "none"
            raise ValueError(f"run {self.name!r} (loss: {self.loss}): {problems} (its options: {known})") from None
        self.__dict__["options"] = options  # validated; assigning through pydantic would validate the entry again
        objective.check_entry(self)
        if self.groups == "ngram" and self.pretrain != "none":
            raise ValueError(f"run {self.name!r}: n-gram groups have no generalized captions to pretrain on; set "
                             "pretrain: none (or groups: magic)")
        return self

    def objective_spec(self) -> type[ObjectiveSpec]:
        """The declaration of the objective that trains this entry (cglib/config/objectives; no torch)."""
        return objective_spec(self.loss).for_entry(self)

    def objective(self) -> type:
        """The objective class (an nn.Module) that trains this entry; a built-in one is imported now, with torch."""
        return trained_by(self.objective_spec())

    def trains_images(self) -> bool:
        """Whether the run has an image-text phase (a text objective such as re trains the text side alone)."""
        return self.objective_spec().phase == "train"


class BaseTrainParams(Section):
    corpus: Literal["none", "synthetic", "magic_train"] = Field(
        "none", description="What the base model (the zero-shot row; every run fine-tunes from it) is trained on "
        "before MAGIC, with the standard CLIP loss on (image, original caption) pairs, as CLIP was. none: the model "
        "as built (a pretrained tag such as OpenAI's CLIP, or random init). synthetic: scenes rendered from "
        "another seed of the synthetic world (disjoint from MAGIC; data.source: synthetic). magic_train: the "
        "MAGIC-train images with their original captions (never test images, never concept names).")
    seed_offset: int = Field(1000, ge=1, description="corpus synthetic: the base world's seed is run.seed + this.")
    images_per_concept: int | None = Field(None, ge=1, description="corpus synthetic: images rendered per l1 "
                                           "concept (null = data.synthetic.images_per_concept).")
    epochs: int = Field(10, ge=1, description="Epochs over the base corpus (one caption per image per epoch).")
    batch_size: int = Field(64, ge=2, description="Image-caption pairs per base-training batch.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate of base training (AdamW, warmup then cosine).")
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps of base training.")


# train.* keys that became options of one objective (train.runs[i].options): the error names where each went
MOVED_TO_OPTIONS = {**{f"re_{k}": ("re", k) for k in ("data", "epochs", "batch_size", "lr", "w_mean", "w_minimax",
                                                      "w_reg")},
                    "mcc_weight": ("mcc", "weight"), "mcc_hidden": ("mcc", "hidden")}


class TrainParams(Section):
    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """train.re_* and train.mcc_* now belong to the run entry of their objective (its `options`)."""
        moved = [key for key in (data if isinstance(data, dict) else {}) if key in MOVED_TO_OPTIONS]
        if moved:
            where = "; ".join(f"train.{k} -> train.runs[i].options.{MOVED_TO_OPTIONS[k][1]} of the loss: "
                              f"{MOVED_TO_OPTIONS[k][0]} run" for k in moved)
            raise ValueError(f"these keys are now options of their objective's run entry: {where} (see `cglib params`)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _pretrain_targets(cls, data: Any) -> Any:
        """A run entry's `pretrain: true` takes train.pretrain_targets, `false` none, so the paper profiles' rows
        are the same in both protocols and the resolved targets are what the run's spec and provenance show."""
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            return data
        targets = data.get("pretrain_targets", cls.model_fields["pretrain_targets"].default)
        runs = [{**r, "pretrain": targets if r["pretrain"] else "none"}
                if isinstance(r, dict) and isinstance(r.get("pretrain"), bool) else r for r in data["runs"]]
        return {**data, "runs": runs}

    runs: list[TrainRunParams] = Field(
        default_factory=lambda: [TrainRunParams(name="clip", loss="clip"),
                                 TrainRunParams(name="pairwise", loss="pairwise"),
                                 TrainRunParams(name="centroid", loss="centroid")],
        description="Models to train, each evaluated against the same items.")
    groups_per_batch: int = Field(2, ge=1, description="M: anchor group plus M-1 hard-negative groups.")
    pairs_per_group: int = Field(10, ge=1, description="N: image-text pairs drawn per group.")
    epochs: int = Field(5, ge=1, description="Image-text epochs (what one covers: train.epoch).")
    epoch: Literal["pairs", "groups", "pairs_as_published"] = Field(
        "pairs", description="What an image-text epoch covers. pairs: every training (image, generalized caption) "
        "pair once; each concept's pairs cut into seeded chunks of N (the last one filled up), each chunk the anchor "
        "of a batch with M-1 random hard-negative concepts without replacement (fallbacks when too few). "
        "pairs_as_published: the authors' code (cglib/train/epochs.py): incomplete chunks and concepts with fewer "
        "than M-1 hard negatives dropped, every remaining chunk the anchor once in a shuffled order (one step each), "
        "negatives with replacement, always their first chunk, and a step whose drawn negative concept was dropped "
        "skipped (counted as empty_steps). groups: one batch per training group (each group the anchor once, N pairs drawn "
        "from it); about pairs-per-group times fewer steps.")
    mask_identical_texts: bool = Field(
        True, description="Whether two identical texts of an image-text batch are never each other's negatives "
        "(the batch's text_ids reach every objective; a protocol key). false: the authors' code, where a caption "
        "shared by two pairs of a batch is a negative of its own image.")
    lr: float = Field(1e-8, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.2, ge=0, description="AdamW weight decay (not on biases, norms, logit scale).")
    warmup_steps: int = Field(100, ge=0, description="Linear warmup steps before the cosine decay.")
    tau: float = Field(0.1, gt=0, description="Outer temperature tau.")
    tau_inner: float = Field(0.1, gt=0, description="Inner temperature tau' (Eqs. 3, 7). The paper gives no value; "
                             "the authors' code fixes 0.07 (params/paper.yaml uses it); 0.1 here matches tau.")
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="Weight of the inner term (Eqs. 4, 8).")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clipping.")
    grad_accum: int = Field(1, ge=1, description="Gradient accumulation steps.")
    amp: Literal["auto", "off", "bf16", "fp16", "auto_fp16"] = Field(
        "auto", description="Mixed precision. auto: bf16 on GPU, off (fp32) on CPU; auto_fp16: fp16 autocast with "
        "loss scaling on GPU (the authors' precision), off on CPU; bf16, fp16 (GPU only) or off everywhere.")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.98), description="AdamW betas of the image-text and text phases: open_clip's ViT fine-tuning recipe; "
        "the authors' code ran (0.9, 0.999) (its parameter defaults test the model name for 'vit').")
    adam_eps: float = Field(1e-6, gt=0, description="AdamW epsilon (open_clip's ViT recipe; the authors' code: "
                            "1e-8).")
    pretrain_targets: Literal["leakage_free", "with_concepts"] = Field(
        "leakage_free", description="The targets of a run entry with pretrain: true (a protocol key): leakage_free "
        "(generalized captions only) or with_concepts (also the l1-l4 names, the authors' PretrainDataset).")
    pretrain_epochs: int = Field(1, ge=0, description="Epochs of textual alignment pretraining.")
    pretrain_pairs: Literal["distinct_targets", "as_published"] = Field(
        "distinct_targets", description="Textual pretraining batches and loss. distinct_targets: distinct targets, "
        "at most one per group, tau fixed (cglib/train/pretrain.py). as_published: the authors' PretrainDataset "
        "(every caption of an image with each of its generalized captions and, with pretrain: with_concepts, its "
        "l1-l4 names; shuffled batches, nothing masked) and the model's learned logit scale, clamped at ln 100.")
    augment: Literal["none", "open_clip_train"] = Field(
        "none", description="Image augmentation of the image-text phase (a protocol key). none: every step sees the "
        "eval crop (short side resized, centre crop) of the image cache; open_clip_train: open_clip's training "
        "transform, a random 90-100% box of the image (aspect ratio 3/4-4/3) resized bicubic, drawn per step from a "
        "seeded stream (resumed runs stay bit-exact) out of a cache that keeps each image's aspect ratio.")
    pretrain_features: Literal["normalized", "raw"] = Field(
        "normalized", description="The features textual pretraining's loss sees (a protocol key). normalized: "
        "unit-norm text embeddings, as every other loss here; raw: the text tower's unnormalized outputs, as the "
        "authors' pretrain.py gives open_clip's ClipLoss model.encode_text outputs (which do not normalize).")
    pretrain_lr: float = Field(1e-5, gt=0, description="Learning rate of the textual pretraining phase.")
    pretrain_batch_size: int = Field(64, ge=2, description="Text pairs per textual-pretraining batch (distinct "
                                     "targets, at most one per group, so two targets of one group are never "
                                     "each other's negatives).")
    text_source: Literal["generalized", "original"] = Field(
        "generalized", description="Text side of training pairs: the group's generalized captions (paper) or "
        "each image's own original captions.")
    resume: bool = Field(True, description="Continue from the last checkpoint of a run when one exists.")
    keep_epoch_weights: bool = Field(False, description="Also keep each epoch's weights (checkpoints/epoch-XXX."
                                     "safetensors); resuming needs none of them, only the final weights are kept.")
    num_workers: int = Field(0, ge=0, description="DataLoader workers.")
    processes: int | Literal["auto"] = Field(
        1, description="Training processes of notebook 05 (`cglib run`): 1 trains in the notebook's kernel; K > 1 "
        "trains each run with `torchrun --nproc_per_node K -m cglib.train` as a child process (NCCL, one GPU each; "
        "gloo CPU processes with run.device: cpu); auto: one per visible GPU (1 without a GPU). Runs whose "
        "objective cannot run distributed train in the kernel, said before training starts. Not part of a run's "
        "spec: the weights do not depend on it.")
    log_every: int = Field(10, ge=1, description="Log every k steps.")
    callbacks: list[str] = Field(
        default_factory=list, description="Your own training callbacks, called at train, epoch and step "
        "begin/end after the built-in checkpointing: each 'package.module:ClassName' of a subclass of "
        "cglib.train.callbacks.Callback (built with no arguments, one per run), importable where the run runs. A "
        "callback reads the training state and may ask to save a checkpoint or to stop (summary.json `stopped`). "
        "Its code enters the spec of every run by its digest (an edited callback retrains), unless the class "
        "declares changes_result = False (it only observes, and may not stop).")
    base: BaseTrainParams = Field(default_factory=BaseTrainParams, description="The pretrained base every run "
                                  "starts from (the zero-shot row).")
    text_trains: Literal["tower", "projection"] = Field(
        "tower", description="What the text phases (textual pretraining, loss: re) train. tower: the whole text "
        "tower and its projection (the authors); projection: the projection alone on the frozen tower, whose "
        "outputs are computed once (the demo: MiniLM, needs model.text_projection: identity).")
    seeds: list[int] = Field(
        default_factory=lambda: [0], description="Training seeds: every run (and the base) is trained once per "
        "seed. A training seed varies only initialization (the base, any new head) and batch order; run.seed keeps "
        "the world, MAGIC, the split and the evaluation items fixed, so models compare paired within a seed. Seed 0 "
        "is run.seed itself and lives in training/ (as before this key); seed k in training/seed<k>/. Results are "
        "means over the seeds with a hierarchical bootstrap (seeds, then images).")

    @field_validator("processes")
    @classmethod
    def _processes(cls, processes: int | str) -> int | str:
        if processes != "auto" and processes < 1:
            raise ValueError(f"train.processes must be a positive int or auto, got {processes}; 1 trains in "
                             "the notebook's own process")
        return processes

    @field_validator("callbacks")
    @classmethod
    def _callback_plugins(cls, paths: list[str]) -> list[str]:
        for path in paths:
            named(CALLBACK_LOADER)(path)  # a ValueError says what to fix
        _unique(paths, "train.callbacks")
        return paths

    @field_validator("seeds")
    @classmethod
    def _train_seeds(cls, seeds: list[int]) -> list[int]:
        if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise ValueError(f"train.seeds must be a non-empty list of distinct non-negative ints, got {seeds}; "
                             "e.g. [0, 1, 2]")
        return seeds

    @model_validator(mode="after")
    def _ngram_runs_use_original_captions(self) -> TrainParams:
        for i, r in enumerate(self.runs):
            if r.groups == "ngram" and (r.text_source or self.text_source) != "original":
                raise ValueError(f"train.runs[{i}] ({r.name!r}) has groups: ngram, whose groups have no generalized "
                                 "captions: set its text_source: original (or train.text_source: original)")
        return self

    @field_validator("runs")
    @classmethod
    def _unique_names(cls, runs: list[TrainRunParams]) -> list[TrainRunParams]:
        names = _unique([r.name for r in runs], "train.runs")
        for name in names:
            if re.fullmatch(r"seed\d+", name):
                raise ValueError(f"train.runs: the name {name!r} is the folder of a training seed "
                                 "(training/seed<k>/); rename the run")
        for i, r in enumerate(runs):
            if r.init is None:
                continue
            if r.init not in names:
                raise ValueError(f"train.runs[{i}].init: no run named {r.init!r}; name an earlier entry of "
                                 f"train.runs ({names[:i]}) or null for the initial weights")
            if names.index(r.init) >= i:
                raise ValueError(f"train.runs[{i}].init: {r.init!r} is not an earlier entry (a run starts from the "
                                 f"final weights of a run trained before it); move {r.init!r} above {r.name!r}")
        return runs
