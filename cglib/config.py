"""Parameters: one YAML file per profile, validated by a pydantic schema with errors that name the key and the fix.

Each pipeline stage owns one section (`run`, `data`, `llm`, `magic`, `model`, `train`, `eval`, `viz`).
Unknown keys are errors (with the closest valid key suggested), so a typo never silently falls back to a
default. Secrets never live here: `llm.api_key_env` names the environment variable that holds the key.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# a Hugging Face Hub repository id, owner/name (magic.source)
SHIPPED_TAXONOMY_NAMES = ("synthetic", "everyday")  # llm.offline_taxonomy values naming a taxonomy of the package
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ParamsError(ValueError):
    """A params file is missing, unreadable or invalid; the message names each bad key and its fix."""


def _unique(names: list[str], key: str) -> list[str]:
    """`names` when no two are equal, else ValueError naming the duplicates and `key`."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate names {dupes}; give every entry of {key} its own name")
    return names


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------- run
class RunParams(Section):
    name: str = Field("demo", description="Run name; results go to `<output_dir>/<name>/`.", pattern=r"^[A-Za-z0-9_.-]+$")
    profile: Literal["demo", "paper", "hierarcaps", "rehearsal", "related", "custom"] = Field(
        "demo", description="Which profile this file is: demo (synthetic, offline), paper, hierarcaps, rehearsal "
        "(the paper's code path shrunk for CI), related (the related methods beside CLEAR GLASS on the synthetic "
        "world), custom.")
    seed: int = Field(0, ge=0, description="Master seed: data order, splits, sampling, initialisation.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Torch device; auto picks cuda when present.")
    output_dir: Path = Field(Path("outputs"), description="Parent folder of run directories (relative to the repo root).")
    cell_timeout_s: int = Field(3600, gt=0, description="Per-cell timeout for headless notebook runs (seconds).")
    cell_silence_s: int = Field(
        900, ge=0, description="Headless runs: a cell that sends no output (prints, bars, figures) for this long is "
        "reported as hung by notebook and cell and its kernel interrupted; 0 = off (seconds).")
    threads: int = Field(0, ge=0, description="Torch/faiss CPU threads; 0 = all cores.")


# -------------------------------------------------------------------------------------------- data
class SyntheticParams(Section):
    images_per_concept: int = Field(30, ge=2, le=10_000, description="Images rendered per l1 concept.")
    image_size: int = Field(64, ge=16, le=512, description="Rendered image side in pixels.")
    captions_per_image: int = Field(5, ge=1, le=20, description="Templated captions per image.")
    min_objects: int = Field(2, ge=1, le=10, description="Fewest objects drawn in a scene.")
    max_objects: int = Field(5, ge=1, le=10, description="Most objects drawn in a scene.")

    @model_validator(mode="after")
    def _objects_order(self) -> SyntheticParams:
        if self.min_objects > self.max_objects:
            raise ValueError(f"min_objects ({self.min_objects}) exceeds max_objects ({self.max_objects}); "
                             "set min_objects <= max_objects")
        return self


class DataParams(Section):
    source: Literal["synthetic", "coco", "hierarcaps"] = Field(
        "synthetic", description="Where images and captions come from.")
    synthetic: SyntheticParams = Field(default_factory=SyntheticParams, description="Synthetic world settings.")
    coco_captions: Path | None = Field(None, description="COCO `captions_*.json` (source: coco).")
    coco_images: Path | None = Field(None, description="Folder of the COCO images named in the captions file.")
    hierarcaps_csv: Path | None = Field(None, description="HierarCaps test CSV (source: hierarcaps, and evaluation).")
    hierarcaps_images: Path | None = Field(None, description="Folder of the HierarCaps test images.")
    hierarcaps_train_csv: Path | None = Field(None, description="HierarCaps train hierarchies, hierarcaps_train.csv.gz "
                                              "(`cglib download hierarcaps-train`; a loss: re run's options.data: hierarcaps_train).")
    max_images: int | None = Field(None, ge=1, description="Use only the first N images (sorted by id); null = all.")
    image_cache_size: int = Field(224, ge=16, le=1024, description="Side of the decoded uint8 image cache for training.")

    @model_validator(mode="after")
    def _source_inputs(self) -> DataParams:
        if self.source == "coco" and (self.coco_captions is None or self.coco_images is None):
            raise ValueError("source 'coco' needs data.coco_captions and data.coco_images; set both paths")
        if self.source == "hierarcaps" and (self.hierarcaps_csv is None or self.hierarcaps_images is None):
            raise ValueError("source 'hierarcaps' needs data.hierarcaps_csv and data.hierarcaps_images; set both paths")
        return self


