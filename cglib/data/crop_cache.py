"""Images kept for random resized crops (`train.augment: open_clip_train`): open_clip's training transform, drawn
per step from a cache instead of from the JPEGs.

open_clip trains through `RandomResizedCrop(size, scale=(0.9, 1.0), interpolation=bicubic)`: a box of 90-100% of
the photograph's area with an aspect ratio in [3/4, 4/3] (log-uniform), resized to `size` x `size`. The eval cache
(`image_cache.py`) holds the centre crop at `size`, from which such boxes cannot be cut. This cache holds each image
with its aspect ratio kept, its short side brought down to `ceil(1.25 * size)` (never up): a box covers at least
about 0.87 of the short side, so every crop is still a reduction, as it is from the full photograph. The boxes are
drawn in the photograph's own pixel grid (its size is kept in the index) by torchvision's algorithm with the
caller's `torch.Generator`, so the same generator state gives the same boxes as open_clip's transform; a box is
then resized from the stored image with PIL's bicubic filter on the box scaled to it. An image stored at its own
size (the synthetic world's, or any photograph no larger than the cap) is cropped and resized exactly as
torchvision does, pixel for pixel.

All images are one flat uint8 file (`pixels.bin`, memory-mapped), each at the offset its stored shape implies;
`index.json` holds the ids, the stored and original sizes, and the skipped images by reason, as the eval cache does.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import INDEX_FILE, complete_index, dataset_digest, decoded_images
from cglib.run import write_text_atomic

PIXELS_FILE = "pixels.bin"
CACHE_VERSION = 1
SHORT_SIDE_MARGIN = 1.25  # stored short side = ceil(1.25 * size): a crop (>= ~0.87 of the short side) reduces
CROP_SCALE = (0.9, 1.0)  # open_clip's AugmentationCfg default: the crop's share of the image's area
CROP_RATIO = (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop default aspect-ratio range


def crop_box(width: int, height: int, generator: torch.Generator, scale: tuple[float, float] = CROP_SCALE,
             ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random resized crop of a width x height image: torchvision's
    `RandomResizedCrop.get_params`, step for step, drawing from `generator` (10 tries, then the central crop)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            top = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
            left = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def stored_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) an image is kept at: its short side brought down to ceil(1.25 * size), never up."""
    factor = min(1.0, math.ceil(SHORT_SIDE_MARGIN * size) / min(width, height))
    return (width, height) if factor == 1.0 else (max(1, round(width * factor)), max(1, round(height * factor)))


def resized_crop(stored: Image.Image, original: tuple[int, int], box: tuple[int, int, int, int],
                 size: int) -> np.ndarray:
    """uint8 (size, size, 3): crop `box` (top, left, height, width, in the original's pixels) resized bicubic."""
    top, left, h, w = box
    if stored.size == tuple(original):  # torchvision's own path: crop, then resize
        return np.asarray(stored.crop((left, top, left + w, top + h)).resize((size, size), Image.BICUBIC))
    fx, fy = stored.size[0] / original[0], stored.size[1] / original[1]
    scaled = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
    return np.asarray(stored.resize((size, size), Image.BICUBIC, box=scaled))


