"""What a `ClipModel` is fed and what it returns: images as uint8 pixels resized like CLIP's eval transform and
normalised for the model, texts tokenized, and L2-normalised embeddings of both (the frozen MiniLM tower's outputs
computed once per process and text)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from cglib.embed import MINILM_DIM
from cglib.models import ClipModel
from cglib.weights import tensors_sha1


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


def _pad_token_id(bundle: ClipModel) -> int | None:
    """The padding id of a tower that masks padding (Hugging Face towers such as the MiniLM), else None."""
    return getattr(getattr(getattr(bundle.model, "text", None), "config", None), "pad_token_id", None)


def tokenize(bundle: ClipModel, texts: Sequence[str]) -> torch.Tensor:
    """Tokens of `texts`; on a tower that masks padding, columns that are padding for every text are dropped."""
    tokens = bundle.tokenizer(list(texts))
    pad = _pad_token_id(bundle)
    if pad is not None:
        tokens = tokens[:, :int((tokens != pad).any(dim=0).nonzero().max()) + 1]
    return tokens


@contextmanager
def without_text_projection(bundle: ClipModel) -> Iterator[None]:
    """Inside the block the text tower stops before its projection: `encode_texts(..., normalize=False)` then gives
    the frozen tower's outputs, which a text phase that trains the projection alone computes once."""
    text, proj = bundle.model.text, bundle.text_projection()
    text.proj = torch.nn.Identity()
    try:
        yield
    finally:
        text.proj = proj


@torch.no_grad()
def encode_texts(bundle: ClipModel, texts: Sequence[str], batch_size: int = 256, normalize: bool = True
                 ) -> np.ndarray:
    """Text embeddings (float32, (n, D)), L2-normalised unless `normalize=False`, in eval mode.

    Hugging Face towers (the MiniLM) mask padding, and open_clip's HF tokenizer pads every text to the context
    length: texts are batched by length and columns that are padding in the whole batch are dropped (about 4x
    fewer tokens for captions; equal up to float rounding). CLIP's own tower has a fixed positional table and
    takes the full context. A MiniLM tower's outputs before its projection are remembered per tower weights
    (`_minilm_outputs`), so only the projection runs for a text that tower has already embedded.
    """
    if bundle.text_tower == "minilm":
        outputs = torch.from_numpy(_minilm_outputs(bundle, texts, batch_size)).to(bundle.device)
        embedded = bundle.model.text.proj(outputs).float()
        return (F.normalize(embedded, dim=-1) if normalize else embedded).cpu().numpy()
    return _run_text_tower(bundle, texts, batch_size, normalize)


def _run_text_tower(bundle: ClipModel, texts: Sequence[str], batch_size: int, normalize: bool) -> np.ndarray:
    """Text embeddings straight from the tower, batched by length with shared padding columns dropped."""
    pad = _pad_token_id(bundle)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if pad is not None else range(len(texts))
    order = list(order)
    out = np.empty((len(texts), bundle.embed_dim), dtype=np.float32)
    was_training = bundle.model.training
    bundle.model.eval()
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        tokens = tokenize(bundle, [texts[i] for i in rows])
        out[rows] = bundle.model.encode_text(tokens.to(bundle.device), normalize=normalize).float().cpu().numpy()
    bundle.model.train(was_training)
    return out


# MiniLM outputs before the projection, per digest of the tower's weights. Every model of a demo run shares the
# package's frozen MiniLM, and the base, each run's text table, the text phases and evaluation embed the same
# captions again and again (about 40% of notebook 05's time before this memo). A tower that trains gets a new
# digest, so it never reads outputs of other weights; the two most recent towers are kept.
_MINILM_MEMO: dict[str, dict[str, np.ndarray]] = {}
_MINILM_MEMO_TOWERS = 2


def _minilm_outputs(bundle: ClipModel, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """The MiniLM tower's outputs (before its projection) for `texts`, computing only those not yet remembered."""
    tower = bundle.model.text
    digest = tensors_sha1({k: v for k, v in tower.state_dict().items() if not k.startswith("proj.")})
    memo = _MINILM_MEMO.pop(digest, {})
    _MINILM_MEMO[digest] = memo  # the most recent tower last
    while len(_MINILM_MEMO) > _MINILM_MEMO_TOWERS:
        del _MINILM_MEMO[next(iter(_MINILM_MEMO))]
    missing = [t for t in dict.fromkeys(texts) if t not in memo]
    if missing:
        proj, tower.proj = tower.proj, torch.nn.Identity()
        try:
            memo.update(zip(missing, _run_text_tower(bundle, missing, batch_size, normalize=False)))
        finally:
            tower.proj = proj
    if not texts:
        return np.zeros((0, MINILM_DIM), np.float32)
    return np.stack([memo[t] for t in texts])