# --------------------------------------------------------------------------------------------- llm
class LLMParams(Section):
    backend: Literal["offline", "openai", "oracle"] = Field(
        "offline", description="Abstraction backend: offline (taxonomy + MiniLM), openai (any compatible server), "
        "oracle (synthetic ground truth, controlled experiments only).")
    model: str = Field("gpt-4o-mini", description="Model name sent to the OpenAI-compatible server.")
    base_url: str | None = Field(None, description="OpenAI-compatible server URL (vLLM, Ollama, ...); null = OpenAI.")
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                             description="Name of the environment variable holding the API key (never the key).")
    concurrency: int = Field(16, ge=1, le=1024, description="Requests in flight at once.")
    max_retries: int = Field(5, ge=0, le=50, description="Retries per request on 429, 5xx, timeouts and connection errors "
                             "(Batch API: extra rounds for failed or expired items).")
    max_bad_reply_retries: int = Field(2, ge=0, le=20, description="Retries of a reply that is not valid JSON, misses fields, "
                                       "is empty, too long, truncated or a refusal, before it is recorded as a failure.")
    backoff_base_s: float = Field(0.5, gt=0, description="First retry delay (s); doubles per retry, with jitter.")
    backoff_max_s: float = Field(30.0, gt=0, description="Longest retry delay without a Retry-After header (s).")
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout in seconds.")
    http_transport: Literal["auto", "httpx", "aiohttp"] = Field(
        "auto", description="HTTP transport of the openai client: aiohttp is about 2x faster at high concurrency; "
        "auto = aiohttp when installed, else httpx.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature (0 = deterministic).")
    structured_output: bool = Field(True, description="Ask the server for JSON-schema structured output.")
    batch_api: bool = Field(False, description="Use the OpenAI Batch API (24 h window, half price) instead of live calls.")
    prompt_version: str = Field("v1", description="Prompt set version; part of the cache key.")
    max_reply_chars: int = Field(2000, ge=10, description="Longer replies are rejected as absurd and retried.")
    price_input_per_1m: float = Field(0.15, ge=0, description="USD per 1M input tokens, for the cost estimate.")
    price_output_per_1m: float = Field(0.60, ge=0, description="USD per 1M output tokens, for the cost estimate.")
    generalized_captions_per_node: int = Field(5, ge=1, le=100, description="Generalized captions written per l1 node.")
    generalized_captions_per_image: int = Field(1, ge=1, le=20, description="Generalized captions written per image "
                                                "(magic.generalize: image; the paper pairs each image with one).")
    generalize_image_prompt_version: str = Field("gi-v1", description="Version of the per-image LLM_gen prompt "
                                                 "(cglib/llm/prompts/generalize_image/); part of the cache key.")
    cache_path: Path | None = Field(None, description="SQLite cache file; null = `<run>/abstraction/cache.sqlite`; "
                                    "relative paths resolve against the run directory.")
    retry_failed: bool = Field(False, description="Ask again for items whose reply failed validation in an earlier run "
                               "(cached failures); transport failures are always asked again.")
    max_output_tokens: int = Field(64, ge=8, le=4096, description="max_tokens of a concept reply "
                                   "(generalized captions: this times the number asked for).")
    max_cost_usd: float | None = Field(None, ge=0, description="Refuse to start when the estimated cost of the "
                                       "uncached requests exceeds this (USD); null = no limit.")
    generalize_max_captions: int = Field(40, ge=1, le=1000, description="Captions of a node shown to the LLM for "
                                         "generalized captions (a seeded sample when the node has more).")
    offline_method: Literal["name", "photo", "content", "name+content"] = Field(
        "content", description="Offline backend: what an image's mean caption embedding is compared with: the l1 "
        "name, 'a photo of <name>', the scene's objects and settings, or the mean of name and content.")
    offline_taxonomy: str | None = Field(
        None, description="Concept taxonomy of the offline backend: synthetic (the synthetic world's, also null), "
        "everyday (shipped: everyday photographs, for COCO photos) or the path of a YAML file with levels, parents "
        "and descriptions.")
    batch_max_requests: int = Field(50_000, ge=1, le=50_000, description="Batch API: requests per JSONL file.")
    batch_max_bytes: int = Field(200_000_000, ge=1_000, le=200_000_000, description="Batch API: bytes per JSONL file.")
    batch_max_enqueued_tokens: int = Field(2_000_000, ge=1_000, description="Batch API: estimated input tokens "
                                           "enqueued at once (the per-model limit of the account tier).")
    batch_poll_s: float = Field(30.0, gt=0, description="Batch API: seconds between status polls.")
    batch_price_factor: float = Field(0.5, gt=0, le=1, description="Batch API price relative to live calls.")


