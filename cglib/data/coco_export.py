"""The synthetic world written out as COCO-format files, so the COCO code path runs without COCO.

`write_coco_files` writes any in-memory `CaptionDataset` as a standard COCO captions file (`images` with `id`,
`file_name`, `width`, `height`; `annotations` with `id`, `image_id`, `caption`) and one image file per image;
`load_coco_captions` reads it back with the same captions and nothing skipped. `write_synthetic_coco` renders
a world and also writes a HierarCaps-format CSV for scenes of another seed (unseen images, like HierarCaps'
COCO val2014 photographs beside COCO train2017), so a profile with `data.source: coco` and `eval.hierarcaps`
(the rehearsal of the paper profile) runs end to end where the HierarCaps 1K data is absent.
"""

from __future__ import annotations

import csv
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image

from cglib.data.dataset import CaptionDataset
from cglib.data.hierarcaps import LEVEL_SEPARATOR, N_LEVELS
from cglib.data.synthetic import make_world

ImageFormat = Literal["png", "jpg"]
CAPTIONS_FILE = "captions_synthetic.json"
HIERARCAPS_FILE = "hierarcaps_test.csv"


@dataclass(frozen=True)
class CocoFiles:
    """Where an export went: the captions JSON, its image folder, and the COCO id given to each image id."""

    captions_json: Path
    image_dir: Path
    coco_ids: dict[str, int]


def coco_file_name(coco_id: int, image_format: ImageFormat, prefix: str = "synthetic") -> str:
    """COCO-style file name ending in the zero-padded id (HierarCaps reads the id back from it)."""
    return f"{prefix}_{coco_id:012d}.{image_format}"


def _save(image: Image.Image, path: Path, image_format: ImageFormat) -> None:
    if image_format == "png":
        image.save(path, format="PNG")  # lossless: the files decode to the world's exact pixels
    else:
        image.save(path, format="JPEG", quality=95)


def write_images(dataset: CaptionDataset, image_dir: str | Path, image_format: ImageFormat = "png",
                 first_id: int = 1, prefix: str = "synthetic", workers: int = 2) -> dict[str, str]:
    """Save every image of `dataset` under `image_dir` with COCO ids first_id, first_id+1, ...; id -> file name."""
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format must be 'png' or 'jpg', got {image_format!r}")
    image_dir = Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    names = {image_id: coco_file_name(first_id + row, image_format, prefix)
             for row, image_id in enumerate(dataset.image_ids)}

    def save(image_id: str) -> None:
        _save(dataset.load_image(image_id), image_dir / names[image_id], image_format)

    # PIL encodes outside the GIL, so a few threads keep the disk busy.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(save, dataset.image_ids, chunksize=256))
    return names


def write_coco_files(dataset: CaptionDataset, captions_json: str | Path, image_dir: str | Path,
                     image_format: ImageFormat = "png", first_id: int = 1, prefix: str = "synthetic",
                     workers: int = 2) -> CocoFiles:
    """Write `dataset` as a COCO captions file plus one image file per image (COCO ids first_id, first_id+1, ...)."""
    captions_json = Path(captions_json)
    captions_json.parent.mkdir(parents=True, exist_ok=True)
    names = write_images(dataset, image_dir, image_format, first_id, prefix, workers)
    coco_ids = {image_id: first_id + row for row, image_id in enumerate(dataset.image_ids)}
    images, annotations = [], []
    for image_id in dataset.image_ids:
        height, width = _size(dataset, image_id)
        images.append({"id": coco_ids[image_id], "file_name": names[image_id], "width": width, "height": height})
        for caption in dataset.captions[image_id]:
            annotations.append({"id": len(annotations) + 1, "image_id": coco_ids[image_id], "caption": caption})
    record = {"info": {"description": f"cglib export of a {dataset.source} dataset in COCO captions format",
                       "source_meta": dataset.meta},
              "licenses": [], "images": images, "annotations": annotations}
    captions_json.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return CocoFiles(captions_json=captions_json, image_dir=Path(image_dir), coco_ids=coco_ids)


def _size(dataset: CaptionDataset, image_id: str) -> tuple[int, int]:
    """(height, width) of an image, without decoding a file when the pixels are in memory."""
    if dataset.pixels is not None:
        return int(dataset.pixels.shape[1]), int(dataset.pixels.shape[2])
    image = dataset.load_image(image_id)
    return image.height, image.width


