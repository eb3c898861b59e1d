"""One interface for images with captions, whatever their source (synthetic world, COCO, HierarCaps).

Every later stage (abstraction, MAGIC, training, evaluation) reads a `CaptionDataset` and never asks where it
came from. Ground-truth concept chains (synthetic world only) live in a separate file, read explicitly by
evaluation and by the `oracle` backend, so nothing uses them silently.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from cglib.run import output_path

DATASET_FILE = "dataset.json"
PIXELS_FILE = "images.npy"
GROUND_TRUTH_FILE = "ground_truth.json"
FORMAT_VERSION = 1


class ImageLoadError(OSError):
    """An image file is missing, unreadable or truncated; `reason` is a short key for skip counts."""

    def __init__(self, message: str, reason: str = "unreadable image") -> None:
        super().__init__(message)
        self.reason = reason


@contextmanager
def _image_errors(path: Path) -> Iterator[None]:
    """Turn PIL's many exception types into one ImageLoadError with a reason key."""
    if not path.is_file():
        raise ImageLoadError(f"missing image: {path}", reason="image file missing")
    try:
        yield
    except UnidentifiedImageError:
        raise ImageLoadError(f"not an image (unrecognised format): {path}", reason="not an image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageLoadError(f"corrupt or truncated image: {path} ({exc})",
                             reason="corrupt or truncated image") from None


def open_image(path: str | Path) -> Image.Image:
    """Open an image fully decoded as RGB; raise ImageLoadError naming the file and the reason."""
    path = Path(path)
    with _image_errors(path), Image.open(path) as img:
        img.load()  # decode now: truncated files fail here, not later inside a training step
        return img.convert("RGB")


def check_image(path: str | Path) -> None:
    """Raise ImageLoadError unless the file decodes to its last byte (JPEGs at 1/8 scale, which is faster)."""
    path = Path(path)
    with _image_errors(path), Image.open(path) as img:
        # JPEG draft mode skips the inverse DCT at full size but still reads the whole entropy-coded stream,
        # so a truncated file fails exactly as in a full decode, 2-5x faster. Other formats decode fully.
        img.draft("RGB", (1, 1))
        img.load()


@dataclass
class CaptionDataset:
    """Images with their captions. Images are files on disk (`image_files`) or a uint8 array (`pixels`)."""

    source: str
    image_ids: list[str]
    captions: dict[str, list[str]]
    image_files: dict[str, Path] | None = None
    pixels: np.ndarray | None = None  # (n, H, W, 3) uint8, rows in `image_ids` order
    skipped: Counter = field(default_factory=Counter)  # reason -> number of images or captions dropped
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [i for i in self.image_ids if not self.captions.get(i)]
        if missing:
            raise ValueError(f"{len(missing)} images have no captions (first: {missing[0]}); drop them and count "
                             "them in `skipped` before building the dataset")
        if (self.image_files is None) == (self.pixels is None):
            raise ValueError("give exactly one of image_files (files on disk) or pixels (uint8 array)")
        if self.pixels is not None and len(self.pixels) != len(self.image_ids):
            raise ValueError(f"pixels has {len(self.pixels)} rows for {len(self.image_ids)} image ids")
        self._row = {image_id: row for row, image_id in enumerate(self.image_ids)}

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def n_captions(self) -> int:
        return sum(len(self.captions[i]) for i in self.image_ids)

    def load_image(self, image_id: str) -> Image.Image:
        """The RGB image of `image_id` (raises ImageLoadError for an unreadable file)."""
        if self.pixels is not None:
            return Image.fromarray(self.pixels[self._row[image_id]])
        return open_image(self.image_files[image_id])

    def subset(self, image_ids: list[str]) -> CaptionDataset:
        """The same dataset restricted to `image_ids` (in that order)."""
        rows = [self._row[i] for i in image_ids]
        return CaptionDataset(
            source=self.source, image_ids=list(image_ids), captions={i: self.captions[i] for i in image_ids},
            image_files=None if self.image_files is None else {i: self.image_files[i] for i in image_ids},
            pixels=None if self.pixels is None else self.pixels[rows], skipped=Counter(self.skipped),
            meta=dict(self.meta))

    def save(self, directory: str | Path) -> Path:
        """Write `dataset.json` (and `images.npy` for in-memory pixels) into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        record = {
            "format_version": FORMAT_VERSION, "source": self.source, "image_ids": self.image_ids,
            "captions": self.captions, "skipped": dict(self.skipped), "meta": self.meta,
            "image_files": None if self.image_files is None else {k: str(v) for k, v in self.image_files.items()},
        }
        if self.pixels is not None:
            np.save(output_path(directory / PIXELS_FILE), self.pixels)
        output_path(directory / DATASET_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        return directory / DATASET_FILE

    @classmethod
    def load(cls, directory: str | Path) -> CaptionDataset:
        """Read a dataset written by `save`; clear errors for a missing or foreign file."""
        path = Path(directory) / DATASET_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run notebook 01_captions first")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); re-run notebook 01_captions") from None
        if record.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path} has format_version {record.get('format_version')!r}, expected "
                             f"{FORMAT_VERSION}; re-run notebook 01_captions")
        pixels = np.load(Path(directory) / PIXELS_FILE) if record["image_files"] is None else None
        files = None if record["image_files"] is None else {k: Path(v) for k, v in record["image_files"].items()}
        return cls(source=record["source"], image_ids=record["image_ids"], captions=record["captions"],
                   image_files=files, pixels=pixels, skipped=Counter(record["skipped"]), meta=record["meta"])


def save_ground_truth(directory: str | Path, chains: dict[str, list[str]]) -> Path:
    """Write the ground-truth concept chain (l1..l_max names) of every image."""
    path = output_path(Path(directory) / GROUND_TRUTH_FILE)
    path.write_text(json.dumps({"format_version": FORMAT_VERSION, "chains": chains}, ensure_ascii=False),
                    encoding="utf-8")
    return path


def load_ground_truth(directory: str | Path) -> dict[str, list[str]] | None:
    """Ground-truth chains of a synthetic run, or None when the source has none (real data)."""
    path = Path(directory) / GROUND_TRUTH_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["chains"]