# ------------------------------------------------------------------------------------------- magic
class MagicParams(Section):
    l_max: int = Field(4, ge=1, le=8, description="Number of abstraction levels (l1..l_max).")
    size_min: int = Field(5, ge=1, description="Nodes with fewer images merge or are removed (Size_min).")
    sim_min: float = Field(0.9, ge=-1.0, le=1.0, description="Concept cosine needed to merge a small node (Sim_min).")
    hard_negative_sim: float = Field(0.85, ge=-1.0, le=1.0, description="Cosine above which same-level nodes are hard negatives.")
    min_hard_negatives: int = Field(0, ge=0, description="Guarantee at least k hard negatives per node (flagged fallbacks).")
    max_hard_negatives: int | None = Field(
        None, ge=1, description="Keep each node's K most similar threshold negatives (a pair kept by either node "
        "is kept by both); null = every one (the paper). Bounds the pairs at K per node where names crowd together.")
    negative_search: Literal["auto", "exact", "hnsw"] = Field(
        "auto", description="How faiss finds the pairs above hard_negative_sim (each then decided in float64): exact "
        "compares every pair of a level (O(n^2)); hnsw, a graph index (O(n log n)), pays only when "
        "max_hard_negatives bounds the output; auto = hnsw for a capped level of more than 20,000 nodes, else exact.")
    embedder: Literal["minilm", "open_clip", "openai"] = Field("minilm", description="Concept-embedding model.")
    embedder_model: str | None = Field(None, description="open_clip: 'ARCH' or 'ARCH:PRETRAINED' (null: the model "
                                       "section); openai: embedding model (null: text-embedding-3-small).")
    split: Literal["image", "concept"] = Field(
        "image", description="image: 80/20 within each l1 node (paper); concept: held-out l1 concepts.")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Fraction of images (or concepts) held out for test.")
    generalize: Literal["image", "group"] = Field(
        "image", description="LLM_gen granularity: image = one request per image (its captions, l1 concept and "
        "ancestors -> its own generalized captions; paper Sec. 3.1 step 5 and the authors' code); group = "
        "captions pooled per l1 node (Algorithm 1 as printed; the project's first version).")
    source: str = Field(
        "build", min_length=1, description="Where MAGIC comes from: build (notebooks 02-03 run the abstraction and "
        "Algorithm 1), or an export written by `cglib export-magic`: a local folder (relative to the repo root) or a "
        "Hugging Face dataset id owner/name (downloaded with huggingface_hub); notebooks 02-03 then check and show it "
        "instead of calling an LLM.")
    generalize_from: Literal["train", "all"] = Field(
        "train", description="Captions sent to LLM_gen: train (a node's training images; held-out concepts use all) "
        "or all (the paper's code: every image, test images included).")


# ------------------------------------------------------------------------------------------- ngram
class NgramParams(Section):
    """The LLM-free group builder (cglib.magic.ngram): caption n-grams shared by enough MAGIC-train images."""

    n_max: int = Field(3, ge=1, le=5, description="Longest n-gram mined (n = 1..n_max words).")
    max_document_fraction: float = Field(
        0.2, gt=0.0, le=1.0, description="N-grams in the captions of more than this fraction of the MAGIC-train "
        "images are too frequent to name a concept and are removed (listed in ngram.json's stats).")
    min_images: int | None = Field(None, ge=2, description="Fewest MAGIC-train images an n-gram group needs "
                                   "(null = magic.size_min).")
    stop_words: Literal["shipped", "sklearn"] = Field(
        "shipped", description="An n-gram with a stop word is never a concept: shipped = a short list of function "
        "words in cglib.magic.ngram; sklearn = scikit-learn's ENGLISH_STOP_WORDS (318 words, also 'fire', 'top', "
        "'front' and number words).")
    extra_stop_words: list[str] = Field(default_factory=list, description="More stop words (lower case), e.g. "
                                        "caption template words such as 'photo'.")


