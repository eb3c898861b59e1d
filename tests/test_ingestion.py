"""Caption ingestion: COCO captions JSON and the HierarCaps CSV -> CaptionDataset, with counted skips."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from cglib.config import parse_params
from cglib.data.coco import CaptionFileError, load_coco_captions, normalize_caption, parse_coco_captions
from cglib.data.dataset import CaptionDataset, ImageLoadError, check_image, open_image
from cglib.data.hierarcaps import HierarCapsItem, load_hierarcaps, load_hierarcaps_dataset
from cglib.magic.sources import load_captions

# ----------------------------------------------------------------------------------------------- fixtures


def write_jpeg(path: Path, seed: int = 0, size: int = 48) -> Path:
    """A real (noisy, so not trivially short) JPEG file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.effect_noise((size, size), 40 + seed).convert("RGB").save(path, quality=90)
    return path


def truncate(path: Path, keep: float = 0.6) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def coco_json(path: Path, images: list[dict], annotations: list[dict]) -> Path:
    path.write_text(json.dumps({"info": {}, "images": images, "annotations": annotations}), encoding="utf-8")
    return path


def img(image_id: int) -> dict:
    return {"id": image_id, "file_name": f"COCO_{image_id:012d}.jpg"}


def ann(image_id: int, caption: str) -> dict:
    return {"id": 1000 + image_id, "image_id": image_id, "caption": caption}


@pytest.fixture
def coco_dir(tmp_path: Path) -> Path:
    """Four good images (ids 1, 2, 3, 10: the numeric order differs from the string order)."""
    for i in (1, 2, 3, 10):
        write_jpeg(tmp_path / "images" / img(i)["file_name"], seed=i)
    return tmp_path


# ------------------------------------------------------------------------------------------ COCO: real data


def test_real_coco_captions_exact_counts(shared_data: Path) -> None:
    """The 1,000 real images all load; 4,746 annotations = 4,745 kept + 1 exact duplicate, counted."""
    hc = shared_data / "hierarcaps"
    ds = load_coco_captions(hc / "coco_captions_hc1k.json", hc / "test_imgs")
    assert (len(ds), ds.n_captions, ds.meta["n_annotations"]) == (1000, 4745, 4746)
    assert ds.skipped == Counter({"duplicate caption": 1})
    assert ds.image_ids == sorted(ds.image_ids, key=int) and ds.image_ids[0] == "139"
    assert ds.captions["32861"] == [  # its 5th caption repeats the 1st up to a double space
        "A man holding an umbrella in a hallway.", "A young man stands inside with an umbrella pouring rain.",
        "A person poses with a open umbrella indoors.",
        "A man standing in a hallway with an umbrella and rain coming down."]
    per_image = Counter(len(c) for c in ds.captions.values())
    assert sorted(per_image.items()) == [(2, 1), (3, 23), (4, 208), (5, 766), (6, 2)]
    assert all(f.is_file() for f in ds.image_files.values())
    print(f"checked 1,000 real images in {ds.meta['image_check_seconds']:.2f} s")


def test_real_coco_max_images_takes_first_ids(shared_data: Path) -> None:
    """max_images keeps the first N images by integer id, with all their captions."""
    hc = shared_data / "hierarcaps"
    full = parse_coco_captions(hc / "coco_captions_hc1k.json")
    ds = load_coco_captions(hc / "coco_captions_hc1k.json", hc / "test_imgs", max_images=25)
    assert ds.image_ids == [str(i) for i in sorted(full.captions)[:25]]
    assert all(ds.captions[i] == full.captions[int(i)] for i in ds.image_ids)


# ------------------------------------------------------------------------------------------ COCO: fixtures


def test_coco_order_normalisation_and_paths(coco_dir: Path) -> None:
    """Ids are str(COCO id) sorted numerically; whitespace is collapsed; paths come from file_name."""
    path = coco_json(coco_dir / "c.json", [img(10), img(3), img(1), img(2)],
                     [ann(10, "ten"), ann(3, "  a  dog\n runs\t"), ann(1, "one"), ann(2, "two"), ann(3, "x")])
    ds = load_coco_captions(path, coco_dir / "images")
    assert ds.image_ids == ["1", "2", "3", "10"]
    assert ds.captions["3"] == ["a dog runs", "x"]
    assert ds.image_files["10"] == coco_dir / "images" / "COCO_000000000010.jpg"
    assert ds.skipped == Counter() and ds.source == "coco"
    assert ds.load_image("3").size == (48, 48)


