"""CLIP models through open_clip: the paper's ViT-B/32, small configs for CPU, the demo's ViT + MiniLM text tower.

`build_model(params.model)` returns a `ClipModel`: the open_clip module, its tokenizer and image normalisation.
The project's own configs are registered with open_clip at import:

    cglib-demo-vit   ViT 64 px, patch 8, width 192, 4 layers + MiniLM text tower (384-d): the demo model
    cglib-tiny-vit   ViT 32 px, patch 8, width 64, 2 layers + MiniLM text tower: fast tests
    cglib-tiny-clip  the same tiny ViT + a tiny open_clip text transformer (CLIP's own tokenizer): tests of the
                     code path the paper's ViT-B/32 takes, with no download

With `text_tower: minilm` the text side is the pretrained sentence encoder, mean-pooled with no projection, so
its embeddings equal sentence-transformers' all-MiniLM-L6-v2 exactly (and can be computed once when frozen).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image

from cglib.config import ModelParams
from cglib.embed import MINILM_DIM, minilm_path

TINY_VISION = {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32}
DEMO_VISION = {"image_size": 64, "layers": 4, "width": 192, "patch_size": 8, "head_width": 64}
TINY_TEXT = {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}
CGLIB_CONFIGS = ("cglib-demo-vit", "cglib-tiny-vit", "cglib-tiny-clip")


def _minilm_text_cfg() -> dict:
    path = str(minilm_path())
    return {"hf_model_name": path, "hf_tokenizer_name": path, "hf_pooler_type": "mean_pooler",
            "hf_proj_type": None, "context_length": 64}


def _project_config(name: str, text_tower: str, embed_dim: int | None) -> dict:
    vision = dict(DEMO_VISION if name == "cglib-demo-vit" else TINY_VISION)
    if name == "cglib-tiny-clip" or text_tower == "open_clip":
        return {"embed_dim": embed_dim or 128, "vision_cfg": vision, "text_cfg": dict(TINY_TEXT)}
    # The MiniLM tower has no projection, so the joint space is its own 384-d space.
    if embed_dim not in (None, MINILM_DIM):
        raise ValueError(f"model.embed_dim must be {MINILM_DIM} (or null) with text_tower: minilm, got {embed_dim}")
    return {"embed_dim": MINILM_DIM, "vision_cfg": vision, "text_cfg": _minilm_text_cfg()}


def _register(name: str, config: dict) -> str:
    """Register a config with open_clip under a unique name (open_clip reads configs from JSON files)."""
    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
    key = f"{name}--{digest}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{key}.json"
        path.write_text(json.dumps(config))
        open_clip.add_model_config(path)
    return key


def _quiet_transformers() -> None:
    """The MiniLM checkpoint carries an unused BERT pooler: its load report and progress bar are noise."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@dataclass