# ------------------------------------------------------------------------------------------- model
class ModelParams(Section):
    source: Literal["open_clip", "hf"] = Field(
        "open_clip", description="Where the model comes from: open_clip (an architecture or cglib config) or hf (a "
        "Hugging Face transformers CLIP checkpoint: model.name is a Hub id such as openai/clip-vit-base-patch32 or a "
        "local directory with its config.json).")
    name: str = Field("cglib-demo-vit", description="open_clip architecture (e.g. ViT-B-32) or a cglib config "
                      "(cglib-demo-vit, cglib-tiny-vit); with source: hf, a Hub id or a local CLIP directory.")
    hf_state_dict: Path | None = Field(
        None, description="source: hf only: a Hugging Face CLIP state dict (.bin / .pt / .safetensors, CLIPModel keys) "
        "loaded on top of model.name's weights, e.g. the released HierarCaps fine-tuned weights.")
    pretrained: str | None = Field(None, description="open_clip pretrained tag (e.g. openai); null = random init.")
    checkpoint: Path | None = Field(None, description="Local checkpoint to start from (safetensors or torch state dict).")
    text_tower: Literal["open_clip", "minilm"] = Field(
        "minilm", description="open_clip: the architecture's own text tower; minilm: the offline pretrained MiniLM "
        "(with source: hf the checkpoint's own tower: unset means open_clip).")
    freeze_text: bool = Field(True, description="Freeze the text tower (lets text embeddings be computed once).")
    text_projection: Literal["none", "identity"] = Field(
        "none", description="text_tower: minilm only. none: the joint space is MiniLM's own 384-d output; identity: "
        "a 384x384 linear projection after the tower, initialised to the identity (embeddings unchanged until it "
        "trains), so that text phases can train the projection alone (train.text_trains: projection).")
    image_size: int | None = Field(None, ge=16, le=1024, description="Override the image tower's input size.")
    embed_dim: int | None = Field(None, ge=8, le=4096, description="Override the joint embedding size (cglib configs).")
    force_activation: Literal["gelu", "quick_gelu"] | None = Field(
        None, description="MLP activation of both towers. null = the pretrained tag's (open_clip's registry says "
        "quick_gelu for OpenAI's weights), else the architecture's; a `-quickgelu` architecture with a tag trained "
        "with GELU (or the reverse) is an error. gelu / quick_gelu override both (e.g. gelu reproduces runs made "
        "before the activation followed the tag).")
    pretrained_weights: bool = Field(True, description="false: resolve the pretrained tag (its config: activation, "
                                     "preprocessing) but neither download nor load its weights (random init; the "
                                     "rehearsal profile, where no weights can be fetched); with source: hf, build from the "
                                     "checkpoint's config.json alone.")
    arch_overrides: dict[Literal["vision_cfg", "text_cfg"], dict[str, int]] | None = Field(
        None, description="Entries of the open_clip architecture's vision_cfg / text_cfg to override, e.g. "
        "{text_cfg: {layers: 2, width: 128, heads: 2}}: smaller towers on the same code path (the rehearsal). "
        "The tag's weights no longer fit, so this needs pretrained_weights: false.")

    @model_validator(mode="before")
    @classmethod
    def _hf_text_tower(cls, data: Any) -> Any:
        """With source: hf the text tower is the checkpoint's own, so an unset text_tower means open_clip."""
        if isinstance(data, dict) and data.get("source") == "hf" and "text_tower" not in data:
            data = {**data, "text_tower": "open_clip"}
        return data

    @model_validator(mode="after")
    def _projection_needs_minilm(self) -> ModelParams:
        if self.text_projection == "identity" and (self.text_tower != "minilm" or self.source != "open_clip"):
            raise ValueError("model.text_projection: identity adds a projection to the MiniLM text tower; set "
                             "model.text_tower: minilm (a cglib config), or text_projection: none (open_clip and HF "
                             "towers have their own projection)")
        return self

    @model_validator(mode="after")
    def _hf_options(self) -> ModelParams:
        if self.source != "hf":
            if self.hf_state_dict is not None:
                raise ValueError("model.hf_state_dict applies to Hugging Face checkpoints only; set model.source: hf "
                                 "(model.name a Hub id or CLIP directory), or use model.checkpoint for open_clip")
            return self
        fixes = {
            "pretrained": "with source: hf the weights come from model.name (Hub id or local directory); remove "
                          "model.pretrained",
            "arch_overrides": "the architecture is the checkpoint's config.json; remove model.arch_overrides",
            "image_size": "the input size is the checkpoint's (its processor config); remove model.image_size",
            "embed_dim": "the joint size is the checkpoint's projection_dim; remove model.embed_dim",
            "force_activation": "the activation is the checkpoint config's hidden_act; remove model.force_activation",
        }
        for key, fix in fixes.items():
            if getattr(self, key) is not None:
                raise ValueError(f"model.{key} is an open_clip option and does not apply to source: hf; {fix}")
        if self.text_tower == "minilm":
            raise ValueError("model.text_tower: minilm is not available with source: hf (the checkpoint has its own "
                             "text tower); remove model.text_tower or set it to open_clip")
        if self.name.startswith("cglib-"):
            raise ValueError(f"model.name '{self.name}' is a cglib config, not a Hugging Face checkpoint; with "
                             "source: hf set a Hub id (openai/clip-vit-base-patch32) or a local CLIP directory")
        return self

    @model_validator(mode="after")
    def _overrides_without_weights(self) -> ModelParams:
        if self.arch_overrides and self.pretrained and self.pretrained_weights:
            raise ValueError("arch_overrides change the architecture, so the pretrained tag's weights cannot load; "
                             "set pretrained_weights: false or remove arch_overrides")
        return self


