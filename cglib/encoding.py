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
    """L2-normalised image embeddings (float32, (n, D)) of uint8 (n, H, W, 3) images, in eval mode.

    Every call of the tower holds exactly `batch_size` images (the last chunk is filled with copies of its last
    image): BLAS picks its kernels by matrix shape, so an image embedded in a chunk of 1 or 7 differs in the last
    float32 digit from the same image in a chunk of 40. With one shape, an image's embedding depends on the image
    and `batch_size` alone, not on which other images were asked for or how many.
    """
    was_training = bundle.model.training
    bundle.model.eval()
    chunks = []
    for start in range(0, len(pixels), batch_size):
        chunk = pixels[start:start + batch_size]
        filled = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - len(chunk), axis=0)])
        x = pixels_to_tensor(filled, bundle).to(bundle.device)
        chunks.append(bundle.model.encode_image(x, normalize=True).float().cpu()[:len(chunk)])
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


# Every call of a text tower holds TEXT_BATCH texts (the last chunk filled with copies of its last text), each
# cut to its own token length rounded up to LENGTH_STEP. BLAS picks kernels by matrix shape and a longer padded
# row sums its attention in another order, so before this a text's embedding changed in the last float32 digits
# with the other texts of its batch (which came first, how many were asked for, the longest among them).
TEXT_BATCH = 64
LENGTH_STEP = 8


@torch.no_grad()
def encode_texts(bundle: ClipModel, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
    """Text embeddings (float32, (n, D)), L2-normalised unless `normalize=False`, in eval mode.

    Each text's embedding is bitwise a function of the text and the weights alone (`_run_text_tower`).
    Hugging Face towers (the MiniLM) mask padding, and open_clip's HF tokenizer pads every text to the context
    length: each text takes its own length rounded up to LENGTH_STEP tokens (about 4x fewer tokens for
    captions). CLIP's own tower has a fixed positional table and takes the full context. A MiniLM tower's outputs
    before its projection are remembered per tower weights (`_minilm_outputs`), so only the projection runs for a
    text that tower has already embedded.
    """
    if bundle.text_tower == "minilm":
        outputs = torch.from_numpy(_minilm_outputs(bundle, texts)).to(bundle.device)
        embedded = _in_fixed_chunks(bundle.model.text.proj, outputs).float()
        return (F.normalize(embedded, dim=-1) if normalize else embedded).cpu().numpy()
    return _run_text_tower(bundle, texts, normalize)


def _in_fixed_chunks(layer: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """`layer(rows)` computed TEXT_BATCH rows at a time (the last chunk filled with copies of its last row), so each
    row's result is the same however many rows are asked for (a linear layer on fewer than 8 rows takes another
    BLAS kernel)."""
    out = []
    for start in range(0, len(rows), TEXT_BATCH):
        chunk = rows[start:start + TEXT_BATCH]
        filled = torch.cat([chunk, chunk[-1:].expand(TEXT_BATCH - len(chunk), -1)])
        out.append(layer(filled)[:len(chunk)])
    return torch.cat(out) if out else layer(rows)


def _token_lengths(bundle: ClipModel, tokens: torch.Tensor) -> list[int]:
    """Columns each text is run with: its own tokens rounded up to LENGTH_STEP (a tower that masks padding),
    else the full context."""
    context = tokens.shape[1]
    pad = _pad_token_id(bundle)
    if pad is None:
        return [context] * len(tokens)
    used = torch.arange(1, context + 1) * (tokens != pad)  # 1-based column of each real token, 0 at padding
    own = used.max(dim=1).values.tolist()
    return [min(context, -(-n // LENGTH_STEP) * LENGTH_STEP) for n in own]


def _run_text_tower(bundle: ClipModel, texts: Sequence[str], normalize: bool) -> np.ndarray:
    """Text embeddings straight from the tower, in calls of one shape per token length: TEXT_BATCH rows."""
    out = np.empty((len(texts), bundle.embed_dim), dtype=np.float32)
    if not texts:
        return out
    tokens = bundle.tokenizer(list(texts))
    lengths = _token_lengths(bundle, tokens)
    was_training = bundle.model.training
    bundle.model.eval()
    for length in sorted(set(lengths)):
        rows = [i for i, n in enumerate(lengths) if n == length]
        for start in range(0, len(rows), TEXT_BATCH):
            chunk = rows[start:start + TEXT_BATCH]
            filled = chunk + chunk[-1:] * (TEXT_BATCH - len(chunk))
            x = tokens[filled, :length].to(bundle.device)
            out[chunk] = bundle.model.encode_text(x, normalize=normalize).float().cpu().numpy()[:len(chunk)]
    bundle.model.train(was_training)
    return out


# MiniLM outputs before the projection, per digest of the tower's weights. Every model of a demo run shares the
# package's frozen MiniLM, and the base, each run's text table, the text phases and evaluation embed the same
# captions again and again (about 40% of notebook 05's time before this memo). A tower that trains gets a new
# digest, so it never reads outputs of other weights; the two most recent towers are kept. Since a text's outputs
# do not depend on the texts computed with it (`_run_text_tower`), what the first caller asked for changes nothing.
_MINILM_MEMO: dict[str, dict[str, np.ndarray]] = {}
_MINILM_MEMO_TOWERS = 2


def _minilm_outputs(bundle: ClipModel, texts: Sequence[str]) -> np.ndarray:
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
            memo.update(zip(missing, _run_text_tower(bundle, missing, normalize=False)))
        finally:
            tower.proj = proj
    if not texts:
        return np.zeros((0, MINILM_DIM), np.float32)
    return np.stack([memo[t] for t in texts])