class ClipModel:
    """An open_clip model with what is needed to feed it: tokenizer and image normalisation."""

    model: torch.nn.Module
    tokenizer: Callable[[list[str]], torch.Tensor]
    name: str
    image_size: int
    embed_dim: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    text_tower: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def text_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters of the text tower (token embedding, transformer, projection) - what `freeze_text` freezes."""
        m = self.model
        if hasattr(m, "text"):  # CustomTextCLIP (HF text tower)
            return list(m.text.parameters())
        names = ("token_embedding", "transformer", "ln_final", "text_projection", "positional_embedding")
        return [p for n, p in m.named_parameters() if n.split(".")[0] in names]


    def set_text_trainable(self, trainable: bool) -> None:
        """Freeze (False) or unfreeze (True) the text tower."""
        for p in self.text_parameters():
            p.requires_grad_(trainable)

    def freeze_logit_scale(self) -> None:
        """Freeze logit_scale (and logit_bias): the project's losses use a fixed tau and never read them.

        Under DDP every trainable parameter must receive a gradient (open_clip #1076), so an unused learnable
        temperature has to be frozen; retrieval ranks by cosine, which the scale does not change.
        """
        for name in ("logit_scale", "logit_bias"):
            param = getattr(self.model, name, None)
            if isinstance(param, torch.nn.Parameter):
                param.requires_grad_(False)


class Towers(torch.nn.Module):
    """Both encoders behind one `forward`, so DDP sees every call (it only synchronises through forward)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor | None = None, tokens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """L2-normalised image and text features (None for a side that is not given)."""
        image = self.model.encode_image(images, normalize=True) if images is not None else None
        text = self.model.encode_text(tokens, normalize=True) if tokens is not None else None
        return image, text


class _DropExpectedWarnings(logging.Filter):
    """open_clip warns that a cglib config is 'initialized partially' or randomly: that is the design here."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("initialized partially" in msg or "Model initialized randomly" in msg)


def tag_without_weights(params: ModelParams, arch: str) -> dict[str, Any]:
    """create_model arguments for `pretrained_weights: false` and `arch_overrides` (empty when neither is set).

    open_clip downloads a tag's weights whenever `pretrained` names it, even with load_weights=False, so the tag
    is resolved here (it must exist for the architecture) and only its preprocessing is passed on; the tag's
    activation is chosen from `params.pretrained` by build_model as for a weighted model. `arch_overrides` are
    merged into the architecture's own vision_cfg / text_cfg (open_clip replaces these dicts wholesale).
    """
    kwargs: dict[str, Any] = {}
    if params.pretrained and not params.pretrained_weights:
        tag_cfg = open_clip.get_pretrained_cfg(arch, params.pretrained)
        if not tag_cfg:
            raise ValueError(f"model.pretrained '{params.pretrained}' is not a tag of {arch}; available: "
                             f"{open_clip.list_pretrained_tags_by_model(arch)}")
        kwargs["pretrained"] = None
        kwargs["force_preprocess_cfg"] = {k: tag_cfg[k] for k in ("mean", "std", "interpolation", "resize_mode")
                                          if k in tag_cfg}
    if params.arch_overrides:
        if params.name in CGLIB_CONFIGS:
            raise ValueError(f"model.arch_overrides apply to open_clip architectures, not the project config "
                             f"{params.name}; use an open_clip name such as ViT-B-32")
        base = open_clip.get_model_config(arch)
        fields = {"vision_cfg": open_clip.model.CLIPVisionCfg, "text_cfg": open_clip.model.CLIPTextCfg}
        for section, values in params.arch_overrides.items():
            valid = {f.name for f in dataclasses.fields(fields[section])}
            unknown = sorted(set(values) - valid)
            if unknown:
                raise ValueError(f"model.arch_overrides.{section}: unknown keys {unknown}; valid: {sorted(valid)}")
            kwargs[section] = {**base[section], **values}
        if params.image_size is not None:  # the replaced vision_cfg must keep force_image_size's effect
            kwargs.setdefault("vision_cfg", dict(base["vision_cfg"]))["image_size"] = params.image_size
    return kwargs


def build_model(params: ModelParams, device: str | torch.device = "cpu") -> ClipModel:
    """Create the model named in params (pretrained tag or random init), load a checkpoint, freeze the text tower."""
    if params.name in CGLIB_CONFIGS:
        if params.pretrained:
            raise ValueError(f"model.pretrained must be null for the project config {params.name} "
                             "(it is trained from scratch); use an open_clip name such as ViT-B-32 for weights")
        arch = _register(params.name, _project_config(params.name, params.text_tower, params.embed_dim))
    else:
        if params.name not in open_clip.list_models():
            raise ValueError(f"model.name '{params.name}' is neither a cglib config {CGLIB_CONFIGS} nor an open_clip "
                             "architecture (see open_clip.list_models())")
        if params.text_tower == "minilm":
            raise ValueError(f"text_tower: minilm is only available with the cglib configs {CGLIB_CONFIGS}; "
                             f"set model.text_tower: open_clip for {params.name}")
        arch = params.name
    kwargs = {}
    if params.image_size is not None:
        kwargs["force_image_size"] = params.image_size
    kwargs.update(tag_without_weights(params, arch))
    _quiet_transformers()
    quiet = _DropExpectedWarnings()
    if params.name in CGLIB_CONFIGS:
        logging.getLogger().addFilter(quiet)
    try:
        model = open_clip.create_model(arch, pretrained=kwargs.pop("pretrained", params.pretrained), device=device,
                                       **kwargs)
    finally:
        logging.getLogger().removeFilter(quiet)
    if params.checkpoint is not None:
        load_weights(model, params.checkpoint)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg["size"][0] if isinstance(cfg["size"], (tuple, list)) else cfg["size"]
    bundle = ClipModel(model=model, tokenizer=open_clip.get_tokenizer(arch), name=params.name, image_size=int(size),
                       embed_dim=int(model.visual.output_dim), mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
                       text_tower="minilm" if hasattr(model, "text") else "open_clip")
    if params.freeze_text:
        for p in bundle.text_parameters():
            p.requires_grad_(False)
    return bundle


def save_weights(model: torch.nn.Module, path: str | Path) -> Path:
    """Save a state dict as safetensors (tied or shared tensors are cloned so the file loads anywhere)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(path))
    return path


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load safetensors or a torch state dict (weights_only=True); mismatched keys are an error naming them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state
        state = {k.removeprefix("module."): v for k, v in state.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even with strict=False
        raise ValueError(f"checkpoint {path} does not fit the model ({str(exc).splitlines()[-1].strip()}); "
                         "check model.name matches the checkpoint's architecture") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}; check model.name matches the checkpoint's architecture")


