"""Attention maps of ViT image towers (open_clip, or transformers CLIP with `model.source: hf`): class-token
attention, rollout, text-conditioned patch maps.

open_clip's `ResidualAttentionBlock` calls `nn.MultiheadAttention(..., need_weights=False)`, so the weights are
never materialised. We recompute them: a forward hook on each block's `ln_1` sees the normalised tokens the
attention reads; `softmax(q k^T / sqrt(d_head))` per head follows from the block's `in_proj_weight`. Hooks only
read, so the model's outputs are bit-identical with and without extraction (tested with `torch.equal`).

- Class-token attention: row 0 of each layer's per-head matrix, over the patch tokens.
- Attention rollout (Abnar & Zuidema 2020): average heads, add the identity (the residual path), renormalise
  rows, multiply across layers (`R = A'_L ... A'_1`); rows stay on the simplex.
- Text-conditioned map: every final patch token goes through `ln_post` and `proj` exactly as the class token
  does, and its cosine with a caption or concept embedding is drawn over the image.

A transformers CLIP vision tower (`cglib.hf_clip.HFVisual`) is read the same way: a hook on each encoder layer's
`layer_norm1` and `softmax(q k^T * scale)` from its `self_attn.q_proj` / `k_proj` (equal to what transformers
returns with eager attention and `output_attentions=True`, whatever attention implementation runs); patch tokens
go through `post_layernorm` and `visual_projection` as the pooled class token does.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer

from cglib.encoding import encode_texts, pixels_to_tensor
from cglib.figure_data import replottable
from cglib.hf_clip import HFVisual
from cglib.magic.schema import MagicFile
from cglib.models import ClipModel

MAP_CMAP = "viridis"  # perceptually uniform and colour-blind safe


@dataclass
class AttentionMaps:
    """What one ViT forward pass reveals about a batch of images."""

    attentions: torch.Tensor  # (layers, n, heads, tokens, tokens); token 0 is the class token; rows sum to one
    patch_embeddings: torch.Tensor  # (n, patches, D): final patch tokens through ln_post and proj (not normalised)
    image_embeddings: torch.Tensor  # (n, D): the tower's own output (not normalised)
    class_embeddings: torch.Tensor  # (n, D): the final class token through ln_post and proj, as the patches are
    grid: tuple[int, int]  # patch grid (rows, cols)

    @property
    def n_layers(self) -> int:
        return self.attentions.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attentions.shape[2]

    def cls_attention(self) -> torch.Tensor:
        """Class-token attention over patches per layer and head, as maps: (layers, n, heads, rows, cols)."""
        a = self.attentions[..., 0, 1:]
        return a.reshape(*a.shape[:-1], *self.grid)

    def rollout(self) -> torch.Tensor:
        """Class-token row of the attention rollout over patches, as maps: (n, rows, cols)."""
        r = attention_rollout(self.attentions)[:, 0, 1:]
        return r.reshape(r.shape[0], *self.grid)

    def text_maps(self, text_embeddings: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Cosine of every patch with one text embedding per image ((n, D) or (D,)): (n, rows, cols)."""
        t = torch.as_tensor(np.asarray(text_embeddings), dtype=self.patch_embeddings.dtype)
        t = t.expand(self.patch_embeddings.shape[0], -1) if t.ndim == 1 else t
        if t.shape != (self.patch_embeddings.shape[0], self.patch_embeddings.shape[-1]):
            raise ValueError(f"text embeddings of shape {tuple(t.shape)} do not fit {self.patch_embeddings.shape[0]} "
                             f"images of dimension {self.patch_embeddings.shape[-1]}; pass (n, D) or (D,)")
        cos = torch.einsum("npd,nd->np", F.normalize(self.patch_embeddings, dim=-1), F.normalize(t, dim=-1))
        return cos.reshape(cos.shape[0], *self.grid)


def vision_transformer(bundle: ClipModel) -> VisionTransformer | HFVisual:
    """The model's ViT image tower (open_clip's, or a transformers CLIP one); a clear error for towers whose
    attention we cannot read."""
    visual = bundle.model.visual
    if isinstance(visual, HFVisual):
        return visual
    if not isinstance(visual, VisionTransformer):
        raise TypeError(f"attention maps need an open_clip VisionTransformer image tower; {bundle.name} has "
                         f"{type(visual).__name__} (use a ViT architecture such as ViT-B-32 or cglib-demo-vit)")
    if visual.attn_pool is not None:
        raise ValueError(f"{bundle.name} pools with an attentional pooler (CoCa-style), so the class token is not "
                         "its embedding and patch projections are not comparable; use a plain ViT")
    for i, block in enumerate(visual.transformer.resblocks):
        if not isinstance(block, ResidualAttentionBlock) or not block.attn._qkv_same_embed_dim:
            raise ValueError(f"block {i} of {bundle.name} is {type(block).__name__}; attention extraction supports "
                             "open_clip's default ResidualAttentionBlock (no qk-norm or scaled-cosine attention)")
    return visual


