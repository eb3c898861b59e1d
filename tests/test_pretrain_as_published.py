"""The authors' textual pretraining (train.pretrain_pairs: as_published, issue #32 item 1): their PretrainDataset's
pairs and batches, their loss with the model's learned logit scale clamped at ln 100, trained, resumed exactly and
under torchrun equal to one process."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from prepared_runs import train_one_prepared
from safetensors.torch import load_file
from test_train import _final_and_log, _interrupt_at, make_run
from test_train_distributed import torchrun_train

from cglib.run import RunContext
from cglib.train.objectives import TextAlignment
from cglib.train.pretrain import PublishedTextPairSampler, _chain
from tests.factories import tiny_magic
from tests.float_tolerance import ADAM_EPS, optimizer_steps, trained_tolerance


def authors_pretrain_pairs(magic, with_levels: bool):
    """PretrainDataset._load_data, literally, over the train images in our data order (group by group)."""
    processed = []
    for group in sorted(magic.groups("train")):
        names = [magic.nodes[n].name for n in _chain(magic, group)]
        for image_id in magic.images_of(group, "train"):
            image = {"old_captions": magic.images[image_id].captions, "new_captions": magic.generalized_texts(image_id),
                     **{f"level{k}": names[k - 1] if with_levels and k <= len(names) else None for k in range(1, 5)}}
            for old_caption in image["old_captions"]:
                for new_caption in image["new_captions"]:
                    processed.append((old_caption, new_caption))
                for k in range(1, 5):
                    if image[f"level{k}"]:
                        processed.append((old_caption, image[f"level{k}"]))
    return processed


@pytest.mark.parametrize("mode", ["with_concepts", "leakage_free"])
def test_the_pairs_are_the_authors_and_batches_are_shuffled_with_the_last_dropped(mode):
    """with_concepts: their pairs exactly (every caption with every generalized caption, then l1-l4); leakage_free
    leaves the names out. Batches: a seeded shuffle cut into full batches, so one epoch covers len // B * B pairs."""
    magic, _ = tiny_magic()
    sampler = PublishedTextPairSampler(magic, mode, batch_size=8, seed=4)
    assert sampler.pairs == authors_pretrain_pairs(magic, mode == "with_concepts")
    assert len(sampler) == len(sampler.pairs) // 8
    epoch = [pair for k in range(len(sampler)) for pair in zip(*sampler.batch(1, k), strict=True)]
    assert len(epoch) == len(sampler) * 8 and set(epoch) <= set(sampler.pairs)
    assert epoch != [pair for k in range(len(sampler)) for pair in zip(*sampler.batch(2, k), strict=True)]
    assert sampler.describe()["exposed_to_eval_strings"] == (mode == "with_concepts")
    with pytest.raises(ValueError, match="do not fill one batch"):
        PublishedTextPairSampler(magic, mode, batch_size=10_000)


def test_the_learned_scale_sets_the_temperature_and_is_clamped():
    scale = torch.nn.Parameter(torch.tensor(math.log(20.0)))
    align = TextAlignment({"tau": 0.1}, logit_scale=lambda: scale)
    a, b = torch.nn.functional.normalize(torch.randn(2, 4, 8), dim=-1)
    from cglib.losses import text_alignment_loss

    out = align(a, b)
    assert out["loss"].item() == pytest.approx(text_alignment_loss(a, b, tau=1 / 20).item(), rel=1e-6)
    assert out["logit_scale"].item() == pytest.approx(20.0)
    with torch.no_grad():
        scale.fill_(9.0)
    align.after_step(False)
    assert scale.item() == pytest.approx(math.log(100))


SETTINGS = {"model": {"freeze_text": False}, "pretrain_pairs": "as_published", "pretrain_batch_size": 8,
            "pretrain_epochs": 2, "runs": [{"name": "pp", "loss": "pairwise", "pretrain": "with_concepts"}]}


def test_a_run_trains_the_scale_and_resumes_exactly(tmp_path):
    """The model's logit scale moves in pretraining (the authors train it), the summary names the pairs, and a run
    interrupted in pretraining resumes to the same weights and log."""
    whole = make_run(tmp_path / "whole", **SETTINGS)
    summary = train_one_prepared(whole, "pp", progress=False)
    assert summary["pretraining"]["pairs"] == "as_published" and summary["exposed_to_eval_strings"]
    start = load_file(str(tmp_path / "whole" / "training" / "initial.safetensors"))["logit_scale"]
    final = load_file(str(tmp_path / "whole" / "training" / "pp" / "final.safetensors"))["logit_scale"]
    assert not torch.equal(start, final) and 0 <= float(final) <= math.log(100)
    parts = make_run(tmp_path / "parts", **SETTINGS)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "pp", progress=False, on_step=_interrupt_at(3))
    train_one_prepared(parts, "pp", progress=False)
    (w1, log1), (w2, log2) = _final_and_log(whole, "pp"), _final_and_log(parts, "pp")
    assert log1 == log2 and all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.slow
def test_the_authors_pretraining_under_torchrun_equals_one_process(tmp_path):
    """2 gloo processes (half of each batch each) train the same towers and logit scale as one process: the scale
    is a DDP parameter of the text phase, its gradient averaged like the tower's."""
    params = {"run": {"name": "ddp", "device": "cpu", "threads": 1},
              "model": {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": False},
              # ADAM_EPS keeps AdamW from amplifying rounding (tests/float_tolerance.py); at lr 0.1 the gradients,
              # not the weight decay, move the weights
              "train": {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 1, "lr": 0.1, "warmup_steps": 1,
                        "adam_eps": ADAM_EPS, "pretrain_pairs": "as_published", "pretrain_batch_size": 8,
                        "pretrain_epochs": 1, "pretrain_lr": 0.1,
                        "runs": [{"name": "pp", "loss": "pairwise", "pretrain": "with_concepts"}]}}
    params_path = tmp_path / "ddp.yaml"
    params_path.write_text(yaml.safe_dump(params))
    distributed_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    for directory in (distributed_dir, single_dir):
        make_run(directory)
    torchrun_train(params_path, distributed_dir)
    from cglib.config import load_params

    torch.set_num_threads(1)
    train_one_prepared(RunContext(params=load_params(params_path), dir=single_dir), "pp", progress=False)
    got = load_file(str(distributed_dir / "training/pp/final.safetensors"))
    expected = load_file(str(single_dir / "training/pp/final.safetensors"))
    assert not torch.equal(expected["logit_scale"], load_file(str(single_dir / "training/initial.safetensors"))[
        "logit_scale"])
    # 78 steps at lr 0.1: atol 9.3e-7, rtol 9.3e-6; measured, the largest difference used 6% of it on AVX2 and on
    # AVX-512 kernels (1.2e-7, one ulp of a token embedding near 1)
    tolerance = trained_tolerance(optimizer_steps(single_dir / "training/pp"), lr=0.1)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **tolerance, msg=name)
