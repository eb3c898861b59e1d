"""The decoded-image cache: built once, reused, unreadable images skipped and counted (never blacked out)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from cglib.accounts import summary_lines
from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import build_image_cache, cache_key, open_image_cache
from cglib.encoding import images_to_pixels


def _pixel_dataset(n: int = 5, size: int = 16, seed: int = 0) -> CaptionDataset:
    rng = np.random.default_rng(seed)
    ids = [f"im{i}" for i in range(n)]
    return CaptionDataset(source="synthetic", image_ids=ids, captions={i: [f"caption {i}"] for i in ids},
                          pixels=rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8))


def _file_dataset(tmp_path) -> CaptionDataset:
    """Four JPEG/PNG files of odd shapes, one truncated JPEG, one not an image, one missing file."""
    rng = np.random.default_rng(1)
    files = {}
    for k, (w, h) in enumerate([(40, 30), (25, 50), (32, 32), (64, 20)]):
        path = tmp_path / f"ok{k}.{'jpg' if k % 2 else 'png'}"
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)
        files[f"ok{k}"] = path
    good = (tmp_path / "ok1.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(good[: len(good) // 2])
    files["cut"] = tmp_path / "cut.jpg"
    (tmp_path / "text.jpg").write_text("not an image")
    files["text"] = tmp_path / "text.jpg"
    files["gone"] = tmp_path / "gone.jpg"
    ids = ["ok0", "cut", "ok1", "text", "ok2", "gone", "ok3"]
    return CaptionDataset(source="coco", image_ids=ids, captions={i: ["a caption"] for i in ids},
                          image_files={i: files[i] for i in ids})


def test_pixel_dataset_is_cached_row_for_row(tmp_path):
    """In-memory images at the cache size are stored as they are; get() returns rows in the order asked."""
    ds = _pixel_dataset()
    cache = build_image_cache(ds, 16, tmp_path, progress=False)
    assert cache.pixels.shape == (5, 16, 16, 3) and cache.pixels.dtype == np.uint8
    assert isinstance(cache.pixels, np.memmap)
    np.testing.assert_array_equal(cache.pixels, ds.pixels)
    np.testing.assert_array_equal(cache.get(["im3", "im0", "im3"]), ds.pixels[[3, 0, 3]])
    assert cache.row("im4") == 4 and not cache.skipped


def test_resizes_to_the_clip_eval_crop(tmp_path):
    """Images of another size are resized (short side) and centre-cropped, as images_to_pixels does."""
    ds = _pixel_dataset(size=24)
    cache = build_image_cache(ds, 12, tmp_path, progress=False)
    assert cache.pixels.shape == (5, 12, 12, 3)
    expected = images_to_pixels([Image.fromarray(p) for p in ds.pixels], 12)
    np.testing.assert_array_equal(cache.pixels, expected)


def test_reused_when_built_and_rebuilt_when_the_data_changes(tmp_path):
    """Same ids, size and content reuse the files; other pixels or another size give another cache."""
    ds = _pixel_dataset()
    first = build_image_cache(ds, 16, tmp_path, progress=False)
    stamp = (first.directory / "pixels.npy").stat().st_mtime_ns
    again = build_image_cache(ds, 16, tmp_path, progress=False)
    assert again.directory == first.directory
    assert (again.directory / "pixels.npy").stat().st_mtime_ns == stamp
    assert open_image_cache(ds, 16, tmp_path) is not None
    changed = _pixel_dataset(seed=5)
    assert cache_key(changed, 16) != cache_key(ds, 16)
    assert cache_key(ds, 8) != cache_key(ds, 16)
    assert open_image_cache(changed, 16, tmp_path) is None


def test_unreadable_images_are_skipped_with_counts(tmp_path):
    """Truncated, non-image and missing files are left out and counted by reason; the rest are decoded."""
    ds = _file_dataset_dir(tmp_path)
    cache = build_image_cache(ds, 16, tmp_path / "cache", progress=False)
    assert cache.image_ids == ["ok0", "ok1", "ok2", "ok3"]
    assert cache.pixels.shape == (4, 16, 16, 3)
    assert sum(cache.skipped.values()) == 3
    assert cache.skipped["image file missing"] == 1 and cache.skipped["not an image"] == 1
    assert cache.skipped["corrupt or truncated image"] == 1
    assert set(cache.skipped_ids) == {"cut", "text", "gone"}
    for image_id in cache.image_ids:
        np.testing.assert_array_equal(cache.get([image_id])[0], images_to_pixels([ds.load_image(image_id)], 16)[0])
    assert cache.pixels.reshape(4, -1).max(axis=1).min() > 0  # no black stand-ins
    with pytest.raises(KeyError, match="skipped when the cache was built"):
        cache.row("cut")
    with pytest.raises(KeyError, match="not part of the cached dataset"):
        cache.row("never-seen")
    reopened = open_image_cache(ds, 16, tmp_path / "cache")
    assert reopened.image_ids == cache.image_ids and reopened.skipped == cache.skipped
    # the cache's account: every image of the dataset is a row built now (then kept from that build) or a skip
    reasons = {"corrupt or truncated image": 1, "image file missing": 1, "not an image": 1}
    assert cache.account() == {"images": 7, "size": 16, "from_earlier_build": 0, "built_now": 4, "skipped": 3,
                               "skipped_by_reason": reasons, "adds_up": True}
    assert reopened.account() == {**cache.account(), "from_earlier_build": 4, "built_now": 0}
    stage = {"kept": 0, "unit": "models trained", "skipped": {}, "failed": {}, "runs": {},
             "image_cache": {"16px": reopened.account()}}
    assert summary_lines({"training": stage})[1].strip() == (
        "image cache 16px: 7 images = 4 from an earlier build + 0 built now + 3 skipped (corrupt or truncated "
        "image: 1, image file missing: 1, not an image: 1)")


def _file_dataset_dir(tmp_path):
    (tmp_path / "files").mkdir()
    return _file_dataset(tmp_path / "files")


def test_pickles_without_the_pixels(tmp_path):
    """DataLoader workers receive the cache by pickle: the path travels, each process maps the file itself."""
    ds = _pixel_dataset(n=50, size=32)
    cache = build_image_cache(ds, 32, tmp_path, progress=False)
    _ = cache.pixels
    blob = pickle.dumps(cache)
    assert len(blob) < 10_000
    np.testing.assert_array_equal(pickle.loads(blob).get(["im7"]), ds.pixels[[7]])
