"""Image and text embeddings of the evaluation items, computed once per model and cached on disk.

`evaluation/embeddings/<model>.<domain>.npz` holds one model's embeddings of one item set (domain `magic`: the
test split; `hierarcaps`: the HierarCaps images and texts). Each half is keyed by a content hash:

    image key = hash(library code, image-tower weights, preprocessing, image ids, pixel-source fingerprint)
    text key  = hash(library code, text-tower weights, the sorted strings)

so retrained weights, a changed test split, new strings or other library code (`library_digest`: the encoding
and model code are part of it) recompute, and nothing else does. The weights are
hashed as loaded (the model's state dict), which covers the zero-shot model that has no weights file. Models
sharing a frozen text tower (the demo's MiniLM) share text embeddings: a text key found in another model's
file is reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cglib.code_identity import library_digest
from cglib.encoding import encode_images, encode_texts
from cglib.models import ClipModel

logger = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: fingerprints of files holding part of a tower cover the part they reference; 3: fixed-shape encoding
NON_TOWER_KEYS = ("logit_scale", "logit_bias")


@dataclass
class Embeddings:
    """L2-normalised embeddings of a set of images and strings, with row lookups."""

    image_ids: list[str]
    images: np.ndarray
    texts: list[str]
    text_vectors: np.ndarray

    def __post_init__(self) -> None:
        self.text_index = {t: i for i, t in enumerate(self.texts)}
        self.image_index = {i: r for r, i in enumerate(self.image_ids)}

    def text(self, strings: list[str]) -> np.ndarray:
        """Vectors of `strings` (each must have been embedded)."""
        return self.text_vectors[[self.text_index[s] for s in strings]]


def _hash_tensors(items: Iterable[tuple[str, torch.Tensor]], preprocessing: str) -> tuple[str, str]:
    image, text = hashlib.sha1(preprocessing.encode()), hashlib.sha1()
    for key, tensor in sorted(items, key=lambda kv: kv[0]):
        if key in NON_TOWER_KEYS:
            continue
        digest = image if key.startswith("visual.") else text
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{key}|{t.dtype}|{tuple(tensor.shape)}".encode())
        if t.numel():
            digest.update(t.view(torch.uint8).numpy())  # the buffer itself, no copy
    return image.hexdigest(), text.hexdigest()


def tower_fingerprints(bundle: ClipModel) -> tuple[str, str]:
    """Content hashes of the image tower (+ preprocessing) and of the text tower, from the loaded weights."""
    return _hash_tensors(bundle.model.state_dict().items(), f"{bundle.image_size}|{bundle.mean}|{bundle.std}")


def file_fingerprints(path: Path, preprocessing: str) -> tuple[str, str]:
    """The same hashes as `tower_fingerprints`, read from a safetensors state dict without building the model.

    A file may hold part of a tower and reference the rest (cglib.weights.save_weights: a run that trained only the
    MiniLM projection holds `text.proj.weight` and references the frozen tower). Per tower: nothing referenced -
    the hash of what is held; nothing held - the referenced file's fingerprint (the same tower, so its embeddings
    are shared); both - the two combined, so a trained projection never reuses the frozen tower's embeddings.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        held = [k for k in f.keys() if k not in NON_TOWER_KEYS]  # noqa: SIM118
        image, text = _hash_tensors(((k, f.get_tensor(k)) for k in held), preprocessing)
        referenced = (f.metadata() or {}).get("cglib_referenced")
    if not referenced:
        return image, text
    reference = json.loads(referenced)
    if reference["source"] == "package":  # a MiniLM built from its package: the reference (with its hash) stands in
        source_image, source_text = image, hashlib.sha1(referenced.encode()).hexdigest()
    else:
        source_image, source_text = file_fingerprints(Path(path).parent / reference["source"], preprocessing)
    refers = [k for k in reference["keys"] if k not in NON_TOWER_KEYS]

    def tower(is_image: bool, own: str, source: str) -> str:
        holds = any(k.startswith("visual.") == is_image for k in held)
        if not any(k.startswith("visual.") == is_image for k in refers):
            return own
        return hashlib.sha1(f"{own}|{source}".encode()).hexdigest() if holds else source

    return tower(True, image, source_image), tower(False, text, source_text)


