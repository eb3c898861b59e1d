"""HierarCaps test set (Alper and Averbuch-Elor, ECCV 2024): four caption levels per image, general first.

The CSV has columns `id`, `captions` (levels joined by " => "; the last is an original COCO caption) and
`image_url` (ending in the COCO val2014 file name, which is also the image's file name on disk).
Rows that cannot be used are skipped and counted per reason, never dropped silently.
"""

from __future__ import annotations

import csv
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cglib.data.coco import (
    CaptionFileError,
    image_problems,
    log_summary,
    normalize_caption,
    parse_coco_captions,
)
from cglib.data.dataset import CaptionDataset

logger = logging.getLogger(__name__)

LEVEL_SEPARATOR = " => "
N_LEVELS = 4
REQUIRED_COLUMNS = ("captions", "image_url")
CSV_FIX = ("give the HierarCaps test CSV (`cglib download hierarcaps --dest DIR` fetches it; `cglib download "
           "hierarcaps-1k --dest data/hierarcaps` fetches it with its images and captions)")


@dataclass(frozen=True)
class HierarCapsItem:
    """One test image and its caption chain, `levels[0]` most general, `levels[-1]` a COCO caption."""

    image_id: str  # the image file name without extension, e.g. "COCO_val2014_000000301718"
    image_file: Path
    levels: tuple[str, ...]

    @property
    def coco_id(self) -> int | None:
        """The integer COCO image id encoded at the end of the file name, or None when there is none."""
        tail = self.image_id.rsplit("_", 1)[-1]
        return int(tail) if tail.isdigit() else None


@dataclass
class HierarCapsSet:
    """The usable HierarCaps items in CSV order, and how many rows were skipped for each reason."""

    items: list[HierarCapsItem]
    skipped: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.items)


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a HierarCaps CSV as dicts; clear errors for a missing file, column or bad encoding."""
    if not path.is_file():
        raise FileNotFoundError(f"HierarCaps CSV not found: {path}; {CSV_FIX}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CaptionFileError(f"{path}: no column {missing[0]!r} (header: {reader.fieldnames}); "
                                       f"expected columns id,captions,image_url; {CSV_FIX}")
            return list(reader)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CaptionFileError(f"{path} is not a readable UTF-8 CSV ({exc}); {CSV_FIX}") from None


def load_hierarcaps(csv_path: str | Path, image_dir: str | Path, check_images: bool = True,
                    n_levels: int = N_LEVELS) -> HierarCapsSet:
    """Parse the HierarCaps CSV into items (CSV order); count and skip bad rows and bad images."""
    result = _parse(Path(csv_path), Path(image_dir), check_images, n_levels)
    message = (f"HierarCaps {Path(csv_path).name}: kept {len(result)} items; skipped "
               f"{', '.join(f'{k}: {v}' for k, v in sorted(result.skipped.items())) or 'nothing'}")
    (logger.warning if result.skipped else logger.info)(message)
    return result


def _parse(path: Path, image_dir: Path, check_images: bool, n_levels: int) -> HierarCapsSet:
    if not image_dir.is_dir():
        raise FileNotFoundError(f"HierarCaps image folder not found: {image_dir}; set data.hierarcaps_images "
                                "to the folder of COCO_val2014_*.jpg files named in the CSV")
    skipped: Counter = Counter()
    candidates: list[HierarCapsItem] = []
    seen: set[str] = set()
    for row in read_csv_rows(path):
        # A short row leaves trailing fields as None.
        levels = tuple(normalize_caption(t) for t in (row["captions"] or "").split(LEVEL_SEPARATOR))
        file_name = (row["image_url"] or "").strip().rsplit("/", 1)[-1]
        if len(levels) != n_levels:
            skipped["wrong number of levels"] += 1
        elif not all(levels):
            skipped["empty level"] += 1
        elif not file_name:
            skipped["no image url"] += 1
        elif Path(file_name).stem in seen:
            skipped["duplicate image"] += 1
        else:
            seen.add(Path(file_name).stem)
            candidates.append(HierarCapsItem(Path(file_name).stem, image_dir / file_name, levels))
    if check_images:
        problems = image_problems([item.image_file for item in candidates])
    else:
        problems = [None if item.image_file.is_file() else "image file missing" for item in candidates]
    items = [item for item, problem in zip(candidates, problems) if problem is None]
    skipped.update(problem for problem in problems if problem is not None)
    return HierarCapsSet(items=items, skipped=+skipped)


def load_hierarcaps_dataset(csv_path: str | Path, image_dir: str | Path, max_images: int | None = None,
                            coco_captions_json: str | Path | None = None,
                            check_images: bool = True) -> CaptionDataset:
    """The HierarCaps images as a CaptionDataset (ids = file stems, sorted); captions = the level-4 caption.

    With `coco_captions_json` (e.g. COCO captions_val2014.json), each image's other original COCO captions
    (matched on the COCO id in the file name) follow its level-4 caption.
    """
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1 or None, got {max_images}")
    hc = _parse(Path(csv_path), Path(image_dir), check_images, N_LEVELS)
    items = sorted(hc.items, key=lambda item: item.image_id)[:max_images]
    if not items:
        raise ValueError(f"no usable HierarCaps item in {csv_path} with images under {image_dir} "
                         f"(skipped: {dict(hc.skipped)})")
    captions = {item.image_id: [item.levels[-1]] for item in items}
    meta: dict = {"csv": str(csv_path), "image_dir": str(image_dir), "max_images": max_images,
                  "captions": "hierarcaps level 4 (an original COCO caption)", "images_checked": check_images}
    if coco_captions_json is not None:
        coco = parse_coco_captions(coco_captions_json)
        without = 0
        for item in items:
            others = coco.captions.get(item.coco_id, []) if item.coco_id is not None else []
            without += not others
            captions[item.image_id] += [c for c in others if c != item.levels[-1]]
        meta.update(captions="hierarcaps level 4 + the image's other COCO captions",
                    coco_captions_json=str(coco_captions_json), images_without_coco_captions=without)
        if without:
            logger.warning("%d HierarCaps images have no captions in %s; they keep only their level-4 "
                           "caption", without, coco_captions_json)
    dataset = CaptionDataset(
        source="hierarcaps", image_ids=[item.image_id for item in items], captions=captions,
        image_files={item.image_id: item.image_file for item in items}, skipped=Counter(hc.skipped),
        meta=meta)
    log_summary(dataset, f"HierarCaps dataset {Path(csv_path).name}", logger)
    return dataset