# ------------------------------------------------------------------------------------------- train
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
        "with_concepts (the authors' variant, also vs l1-l4 names: exposed to evaluation strings).")
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
        from cglib.train.objectives import objective_class  # torch and the losses: see objective()

        objective_class(loss)
        return loss

    @model_validator(mode="after")
    def _objective_accepts_entry(self) -> TrainRunParams:
        """The objective's own rules for its run entries (cglib/train/objectives), and n-gram groups' rule."""
        objective = self.objective()
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

    def objective(self) -> type:
        """The objective class that trains this entry (`cglib.train.objectives.objective_for`)."""
        # imported here: the objectives import torch and the losses, which validating a params file rarely needs
        from cglib.train.objectives import objective_for

        return objective_for(self)

    def trains_images(self) -> bool:
        """Whether the run has an image-text phase (a text objective such as re trains the text side alone)."""
        return self.objective().phase == "train"


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

    runs: list[TrainRunParams] = Field(
        default_factory=lambda: [TrainRunParams(name="clip", loss="clip"),
                                 TrainRunParams(name="pairwise", loss="pairwise"),
                                 TrainRunParams(name="centroid", loss="centroid")],
        description="Models to train, each evaluated against the same items.")
    groups_per_batch: int = Field(2, ge=1, description="M: anchor group plus M-1 hard-negative groups.")
    pairs_per_group: int = Field(10, ge=1, description="N: image-text pairs drawn per group.")
    epochs: int = Field(5, ge=1, description="Image-text epochs (what one covers: train.epoch).")
    epoch: Literal["pairs", "groups"] = Field(
        "pairs", description="What an image-text epoch covers. pairs (the authors' code): every training (image, "
        "generalized caption) pair once; each concept's pairs cut into seeded chunks of N, each chunk the anchor "
        "group of a batch with M-1 chunks of hard-negative concepts. groups: one batch per training group (each "
        "group the anchor once, N pairs drawn from it); about pairs-per-group times fewer steps.")
    lr: float = Field(1e-8, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.2, ge=0, description="AdamW weight decay (not on biases, norms, logit scale).")
    warmup_steps: int = Field(100, ge=0, description="Linear warmup steps before the cosine decay.")
    tau: float = Field(0.1, gt=0, description="Outer temperature tau.")
    tau_inner: float = Field(0.1, gt=0, description="Inner temperature tau' (Eqs. 3, 7). The paper gives no value; "
                             "the authors' code fixes 0.07 (params/paper.yaml uses it); 0.1 here matches tau.")
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="Weight of the inner term (Eqs. 4, 8).")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clipping.")
    grad_accum: int = Field(1, ge=1, description="Gradient accumulation steps.")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field("auto", description="Mixed precision (auto: bf16 on GPU, off on CPU).")
    pretrain_epochs: int = Field(1, ge=0, description="Epochs of textual alignment pretraining.")
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
    log_every: int = Field(10, ge=1, description="Log every k steps.")
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


# -------------------------------------------------------------------------------------------- eval
ZERO_SHOT_NAME = "zero-shot"  # the untrained initial model's row name (cglib.evaluate.loading.ZERO_SHOT)
MINILM_CONFIGS = ("cglib-demo-vit", "cglib-tiny-vit")  # cglib configs whose default text tower is MiniLM


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
        if not paths:  # no import of the evaluation package when loading params that plug in nothing
            return paths
        from cglib.evaluate.benchmarks import load_benchmark  # here: cglib.evaluate imports this module

        names = [load_benchmark(path).name for path in paths]  # a ValueError says what to fix
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