class CropCache:
    """Images with their aspect ratio kept, for random resized crops; rows follow `image_ids` (readable only)."""

    def __init__(self, directory: Path, index: dict) -> None:
        self.directory = Path(directory)
        self.size = index["size"]
        self.image_ids = list(index["image_ids"])
        self.stored = [tuple(s) for s in index["stored"]]  # (width, height) in the file
        self.originals = [tuple(s) for s in index["originals"]]  # (width, height) of the decoded image
        self.skipped = Counter(index["skipped"])
        self.skipped_ids = dict(index["skipped_ids"])  # image id -> reason
        self.offsets = np.concatenate([[0], np.cumsum([w * h * 3 for w, h in self.stored])]).astype(np.int64)
        self._row = {image_id: i for i, image_id in enumerate(self.image_ids)}
        self._pixels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getstate__(self) -> dict:  # DataLoader workers map the file themselves
        return {**self.__dict__, "_pixels": None}

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._row

    def row(self, image_id: str) -> int:
        """Row of `image_id`; KeyError naming why when it was skipped or never part of the dataset."""
        try:
            return self._row[image_id]
        except KeyError:
            why = "it was skipped when the cache was built" if image_id in self.skipped_ids else \
                "it is not part of the cached dataset"
            raise KeyError(f"image {image_id} is not in the crop cache ({self.directory}): {why}") from None

    def image(self, image_id: str) -> Image.Image:
        """The stored image of `image_id`, with its aspect ratio."""
        return self._stored_image(self.row(image_id))

    def _stored_image(self, k: int) -> Image.Image:
        if self._pixels is None:
            self._pixels = np.memmap(self.directory / PIXELS_FILE, dtype=np.uint8, mode="r")
        width, height = self.stored[k]
        return Image.fromarray(np.asarray(self._pixels[self.offsets[k]:self.offsets[k + 1]]).reshape(height, width, 3))

    def crops(self, image_ids: list[str], generator: torch.Generator, keep: slice = slice(None)) -> np.ndarray:
        """uint8 (n, size, size, 3): a random resized crop of each image of `image_ids[keep]`, the boxes drawn from
        `generator` for every image of `image_ids` in order (so each rank of a batch keeps its slice of one draw)."""
        originals = [self.originals[self.row(image_id)] for image_id in image_ids]
        boxes = [crop_box(*original, generator) for original in originals]
        kept = list(zip(image_ids, originals, boxes, strict=True))[keep]
        out = np.empty((len(kept), self.size, self.size, 3), dtype=np.uint8)
        for i, (image_id, original, box) in enumerate(kept):
            out[i] = resized_crop(self._stored_image(self._row[image_id]), original, box, self.size)
        return out


def crop_cache_key(dataset: CaptionDataset, size: int) -> str:
    """The folder name of `dataset`'s crop cache at `size`: ids, size and content fingerprint hashed."""
    digest = hashlib.sha1(f"crops-v{CACHE_VERSION}\0{size}\0{SHORT_SIDE_MARGIN}\0".encode())
    digest.update(dataset_digest(dataset).encode())
    return f"{size}px-crops-{digest.hexdigest()[:16]}"


def open_crop_cache(dataset: CaptionDataset, size: int, cache_dir: Path) -> CropCache | None:
    """The already built crop cache of `dataset` at `size` under `cache_dir`, or None when there is none."""
    directory = Path(cache_dir) / crop_cache_key(dataset, size)
    index = complete_index(directory, PIXELS_FILE, CACHE_VERSION)
    return None if index is None else CropCache(directory, index)


def build_crop_cache(dataset: CaptionDataset, size: int, cache_dir: Path, progress: bool = True) -> CropCache:
    """Decode every image of `dataset` once and keep it at `stored_size` under `cache_dir` (reused when built)."""
    existing = open_crop_cache(dataset, size, cache_dir)
    if existing is not None:
        return existing
    directory = Path(cache_dir) / crop_cache_key(dataset, size)
    directory.mkdir(parents=True, exist_ok=True)
    index = {"version": CACHE_VERSION, "complete": True, "size": size, "n_dataset": len(dataset), "image_ids": [],
             "stored": [], "originals": [], "skipped": Counter(), "skipped_ids": {}}

    def keep(image: Image.Image) -> tuple[Image.Image, tuple[int, int]]:
        target = stored_size(*image.size, size)
        return (image if target == image.size else image.resize(target, Image.BICUBIC)), image.size

    tmp = directory / (PIXELS_FILE + ".tmp")
    with tmp.open("wb") as out:
        for image_id, result in decoded_images(dataset, keep, progress, f"crop cache {size}px"):
            if isinstance(result, Exception):
                index["skipped"][result.reason] += 1
                index["skipped_ids"][image_id] = result.reason
                continue
            stored, original = result
            out.write(stored.tobytes())  # RGB rows, as decoded_images hands them
            index["image_ids"].append(image_id)
            index["stored"].append(list(stored.size))
            index["originals"].append(list(original))
    tmp.replace(directory / PIXELS_FILE)
    write_text_atomic(directory / INDEX_FILE, json.dumps(index))
    return CropCache(directory, index)
