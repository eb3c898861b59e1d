"""Training seeds (train.seeds): each seed changes initialization and batch order, never the data; its files live
in training/ (seed 0, the one-seed layout) or training/seed<k>/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import tiny_magic
from prepared_runs import train_all_prepared
from safetensors.torch import load_file

from cglib.config import Params, ParamsError, parse_params
from cglib.magic.files import load_magic, save_magic
from cglib.run import RunContext, training_dir, training_seed_value
from cglib.train import base_record, load_trained
from cglib.train.checkpoint import INITIAL
from cglib.train.sampler import GroupBatchSampler

TINY_MODEL = {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True}


def seeded_run(directory: Path, seeds: list[int]) -> RunContext:
    """tiny_magic's captions and magic.json, a base trained on its training images, one clip run per seed."""
    magic, dataset = tiny_magic()
    save_magic(magic, directory / "magic" / "magic.json")
    dataset.save(directory / "captions")
    params = Params.model_validate({
        "run": {"name": "s", "device": "cpu", "threads": 1, "seed": 7}, "model": TINY_MODEL,
        "train": {"runs": [{"name": "clip", "loss": "clip"}], "groups_per_batch": 2, "pairs_per_group": 3,
                  "epochs": 1, "lr": 1e-3, "warmup_steps": 1, "epoch": "groups", "seeds": seeds,
                  "base": {"corpus": "magic_train", "epochs": 1, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1}}})
    return RunContext(params=params, dir=directory)


def test_seeds_param_validates_and_defaults_to_one_seed(tmp_path):
    assert parse_params({}, tmp_path).train.seeds == [0]
    for bad in ([], [0, 0], [-1]):
        with pytest.raises(ParamsError, match="train.seeds"):
            parse_params({"train": {"seeds": bad}}, tmp_path)
    with pytest.raises(ParamsError, match="folder of a training seed"):
        parse_params({"train": {"runs": [{"name": "seed1", "loss": "clip"}]}}, tmp_path)
    assert "Training seeds" in Params.model_fields["train"].annotation.model_fields["seeds"].description


def test_seed_zero_is_run_seed_and_other_seeds_get_their_own_folder(tmp_path):
    assert training_seed_value(7, 0) == 7
    assert len({training_seed_value(7, k) for k in range(5)}) == 5
    assert training_dir(tmp_path, 0) == tmp_path / "training"
    assert training_dir(tmp_path, 2) == tmp_path / "training" / "seed2"


@pytest.mark.slow
def test_training_seeds_change_init_and_batch_order_but_not_the_data(tmp_path, capsys):
    """Two seeds: the bases start from different weights and see their pairs in a different order, but on the same
    corpus; the runs draw other batches from the same MAGIC groups, pairs and split; seed 0 keeps the one-seed
    layout and seed 1 sits in training/seed1/."""
    run = seeded_run(tmp_path, [0, 1])
    summaries = train_all_prepared(run, progress=False)
    assert set(summaries) == {"clip", "clip@seed1"}
    lines = capsys.readouterr().out.splitlines()  # each seed's block of run lines under its own label
    labels = [i for i, line in enumerate(lines) if line.startswith("Training seed")]
    assert [lines[i] for i in labels] == ["Training seed 0 (1 of 2), in training:",
                                          "Training seed 1 (2 of 2), in training/seed1:"]
    assert all(any(line.startswith("clip: ") for line in block) for block in (lines[labels[0]:labels[1]],
                                                                              lines[labels[1]:]))
    for k, folder in ((0, tmp_path / "training"), (1, tmp_path / "training" / "seed1")):
        assert (folder / INITIAL).is_file() and (folder / "clip" / "final.safetensors").is_file()
        assert json.loads((folder / "initial.json").read_text())["training_seed"] == k
    # initialization: the two bases differ in every trained tower
    a, b = load_file(str(tmp_path / "training" / INITIAL)), load_file(str(tmp_path / "training/seed1" / INITIAL))
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("visual."))
    # the data: the same base corpus, the same MAGIC training groups, images and pairs
    base0, base1 = base_record(tmp_path, 0), base_record(tmp_path, 1)
    assert {k: base0[k] for k in ("corpus", "images", "captions", "steps")} == \
        {k: base1[k] for k in ("corpus", "images", "captions", "steps")}
    s0, s1 = summaries["clip"], summaries["clip@seed1"]
    assert s0["data_fingerprint"] == s1["data_fingerprint"]
    for key in ("groups", "train_images", "training_pairs", "batches_per_epoch"):
        assert s0["sampler"][key] == s1["sampler"][key]
    assert (s0["training_seed"], s0["init_and_order_seed"]) == (0, 7)
    assert s1["training_seed"] == 1 and s1["init_and_order_seed"] == training_seed_value(7, 1)
    assert s0["spec_hash"] != s1["spec_hash"]
    # batch order: the samplers the two seeds train with put other anchors and images in their first batches
    m = load_magic(tmp_path / "magic" / "magic.json")
    samplers = [GroupBatchSampler(m, 2, 3, s["init_and_order_seed"], "generalized", epoch="groups") for s in (s0, s1)]
    first = [[(tuple(b.groups), tuple(map(tuple, b.image_ids))) for b in (s.batch(0, i) for i in range(len(s)))]
             for s in samplers]
    assert first[0] != first[1]
    # the trained models differ, and each loads from its own seed's folder
    w0 = load_trained(run.params, tmp_path, "clip").model.state_dict()
    w1 = load_trained(run.params, tmp_path, "clip", seed=1).model.state_dict()
    assert any(not torch.equal(w0[k], w1[k]) for k in w0 if k.startswith("visual."))
    # adding a seed does not retrain the others: the same spec, reused
    again = train_all_prepared(run, progress=False, seeds=[0])
    assert again["clip"]["wall_time_s"] == s0["wall_time_s"]
