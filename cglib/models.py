"""CLIP models through open_clip: the paper's ViT-B/32, small configs for CPU, the demo's ViT + MiniLM text tower.

`model.source: hf` builds a Hugging Face transformers CLIP checkpoint instead, behind the same interface
(`cglib.hf_clip`: Hub id or local directory, plus an optional `model.hf_state_dict` such as HierarCaps' weights).

`build_model(params.model)` returns a `ClipModel`: the open_clip module, its tokenizer and image normalisation
(`cglib.encoding` feeds it images and texts and returns their embeddings).
The project's own configs are registered with open_clip at import:

    cglib-demo-vit   ViT 64 px, patch 8, width 192, 4 layers + MiniLM text tower (384-d): the demo model
    cglib-tiny-vit   ViT 32 px, patch 8, width 64, 2 layers + MiniLM text tower: fast tests
    cglib-tiny-clip  the same tiny ViT + a tiny open_clip text transformer (CLIP's own tokenizer): tests of the
                     code path the paper's ViT-B/32 takes, with no download

With `text_tower: minilm` the text side is the pretrained sentence encoder, mean-pooled with no projection, so
its embeddings equal sentence-transformers' all-MiniLM-L6-v2 exactly (and can be computed once when frozen).
`model.text_projection: identity` adds a 384x384 linear projection after it, initialised to the identity, so a
text phase can train the projection alone on the frozen tower (`train.text_trains: projection`, the demo).

Activation: OpenAI's CLIP weights were trained with QuickGELU, but open_clip's plain `ViT-B-32` config builds
nn.GELU (open_clip only warns). `resolve_activation` decides from open_clip's pretrained registry, before any
download: the tag's `quick_gelu` wins for a plain architecture, a `-quickgelu` architecture with a GELU tag (or an
architecture config that fixes GELU with a QuickGELU tag) is an error, and `model.force_activation` overrides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import open_clip
import torch

from cglib import hf_clip
from cglib.config import ModelParams
from cglib.embed import MINILM_DIM, minilm_path
from cglib.weights import load_weights

TINY_VISION = {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32}
DEMO_VISION = {"image_size": 64, "layers": 4, "width": 192, "patch_size": 8, "head_width": 64}
TINY_TEXT = {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}
CGLIB_CONFIGS = ("cglib-demo-vit", "cglib-tiny-vit", "cglib-tiny-clip")
QUICKGELU_SUFFIX = "-quickgelu"

Activation = Literal["gelu", "quick_gelu"]


@dataclass(frozen=True)
class ActivationChoice:
    """How `build_model` calls open_clip: which architecture, with or without QuickGELU, and why."""

    activation: Activation
    arch: str  # open_clip architecture to build (a `-quickgelu` name is built as its base + force_quick_gelu)
    source: str  # why: "model.force_activation", "pretrained tag 'openai'" or "architecture"

    @property
    def force_quick_gelu(self) -> bool:
        return self.activation == "quick_gelu"


def _tag_quick_gelu(arch: str, pretrained: str | None) -> bool | None:
    """The tag's `quick_gelu` from open_clip's registry (no download); None when not a known tag (a file, none)."""
    if not pretrained or os.path.isfile(pretrained):
        return None
    for name in (arch, arch.removesuffix(QUICKGELU_SUFFIX)):
        cfg = open_clip.get_pretrained_cfg(name, pretrained)
        if cfg:
            return bool(cfg.get("quick_gelu", False))
    return None


def resolve_activation(name: str, pretrained: str | None, force: Activation | None = None) -> ActivationChoice:
    """Decide the MLP activation of `name` + `pretrained` from open_clip's registries alone (before any download).

    A plain architecture (its config does not fix `quick_gelu`, like `ViT-B-32`) follows the tag: OpenAI's weights
    get QuickGELU. An architecture that fixes it (`ViT-B-32-quickgelu`) must agree with the tag, else ValueError
    naming both and the fix. `force` ("gelu" / "quick_gelu") overrides both, with a warning when it contradicts the
    tag. Unknown tags and local files follow the architecture.
    """
    if force not in (None, "gelu", "quick_gelu"):
        raise ValueError(f"model.force_activation must be null, 'gelu' or 'quick_gelu', got {force!r}")
    if name in CGLIB_CONFIGS:
        return ActivationChoice(force or "gelu", name, "model.force_activation" if force else "architecture")
    config = open_clip.get_model_config(name)
    if config is None:
        raise ValueError(f"model.name '{name}' is neither a cglib config {CGLIB_CONFIGS} nor an open_clip "
                         "architecture (see open_clip.list_models())")
    arch = name
    base = name.removesuffix(QUICKGELU_SUFFIX)
    base_config = open_clip.get_model_config(base) if base != name else None
    if base_config is not None and base_config == {k: v for k, v in config.items() if k != "quick_gelu"}:
        arch = base  # open_clip's X-quickgelu is X plus quick_gelu: build X, so any tag of X and either activation work
    declared = config.get("quick_gelu")  # None: the architecture leaves it to the weights
    tag = _tag_quick_gelu(name, pretrained)
    if force is not None:
        if tag is not None and tag != (force == "quick_gelu"):
            trained = "quick_gelu" if tag else "gelu"
            warnings.warn(f"model.force_activation: {force} overrides pretrained tag '{pretrained}', whose weights "
                          f"were trained with {trained}: features will differ from the published model's",
                          stacklevel=2)
        if force == "gelu" and declared and arch == name:
            raise ValueError(f"model.force_activation: gelu cannot apply to '{name}': its config fixes QuickGELU; "
                             "use an architecture without it")
        return ActivationChoice(force, arch, "model.force_activation")
    if tag is None:
        return ActivationChoice("quick_gelu" if declared else "gelu", arch, "architecture")
    trained: Activation = "quick_gelu" if tag else "gelu"
    if declared is not None and bool(declared) != tag:
        built = "quick_gelu" if declared else "gelu"
        fix = (f"model.name: {base}" if declared and base != name
               else "an architecture whose config does not fix quick_gelu")
        raise ValueError(f"model.name '{name}' builds {built} but pretrained tag '{pretrained}' was trained with "
                         f"{trained}; set {fix} (the activation then follows the tag), or model.force_activation: "
                         f"{built} to keep the mismatch on purpose")
    return ActivationChoice(trained, arch, f"pretrained tag '{pretrained}'")


def _minilm_text_cfg(projection: bool) -> dict:
    path = str(minilm_path())
    return {"hf_model_name": path, "hf_tokenizer_name": path, "hf_pooler_type": "mean_pooler",
            "hf_proj_type": "linear" if projection else None, "context_length": 64}


def _project_config(name: str, text_tower: str, embed_dim: int | None, text_projection: str = "none") -> dict:
    vision = dict(DEMO_VISION if name == "cglib-demo-vit" else TINY_VISION)
    if name == "cglib-tiny-clip" or text_tower == "open_clip":
        return {"embed_dim": embed_dim or 128, "vision_cfg": vision, "text_cfg": dict(TINY_TEXT)}
    # The joint space is MiniLM's own 384-d space, with or without the (square) projection.
    if embed_dim not in (None, MINILM_DIM):
        raise ValueError(f"model.embed_dim must be {MINILM_DIM} (or null) with text_tower: minilm, got {embed_dim}")
    return {"embed_dim": MINILM_DIM, "vision_cfg": vision,
            "text_cfg": _minilm_text_cfg(projection=text_projection == "identity")}


def _identity_text_projection(model: torch.nn.Module) -> None:
    """Start the MiniLM tower's linear projection at the identity: the tower's embeddings are unchanged until it
    trains (open_clip initialises it at random, which would scramble the pretrained sentence space)."""
    with torch.no_grad():
        model.text.proj.weight.copy_(torch.eye(model.text.proj.weight.shape[0]))


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
    text_tower: str  # "open_clip", "minilm" or "hf" (a transformers CLIP checkpoint's own tower)
    activation: Activation | str = "gelu"  # MLP activation of both towers (resolve_activation, or HF's hidden_act)
    activation_source: str = "architecture"  # why that activation (tag, architecture or model.force_activation)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def info(self) -> dict[str, Any]:
        """What a run summary records about the model: name, sizes, towers and the resolved activation."""
        return {"name": self.name, "image_size": self.image_size, "embed_dim": self.embed_dim,
                "text_tower": self.text_tower, "activation": self.activation,
                "activation_source": self.activation_source,
                "parameters": sum(p.numel() for p in self.model.parameters())}

    def text_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters of the text tower (token embedding, transformer, projection) - what `freeze_text` freezes."""
        m = self.model
        if hasattr(m, "text_model"):  # HFClipAdapter (transformers CLIP): text transformer + projection
            return [*m.text_model.parameters(), *m.text_projection.parameters()]
        if hasattr(m, "text"):  # CustomTextCLIP (HF text tower)
            return list(m.text.parameters())
        names = ("token_embedding", "transformer", "ln_final", "text_projection", "positional_embedding")
        return [p for n, p in m.named_parameters() if n.split(".")[0] in names]


    def text_projection(self) -> torch.nn.Linear:
        """The linear projection after the MiniLM tower (model.text_projection: identity)."""
        proj = getattr(getattr(self.model, "text", None), "proj", None)
        if not isinstance(proj, torch.nn.Linear):  # a params problem (no projection configured), not a type error
            raise ValueError(  # noqa: TRY004
                "this model's text tower has no separate projection to train alone; set "
                "model.text_tower: minilm and model.text_projection: identity, or train.text_trains: tower")
        return proj

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

    def forward(self, images: torch.Tensor | None = None, tokens: torch.Tensor | None = None, normalize: bool = True
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Image and text features, L2-normalised unless `normalize` is false (None for a side that is not given)."""
        image = self.model.encode_image(images, normalize=normalize) if images is not None else None
        text = self.model.encode_text(tokens, normalize=normalize) if tokens is not None else None
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


def build_hf_model(params: ModelParams, device: str | torch.device = "cpu") -> ClipModel:
    """`model.source: hf`: a transformers CLIP checkpoint (Hub id or directory) behind the open_clip interface.

    The weights of `model.name` (none with `pretrained_weights: false`: its config.json alone), then
    `model.hf_state_dict` on top, then `model.checkpoint` (a project weights file of the adapter).
    """
    clip = hf_clip.load_clip(params.name, weights=params.pretrained_weights)
    if params.hf_state_dict is not None:
        hf_clip.apply_state_dict(clip, params.hf_state_dict)
    config = clip.config
    size, mean, std = hf_clip.preprocessing(params.name, config)
    model = hf_clip.HFClipAdapter(clip).to(device)
    if params.checkpoint is not None:
        load_weights(model, params.checkpoint)
    bundle = ClipModel(model=model, tokenizer=hf_clip.load_tokenizer(params.name, config), name=params.name,
                       image_size=size, embed_dim=model.visual.output_dim, mean=mean, std=std, text_tower="hf",
                       activation=hf_clip.activation(config), activation_source=hf_clip.CONFIG_SOURCE)
    if params.freeze_text:
        bundle.set_text_trainable(False)
    return bundle


def build_model(params: ModelParams, device: str | torch.device = "cpu") -> ClipModel:
    """Create the model named in params (pretrained tag or random init), load a checkpoint, freeze the text tower."""
    if params.source == "hf":
        return build_hf_model(params, device)
    if params.name in CGLIB_CONFIGS:
        if params.pretrained:
            raise ValueError(f"model.pretrained must be null for the project config {params.name} "
                             "(it is trained from scratch); use an open_clip name such as ViT-B-32 for weights")
    else:
        if params.name not in open_clip.list_models():
            raise ValueError(f"model.name '{params.name}' is neither a cglib config {CGLIB_CONFIGS} nor an open_clip "
                             "architecture (see open_clip.list_models())")
        if params.text_tower == "minilm":
            raise ValueError(f"text_tower: minilm is only available with the cglib configs {CGLIB_CONFIGS}; "
                             f"set model.text_tower: open_clip for {params.name}")
    choice = resolve_activation(params.name, params.pretrained, params.force_activation)  # before any download
    if params.name in CGLIB_CONFIGS:
        arch = _register(params.name, _project_config(params.name, params.text_tower, params.embed_dim,
                                                      params.text_projection))
    else:
        arch = choice.arch
    kwargs: dict[str, Any] = {"force_quick_gelu": choice.force_quick_gelu}
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
    if params.text_projection == "identity":
        _identity_text_projection(model)
    if params.checkpoint is not None:
        load_weights(model, params.checkpoint)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg["size"][0] if isinstance(cfg["size"], (tuple, list)) else cfg["size"]
    # timm image towers (ConvNeXt, EVA02) have no `output_dim`: the architecture's config states the joint size.
    # The text tower is what the params asked for (CoCa's own transformer is also called `model.text`).
    embed_dim = getattr(model.visual, "output_dim", None) or open_clip.get_model_config(arch)["embed_dim"]
    bundle = ClipModel(model=model, tokenizer=open_clip.get_tokenizer(arch), name=params.name, image_size=int(size),
                       embed_dim=int(embed_dim), mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
                       text_tower=params.text_tower,
                       activation=choice.activation, activation_source=choice.source)
    if params.freeze_text:
        for p in bundle.text_parameters():
            p.requires_grad_(False)
    return bundle


def architecture_params(params: ModelParams) -> ModelParams:
    """The same architecture and activation with random init and no checkpoint: the shell to load saved weights into.

    Dropping `pretrained` alone would lose the tag's activation (OpenAI's weights need QuickGELU, which the plain
    `ViT-B-32` does not select) and its preprocessing, so the resolved activation is pinned in `force_activation`
    and a registry tag is kept with `pretrained_weights: false` (its config, never its weights). An HF checkpoint
    (`source: hf`) is rebuilt from its config.json alone, whose hidden_act fixes the activation.
    """
    if params.source == "hf":
        return params.model_copy(update={"pretrained_weights": False, "checkpoint": None, "hf_state_dict": None})
    choice = resolve_activation(params.name, params.pretrained, params.force_activation)
    registry_tag = (params.pretrained is not None and params.name not in CGLIB_CONFIGS
                    and bool(open_clip.get_pretrained_cfg(choice.arch, params.pretrained)))
    return params.model_copy(update={"pretrained": params.pretrained if registry_tag else None,
                                     "pretrained_weights": False, "checkpoint": None,
                                     "force_activation": choice.activation})