def pixels_to_tensor(pixels: np.ndarray | torch.Tensor, bundle: ClipModel) -> torch.Tensor:
    """uint8 (n, H, W, 3) images -> normalised float (n, 3, S, S) at the model's input size, on the input's device."""
    x = torch.as_tensor(pixels)
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected uint8 images of shape (n, H, W, 3), got {x.dtype} {tuple(x.shape)}")
    x = x.permute(0, 3, 1, 2).float().div_(255.0)
    if x.shape[-1] != bundle.image_size or x.shape[-2] != bundle.image_size:
        x = F.interpolate(x, size=(bundle.image_size, bundle.image_size), mode="bicubic", align_corners=False,
                          antialias=True).clamp_(0, 1)
    mean = torch.tensor(bundle.mean, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(bundle.std, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def images_to_pixels(images: Sequence[Image.Image], size: int) -> np.ndarray:
    """PIL images -> uint8 (n, size, size, 3): resize the short side to `size`, centre crop (CLIP's eval transform)."""
    out = np.empty((len(images), size, size, 3), dtype=np.uint8)
    for i, img in enumerate(images):
        img = img.convert("RGB")
        w, h = img.size
        scale = size / min(w, h)
        img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
        left, top = (img.size[0] - size) // 2, (img.size[1] - size) // 2
        out[i] = np.asarray(img.crop((left, top, left + size, top + size)))
    return out


@torch.no_grad()
def encode_images(bundle: ClipModel, pixels: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """L2-normalised image embeddings (float32, (n, D)) of uint8 (n, H, W, 3) images, in eval mode."""
    was_training = bundle.model.training
    bundle.model.eval()
    chunks = []
    for start in range(0, len(pixels), batch_size):
        x = pixels_to_tensor(pixels[start:start + batch_size], bundle).to(bundle.device)
        chunks.append(bundle.model.encode_image(x, normalize=True).float().cpu())
    bundle.model.train(was_training)
    return torch.cat(chunks).numpy() if chunks else np.zeros((0, bundle.embed_dim), np.float32)


@torch.no_grad()
def encode_texts(bundle: ClipModel, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """L2-normalised text embeddings (float32, (n, D)), in eval mode.

    Hugging Face towers (the MiniLM) mask padding, and open_clip's HF tokenizer pads every text to the context
    length: texts are batched by length and columns that are padding in the whole batch are dropped (about 4x
    fewer tokens for captions; equal up to float rounding). CLIP's own tower has a fixed positional table and
    takes the full context.
    """
    pad = getattr(getattr(getattr(bundle.model, "text", None), "config", None), "pad_token_id", None)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if pad is not None else range(len(texts))
    order = list(order)
    out = np.empty((len(texts), bundle.embed_dim), dtype=np.float32)
    was_training = bundle.model.training
    bundle.model.eval()
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        tokens = bundle.tokenizer([texts[i] for i in rows])
        if pad is not None:
            tokens = tokens[:, :int((tokens != pad).any(dim=0).nonzero().max()) + 1]
        out[rows] = bundle.model.encode_text(tokens.to(bundle.device), normalize=True).float().cpu().numpy()
    bundle.model.train(was_training)
    return out
