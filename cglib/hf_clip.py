"""Hugging Face `transformers` CLIP checkpoints behind the interface the project calls on open_clip models.

`model.source: hf` with `model.name` a Hub id (`openai/clip-vit-base-patch32`, through `from_pretrained`) or a
local directory saved by `CLIPModel.save_pretrained` (config.json, weights, tokenizer files and, for the input
size and normalisation, preprocessor_config.json). `model.hf_state_dict` loads a CLIPModel state dict on top (the
released HierarCaps weights are such state dicts over `openai/clip-vit-base-patch32`).

`HFClipAdapter` wraps `transformers.CLIPModel`: `encode_image` / `encode_text` (optionally L2-normalised) equal
`get_image_features` / `get_text_features`; `visual` holds the vision transformer and its projection, so state-dict
keys of the image tower start with `visual.` as open_clip's do (what `text_keys` and the embedding fingerprints
rely on); the text tower is `text_model` + `text_projection`. The text tower is causal and pools at the first EOS,
so padding after it never changes a text's feature: texts are padded to the full context, as open_clip's are.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIPImageProcessor's defaults (OpenAI's normalisation)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
CONFIG_SOURCE = "checkpoint config hidden_act"


class HFVisual(torch.nn.Module):
    """The image tower: CLIP's vision transformer and its projection; `forward` gives unnormalised features."""

    def __init__(self, vision_model: torch.nn.Module, visual_projection: torch.nn.Linear) -> None:
        super().__init__()
        self.vision_model = vision_model
        self.visual_projection = visual_projection
        cfg = vision_model.config
        self.output_dim = int(visual_projection.out_features)
        self.image_size = int(cfg.image_size)
        self.patch_size = int(cfg.patch_size)
        self.grid_size = (self.image_size // self.patch_size, self.image_size // self.patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.visual_projection(self.vision_model(pixel_values=images).pooler_output)


class HFClipAdapter(torch.nn.Module):
    """`transformers.CLIPModel` with open_clip's `encode_image`, `encode_text`, `visual` and `logit_scale`.

    The submodules are the CLIPModel's own (shared, not copied), so `hf_model` stays in step with training.
    """

    def __init__(self, clip: torch.nn.Module) -> None:
        super().__init__()
        self.visual = HFVisual(clip.vision_model, clip.visual_projection)
        self.text_model = clip.text_model
        self.text_projection = clip.text_projection
        self.logit_scale = clip.logit_scale
        object.__setattr__(self, "_hf_model", clip)  # not a registered child: its parameters are ours already

    @property
    def hf_model(self) -> torch.nn.Module:
        """The wrapped `transformers.CLIPModel` (same parameters)."""
        return self._hf_model

    @property
    def config(self) -> Any:
        return self._hf_model.config

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        features = self.visual(images)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        features = self.text_projection(self.text_model(input_ids=tokens).pooler_output)
        return F.normalize(features, dim=-1) if normalize else features

    def forward(self, images: torch.Tensor | None = None, tokens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """Normalised image and text features and exp(logit_scale), as open_clip's CLIP returns them."""
        image = self.encode_image(images, normalize=True) if images is not None else None
        text = self.encode_text(tokens, normalize=True) if tokens is not None else None
        return image, text, self.logit_scale.exp()


class HFTokenizer:
    """A CLIP tokenizer as open_clip's: list of strings -> LongTensor (n, context_length), padded and truncated."""

    def __init__(self, tokenizer: Any, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = int(context_length)
        self.pad_token_id = tokenizer.pad_token_id

    def __call__(self, texts: str | list[str]) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return torch.zeros((0, self.context_length), dtype=torch.long)
        out = self.tokenizer(texts, padding="max_length", truncation=True, max_length=self.context_length,
                             return_tensors="pt")
        return out["input_ids"].long()


def check_hf_name(name: str) -> None:
    """A local `model.name` must be a CLIP checkpoint directory; anything else that looks like a path is an error."""
    path = Path(name).expanduser()
    fix = ("save one with transformers' CLIPModel.save_pretrained(DIR) (plus the tokenizer and image processor), "
           "or give a Hub id such as openai/clip-vit-base-patch32")
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model.name '{name}' is a file; with model.source: hf it must be a CLIP checkpoint "
                             f"directory (a state dict goes in model.hf_state_dict); {fix}")
        config = path / "config.json"
        if not config.is_file():
            raise ValueError(f"model.name '{name}' has no config.json, so it is not a Hugging Face checkpoint "
                             f"directory; {fix}")
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        if model_type != "clip":
            raise ValueError(f"model.name '{name}': config.json has model_type {model_type!r}, not 'clip'; "
                             f"model.source: hf loads transformers CLIPModel checkpoints; {fix}")
        return
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or os.path.isabs(name)
    if looks_local:
        raise ValueError(f"model.name '{name}': no such directory; fix the path to a local CLIP checkpoint "
                         "directory, or give a Hub id (owner/name)")


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_clip(name: str, weights: bool = True) -> torch.nn.Module:
    """transformers.CLIPModel from a Hub id or directory (float32); `weights=False`: its config.json alone."""
    import transformers

    check_hf_name(name)
    _quiet()
    try:
        if weights:
            return transformers.CLIPModel.from_pretrained(name, dtype=torch.float32)
        return transformers.CLIPModel(transformers.CLIPConfig.from_pretrained(name))
    except OSError as exc:
        raise ValueError(f"model.name '{name}' could not be loaded as a Hugging Face CLIP checkpoint "
                         f"({str(exc).splitlines()[0]}); check the Hub id, the network (HF_HUB_OFFLINE) or the "
                         "local directory") from None


def read_state_dict(path: str | Path, key: str = "model.hf_state_dict") -> dict[str, torch.Tensor]:
    """A state dict from safetensors or a torch file (weights_only), unwrapped and without DDP's `module.`;
    `key` names the params key in error messages."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{key} not found: {path}; fix the path")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{key} {path} is not a state dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in state.items()}


def open_clip_text_state(state: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """The text tower and projection of a transformers CLIPModel state dict as open_clip CLIP state-dict entries.

    Both libraries implement OpenAI's text transformer; they differ in names and in two layouts: open_clip keeps
    q, k and v in one `in_proj` matrix (rows q, then k, then v, as nn.MultiheadAttention) and applies its text
    projection as `x @ text_projection` (the transpose of transformers' nn.Linear weight).
    """
    hf = "text_model."
    fixed = {"token_embedding.weight": f"{hf}embeddings.token_embedding.weight",
             "positional_embedding": f"{hf}embeddings.position_embedding.weight",
             "ln_final.weight": f"{hf}final_layer_norm.weight", "ln_final.bias": f"{hf}final_layer_norm.bias"}
    per_layer = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
                 "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    layers = sorted({int(k.split(".")[3]) for k in state if k.startswith(f"{hf}encoder.layers.")})
    needed = [*fixed.values(), "text_projection.weight"]
    for i in layers:
        layer = f"{hf}encoder.layers.{i}."
        needed += [f"{layer}{name}.{p}" for name in (*per_layer.values(), "self_attn.q_proj", "self_attn.k_proj",
                                                     "self_attn.v_proj") for p in ("weight", "bias")]
    missing = [k for k in needed if k not in state]
    if not layers or missing:
        raise ValueError(f"{source} is not a transformers CLIPModel state dict with a text tower: missing "
                         f"{(missing or ['text_model.encoder.layers.*'])[:3]}")
    out = {ours: state[theirs] for ours, theirs in fixed.items()}
    out["text_projection"] = state["text_projection.weight"].T.contiguous()
    for i in layers:
        layer, block = f"{hf}encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for ours, theirs in per_layer.items():
            for p in ("weight", "bias"):
                out[f"{block}{ours}.{p}"] = state[f"{layer}{theirs}.{p}"]
        for p in ("weight", "bias"):
            out[f"{block}attn.in_proj_{p}"] = torch.cat([state[f"{layer}self_attn.{q}_proj.{p}"] for q in "qkv"])
    return out


def apply_state_dict(clip: torch.nn.Module, path: str | Path) -> list[str]:
    """Load a CLIPModel state dict on top of `clip`; every key must be the model's with the model's shape.

    Keys the file lacks keep the checkpoint's values (a state dict of the text tower alone applies as such); the
    constant `position_ids` buffers older transformers versions saved are skipped. Returns the keys loaded.
    """
    state = read_state_dict(path)
    own = clip.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.endswith("embeddings.position_ids")}
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ValueError(f"model.hf_state_dict {path}: {len(unknown)} keys are not transformers CLIPModel keys of "
                         f"model.name, e.g. {unknown[:3]}; expected keys such as {sorted(own)[:2]} (a state dict "
                         "of transformers.CLIPModel for the same architecture)")
    wrong = [f"{k}: file {tuple(v.shape)}, model {tuple(own[k].shape)}" for k, v in sorted(state.items())
             if tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise ValueError(f"model.hf_state_dict {path} does not fit model.name's architecture ({len(wrong)} shapes "
                         f"differ, e.g. {wrong[:2]}); use the base checkpoint these weights were trained from")
    clip.load_state_dict(state, strict=False)
    skipped = len(own) - len(state)
    if skipped:
        logger.info("model.hf_state_dict %s: %d of %d keys loaded; the others keep model.name's values", path,
                    len(state), len(own))
    return sorted(state)


def preprocessing(name: str, clip_config: Any) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """(input size, mean, std) from the checkpoint's preprocessor_config.json; without one the vision config's
    image_size and OpenAI's normalisation (CLIPImageProcessor's defaults), with a warning."""
    from transformers.image_processing_base import ImageProcessingMixin

    try:
        cfg, _ = ImageProcessingMixin.get_image_processor_dict(name)
    except OSError:
        logger.warning("model.name %s has no preprocessor_config.json: using image_size %d and OpenAI's "
                       "mean/std (CLIPImageProcessor's defaults)", name, clip_config.vision_config.image_size)
        cfg = {}
    size = None
    crop = cfg.get("crop_size")
    if cfg.get("do_center_crop", True) and crop:
        size = crop.get("height", crop.get("shortest_edge")) if isinstance(crop, dict) else crop
    if size is None and cfg.get("size"):
        s = cfg["size"]
        size = s.get("shortest_edge", s.get("height")) if isinstance(s, dict) else s
    size = int(size or clip_config.vision_config.image_size)
    if size != clip_config.vision_config.image_size:
        raise ValueError(f"model.name {name}: the image processor crops to {size} px but the vision tower takes "
                         f"{clip_config.vision_config.image_size} px; fix preprocessor_config.json")
    return size, tuple(cfg.get("image_mean", OPENAI_MEAN)), tuple(cfg.get("image_std", OPENAI_STD))


def activation(clip_config: Any) -> str:
    """The towers' MLP activation from the config's hidden_act (quick_gelu for OpenAI's weights)."""
    vision, text = clip_config.vision_config.hidden_act, clip_config.text_config.hidden_act
    return vision if vision == text else f"vision {vision}, text {text}"


def load_tokenizer(name: str, clip_config: Any) -> HFTokenizer:
    """The checkpoint's tokenizer, padded and truncated to the text tower's context length."""
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.name {name}: no tokenizer could be loaded ({str(exc).splitlines()[0]}); save the "
                         "CLIP tokenizer next to the model (CLIPTokenizer.save_pretrained(DIR))") from None
    context = clip_config.text_config.max_position_embeddings
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < context:
        context = limit
    return HFTokenizer(tokenizer, context)


def image_size(name: str) -> int:
    """The input size of an HF checkpoint without loading its weights (the training image cache's size)."""
    import transformers

    check_hf_name(name)
    _quiet()
    return preprocessing(name, transformers.CLIPConfig.from_pretrained(name))[0]