def write_hierarcaps_csv(dataset: CaptionDataset, chains: dict[str, list[str]], csv_path: str | Path,
                         image_dir: str | Path, image_format: ImageFormat = "png", first_id: int = 1,
                         prefix: str = "synthetic_hc") -> Path:
    """Write a HierarCaps-format CSV (and its images): levels l3 => l2 => l1 => the image's first caption."""
    if N_LEVELS != 4:
        raise ValueError(f"the HierarCaps format has {N_LEVELS} levels; this writer fills 3 concepts + a caption")
    names = write_images(dataset, image_dir, image_format, first_id, prefix)
    csv_path = Path(csv_path)
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "captions", "image_url"])
        for row, image_id in enumerate(dataset.image_ids):
            chain = chains[image_id]
            if len(chain) < N_LEVELS - 1:
                raise ValueError(f"image {image_id} has a chain of {len(chain)} levels; HierarCaps needs "
                                 f"{N_LEVELS - 1} concept levels (render the world with levels >= 3)")
            # HierarCaps goes from general to specific and ends in an original caption.
            levels = [*reversed(chain[:N_LEVELS - 1]), dataset.captions[image_id][0]]
            writer.writerow([row, LEVEL_SEPARATOR.join(levels), f"synthetic://hierarcaps/{names[image_id]}"])
    return csv_path


@dataclass(frozen=True)
class SyntheticCoco:
    """Paths of an exported synthetic world: COCO captions + images, HierarCaps CSV + images (or None)."""

    captions_json: Path
    image_dir: Path
    hierarcaps_csv: Path | None
    hierarcaps_images: Path | None
    n_images: int
    n_captions: int

    def data_params(self) -> dict[str, str | None]:
        """The `data` section keys that point a profile at these files."""
        return {"source": "coco", "coco_captions": str(self.captions_json), "coco_images": str(self.image_dir),
                "hierarcaps_csv": None if self.hierarcaps_csv is None else str(self.hierarcaps_csv),
                "hierarcaps_images": None if self.hierarcaps_images is None else str(self.hierarcaps_images)}


def write_synthetic_coco(dest: str | Path, images_per_concept: int = 6, seed: int = 0, image_size: int = 64,
                         captions_per_image: int = 5, image_format: ImageFormat = "png",
                         hierarcaps_per_concept: int = 2, workers: int = 2) -> SyntheticCoco:
    """Render the synthetic world and write it under `dest` as COCO files (+ a HierarCaps CSV from seed+1's scenes).

    Layout: `dest/annotations/captions_synthetic.json`, `dest/images/`, `dest/hierarcaps/hierarcaps_test.csv`,
    `dest/hierarcaps/test_imgs/`. `hierarcaps_per_concept: 0` writes no HierarCaps files.
    """
    dest = Path(dest)
    world = make_world(images_per_concept=images_per_concept, seed=seed, image_size=image_size,
                       captions_per_image=captions_per_image)
    files = write_coco_files(world.dataset, dest / "annotations" / CAPTIONS_FILE, dest / "images", image_format,
                             workers=workers)
    hc_csv = hc_images = None
    if hierarcaps_per_concept > 0:
        # Another seed's scenes: images no MAGIC split has seen, as HierarCaps' val2014 photos are to train2017.
        held_out = make_world(images_per_concept=hierarcaps_per_concept, seed=seed + 1, image_size=image_size,
                              captions_per_image=1)
        hc_images = dest / "hierarcaps" / "test_imgs"
        # Ids after the world's, so evaluation's overlap check (by COCO id) finds none, as with val2014.
        hc_csv = write_hierarcaps_csv(held_out.dataset, held_out.ground_truth, dest / "hierarcaps" / HIERARCAPS_FILE,
                                      hc_images, image_format, first_id=len(world.dataset) + 1)
    return SyntheticCoco(captions_json=files.captions_json, image_dir=files.image_dir, hierarcaps_csv=hc_csv,
                         hierarcaps_images=hc_images, n_images=len(world.dataset),
                         n_captions=world.dataset.n_captions)
