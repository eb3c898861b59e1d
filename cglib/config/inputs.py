"""The sections of the pipeline's inputs and its model: run, data, llm, magic, ngram, model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cglib.config.base import Section


class RunParams(Section):
    name: str = Field("demo", description="Run name; results go to `<output_dir>/<name>/`.", pattern=r"^[A-Za-z0-9_.-]+$")
    profile: Literal["demo", "paper", "hierarcaps", "rehearsal", "related", "custom"] = Field(
        "demo", description="Which profile this file is: demo (synthetic, offline), paper, hierarcaps, rehearsal "
        "(the paper's code path shrunk for CI), related (the related methods beside CLEAR GLASS on the synthetic "
        "world), custom.")
    seed: int = Field(0, ge=0, description="Master seed: data order, splits, sampling, initialisation.")
    protocol: Literal["corrected", "as_published"] = Field(
        "corrected", description="The paper's procedure as the authors' code ran it (as_published) or with our "
        "corrections (corrected): sets every protocol key the file leaves unset (cglib/config/protocol.py; the guide's "
        "page Paper fidelity, book/fidelity.md). Evaluation scores both either way.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Torch device; auto picks cuda when present.")
    output_dir: Path = Field(Path("outputs"), description="Parent folder of run directories (relative to the repo root).")
    cell_timeout_s: int = Field(3600, gt=0, description="Per-cell timeout for headless notebook runs (seconds).")
    cell_silence_s: int = Field(
        900, ge=0, description="Headless runs: a cell that sends no output (prints, bars, figures) for this long is "
        "reported as hung by notebook and cell and its kernel interrupted; 0 = off (seconds).")
    threads: int = Field(0, ge=0, description="Torch/faiss CPU threads; 0 = all cores.")


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
    generalize_level_prompt_version: str = Field("gl-v1", description="Version of the per-image, per-level LLM_gen "
                                                 "prompt (magic.generalize: level; cglib/llm/prompts/"
                                                 "generalize_level/; its temperature is the file's); part of the "
                                                 "cache key.")
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


class MagicParams(Section):
    l_max: int = Field(4, ge=1, le=8, description="Number of abstraction levels (l1..l_max).")
    size_min: int = Field(5, ge=1, description="Nodes with fewer images merge or are removed (Size_min).")
    sim_min: float = Field(0.9, ge=-1.0, le=1.0, description="Concept cosine needed to merge a small node (Sim_min).")
    hard_negative_sim: float | Literal["calibrated"] = Field(
        0.85, description="Cosine above which same-level nodes are hard negatives (-1..1), or calibrated: per level, "
        "the cosine above which about hard_negative_coverage of the nodes have one (their nearest neighbour lies "
        "above it), recorded in stats.json's settings.hard_negative_sim_by_level.")
    hard_negative_coverage: float = Field(
        0.9, gt=0.0, lt=1.0, description="hard_negative_sim: calibrated: the share of each level's nodes given a hard "
        "negative (0.9: nearly every node, as the paper's 0.85 gave an embedder whose cosines crowd near 1; the "
        "authors' epoch drops a concept without one).")
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
    generalize: Literal["image", "level", "group"] = Field(
        "image", description="LLM_gen granularity (a protocol key: run.protocol sets it when unset): image = one "
        "request per image (its captions, l1 concept and ancestors -> llm.generalized_captions_per_image captions; "
        "the paper's step list, our choice); level = one request per image and level l1..l_max, each given that "
        "level's concept alone, one caption back (the authors' generate_new_caption.py: as published); group = "
        "captions pooled per l1 node (Algorithm 1 as printed; the project's first version).")
    source: str = Field(
        "build", min_length=1, description="Where MAGIC comes from: build (notebooks 02-03 run the abstraction and "
        "Algorithm 1), or an export written by `cglib export-magic`: a local folder (relative to the repo root) or a "
        "Hugging Face dataset id owner/name (downloaded with huggingface_hub); notebooks 02-03 then check and show it "
        "instead of calling an LLM.")
    generalize_from: Literal["train", "all"] = Field(
        "train", description="Captions sent to LLM_gen: train (a node's training images; held-out concepts use all) "
        "or all (the paper's code: every image, test images included).")

    @field_validator("hard_negative_sim")
    @classmethod
    def _cosine_or_calibrated(cls, value: float | str) -> float | str:
        if isinstance(value, float) and not -1.0 <= value <= 1.0:
            raise ValueError(f"{value} is no cosine: use a value in [-1, 1], or calibrated")
        return value


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