# --------------------------------------------------------------------------------------------- viz
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
    numba_cache_dir: Path | None = Field(None, description="numba compile cache for UMAP; null = $NUMBA_CACHE_DIR "
                                         "or ~/.cache/cglib/numba.")


# ------------------------------------------------------------------------------------------ search
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
        "processes on one machine); 'sqlite:///PATH' or any SQLAlchemy database URL such as "
        "'postgresql://user@host/db' (workers on many machines). Relative paths resolve against the run "
        "directory; a password belongs in the URL's environment, never here (use ${ENV_VAR} in the URL).")
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
    heartbeat_s: int = Field(60, ge=1, description="Database storages: a RUNNING trial of a worker silent for "
                             "twice this long (on any machine) is failed and its values tried again.")

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, storage: str | None) -> str | None:
        if storage is None or storage.startswith("journal:") or "://" in storage:
            return storage
        raise ValueError(f"search.storage {storage!r} is neither 'journal:PATH' nor a database URL; use e.g. "
                         "journal:search/study.log, sqlite:///search/study.sqlite3 or postgresql://host/db")


# ---------------------------------------------------------------------------------------------- all
class Params(Section):
    run: RunParams = Field(default_factory=RunParams)
    data: DataParams = Field(default_factory=DataParams)
    llm: LLMParams = Field(default_factory=LLMParams)
    magic: MagicParams = Field(default_factory=MagicParams)
    ngram: NgramParams = Field(default_factory=NgramParams)
    model: ModelParams = Field(default_factory=ModelParams)
    train: TrainParams = Field(default_factory=TrainParams)
    eval: EvalParams = Field(default_factory=EvalParams)
    viz: VizParams = Field(default_factory=VizParams)
    search: SearchParams = Field(default_factory=SearchParams)

    @model_validator(mode="after")
    def _cross_section(self) -> Params:
        if self.viz.color_level > self.magic.l_max:
            raise ValueError(f"viz.color_level ({self.viz.color_level}) exceeds magic.l_max ({self.magic.l_max}); "
                             "lower viz.color_level")
        if self.train.base.corpus == "synthetic" and self.data.source != "synthetic":
            raise ValueError("train.base.corpus 'synthetic' renders the synthetic world; with data.source "
                             f"'{self.data.source}' use train.base.corpus: magic_train (or none)")
        if self.train.text_trains == "projection" and self.model.text_projection == "none":
            raise ValueError("train.text_trains: projection trains the text projection alone, and the model has "
                             "none: set model.text_projection: identity (text_tower: minilm), or text_trains: tower")
        clash = sorted({z.name for z in self.eval.zoo} & {r.name for r in self.train.runs})
        if clash:
            raise ValueError(f"eval.zoo names {clash} are also train.runs names; rename the eval.zoo entries "
                             "(every row of Table 3 needs its own name)")
        self._search_run()
        if self.llm.backend == "oracle" and self.data.source != "synthetic":
            raise ValueError("llm.backend 'oracle' needs the synthetic world's ground truth; "
                             "use data.source: synthetic or another backend")
        return self

    def _search_run(self) -> None:
        """search.run names an image-text run whose tuned keys are not overridden in its train.runs entry."""
        name = self.search.run
        if name is None:
            return
        entry = next((r for r in self.train.runs if r.name == name), None)
        if entry is None:
            raise ValueError(f"search.run {name!r} is not a train.runs entry; choose one of "
                             f"{[r.name for r in self.train.runs]} (or null for the first image-text run)")
        if not entry.trains_images():
            raise ValueError(f"search.run {name!r} has loss {entry.loss}, which trains the text tower alone; tune an "
                             "image-text run (loss clip, pairwise or centroid)")
        if entry.groups != "magic":
            raise ValueError(f"search.run {name!r} trains on groups: {entry.groups}, but the search's validation "
                             "split is carved from MAGIC's groups; tune a groups: magic run")
        for key, where in (("tau", "tau"), ("alpha", "options.alpha")):
            own = getattr(entry, key, None) if key == "tau" else getattr(entry.options, key, None)
            if own is not None and getattr(self.search.space, key) is not None:
                raise ValueError(f"train.runs entry {name!r} overrides {key}, so a tuned train.{key} would not "
                                 f"reach it; remove its {where} or set search.space.{key}: null")

    def search_run(self) -> str:
        """The train.runs entry the search tunes: search.run, else the first entry with an image-text loss."""
        if self.search.run is not None:
            return self.search.run
        for entry in self.train.runs:
            if entry.trains_images() and entry.groups == "magic":
                return entry.name
        raise ValueError("train.runs has no image-text run (loss clip, pairwise or centroid) to tune; add one "
                         "or set search.run")

    def run_dir(self, root: Path | None = None) -> Path:
        """The run directory `<output_dir>/<name>`, relative paths resolved against `root` (default: cwd)."""
        base = self.run.output_dir if self.run.output_dir.is_absolute() else (root or Path.cwd()) / self.run.output_dir
        return base / self.run.name


