"""COCO captions (`captions_*.json`) -> `CaptionDataset`, with every dropped item counted by reason.

Structural problems (bad JSON, a missing field) stop with a ValueError that names the file, the field and
the fix. Per-item problems (an empty caption, a caption for an unknown image, an image without captions,
a missing or unreadable image file) are skipped and counted in `dataset.skipped`, and summarised in one
logged line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cglib.data.dataset import CaptionDataset, ImageLoadError, check_image

logger = logging.getLogger(__name__)

COCO_FIX = "give a COCO captions file such as annotations/captions_train2017.json"


class CaptionFileError(ValueError):
    """A captions file (COCO JSON, HierarCaps CSV) is malformed; the message names the file, field and fix."""


@dataclass
class CocoCaptions:
    """A parsed COCO captions file: file names and normalised captions per integer image id."""

    path: Path
    file_names: dict[int, str]
    captions: dict[int, list[str]]  # only images with at least one caption, annotation order
    skipped: Counter = field(default_factory=Counter)
    n_annotations: int = 0


def normalize_caption(text: str) -> str:
    """Collapse runs of whitespace (spaces, tabs, newlines) to one space and strip the ends."""
    return " ".join(text.split())


def _field(record: dict, key: str, where: str, path: Path) -> object:
    if not isinstance(record, dict) or key not in record:
        raise CaptionFileError(f"{path}: {where} has no field {key!r}; {COCO_FIX}")
    return record[key]


def parse_coco_captions(captions_json: str | Path) -> CocoCaptions:
    """Read and validate a COCO captions file; group normalised captions per image (no disk access)."""
    path = Path(captions_json)
    if not path.is_file():
        raise FileNotFoundError(f"COCO captions file not found: {path}; {COCO_FIX} "
                                "(`cglib download coco-annotations --dest DIR` fetches it)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CaptionFileError(f"{path} is not valid JSON ({exc}); re-download it or {COCO_FIX}") from None
    if not isinstance(record, dict):
        raise CaptionFileError(f"{path}: top level is a {type(record).__name__}, expected an object with "
                         f"'images' and 'annotations'; {COCO_FIX}")
    images = _field(record, "images", "the top-level object", path)
    annotations = _field(record, "annotations", "the top-level object", path)
    for key, value in (("images", images), ("annotations", annotations)):
        if not isinstance(value, list):
            raise CaptionFileError(f"{path}: field {key!r} is a {type(value).__name__}, expected a list; "
                                   f"{COCO_FIX}")

    file_names: dict[int, str] = {}
    for n, image in enumerate(images):
        image_id = _field(image, "id", f"images[{n}]", path)
        file_name = _field(image, "file_name", f"images[{n}]", path)
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise CaptionFileError(f"{path}: images[{n}].id is {image_id!r}, expected an integer COCO id; "
                                   f"{COCO_FIX}")
        if not isinstance(file_name, str) or not file_name:
            raise CaptionFileError(f"{path}: images[{n}].file_name is {file_name!r}, expected a file name; "
                                   f"{COCO_FIX}")
        if image_id in file_names:
            raise CaptionFileError(f"{path}: image id {image_id} is listed twice in 'images' (images[{n}]); "
                             "fix or regenerate the file so that each image appears once")
        file_names[image_id] = file_name

    skipped: Counter = Counter()
    captions: dict[int, list[str]] = {}
    seen: dict[int, set[str]] = {}
    for n, annotation in enumerate(annotations):
        image_id = _field(annotation, "image_id", f"annotations[{n}]", path)
        caption = _field(annotation, "caption", f"annotations[{n}]", path)
        if not isinstance(caption, str):
            raise CaptionFileError(f"{path}: annotations[{n}].caption is {caption!r}, expected a string; "
                                   f"{COCO_FIX}")
        if image_id not in file_names:
            skipped["caption for unknown image id"] += 1
            continue
        text = normalize_caption(caption)
        if not text:
            skipped["empty caption"] += 1
            continue
        # Exact repeats (after whitespace normalisation) add nothing and would double-count a positive.
        if text in seen.setdefault(image_id, set()):
            skipped["duplicate caption"] += 1
            continue
        seen[image_id].add(text)
        captions.setdefault(image_id, []).append(text)
    skipped["image without captions"] += len(file_names) - len(captions)
    return CocoCaptions(path=path, file_names=file_names, captions=captions, skipped=+skipped,
                        n_annotations=len(annotations))


def _image_problem(path: Path) -> str | None:
    """The skip reason of an image file, or None when it decodes."""
    try:
        check_image(path)
    except ImageLoadError as exc:
        return exc.reason
    return None


def image_problems(paths: list[Path], workers: int | None = None) -> list[str | None]:
    """Skip reason (or None) for each image, checked in parallel threads (PIL decodes outside the GIL)."""
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_image_problem, paths, chunksize=64))


def summary_line(dataset: CaptionDataset, what: str) -> str:
    """One line: how many images and captions were kept, and every skip reason with its count."""
    skipped = ", ".join(f"{reason}: {count}" for reason, count in sorted(dataset.skipped.items()))
    return (f"{what}: kept {len(dataset)} images, {dataset.n_captions} captions; "
            f"skipped {skipped or 'nothing'}")


def log_summary(dataset: CaptionDataset, what: str, log: logging.Logger = logger) -> None:
    """Log the summary line; as a warning (visible by default) when anything was skipped."""
    (log.warning if dataset.skipped else log.info)(summary_line(dataset, what))


def load_coco_captions(captions_json: str | Path, image_dir: str | Path, max_images: int | None = None,
                       check_images: bool = True) -> CaptionDataset:
    """COCO captions as a CaptionDataset (ids = str(COCO id), sorted by id); drops are counted in `skipped`.

    `max_images` keeps the first N usable images in id order (images are checked only until N are found).
    With `check_images`, every kept image is decoded to its last byte, so truncated files are caught here;
    without it only existence is checked. `skipped` counts the caption problems of the whole file and the
    image problems of the images inspected.
    """
    image_dir = Path(image_dir)
    if not image_dir.is_dir():
        raise FileNotFoundError(f"COCO image folder not found: {image_dir}; set data.coco_images to the "
                                "folder holding the images named in the captions file (e.g. train2017/)")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1 or None, got {max_images}")
    parsed = parse_coco_captions(captions_json)
    skipped = Counter(parsed.skipped)
    candidates = sorted(parsed.captions)
    kept: list[int] = []
    start = time.perf_counter()
    # Check in chunks so that a small max_images never decodes a whole 118k-image folder.
    chunk = 2048 if max_images is None else max(64, max_images)
    for begin in range(0, len(candidates), chunk):
        ids = candidates[begin:begin + chunk]
        paths = [image_dir / parsed.file_names[i] for i in ids]
        if check_images:
            problems = image_problems(paths)
        else:
            problems = [None if p.is_file() else "image file missing" for p in paths]
        for image_id, problem in zip(ids, problems):
            if max_images is not None and len(kept) == max_images:
                break
            if problem is None:
                kept.append(image_id)
            else:
                skipped[problem] += 1
        if max_images is not None and len(kept) == max_images:
            break
    check_seconds = time.perf_counter() - start
    if not kept:
        raise ValueError(f"no usable image in {parsed.path} under {image_dir} (skipped: {dict(skipped)}); "
                         "check that data.coco_images is the folder of this captions file's images")
    ids = [str(i) for i in kept]
    dataset = CaptionDataset(
        source="coco", image_ids=ids, captions={str(i): parsed.captions[i] for i in kept},
        image_files={str(i): image_dir / parsed.file_names[i] for i in kept}, skipped=+skipped,
        meta={"captions_json": str(parsed.path), "image_dir": str(image_dir),
              "n_annotations": parsed.n_annotations, "max_images": max_images, "images_checked": check_images,
              "image_check_seconds": round(check_seconds, 3)})
    log_summary(dataset, f"COCO captions {parsed.path.name}")
    return dataset
