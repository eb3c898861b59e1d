"""Concept embedders for merging and hard negatives: texts -> L2-normalised float32 vectors (n, d).

`magic.embedder` picks one:
    minilm     the offline sentence encoder shipped in a PyPI package (`cglib.embed.embed_texts`), default
    open_clip  an open_clip text tower: `magic.embedder_model` as "ARCH" or "ARCH:PRETRAINED_TAG"
               (e.g. "ViT-B-32:openai"); null uses the run's own `model` section (its text space)
    openai     OpenAI-compatible POST /embeddings (`magic.embedder_model`, default text-embedding-3-small),
               at `llm.base_url`, key from the environment variable named by `llm.api_key_env`
Any callable `list[str] -> np.ndarray` can be passed to `build_magic(embedder=...)` instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from cglib.config import ModelParams, Params
from cglib.embed import embed_texts

Embedder = Callable[[list[str]], np.ndarray]
OPENAI_DEFAULT_MODEL = "text-embedding-3-small"
OPENAI_BATCH = 512  # inputs per request (the API accepts up to 2048)


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows (float32); a zero row is an error because its cosine is undefined."""
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError(f"an embedder must return a 2-d array (n, d), got shape {v.shape}")
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    if np.any(norms == 0) or not np.all(np.isfinite(v)):
        raise ValueError("the embedder returned a zero or non-finite vector; check the embedder")
    return v / norms


def embed_names(embedder: Embedder, names: list[str]) -> dict[str, np.ndarray]:
    """Unit vectors of distinct names (embedded once each, in sorted order)."""
    unique = sorted(set(names))
    vectors = normalize_rows(embedder(unique)) if unique else np.zeros((0, 1), np.float32)
    if len(vectors) != len(unique):
        raise ValueError(f"the embedder returned {len(vectors)} vectors for {len(unique)} texts")
    return dict(zip(unique, vectors))


def minilm_embedder() -> Embedder:
    """The offline MiniLM sentence encoder."""
    return embed_texts


def open_clip_embedder(params: Params, device: str = "cpu") -> Embedder:
    """The text tower of an open_clip model (`magic.embedder_model`, or the run's `model` section when null)."""
    from cglib.encoding import encode_texts  # lazy: torch; cglib.magic imports without it
    from cglib.models import build_model  # lazy: torch; cglib.magic imports without it

    spec = params.magic.embedder_model
    if spec is None:
        model_params = params.model
    else:
        arch, _, tag = spec.partition(":")
        model_params = ModelParams(name=arch, pretrained=tag or None, text_tower="open_clip")
    bundle = build_model(model_params, device=device)
    return lambda texts: encode_texts(bundle, texts)


def openai_embedder(params: Params) -> Embedder:
    """OpenAI (or compatible) embeddings API; the key comes from the environment, never from params."""
    import openai

    key = os.environ.get(params.llm.api_key_env)
    if not key:
        raise RuntimeError(f"magic.embedder 'openai' needs an API key in the environment variable "
                           f"{params.llm.api_key_env} (llm.api_key_env); export it, or use magic.embedder: minilm")
    client = openai.OpenAI(api_key=key, base_url=params.llm.base_url, timeout=params.llm.timeout_s,
                           max_retries=params.llm.max_retries)
    model = params.magic.embedder_model or OPENAI_DEFAULT_MODEL

    def embed(texts: list[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for start in range(0, len(texts), OPENAI_BATCH):
            batch = list(texts[start:start + OPENAI_BATCH])
            reply = client.embeddings.create(model=model, input=batch)
            data = sorted(reply.data, key=lambda d: d.index)
            if len(data) != len(batch):
                raise RuntimeError(f"embeddings server returned {len(data)} vectors for {len(batch)} inputs")
            rows += [d.embedding for d in data]
        return np.asarray(rows, dtype=np.float32)

    return embed


def make_embedder(params: Params, device: str = "cpu") -> Embedder:
    """The concept embedder named by `magic.embedder`."""
    kind = params.magic.embedder
    if kind == "minilm":
        return minilm_embedder()
    if kind == "open_clip":
        return open_clip_embedder(params, device=device)
    if kind == "openai":
        return openai_embedder(params)
    raise ValueError(f"unknown magic.embedder {kind!r}; use minilm, open_clip or openai")