# ------------------------------------------------------------------------------------------ loading
def _section_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys of the section at `loc` (for 'did you mean')."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        candidates = [ann, *(inner or [])]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        valid = _section_keys(Params, loc)
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys here: {', '.join(valid)}"
        return f"{key}: unknown key; {hint}"
    if kind == "missing":
        return f"{key}: required key is missing; add it"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def _check_paths(params: Params, root: Path) -> list[str]:
    """Input paths the chosen profile reads must exist."""
    d = params.data
    needed: list[tuple[str, Path | None]] = []
    if d.source == "coco":
        needed += [("data.coco_captions", d.coco_captions), ("data.coco_images", d.coco_images)]
    if d.source == "hierarcaps" or params.eval.hierarcaps:
        needed += [("data.hierarcaps_csv", d.hierarcaps_csv), ("data.hierarcaps_images", d.hierarcaps_images)]
    for entry in params.train.runs:  # files an objective reads (re on the HierarCaps train hierarchies)
        needed += [f for f in entry.objective().input_files(params, entry) if f not in needed]
    if params.model.checkpoint is not None:
        needed.append(("model.checkpoint", params.model.checkpoint))
    if params.model.hf_state_dict is not None:
        needed.append(("model.hf_state_dict", params.model.hf_state_dict))
    taxonomy = params.llm.offline_taxonomy
    if params.llm.backend == "offline" and taxonomy is not None and taxonomy not in SHIPPED_TAXONOMY_NAMES:
        needed.append(("llm.offline_taxonomy", Path(taxonomy)))
    errors = []
    source = params.magic.source
    if source != "build":
        local = Path(source).expanduser()
        local = local if local.is_absolute() else root / local
        if not local.is_dir() and not re.match(HUB_ID_PATTERN, source):
            errors.append(f"magic.source: {local} is not a folder and {source!r} is not a Hugging Face dataset id "
                          "(owner/name); point it at a folder written by `cglib export-magic` or a Hub id, or set "
                          "build")
    for key, path in needed:
        if path is None:
            errors.append(f"{key}: required by this profile but not set; set it to an existing path")
            continue
        resolved = path if path.is_absolute() else root / path
        if not resolved.exists():
            errors.append(f"{key}: path does not exist: {resolved}; fix the path, or pass --no-check-paths "
                          "to validate before the data is in place")
    return errors


def resolve_paths(params: Params, root: Path) -> Params:
    """Return a copy whose relative input paths are resolved against `root` (the params file's repo root)."""
    data = params.model_dump()
    for key in ("coco_captions", "coco_images", "hierarcaps_csv", "hierarcaps_images", "hierarcaps_train_csv"):
        p = data["data"][key]
        if p is not None and not Path(p).is_absolute():
            data["data"][key] = root / p
    for section, key in (("model", "checkpoint"), ("model", "hf_state_dict"), ("llm", "cache_path"),
                         ("llm", "offline_taxonomy")):
        p = data[section][key]
        if p is not None and not Path(p).is_absolute() and str(p) not in SHIPPED_TAXONOMY_NAMES:
            data[section][key] = str(root / p) if isinstance(p, str) else root / p
    for model in [data["model"], *(z["model"] for z in data["eval"]["zoo"])]:
        for key in ("checkpoint", "hf_state_dict"):
            if model is not data["model"] and model[key] is not None and not Path(model[key]).is_absolute():
                model[key] = root / model[key]
        name = model["name"]
        if model["source"] == "hf" and not Path(name).is_absolute() and (root / name).is_dir():
            model["name"] = str(root / name)  # a local CLIP directory relative to the repo root
    for run in data["train"]["runs"]:  # an objective's file options (re's released weights)
        for key, value in run["options"].items():
            if isinstance(value, Path) and not value.is_absolute():
                run["options"][key] = root / value
    source = data["magic"]["source"]
    if source != "build" and not Path(source).is_absolute() and (root / source).is_dir():
        data["magic"]["source"] = str(root / source)  # an export folder relative to the repo root
    if not Path(data["run"]["output_dir"]).is_absolute():
        data["run"]["output_dir"] = root / data["run"]["output_dir"]
    return Params.model_validate(data)


