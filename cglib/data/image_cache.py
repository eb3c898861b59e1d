"""Decode and resize every image once into a uint8 array on disk, read back by np.memmap.

COCO-scale training re-reads each image every epoch; decoding JPEGs then dominates a step. The cache holds the
CLIP eval crop (short side resized to `size`, centre crop) of every readable image as one `(n, size, size, 3)`
uint8 `.npy` file that every stage maps into memory. Unreadable images are reported and skipped (counted by
reason in `skipped`, listed in `skipped_ids`), never replaced by black images.

A cache lives in `cache_dir/<size>px-<key>/` where the key hashes the dataset's image ids, the size and a content
fingerprint (the pixel bytes of an in-memory dataset; path, byte size and mtime of each file), so a changed
dataset never reuses a stale cache and an unchanged one is reused across notebooks and reruns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from PIL import Image

from cglib.data.dataset import CaptionDataset, ImageLoadError
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless

if TYPE_CHECKING:
    from cglib.distributed import DistInfo
    from cglib.run import RunContext

logger = logging.getLogger(__name__)

PIXELS_FILE = "pixels.npy"
INDEX_FILE = "index.json"
CACHE_VERSION = 1
T = TypeVar("T")


class ImageCache:
    """Images of a dataset as one uint8 (n, size, size, 3) memmap; rows follow `image_ids` (readable images only)."""

    def __init__(self, directory: Path, image_ids: list[str], size: int, skipped: Counter,
                 skipped_ids: dict[str, str], n_dataset: int | None = None, built_now: bool = False) -> None:
        self.directory = Path(directory)
        self.image_ids = list(image_ids)
        self.size = size
        self.skipped = Counter(skipped)
        self.skipped_ids = dict(skipped_ids)  # image id -> reason
        # the images the build was given (None: an index written before it was recorded) and whether this
        # process built the cache (else it opened an earlier build): the cache's account
        self.n_dataset = n_dataset
        self.built_now = built_now
        self._row = {image_id: i for i, image_id in enumerate(self.image_ids)}
        self._pixels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getstate__(self) -> dict:
        # DataLoader workers get a copy: pickle the path, not the mapped bytes; each process maps the file itself.
        state = dict(self.__dict__)
        state["_pixels"] = None
        return state

    @property
    def pixels(self) -> np.ndarray:
        """The (n, size, size, 3) uint8 images, memory-mapped read-only."""
        if self._pixels is None:
            self._pixels = np.load(self.directory / PIXELS_FILE, mmap_mode="r")[: len(self.image_ids)]
        return self._pixels

    def row(self, image_id: str) -> int:
        """Row of `image_id` in `pixels`; KeyError naming why when it was skipped or never part of the dataset."""
        try:
            return self._row[image_id]
        except KeyError:
            if image_id in self.skipped_ids:
                raise KeyError(f"image {image_id} was skipped when the cache was built "
                               f"({self.skipped_ids[image_id]}); exclude it or fix the file") from None
            raise KeyError(f"image {image_id} is not part of the cached dataset ({self.directory})") from None

    def get(self, image_ids: list[str]) -> np.ndarray:
        """uint8 (len(image_ids), size, size, 3) images, in the order asked (an in-memory copy)."""
        rows = np.fromiter((self.row(i) for i in image_ids), dtype=np.int64, count=len(image_ids))
        return np.asarray(self.pixels[rows])

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._row

    def account(self) -> dict:
        """Every image of the dataset where it ended: a row kept from an earlier build, a row built now, or
        skipped (unreadable) by reason; `adds_up` checks them against the images the build was given."""
        rows, skipped = len(self.image_ids), sum(self.skipped.values())
        return {"images": self.n_dataset, "size": self.size, "from_earlier_build": 0 if self.built_now else rows,
                "built_now": rows if self.built_now else 0, "skipped": skipped,
                "skipped_by_reason": dict(sorted(self.skipped.items())),
                "adds_up": self.n_dataset == rows + skipped}


def _fingerprint(dataset: CaptionDataset) -> str:
    """Content fingerprint: pixel bytes of an in-memory dataset; path, byte size and mtime of each file."""
    digest = hashlib.sha1()
    if dataset.pixels is not None:
        digest.update(str(dataset.pixels.shape).encode())
        digest.update(np.ascontiguousarray(dataset.pixels).data)
        return digest.hexdigest()
    for image_id in dataset.image_ids:
        path = Path(dataset.image_files[image_id])
        try:
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()


def dataset_digest(dataset: CaptionDataset) -> str:
    """A digest of the dataset's source, image ids and content fingerprint (a cache of it is stale when it changes)."""
    digest = hashlib.sha1(f"{dataset.source}\0".encode())
    digest.update("\n".join(dataset.image_ids).encode())
    digest.update(_fingerprint(dataset).encode())
    return digest.hexdigest()


def decoded_images(dataset: CaptionDataset, convert: Callable[[Image.Image], T], progress: bool, desc: str
                   ) -> Iterator[tuple[str, T | ImageLoadError]]:
    """(image id, convert(its decoded RGB image) or the ImageLoadError that stopped it) for every image, in order;
    files are decoded on threads (PIL releases the GIL while decoding, so threads scale across cores)."""
    def load(image_id: str) -> T | ImageLoadError:
        try:
            return convert(dataset.load_image(image_id))
        except ImageLoadError as exc:
            return exc

    workers = 1 if dataset.pixels is not None else min(16, os.cpu_count() or 1)
    with tqdm(total=len(dataset), desc=desc, disable=not progress, leave=False) as bar, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        for image_id, result in zip(dataset.image_ids, pool.map(load, dataset.image_ids, chunksize=64)):
            yield image_id, result
            bar.update(1)


