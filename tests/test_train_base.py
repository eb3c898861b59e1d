"""The pretrained base (train.base): what it trains on, that it learns CLIP's task, and that every run starts from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import tiny_magic
from prepared_runs import train_one_prepared
from safetensors.torch import load_file

from cglib.config import Params, ParamsError, parse_params
from cglib.data.synthetic import make_world
from cglib.magic.files import save_magic
from cglib.models import build_model
from cglib.prepare import model_image_size
from cglib.prepare.base import base_corpus, base_if_needed
from cglib.run import RunContext
from cglib.train import ZERO_SHOT, base_record, ensure_initial, load_trained
from cglib.train.checkpoint import INITIAL

TINY_MODEL = {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True}
SYNTHETIC = {"images_per_concept": 3, "image_size": 32, "captions_per_image": 2}
BASE = {"corpus": "synthetic", "epochs": 3, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2}


def synthetic_run(directory: Path, **base) -> RunContext:
    params = Params.model_validate({
        "run": {"name": "b", "device": "cpu", "threads": 1, "seed": 0},
        "data": {"source": "synthetic", "synthetic": SYNTHETIC}, "model": TINY_MODEL,
        "train": {"runs": [{"name": "clip", "loss": "clip"}], "groups_per_batch": 2, "pairs_per_group": 3,
                  "epochs": 1, "lr": 1e-3, "warmup_steps": 1, "epoch": "groups", "base": {**BASE, **base}}})
    return RunContext(params=params, dir=directory)


def magic_run(directory: Path) -> RunContext:
    """A run folder with tiny_magic's captions and magic.json and a base trained on its training images."""
    magic, dataset = tiny_magic()
    save_magic(magic, directory / "magic" / "magic.json")
    dataset.save(directory / "captions")
    params = Params.model_validate({
        "run": {"name": "m", "device": "cpu", "threads": 1}, "model": TINY_MODEL,
        "train": {"runs": [{"name": "clip", "loss": "clip"}], "groups_per_batch": 2, "pairs_per_group": 3,
                  "epochs": 1, "lr": 1e-3, "warmup_steps": 1, "epoch": "groups",
                  "base": {**BASE, "corpus": "magic_train", "epochs": 1}}})
    return RunContext(params=params, dir=directory)


def ensure_base(run: RunContext) -> Path:
    """ensure_initial with the base corpus prepared when the run's initial weights must still be trained."""
    base = base_if_needed(run, model_image_size(run.params), progress=False)
    return ensure_initial(run, progress=False, base=base)


def test_synthetic_base_corpus_is_another_world_without_concept_names(tmp_path):
    run = synthetic_run(tmp_path)
    corpus, record = base_corpus(run)
    magic_world = make_world(images_per_concept=3, seed=0, image_size=32, captions_per_image=2)
    assert record["world_seed"] == 1000 and record["captions_naming_a_concept"] == 0
    assert len(corpus) == len(magic_world.dataset)
    # rendered from another seed: no base image equals any image the MAGIC world holds
    magic_pixels = {p.tobytes() for p in magic_world.dataset.pixels}
    assert not any(p.tobytes() in magic_pixels for p in corpus.pixels)


def test_base_learns_clip_and_becomes_every_runs_start(tmp_path):
    run = synthetic_run(tmp_path)
    torch.manual_seed(0)
    untrained = build_model(run.params.model).model.state_dict()
    ensure_base(run)
    record = base_record(tmp_path)
    losses = record["epoch_losses"]
    assert record["corpus"] == "synthetic" and record["loss"] == "clip" and record["text_tower_trained"] is False
    assert record["steps"] == 3 * (record["images"] // 16)
    assert losses[-1] < losses[0] < record["chance_loss"] + 0.5, losses
    initial = load_file(str(tmp_path / "training" / INITIAL))
    moved = [k for k, v in initial.items() if k.startswith("visual.") and not torch.equal(v, untrained[k])]
    assert moved, "base training left the image tower unchanged"
    # the text tower was frozen: the base keeps it as built
    assert all(torch.equal(v, untrained[k]) for k, v in initial.items() if not k.startswith("visual."))
    # the zero-shot row is the base
    zero_shot = load_trained(run.params, tmp_path, ZERO_SHOT).model.state_dict()
    assert all(torch.equal(zero_shot[k], v) for k, v in initial.items())


def test_base_is_cached_and_retrained_only_when_its_spec_changes(tmp_path):
    run = synthetic_run(tmp_path, epochs=1)
    ensure_base(run)
    path = tmp_path / "training" / INITIAL
    first = path.stat().st_mtime_ns
    assert base_if_needed(run, 32) is None  # current: nothing to prepare
    ensure_initial(run, progress=False)  # nor to train
    assert path.stat().st_mtime_ns == first
    changed = synthetic_run(tmp_path, epochs=2)
    with pytest.raises(ValueError, match=r"must be trained on the base corpus \(synthetic\), which was not prepared"):
        ensure_initial(changed, progress=False)
    ensure_base(changed)
    assert path.stat().st_mtime_ns != first
    assert base_record(tmp_path)["epochs"] == 2


def test_magic_train_base_sees_training_images_only_and_runs_fine_tune_from_it(tmp_path):
    run = magic_run(tmp_path)
    magic, _ = tiny_magic()
    corpus, record = base_corpus(run)
    train_ids = sorted(i for i, r in magic.images.items() if r.split == "train")
    assert sorted(corpus.image_ids) == train_ids
    assert record["test_images_left_out"] == len(magic.images) - len(train_ids) > 0
    # its texts are the images' original captions, never generalized captions or concept names
    assert all(corpus.captions[i] == magic.images[i].captions for i in corpus.image_ids)
    summary = train_one_prepared(run, "clip", progress=False)
    assert base_record(tmp_path)["images"] == len(train_ids)
    assert summary["steps"] > 0


def test_synthetic_base_needs_the_synthetic_world():
    raw = {"data": {"source": "coco", "coco_captions": "x.json", "coco_images": "imgs"},
           "train": {"base": {"corpus": "synthetic"}}}
    with pytest.raises(ParamsError, match="train.base.corpus 'synthetic'.*magic_train"):
        parse_params(raw, Path("."), check_paths=False)


def test_no_base_keeps_the_model_as_built(tmp_path):
    run = synthetic_run(tmp_path, corpus="none")
    ensure_initial(run, progress=False)
    meta = json.loads((tmp_path / "training" / "initial.json").read_text())
    assert "base" not in meta and base_record(tmp_path) is None
    torch.manual_seed(0)
    built = build_model(run.params.model).model.state_dict()
    saved = load_file(str(tmp_path / "training" / INITIAL))
    assert all(np.array_equal(saved[k].numpy(), built[k].numpy()) for k in saved)