def params_root(path: Path) -> Path:
    """Relative paths in a params file are relative to the repo root: the parent of its `params/` folder."""
    path = Path(path).resolve()
    return path.parent.parent if path.parent.name == "params" else path.parent


def parse_params(raw: Any, root: Path, check_paths: bool = True) -> Params:
    """Validate an already-parsed YAML mapping; raise ParamsError with one line per problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params must be a YAML mapping of sections (run, data, ...), got {type(raw).__name__}")
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError("\n".join(_format_error(e) for e in exc.errors())) from None
    if check_paths:
        errors = _check_paths(params, root)
        if errors:
            raise ParamsError("\n".join(errors))
    return resolve_paths(params, root)


def load_params(path: str | Path, check_paths: bool = True, overrides: dict[str, Any] | None = None) -> Params:
    """Load and validate a params YAML file; relative paths resolve against the repo root."""
    from cglib.strict_yaml import DuplicateKeyError, NotTextError, load_yaml, read_text

    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}; pass an existing YAML file such as params/demo.yaml")
    try:
        text = read_text(path)
    except NotTextError as exc:
        raise ParamsError(f"{exc}; params files are UTF-8 YAML text (pass one such as params/demo.yaml, not a "
                          "data or checkpoint file)") from None
    except OSError as exc:
        raise ParamsError(f"params file {path} cannot be read ({exc.strerror}); check its permissions") from None
    try:
        raw = load_yaml(text)
    except DuplicateKeyError as exc:
        first, second = exc.lines
        raise ParamsError(f"{path}: duplicate key '{exc.key}' at lines {first} and {second}; keep one of them "
                          "(YAML would silently use the last)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParamsError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}; fix the syntax") from None
    if overrides:
        raw = deep_merge(raw or {}, overrides)
    return parse_params(raw, params_root(path), check_paths=check_paths)


def deep_merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged in, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def schema_table() -> list[dict[str, str]]:
    """Every params key with its type, default and meaning, generated from the schema (for docs and 00_overview)."""
    rows: list[dict[str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
                continue
            default = "(required)" if field.is_required() else json.dumps(
                _jsonable(field.get_default(call_default_factory=True)))
            rows.append({"key": key, "type": _type_name(ann), "default": default,
                         "meaning": field.description or ""})
            if name == "runs":
                walk(TrainRunParams, key + "[].")
                from cglib.train.objectives import OBJECTIVES  # the objectives' own options (lazy: torch)

                options: dict[tuple, list[str]] = {}  # an option several objectives share is one row
                for loss, objective in OBJECTIVES.items():
                    for sub, f in objective.Options.model_fields.items():
                        default = "(required)" if f.is_required() else json.dumps(
                            _jsonable(f.get_default(call_default_factory=True)))
                        options.setdefault((sub, _type_name(f.annotation), default, f.description or ""),
                                           []).append(loss)
                for (sub, kind, default, meaning), losses in options.items():
                    rows.append({"key": f"{key}[].options.{sub}", "type": kind, "default": default,
                                 "meaning": f"loss: {', '.join(losses)}: {meaning}"})
            if name == "zoo":
                for sub, f in ZooModelParams.model_fields.items():
                    rows.append({"key": f"{key}[].{sub}", "type": "model section" if sub == "model" else "str",
                                 "default": "(required)", "meaning": f.description or ""})

    walk(Params, "")
    return rows


def _type_name(ann: Any) -> str:
    """Readable type: Literal choices joined by |, Optional as `X | None`, lists as list[X]."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann))


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_keys(params: Params) -> list[dict[str, str]]:
    """Keys whose value differs from the schema default (resolved paths aside), for run summaries."""
    defaults = _flatten(Params().model_dump(mode="json"))
    current = _flatten(params.model_dump(mode="json"))
    return [{"key": k, "default": json.dumps(defaults.get(k)), "value": json.dumps(v)}
            for k, v in current.items() if v != defaults.get(k) and k != "run.output_dir"]