def head_attention(mha: torch.nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """Per-head self-attention weights of `mha` on batch-first input x (n, L, D): (n, heads, L, L)."""
    d, h = mha.embed_dim, mha.num_heads
    hd = d // h
    w, b = mha.in_proj_weight, mha.in_proj_bias
    q = F.linear(x, w[:d], None if b is None else b[:d])
    k = F.linear(x, w[d:2 * d], None if b is None else b[d:2 * d])
    n, length = x.shape[:2]
    q = q.view(n, length, h, hd).transpose(1, 2)
    k = k.view(n, length, h, hd).transpose(1, 2)
    return torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(hd), dim=-1)


def attention_rollout(attentions: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema rollout of (layers, n, heads, L, L) attention: heads averaged, identity added, rows
    renormalised, layers multiplied first to last; returns (n, L, L) with rows summing to one."""
    a = attentions.mean(dim=2)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    a = a + eye
    a = a / a.sum(dim=-1, keepdim=True)
    rollout = eye.expand_as(a[0]).clone()
    for layer in a:
        rollout = layer @ rollout
    return rollout


def hf_head_attention(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Per-head attention weights of a transformers CLIPAttention on its input x (n, L, D): (n, heads, L, L)."""
    n, length = x.shape[:2]
    h, hd = attn.num_heads, attn.head_dim
    q = attn.q_proj(x).view(n, length, h, hd).transpose(1, 2)
    k = attn.k_proj(x).view(n, length, h, hd).transpose(1, 2)
    return torch.softmax((q @ k.transpose(-1, -2)) * attn.scale, dim=-1)


class _HFRecorder:
    """Hooks on a transformers CLIP vision tower: each layer's layer_norm1 output and the final tokens."""

    def __init__(self, visual: HFVisual) -> None:
        self.visual = visual
        self.layers: list[torch.Tensor] = []
        self.final: torch.Tensor | None = None

    def _hook(self, attn: torch.nn.Module):
        def hook(_module, _inputs, out):
            self.layers.append(hf_head_attention(attn, out).float().cpu())
        return hook

    def run(self, x: torch.Tensor) -> torch.Tensor:
        vm = self.visual.vision_model
        handles = [layer.layer_norm1.register_forward_hook(self._hook(layer.self_attn))
                   for layer in vm.encoder.layers]
        try:
            result = vm(pixel_values=x)
        finally:
            for handle in handles:
                handle.remove()
        self.final = result.last_hidden_state
        return self.visual.visual_projection(result.pooler_output)

    def projected_tokens(self) -> torch.Tensor:
        """Every final token through post_layernorm and the projection, as the pooled class token goes."""
        return self.visual.visual_projection(self.visual.vision_model.post_layernorm(self.final))


class _Recorder:
    """Forward hooks that read (never modify) each block's ln_1 output and the transformer's final tokens."""

    def __init__(self, visual: VisionTransformer) -> None:
        self.visual = visual
        self.batch_first = getattr(visual.transformer, "batch_first", True)
        self.layers: list[torch.Tensor] = []
        self.final: torch.Tensor | None = None
        self.handles: list = []

    def _ln1_hook(self, mha: torch.nn.MultiheadAttention):
        def hook(_module, _inputs, out):  # ln_1's output is exactly what the block's attention reads
            tokens = out if self.batch_first else out.transpose(0, 1)
            self.layers.append(head_attention(mha, tokens).float().cpu())
        return hook

    def _final_hook(self, _module, _inputs, out) -> None:
        self.final = out  # open_clip's Transformer returns batch-first tokens whatever its internal layout

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The tower's output on x, recording on the way; hooks are removed whatever happens."""
        for block in self.visual.transformer.resblocks:
            self.handles.append(block.ln_1.register_forward_hook(self._ln1_hook(block.attn)))
        self.handles.append(self.visual.transformer.register_forward_hook(self._final_hook))
        try:
            out = self.visual(x)
        finally:
            for handle in self.handles:
                handle.remove()
        return out[0] if isinstance(out, tuple) else out

    def projected_tokens(self) -> torch.Tensor:
        """Every final token through ln_post and proj, as the class token goes."""
        tokens = self.visual.ln_post(self.final)
        return tokens @ self.visual.proj if self.visual.proj is not None else tokens


@torch.no_grad()
def extract_attention(bundle: ClipModel, pixels: np.ndarray | torch.Tensor, batch_size: int = 64) -> AttentionMaps:
    """Run the image tower (eval mode) on uint8 (n, H, W, 3) images (or an already normalised (n, 3, S, S)
    tensor) and read its attention through hooks that leave every output unchanged."""
    visual = vision_transformer(bundle)
    x_all = pixels if isinstance(pixels, torch.Tensor) and pixels.dtype != torch.uint8 else pixels_to_tensor(
        np.asarray(pixels), bundle)
    was_training = bundle.model.training
    bundle.model.eval()  # also disables patch dropout, which would otherwise drop tokens at random
    attn, patch, cls, outs = [], [], [], []
    try:
        for start in range(0, len(x_all), batch_size):
            rec = _HFRecorder(visual) if isinstance(visual, HFVisual) else _Recorder(visual)
            out = rec.run(x_all[start:start + batch_size].to(bundle.device))
            tokens = rec.projected_tokens()
            attn.append(torch.stack(rec.layers))
            patch.append(tokens[:, 1:].float().cpu())
            cls.append(tokens[:, 0].float().cpu())
            outs.append(out.float().cpu())
    finally:
        bundle.model.train(was_training)
    grid = tuple(int(g) for g in visual.grid_size)
    return AttentionMaps(attentions=torch.cat(attn, dim=1), patch_embeddings=torch.cat(patch),
                         image_embeddings=torch.cat(outs), class_embeddings=torch.cat(cls), grid=grid)


# ------------------------------------------------------------------------------------------ choosing
def choose_attention_images(magic: MagicFile, n: int, split: str = "test") -> list[str]:
    """`n` images of `split` from l1 groups spread evenly over the sorted group list (first image of each)."""
    groups = magic.groups(split)
    if n <= 0 or not groups:
        return []
    picks = np.linspace(0, len(groups) - 1, num=min(n, len(groups))).round().astype(int)
    return [magic.images_of(groups[i], split)[0] for i in dict.fromkeys(picks.tolist())]


# ----------------------------------------------------------------------------------------- drawing
def overlay(ax: plt.Axes, image: np.ndarray, heat: np.ndarray | torch.Tensor, alpha: float = 0.55,
            title: str | None = None, limits: tuple[float, float] | None = None):
    """Draw a patch-grid heat map over an image, smoothly upsampled to the image's extent: min-max scaled on its
    own, or on the shared `limits` (vmin, vmax) of the panels it is compared with; return the heat map's image."""
    heat = np.asarray(heat, dtype=np.float32)
    if limits is None:
        span = float(heat.max() - heat.min())
        heat = (heat - heat.min()) / span if span > 0 else np.zeros_like(heat)
        limits = (0.0, 1.0)
    h, w = image.shape[:2]
    ax.imshow(image, extent=(0, w, h, 0))
    drawn = ax.imshow(heat, cmap=MAP_CMAP, alpha=alpha, extent=(0, w, h, 0), interpolation="bilinear",
                      vmin=limits[0], vmax=limits[1])
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    return drawn


def plot_attention_grid(bundle: ClipModel, pixels: np.ndarray, chains: Sequence[Sequence[str]],
                        image_ids: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """Rows: images; columns: the image, attention rollout, then the text-conditioned map of each concept
    name of its chain (l1..l_max). Maps are min-max scaled per panel; the cosine range is printed below."""
    if len(pixels) != len(chains):
        raise ValueError(f"{len(pixels)} images but {len(chains)} chains; give one concept chain per image")
    maps = extract_attention(bundle, pixels)
    rollout = maps.rollout().numpy()
    levels = max((len(c) for c in chains), default=0)
    names = sorted({name for chain in chains for name in chain})
    name_emb = dict(zip(names, encode_texts(bundle, names))) if names else {}
    cols = 2 + levels
    fig, axes = plt.subplots(len(pixels), cols, figsize=(1.9 * cols, 2.1 * len(pixels)), squeeze=False)
    for row, (image, chain) in enumerate(zip(pixels, chains)):
        label = image_ids[row] if image_ids is not None else f"image {row}"
        axes[row, 0].imshow(image)
        axes[row, 0].set_xticks([])
        axes[row, 0].set_yticks([])
        axes[row, 0].set_title(label, fontsize=8)
        overlay(axes[row, 1], image, rollout[row], title="rollout")
        for level in range(levels):
            ax = axes[row, 2 + level]
            if level >= len(chain):
                ax.axis("off")
                continue
            heat = maps.text_maps(name_emb[chain[level]])[row].numpy()
            overlay(ax, image, heat, title=f"l{level + 1}: {chain[level]}")
            ax.set_xlabel(f"cos {heat.min():.2f}..{heat.max():.2f}", fontsize=7)
    fig.suptitle(title or f"{bundle.name}: attention rollout and text-conditioned patch similarity", fontsize=11)
    fig.tight_layout()
    return fig


def plot_attention_heads(bundle: ClipModel, image: np.ndarray, title: str | None = None) -> Figure:
    """Class-token attention of one image for every layer (rows) and head (columns), plus the head mean."""
    maps = extract_attention(bundle, image[None])
    cls = maps.cls_attention()[:, 0].numpy()  # (layers, heads, rows, cols)
    return draw_attention_heads(np.asarray(image), cls, title or f"{bundle.name}: class-token attention per layer "
                                "and head")


@replottable
def draw_attention_heads(image: np.ndarray, cls: np.ndarray, title: str) -> Figure:
    """The figure of `plot_attention_heads` from the image and its class-token attention maps (layers, heads,
    rows, cols); each map min-max scaled on its own (heads differ in sharpness by orders of magnitude)."""
    layers, heads = cls.shape[:2]
    fig, axes = plt.subplots(layers, heads + 1, figsize=(max(5.5, 1.5 * (heads + 1)), 1.5 * layers + 0.7),
                             squeeze=False)
    for layer in range(layers):
        for head in range(heads + 1):
            heat = cls[layer].mean(0) if head == heads else cls[layer, head]
            overlay(axes[layer, head], image, heat, title=None)
            if layer == 0:
                axes[layer, head].set_title("mean" if head == heads else f"head {head}", fontsize=8)
        axes[layer, 0].set_ylabel(f"layer {layer}", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_attention_models(bundles: dict[str, ClipModel], pixels: np.ndarray, chains: Sequence[Sequence[str]],
                          image_ids: Sequence[str], level: int = 1, title: str | None = None) -> Figure:
    """Models side by side on the same images: columns are the images (top row: the image and its l`level`
    concept), each further row one model's text-conditioned map of that concept (patch cosine to the concept
    name, on one colour scale shared by every panel, with its colorbar, so that the models can be compared; the
    panel's own range below). Keep the images to 4 or fewer, so a row stays readable."""
    if len(pixels) != len(chains) or len(pixels) != len(image_ids):
        raise ValueError(f"{len(pixels)} images, {len(chains)} chains and {len(image_ids)} ids; give one of each per "
                         "image")
    if not bundles or not len(pixels):
        raise ValueError("no model or no image to draw; pass at least one of each")
    names = [chain[min(level, len(chain)) - 1] for chain in chains]  # a short chain: its most abstract concept
    heat = []
    for bundle in bundles.values():
        maps = extract_attention(bundle, pixels)
        unique = sorted(set(names))
        embedded = dict(zip(unique, encode_texts(bundle, unique)))
        heat.append(np.stack([maps.text_maps(embedded[name])[col].numpy() for col, name in enumerate(names)]))
    return draw_attention_models(np.asarray(pixels), np.stack(heat), list(bundles), list(image_ids), names, level,
                                 title)


@replottable
def draw_attention_models(pixels: np.ndarray, heat: np.ndarray, models: list[str], image_ids: list[str],
                          names: list[str], level: int = 1, title: str | None = None) -> Figure:
    """The figure of `plot_attention_models` from the images (n, H, W, 3) and the patch-cosine maps (models, n,
    rows, cols); one colour scale (the maps' overall range) for every panel, with a colorbar."""
    limits = (float(heat.min()), float(heat.max()))
    fig, axes = plt.subplots(1 + len(models), len(pixels), figsize=(1.8 * len(pixels) + 1.2,
                                                                    1.8 * (1 + len(models)) + 0.6), squeeze=False)
    for col, (image, image_id, name) in enumerate(zip(pixels, image_ids, names)):
        axes[0, col].imshow(image)
        axes[0, col].set_xticks([])
        axes[0, col].set_yticks([])
        axes[0, col].set_title(f"{image_id}\nl{level}: {name}", fontsize=9)
    axes[0, 0].set_ylabel("image", fontsize=10)
    drawn = None
    for row, model in enumerate(models, start=1):
        for col, image in enumerate(pixels):
            drawn = overlay(axes[row, col], image, heat[row - 1, col], limits=limits)
            axes[row, col].set_xlabel(f"cos {heat[row - 1, col].min():.2f}..{heat[row - 1, col].max():.2f}",
                                      fontsize=8)
        axes[row, 0].set_ylabel(model, fontsize=10)
    title = title or (f"where each model finds the l{level} concept (patch cosine to the concept name, one colour "
                      "scale for all panels)")
    fig.suptitle(textwrap.fill(title, int(14 * fig.get_figwidth())), fontsize=11)  # no wider than the panels
    fig.tight_layout()
    scale = plt.cm.ScalarMappable(norm=drawn.norm, cmap=drawn.cmap)  # opaque, unlike the overlays
    colorbar = fig.colorbar(scale, ax=axes.ravel().tolist(), shrink=0.6, pad=0.02)
    colorbar.set_label("patch cosine to the concept name", fontsize=9)
    return fig