def cache_key(dataset: CaptionDataset, size: int) -> str:
    """The cache folder name for `dataset` at `size`: ids, size and content fingerprint hashed."""
    digest = hashlib.sha1(f"v{CACHE_VERSION}\0{size}\0{dataset.source}\0".encode())
    digest.update("\n".join(dataset.image_ids).encode())
    digest.update(_fingerprint(dataset).encode())
    return f"{size}px-{digest.hexdigest()[:16]}"


def complete_index(directory: Path, pixels_file: str, version: int) -> dict | None:
    """The index of a cache folder whose build finished (its pixels file in place, its index of `version` marked
    complete), else None."""
    index_path = directory / INDEX_FILE
    if not index_path.is_file() or not (directory / pixels_file).is_file():
        return None
    index = json.loads(index_path.read_text(encoding="utf-8"))
    return index if index.get("version") == version and index.get("complete") else None


def open_image_cache(dataset: CaptionDataset, size: int, cache_dir: Path) -> ImageCache | None:
    """The already built cache of `dataset` at `size` under `cache_dir`, or None when there is none."""
    directory = Path(cache_dir) / cache_key(dataset, size)
    index = complete_index(directory, PIXELS_FILE, CACHE_VERSION)
    if index is None:
        return None
    return ImageCache(directory, index["image_ids"], index["size"], Counter(index["skipped"]), index["skipped_ids"],
                      n_dataset=index.get("n_dataset"))


def build_image_cache(dataset: CaptionDataset, size: int, cache_dir: Path, progress: bool = True) -> ImageCache:
    """Decode and resize every image of `dataset` once into `cache_dir` (reused when already built); skips counted."""
    if size < 1:
        raise ValueError(f"cache image size must be positive, got {size}")
    existing = open_image_cache(dataset, size, cache_dir)
    if existing is not None:
        return existing
    directory = Path(cache_dir) / cache_key(dataset, size)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (PIXELS_FILE + ".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(dataset), size, size, 3))
    kept: list[str] = []
    skipped: Counter = Counter()
    skipped_ids: dict[str, str] = {}
    if dataset.pixels is not None and dataset.pixels.shape[1:3] == (size, size):
        # In-memory images already at the cache size (the synthetic world): a plain copy, nothing to decode.
        out[:] = dataset.pixels
        kept = list(dataset.image_ids)
    else:
        from cglib.encoding import images_to_pixels  # lazy: torch; cglib.data imports without it

        for image_id, result in decoded_images(dataset, lambda image: images_to_pixels([image], size)[0], progress,
                                               f"image cache {size}px"):
            if isinstance(result, ImageLoadError):
                skipped[result.reason] += 1
                skipped_ids[image_id] = result.reason
            else:
                out[len(kept)] = result
                kept.append(image_id)
    out.flush()
    del out
    tmp.replace(directory / PIXELS_FILE)
    index = {"version": CACHE_VERSION, "complete": True, "size": size, "source": dataset.source,
             "n_dataset": len(dataset), "image_ids": kept, "skipped": dict(skipped), "skipped_ids": skipped_ids}
    index_tmp = directory / (INDEX_FILE + ".tmp")
    index_tmp.write_text(json.dumps(index), encoding="utf-8")
    index_tmp.replace(directory / INDEX_FILE)
    if skipped:
        logger.warning("image cache: skipped %d of %d images (%s); they are left out, not replaced",
                       sum(skipped.values()), len(dataset), ", ".join(f"{k}: {v}" for k, v in skipped.items()))
    return ImageCache(directory, kept, size, skipped, skipped_ids, n_dataset=len(dataset), built_now=True)


def image_cache_dir(run: RunContext) -> Path:
    """Where a run keeps its decoded-image caches (shared by training, evaluation and visualization)."""
    return run.dir / "cache" / "images"


def magic_image_cache(run: RunContext, magic_images: Collection[str], dataset: CaptionDataset, size: int,
                      progress: bool = True, info: DistInfo | None = None,
                      build: Callable = build_image_cache, reopen: Callable = open_image_cache) -> Any:
    """The image cache of the MAGIC images (`magic.images`, both splits) at `size`; built by rank 0, opened by the
    others. `build` and `reopen`: another kind of cache of the same images (crop_cache.py's, for augmentation)."""
    from cglib import distributed  # lazy: torch, imported only when a MAGIC cache is asked for

    known = set(dataset.image_ids)
    missing = [i for i in magic_images if i not in known]
    if missing:
        raise ValueError(f"{len(missing)} MAGIC images are not in the captions dataset (first: {missing[0]}); "
                         "re-run 03_magic_dag on the current captions")
    wanted = set(magic_images)
    subset = dataset.subset([i for i in dataset.image_ids if i in wanted])
    info = info or distributed.DistInfo()
    if info.is_main:
        cache = build(subset, size, image_cache_dir(run), progress=progress)
    distributed.barrier(info)
    if not info.is_main:
        cache = reopen(subset, size, image_cache_dir(run))
        if cache is None:
            raise RuntimeError("rank 0 did not leave a complete image cache; check its log")
    return cache
