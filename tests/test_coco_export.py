"""The synthetic world written as COCO-format files reads back through the project's COCO and HierarCaps loaders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cglib.cli import main as cli_main
from cglib.data.coco import load_coco_captions
from cglib.data.coco_export import write_coco_files, write_synthetic_coco
from cglib.data.hierarcaps import load_hierarcaps
from cglib.data.synthetic import make_world


@pytest.fixture(scope="module")
def world():
    return make_world(images_per_concept=2, seed=3, image_size=32, captions_per_image=3)


def test_png_export_loads_with_zero_skips_same_captions_same_pixels(world, tmp_path: Path) -> None:
    """Every image and caption comes back through load_coco_captions: nothing skipped, captions and pixels equal."""
    files = write_coco_files(world.dataset, tmp_path / "annotations" / "captions_x.json", tmp_path / "images")
    loaded = load_coco_captions(files.captions_json, files.image_dir)
    assert not loaded.skipped
    assert len(loaded) == len(world.dataset) and loaded.n_captions == world.dataset.n_captions
    for image_id, coco_id in files.coco_ids.items():
        assert loaded.captions[str(coco_id)] == world.dataset.captions[image_id]
        # PNG is lossless: the file decodes to the rendered pixels exactly
        assert np.array_equal(np.asarray(loaded.load_image(str(coco_id))), np.asarray(world.dataset.load_image(image_id)))


def test_export_is_standard_coco_captions_format(world, tmp_path: Path) -> None:
    """The JSON carries the standard COCO captions fields, one annotation per caption, unique ids."""
    files = write_coco_files(world.dataset, tmp_path / "c.json", tmp_path / "img", image_format="jpg")
    record = json.loads(files.captions_json.read_text())
    assert set(record) >= {"info", "licenses", "images", "annotations"}
    assert all(set(im) == {"id", "file_name", "width", "height"} and im["width"] == 32 for im in record["images"])
    assert all(set(a) == {"id", "image_id", "caption"} for a in record["annotations"])
    assert len({a["id"] for a in record["annotations"]}) == len(record["annotations"]) == world.dataset.n_captions
    assert all((files.image_dir / im["file_name"]).suffix == ".jpg" for im in record["images"])
    loaded = load_coco_captions(files.captions_json, files.image_dir)
    assert not loaded.skipped and len(loaded) == len(world.dataset)


def test_synthetic_coco_with_hierarcaps_files(tmp_path: Path) -> None:
    """write_synthetic_coco writes COCO files and a HierarCaps CSV of other scenes whose ids never collide."""
    out = write_synthetic_coco(tmp_path, images_per_concept=1, seed=0, image_size=32, captions_per_image=2,
                               hierarcaps_per_concept=1)
    coco = load_coco_captions(out.captions_json, out.image_dir)
    assert not coco.skipped and len(coco) == out.n_images and coco.n_captions == out.n_captions
    hc = load_hierarcaps(out.hierarcaps_csv, out.hierarcaps_images)
    assert not hc.skipped and len(hc) == out.n_images  # one per concept, as the world has
    assert all(len(item.levels) == 4 for item in hc.items)
    assert not {item.coco_id for item in hc.items} & {int(i) for i in coco.image_ids}
    # general to specific: the first level is an l3 concept name, the last a caption ending in a full stop
    assert all(item.levels[-1].endswith(".") and not item.levels[0].endswith(".") for item in hc.items)


def test_cli_writes_files_and_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`cglib synthetic-coco` writes the files and prints the data keys; bad sizes exit 2 with the reason."""
    assert cli_main(["synthetic-coco", "--dest", str(tmp_path / "w"), "--images-per-concept", "1",
                     "--image-size", "32", "--hierarcaps-per-concept", "0"]) == 0
    printed = capsys.readouterr().out
    assert "coco_captions:" in printed and "hierarcaps_csv" not in printed
    assert (tmp_path / "w" / "annotations" / "captions_synthetic.json").is_file()
    assert cli_main(["synthetic-coco", "--dest", str(tmp_path / "bad"), "--images-per-concept", "0"]) == 2
    assert "images_per_concept" in capsys.readouterr().err