def _hash_strings(prefix: str, strings: list[str]) -> str:
    # the library's code is part of every key: embeddings computed by other code are computed again
    digest = hashlib.sha1(f"v{CACHE_VERSION}|{library_digest()}|{prefix}|".encode())
    digest.update("\0".join(strings).encode("utf-8"))
    return digest.hexdigest()


class EmbeddingStore:
    """Cache of per-model embeddings under one folder; text embeddings shared between identical text towers."""

    def __init__(self, directory: Path, batch_size: int = 256) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.batch_size = batch_size
        self._texts: dict[str, np.ndarray] = {}  # text key -> vectors (this process)
        self.computed: dict[str, list[str]] = {}  # "<model>.<domain>" -> parts computed (not read from cache)

    def path(self, model: str, domain: str) -> Path:
        return self.directory / f"{model}.{domain}.npz"

    def embed(self, model: str, domain: str, bundle_fn: Callable[[], ClipModel], image_ids: list[str],
              image_source: str, pixels_fn: Callable[[], np.ndarray], texts: list[str],
              fingerprints: tuple[str, str] | None = None) -> Embeddings:
        """Embeddings of `image_ids` (pixels from `pixels_fn`) and `texts` by one model, from cache when valid.

        `bundle_fn` returns the loaded model (only called on a cache miss when `fingerprints`, the towers'
        hashes from `file_fingerprints`, are given); `image_source` fingerprints the pixels.
        """
        texts = sorted(set(texts))
        image_fp, text_fp = fingerprints or tower_fingerprints(bundle_fn())
        image_key = _hash_strings(f"{image_fp}|{image_source}", image_ids)
        text_key = _hash_strings(text_fp, texts)
        path = self.path(model, domain)
        cached = self._read(path)
        computed = []
        if cached is not None and cached["image_key"] == image_key:
            images = cached["images"]
        else:
            images = encode_images(bundle_fn(), pixels_fn(), batch_size=self.batch_size)
            computed.append("images")
        text_vectors = self._texts.get(text_key)
        if text_vectors is None and cached is not None and cached["text_key"] == text_key:
            text_vectors = cached["text_vectors"]
        if text_vectors is None:
            text_vectors = self._shared_texts(domain, text_key)
        if text_vectors is None:
            text_vectors = encode_texts(bundle_fn(), texts)
            computed.append("texts")
        self._texts[text_key] = text_vectors
        self.computed[f"{model}.{domain}"] = computed
        if computed or cached is None or cached["text_key"] != text_key:
            tmp = path.with_name(path.name + ".tmp.npz")
            np.savez(tmp, version=CACHE_VERSION, image_key=image_key, text_key=text_key,
                     image_ids=np.asarray(image_ids, dtype=str), images=images,
                     texts=np.asarray(texts, dtype=str), text_vectors=text_vectors)
            tmp.replace(path)
        return Embeddings(image_ids=list(image_ids), images=np.asarray(images, np.float32), texts=texts,
                          text_vectors=np.asarray(text_vectors, np.float32))

    def _read(self, path: Path) -> dict | None:
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as f:
                if int(f["version"]) != CACHE_VERSION:
                    return None
                return {"image_key": str(f["image_key"]), "text_key": str(f["text_key"]),
                        "images": f["images"], "text_vectors": f["text_vectors"]}
        except (OSError, KeyError, ValueError) as exc:  # a torn or foreign file: recompute, say so
            logger.warning("ignoring unreadable embedding cache %s (%s); recomputing", path, exc)
            return None

    def _shared_texts(self, domain: str, text_key: str) -> np.ndarray | None:
        """Text vectors with the same key in another model's file (same frozen text tower, same strings)."""
        for other in sorted(self.directory.glob(f"*.{domain}.npz")):
            try:
                with np.load(other, allow_pickle=False) as f:
                    if int(f["version"]) == CACHE_VERSION and str(f["text_key"]) == text_key:
                        return f["text_vectors"]
            except (OSError, KeyError, ValueError):
                continue
        return None


def pixel_fingerprint(pixels: np.ndarray | None = None, files: list[Path] | None = None) -> str:
    """Fingerprint of the images' content: their bytes when in memory, else path, byte size and mtime per file."""
    digest = hashlib.sha1()
    if pixels is not None:
        digest.update(str(pixels.shape).encode())
        digest.update(np.ascontiguousarray(pixels).data)
    for path in files or []:
        try:
            stat = Path(path).stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()
