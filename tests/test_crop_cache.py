"""train.augment: open_clip_train draws open_clip's training crops from a cache of images kept with their aspect
ratio: the same boxes as open_clip's own transform for the same generator state, on real photographs, and the same
pixels as that transform up to the cache's downscaling."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
from open_clip.constants import OPENAI_DATASET_MEAN as CLIP_MEAN
from open_clip.constants import OPENAI_DATASET_STD as CLIP_STD
from PIL import Image

from cglib.data.crop_cache import SHORT_SIDE_MARGIN, build_crop_cache, crop_box, stored_size
from cglib.data.dataset import CaptionDataset

SIZE = 64
PHOTOS = 12


def photographs(shared_data) -> CaptionDataset:
    files = sorted((shared_data / "hierarcaps" / "test_imgs").glob("*.jpg"))[:PHOTOS]
    return CaptionDataset(source="hierarcaps-photos", image_ids=[f.stem for f in files],
                          captions={f.stem: ["a photograph"] for f in files},
                          image_files={f.stem: str(f) for f in files})


def open_clip_train_transform(size: int):
    """open_clip's training transform for a model of input size `size` (RandomResizedCrop at scale 0.9-1, bicubic,
    to RGB, to tensor, CLIP's normalization)."""
    return open_clip.image_transform(size, is_train=True, mean=CLIP_MEAN, std=CLIP_STD)


def as_uint8(normalized: torch.Tensor) -> np.ndarray:
    """The transform's normalized (3, S, S) output back to uint8 (S, S, 3) pixels."""
    mean, std = torch.tensor(CLIP_MEAN).view(3, 1, 1), torch.tensor(CLIP_STD).view(3, 1, 1)
    return (normalized * std + mean).mul(255).round().clamp(0, 255).byte().permute(1, 2, 0).numpy()


def test_the_boxes_are_torchvisions_for_the_same_generator_state(shared_data):
    """For every photograph and 50 seeds, crop_box with a generator seeded s gives the box RandomResizedCrop draws
    after torch.manual_seed(s) (open_clip's transform draws from the global generator), fallback included."""
    import torchvision.transforms as T

    draw = T.RandomResizedCrop(SIZE, scale=(0.9, 1.0))
    for path in sorted((shared_data / "hierarcaps" / "test_imgs").glob("*.jpg"))[:PHOTOS]:
        image = Image.open(path)
        for seed in range(50):
            torch.manual_seed(seed)
            theirs = draw.get_params(image, draw.scale, draw.ratio)
            assert crop_box(*image.size, torch.Generator().manual_seed(seed)) == theirs, (path.name, seed)
    # a panorama: no box of 90% of its area fits 4:3, so after 10 tries both take the central 4:3 crop
    torch.manual_seed(0)
    panorama = Image.new("RGB", (400, 100))
    assert crop_box(400, 100, torch.Generator().manual_seed(0)) == draw.get_params(panorama, draw.scale, draw.ratio)


def test_crops_follow_open_clips_training_transform_on_photographs(shared_data, tmp_path):
    """The cache keeps each photograph at a short side of ceil(1.25 * 64) = 80 (aspect ratio kept); its crops for a
    generator seeded s are open_clip's transform's output after torch.manual_seed(s), from the full JPEG, within a
    mean 2 and a 99th percentile 10 grey levels (measured: 1.15 and 9; the downscaling rounds each pixel once
    more); a crop of another seed is 5x further away at least (measured: 11.2). Stored at its own size, a
    photograph gives the transform's pixels exactly."""
    dataset = photographs(shared_data)
    cache = build_crop_cache(dataset, SIZE, tmp_path, progress=False)
    transform = open_clip_train_transform(SIZE)
    gaps, other = [], []
    for image_id in dataset.image_ids:
        image = dataset.load_image(image_id)
        assert cache.originals[cache.image_ids.index(image_id)] == image.size
        assert min(cache.image(image_id).size) == int(np.ceil(SHORT_SIDE_MARGIN * SIZE))
        for seed in range(3):
            torch.manual_seed(seed)
            theirs = as_uint8(transform(image)).astype(int)
            ours = cache.crops([image_id], torch.Generator().manual_seed(seed))[0].astype(int)
            gaps.append(np.abs(ours - theirs))
            other.append(np.abs(cache.crops([image_id], torch.Generator().manual_seed(seed + 100))[0] - theirs))
    gaps = np.stack(gaps)
    assert gaps.mean() < 2 and np.percentile(gaps, 99) <= 10
    assert np.stack(other).mean() > 5 * gaps.mean()

    full = build_crop_cache(dataset, 1000, tmp_path, progress=False)  # no photograph is reduced at this size
    image_id = dataset.image_ids[0]
    assert full.image(image_id).size == full.originals[0] == stored_size(*full.originals[0], 1000)
    torch.manual_seed(5)
    theirs = as_uint8(open_clip_train_transform(1000)(dataset.load_image(image_id)))
    assert np.array_equal(full.crops([image_id], torch.Generator().manual_seed(5))[0], theirs)


def test_the_cache_is_reused_and_counts_an_unreadable_image(shared_data, tmp_path):
    dataset = photographs(shared_data)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    dataset.image_ids.append("broken")
    dataset.captions["broken"] = ["a photograph"]
    dataset.image_files["broken"] = str(broken)
    cache = build_crop_cache(dataset, SIZE, tmp_path / "cache", progress=False)
    assert len(cache) == PHOTOS and "broken" not in cache and sum(cache.skipped.values()) == 1
    with pytest.raises(KeyError, match="broken is not in the crop cache .*: it was skipped when the cache was built"):
        cache.crops(["broken"], torch.Generator())
    again = build_crop_cache(dataset, SIZE, tmp_path / "cache", progress=False)
    assert again.directory == cache.directory and again.image_ids == cache.image_ids


def test_a_run_with_augmentation_trains_on_crops_and_resumes_bit_exactly(tmp_path):
    """train.augment: open_clip_train enters the run's spec (none leaves it as before), trains on other pixels than
    the eval crops (other weights), and a run interrupted mid-epoch resumes to the same weights and log: the crops
    of a batch are a function of (seed, epoch, batch)."""
    from prepared_runs import train_one_prepared
    from test_train import _final_and_log, _interrupt_at, make_run

    from cglib.train.inputs import run_spec

    settings = {"epochs": 2, "augment": "open_clip_train"}
    whole = make_run(tmp_path / "whole", **settings)
    assert run_spec(whole.params, whole.params.train.runs[0])["train"]["augment"] == "open_clip_train"
    summary = train_one_prepared(whole, "clip", progress=False)
    assert summary["sampler"]["augment"]["transform"] == "open_clip_train"
    plain = make_run(tmp_path / "plain", epochs=2)
    assert "augment" not in run_spec(plain.params, plain.params.train.runs[0])["train"]
    train_one_prepared(plain, "clip", progress=False)
    parts = make_run(tmp_path / "parts", **settings)
    assert summary["sampler"]["optimizer_steps_per_epoch"] == 6
    with pytest.raises(KeyboardInterrupt):  # in the first epoch, after its third step
        train_one_prepared(parts, "clip", progress=False, on_step=_interrupt_at(3))
    train_one_prepared(parts, "clip", progress=False)
    (w1, log1), (w2, log2) = _final_and_log(whole, "clip"), _final_and_log(parts, "clip")
    assert log1 == log2 and all(torch.equal(w1[k], w2[k]) for k in w1)
    w0, _ = _final_and_log(plain, "clip")
    assert any(not torch.equal(w0[k], w1[k]) for k in w1 if k.startswith("visual."))