def test_coco_per_item_problems_are_counted(coco_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Bad captions (empty, duplicate, orphan) and bad images (no caption, missing, broken) are counted."""
    images = coco_dir / "images"
    write_jpeg(images / img(20)["file_name"])
    truncate(images / img(20)["file_name"])
    (images / img(21)["file_name"]).write_text("this is not a jpeg", encoding="utf-8")
    path = coco_json(
        coco_dir / "c.json", [img(1), img(2), img(3), img(10), img(20), img(21), img(30)],
        [ann(1, "A cat."), ann(1, "A  cat."), ann(1, "A cat!"), ann(2, "   "), ann(2, "two"),
         ann(99, "orphan"), ann(20, "truncated"), ann(21, "text file"), ann(30, "no file on disk")])
    with caplog.at_level(logging.INFO, logger="cglib.data.coco"):
        ds = load_coco_captions(path, images)
    assert ds.image_ids == ["1", "2"]
    assert ds.captions["1"] == ["A cat.", "A cat!"]
    assert ds.skipped == Counter({"duplicate caption": 1, "empty caption": 1,
                                  "caption for unknown image id": 1, "image without captions": 2,
                                  "corrupt or truncated image": 1, "not an image": 1,
                                  "image file missing": 1})
    line = [r for r in caplog.records if r.levelno == logging.WARNING][-1].getMessage()
    assert "kept 2 images, 3 captions" in line and "corrupt or truncated image: 1" in line


def test_coco_without_image_check_only_requires_existence(coco_dir: Path) -> None:
    """check_images=False keeps a truncated file (existence only) but still drops a missing one."""
    images = coco_dir / "images"
    truncate(images / img(3)["file_name"])
    path = coco_json(coco_dir / "c.json", [img(1), img(3), img(30)],
                     [ann(1, "one"), ann(3, "three"), ann(30, "gone")])
    ds = load_coco_captions(path, images, check_images=False)
    assert ds.image_ids == ["1", "3"] and ds.skipped == Counter({"image file missing": 1})
    with pytest.raises(ImageLoadError, match="truncated"):
        ds.load_image("3")


def test_coco_max_images_skips_bad_ones_first(coco_dir: Path) -> None:
    """max_images counts usable images: a broken image before the N-th does not shorten the result."""
    images = coco_dir / "images"
    truncate(images / img(2)["file_name"])
    path = coco_json(coco_dir / "c.json", [img(i) for i in (1, 2, 3, 10)],
                     [ann(i, f"caption {i}") for i in (1, 2, 3, 10)])
    ds = load_coco_captions(path, images, max_images=2)
    assert ds.image_ids == ["1", "3"]
    assert ds.skipped == Counter({"corrupt or truncated image": 1})


def test_coco_malformed_json_names_the_file(coco_dir: Path) -> None:
    """A truncated JSON file is a CaptionFileError (a ValueError) naming the file and the fix."""
    path = coco_dir / "broken.json"
    path.write_text('{"images": [{"id": 1, "file_name": "a.jpg"}], "annot', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json is not valid JSON.*captions_train2017") as err:
        load_coco_captions(path, coco_dir / "images")
    assert isinstance(err.value, CaptionFileError)


@pytest.mark.parametrize(("where", "field"), [("top", "images"), ("top", "annotations"), ("image", "id"),
                                              ("image", "file_name"), ("annotation", "image_id"),
                                              ("annotation", "caption")])
def test_coco_missing_field_is_a_specific_error(coco_dir: Path, where: str, field: str) -> None:
    """Each required field, when absent, raises a ValueError naming the file, the item and the field."""
    record = {"images": [img(1), img(2)], "annotations": [ann(1, "one"), ann(2, "two")]}
    if where == "top":
        del record[field]
    elif where == "image":
        del record["images"][1][field]
    else:
        del record["annotations"][1][field]
    path = coco_dir / "c.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    item = {"top": "the top-level object", "image": r"images\[1\]", "annotation": r"annotations\[1\]"}[where]
    message = rf"c\.json: {item} has no field '{field}'; give a COCO captions file"
    with pytest.raises(ValueError, match=message):
        load_coco_captions(path, coco_dir / "images")


@pytest.mark.parametrize(("record", "message"), [
    ([1, 2], "top level is a list"),
    ({"images": {}, "annotations": []}, "field 'images' is a dict, expected a list"),
    ({"images": [{"id": "1", "file_name": "a.jpg"}], "annotations": []}, r"images\[0\].id is '1'"),
    ({"images": [img(1)], "annotations": [{"image_id": 1, "caption": None}]},
     r"annotations\[0\].caption is None"),
    ({"images": [img(1), img(1)], "annotations": []}, "image id 1 is listed twice"),
])
def test_coco_wrong_types_are_specific_errors(coco_dir: Path, record: object, message: str) -> None:
    """Wrong JSON types and duplicated image ids are structural errors with a precise message."""
    path = coco_dir / "c.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(CaptionFileError, match=message):
        load_coco_captions(path, coco_dir / "images")


def test_coco_missing_paths_and_nothing_usable(coco_dir: Path) -> None:
    """A missing captions file or image folder is a FileNotFoundError; no usable image is a ValueError."""
    path = coco_json(coco_dir / "c.json", [img(50)], [ann(50, "nowhere")])
    with pytest.raises(FileNotFoundError, match="cglib download coco-annotations"):
        load_coco_captions(coco_dir / "nope.json", coco_dir / "images")
    with pytest.raises(FileNotFoundError, match="data.coco_images"):
        load_coco_captions(path, coco_dir / "no_such_dir")
    with pytest.raises(ValueError, match=r"no usable image .*image file missing"):
        load_coco_captions(path, coco_dir / "images")


def test_coco_dataset_round_trip_keeps_skips(coco_dir: Path, tmp_path: Path) -> None:
    """A loaded COCO dataset saves and reloads with its captions, files and skip counts."""
    path = coco_json(coco_dir / "c.json", [img(1), img(2)], [ann(1, "one"), ann(1, "one"), ann(2, "two")])
    ds = load_coco_captions(path, coco_dir / "images")
    back = CaptionDataset.load(Path(ds.save(tmp_path / "run")).parent)
    assert (back.image_ids, back.captions, back.image_files, back.skipped) == (
        ds.image_ids, ds.captions, ds.image_files, Counter({"duplicate caption": 1}))


def test_normalize_caption() -> None:
    """Whitespace of any kind collapses to single spaces; other characters are untouched."""
    assert normalize_caption("\t A\u00a0 b \n\nC. ") == "A b C."
    assert normalize_caption(" \n ") == ""


# ----------------------------------------------------------------------------------- image checks (dataset)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_check_image_detects_truncation(tmp_path: Path, fmt: str) -> None:
    """check_image passes a whole file and flags it cut short, with a reason key, as open_image does."""
    path = tmp_path / f"x.{fmt.lower()}"
    Image.effect_noise((64, 64), 50).convert("RGB").save(path, format=fmt)
    check_image(path)
    truncate(path, keep=0.97)
    for fn in (check_image, open_image):
        with pytest.raises(ImageLoadError, match="corrupt or truncated") as err:
            fn(path)
        assert err.value.reason == "corrupt or truncated image"


def test_image_error_reasons(tmp_path: Path) -> None:
    """Missing files and non-images get their own reason keys (used as skip-count keys)."""
    (tmp_path / "t.jpg").write_text("hello", encoding="utf-8")
    for path, reason in ((tmp_path / "none.jpg", "image file missing"), (tmp_path / "t.jpg", "not an image")):
        with pytest.raises(ImageLoadError) as err:
            check_image(path)
        assert err.value.reason == reason and str(path) in str(err.value)


# ------------------------------------------------------------------------------------- HierarCaps: real data


def test_real_hierarcaps_items(shared_data: Path) -> None:
    """1,000 items of 4 levels; 491 and 717 distinct strings at levels 1 and 2 (as PAPER_NOTES states)."""
    hc = shared_data / "hierarcaps"
    hset = load_hierarcaps(hc / "hierarcaps_test.csv", hc / "test_imgs")
    assert len(hset) == 1000 and hset.skipped == Counter()
    assert all(len(item.levels) == 4 for item in hset.items)
    assert [len({item.levels[k] for item in hset.items}) for k in range(4)] == [491, 717, 999, 1000]
    first = hset.items[0]  # CSV order
    levels = ("table", "table with plates", "table with three plates, with man and woman holding utensil",
              "A table with three plates with food and a man and a woman both holding utensil near plates.")
    stem = "COCO_val2014_000000301718"
    assert first == HierarCapsItem(stem, hc / "test_imgs" / f"{stem}.jpg", levels)
    assert first.coco_id == 301718
    with pytest.raises(AttributeError):
        first.image_id = "x"  # frozen


def test_real_hierarcaps_dataset_with_and_without_coco(shared_data: Path) -> None:
    """Default: one caption (level 4) per image; with the COCO json, all the image's COCO captions."""
    hc = shared_data / "hierarcaps"
    ds = load_hierarcaps_dataset(hc / "hierarcaps_test.csv", hc / "test_imgs")
    assert len(ds) == 1000 and ds.n_captions == 1000 and ds.image_ids == sorted(ds.image_ids)
    assert ds.image_ids[0] == "COCO_val2014_000000000139" and ds.source == "hierarcaps"
    full = load_hierarcaps_dataset(hc / "hierarcaps_test.csv", hc / "test_imgs",
                                   coco_captions_json=hc / "coco_captions_hc1k.json")
    coco = load_coco_captions(hc / "coco_captions_hc1k.json", hc / "test_imgs", check_images=False)
    assert full.n_captions == coco.n_captions == 4745 and full.meta["images_without_coco_captions"] == 0
    for image_id in full.image_ids:  # level 4 first, then the same COCO captions as the COCO loader
        assert full.captions[image_id][0] == ds.captions[image_id][0]
        assert sorted(full.captions[image_id]) == sorted(coco.captions[str(int(image_id.rsplit("_", 1)[1]))])
    small = load_hierarcaps_dataset(hc / "hierarcaps_test.csv", hc / "test_imgs", max_images=7)
    assert small.image_ids == ds.image_ids[:7]


def test_sources_reads_both_real_sources(shared_data: Path) -> None:
    """cglib.magic.sources.load_captions builds the coco and hierarcaps datasets from params."""
    hc = shared_data / "hierarcaps"
    for data, n in (({"source": "coco", "coco_captions": str(hc / "coco_captions_hc1k.json"),
                      "coco_images": str(hc / "test_imgs"), "max_images": 12}, 12),
                    ({"source": "hierarcaps", "hierarcaps_csv": str(hc / "hierarcaps_test.csv"),
                      "hierarcaps_images": str(hc / "test_imgs"), "max_images": 9}, 9)):
        ds, truth = load_captions(parse_params({"data": data}, root=hc))
        assert (ds.source, len(ds), truth) == (data["source"], n, None)


# -------------------------------------------------------------------------------------- HierarCaps: fixtures


def hc_row(row_id: int, levels: list[str], image: str) -> str:
    captions = " => ".join(levels)
    return f'{row_id},"{captions}",http://images.cocodataset.org/val2014/{image}\n'


def test_hierarcaps_per_row_problems_are_counted(tmp_path: Path) -> None:
    """Wrong level counts, empty levels, duplicate/missing/broken images: skipped and counted per reason."""
    images = tmp_path / "imgs"
    for i in range(1, 5):
        write_jpeg(images / f"COCO_val2014_{i:012d}.jpg", seed=i)
    truncate(images / "COCO_val2014_000000000004.jpg")
    rows = [
        hc_row(0, ["b", "bird", "a bird", "A bird on a branch."], "COCO_val2014_000000000002.jpg"),
        hc_row(1, ["a", "animal", "a  dog", "A dog runs."], "COCO_val2014_000000000001.jpg"),
        hc_row(2, ["x", "y", "z"], "COCO_val2014_000000000003.jpg"),
        hc_row(3, ["x", "y", "z", "w", "v"], "COCO_val2014_000000000003.jpg"),
        hc_row(4, ["x", " ", "z", "w"], "COCO_val2014_000000000003.jpg"),
        hc_row(5, ["c", "cat", "a cat", "A cat."], "COCO_val2014_000000000001.jpg"),
        hc_row(6, ["c", "cat", "a cat", "A cat."], "COCO_val2014_000000000004.jpg"),
        hc_row(7, ["c", "cat", "a cat", "A cat."], "COCO_val2014_000000000009.jpg"),
        '8,"c => cat => a cat => A cat.",\n',
    ]
    csv_path = tmp_path / "hc.csv"
    csv_path.write_text("id,captions,image_url\n" + "".join(rows), encoding="utf-8")
    hset = load_hierarcaps(csv_path, images)
    assert [i.image_id for i in hset.items] == ["COCO_val2014_000000000002", "COCO_val2014_000000000001"]
    assert hset.items[1].levels == ("a", "animal", "a dog", "A dog runs.")
    assert hset.skipped == Counter({"wrong number of levels": 2, "empty level": 1, "duplicate image": 1,
                                    "corrupt or truncated image": 1, "image file missing": 1,
                                    "no image url": 1})
    ds = load_hierarcaps_dataset(csv_path, images)
    assert ds.image_ids == ["COCO_val2014_000000000001", "COCO_val2014_000000000002"]
    assert ds.captions["COCO_val2014_000000000001"] == ["A dog runs."] and ds.skipped == hset.skipped


def test_hierarcaps_attaches_coco_captions(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """COCO captions attach by the id in the file name; an image without any keeps level 4 and is reported."""
    images = tmp_path / "imgs"
    for i in (1, 2):
        write_jpeg(images / f"COCO_val2014_{i:012d}.jpg", seed=i)
    csv_path = tmp_path / "hc.csv"
    csv_path.write_text("id,captions,image_url\n"
                        + hc_row(0, ["a", "b", "c", "A dog runs."], "COCO_val2014_000000000001.jpg")
                        + hc_row(1, ["a", "b", "c", "A cat sits."], "COCO_val2014_000000000002.jpg"),
                        encoding="utf-8")
    coco = coco_json(tmp_path / "c.json", [img(1), img(2)],
                     [ann(1, "A dog is running."), ann(1, "A dog  runs."), ann(1, "Dog running.")])
    with caplog.at_level(logging.WARNING):
        ds = load_hierarcaps_dataset(csv_path, images, coco_captions_json=coco)
    assert ds.captions == {"COCO_val2014_000000000001": ["A dog runs.", "A dog is running.", "Dog running."],
                           "COCO_val2014_000000000002": ["A cat sits."]}
    assert ds.meta["images_without_coco_captions"] == 1
    assert any("1 HierarCaps images have no captions" in r.getMessage() for r in caplog.records)


def test_hierarcaps_bad_files(tmp_path: Path) -> None:
    """A missing CSV, a missing column or a missing image folder is a specific error naming the fix."""
    (tmp_path / "imgs").mkdir()
    with pytest.raises(FileNotFoundError, match="cglib download hierarcaps"):
        load_hierarcaps(tmp_path / "none.csv", tmp_path / "imgs")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,caption,url\n0,a => b => c => d,x.jpg\n", encoding="utf-8")
    with pytest.raises(CaptionFileError, match=r"bad\.csv: no column 'captions'"):
        load_hierarcaps(bad, tmp_path / "imgs")
    with pytest.raises(FileNotFoundError, match="data.hierarcaps_images"):
        load_hierarcaps(bad, tmp_path / "no_imgs")
    with pytest.raises(CaptionFileError, match="not a readable UTF-8 CSV"):
        (tmp_path / "latin.csv").write_bytes(b"id,captions,image_url\n0,caf\xe9 => b => c => d,x.jpg\n")
        load_hierarcaps(tmp_path / "latin.csv", tmp_path / "imgs")
