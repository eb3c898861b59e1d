"""`train.text_trains: projection`: the text phases (loss: re, textual pretraining) train the identity-initialised
projection after a frozen MiniLM tower, on tower outputs computed once (the demo's HierarCaps and pretraining rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from factories import tiny_magic, two_top_magic
from prepared_runs import train_one_prepared

from cglib.config import ModelParams, Params, ParamsError, parse_params
from cglib.encoding import encode_texts
from cglib.magic.files import save_magic
from cglib.models import build_model
from cglib.run import RunContext
from cglib.train import load_trained
from cglib.train.checkpoint import FINAL, INITIAL, text_keys
from cglib.train.text_phase import ProjectedTexts
from cglib.weights import referenced_weights

PROJECTED_MODEL = {"name": "cglib-tiny-vit", "text_tower": "minilm", "text_projection": "identity",
                   "freeze_text": True}
TRAIN = {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 1, "lr": 1e-3, "warmup_steps": 2,
         "weight_decay": 0.01, "epoch": "groups", "text_trains": "projection",
         "pretrain_lr": 1e-2, "pretrain_batch_size": 4}
RE_OPTIONS = {"lr": 1e-2, "batch_size": 8}
PROJECTION = "text.proj.weight"


def make_run(directory, runs: list[dict]) -> RunContext:
    save_magic(two_top_magic(), directory / "magic" / "magic.json")
    tiny_magic()[1].save(directory / "captions")
    params = Params.model_validate({"run": {"name": "t", "device": "cpu", "threads": 1}, "model": PROJECTED_MODEL,
                                    "train": {**TRAIN, "runs": runs}})
    return RunContext(params=params, dir=directory)


def state(bundle) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in bundle.model.state_dict().items()}


def test_identity_projection_leaves_the_minilm_space_unchanged():
    """The projection starts at the identity: every embedding equals the projection-free model's, bitwise."""
    plain = build_model(ModelParams(name="cglib-tiny-vit"))
    projected = build_model(ModelParams(**PROJECTED_MODEL))
    texts = ["a dog runs on the beach", "", "two people share a birthday cake"]
    assert np.array_equal(encode_texts(plain, texts), encode_texts(projected, texts))
    assert torch.equal(projected.model.text.proj.weight, torch.eye(384))
    assert PROJECTION in text_keys(projected.model) and PROJECTION not in plain.model.state_dict()


def test_projection_options_are_validated_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="text_tower: minilm"):
        ModelParams(name="cglib-tiny-clip", text_tower="open_clip", text_projection="identity")
    with pytest.raises(ParamsError, match="model.text_projection: identity"):
        parse_params({"train": {"text_trains": "projection"}}, tmp_path)


def test_re_on_the_projection_moves_only_the_projection(tmp_path, capsys):
    """An RE run with text_trains: projection changes text.proj.weight alone (tower and image side bitwise equal),
    references every other key to the initial weights, and its loss fell; the precomputed path embeds a text
    exactly as the trained model does."""
    run = make_run(tmp_path, [{"name": "hierarcaps", "loss": "re", "options": RE_OPTIONS}])
    summary = train_one_prepared(run, "hierarcaps", progress=False)
    assert "RE alignment (text projection)" in capsys.readouterr().out
    zero, trained = load_trained(run.params, tmp_path, "zero-shot"), load_trained(run.params, tmp_path, "hierarcaps")
    a, b = state(zero), state(trained)
    assert [k for k in a if not torch.equal(a[k], b[k])] == [PROJECTION]
    ref = referenced_weights(tmp_path / "training" / "hierarcaps" / FINAL)
    assert ref["source"] == f"../{INITIAL}" and set(ref["keys"]) == set(a) - {PROJECTION}
    assert summary["text_phase_trained"] == "projection"
    moved = summary["weights_moved"]["text"]
    assert moved["trained"] and moved["parameters"] == 384 * 384 and moved["fraction_changed"] > 0.9
    assert summary["epoch_loss"][0] < 0.5  # the RE loss starts near 0 (reg 0, angles balanced) and stays bounded

    texts = ["a dog runs on the beach", ""]
    torch.testing.assert_close(ProjectedTexts(trained, texts)(texts), torch.from_numpy(encode_texts(trained, texts)),
                               atol=1e-5, rtol=0)
    raw = torch.from_numpy(encode_texts(trained, texts, normalize=False))  # train.pretrain_features: raw
    torch.testing.assert_close(ProjectedTexts(trained, texts, normalize=False)(texts), raw, atol=1e-5, rtol=0)
    assert raw.norm(dim=-1).sub(1).abs().min() > 0.01


def test_pretraining_on_the_projection_then_image_text(tmp_path):
    """A pretraining run trains the projection in phase 1 (the MiniLM tower stays bitwise frozen) and the image
    tower in phase 2; its weights file holds the image side and the projection, the tower is referenced."""
    run = make_run(tmp_path, [{"name": "pairwise_pretrain", "loss": "pairwise", "pretrain": "leakage_free"}])
    summary = train_one_prepared(run, "pairwise_pretrain", progress=False)
    zero = load_trained(run.params, tmp_path, "zero-shot")
    trained = load_trained(run.params, tmp_path, "pairwise_pretrain")
    a, b = state(zero), state(trained)
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    text = set(text_keys(zero.model))
    assert changed & text == {PROJECTION} and any(k.startswith("visual.") for k in changed)
    ref = referenced_weights(tmp_path / "training" / "pairwise_pretrain" / FINAL)
    assert set(ref["keys"]) == text - {PROJECTION}
    assert summary["pretrain_steps"] > 0 and summary["pretraining"]["tower_outputs_precomputed"] > 0
    assert summary["weights_moved"]["text"]["fraction_changed"] > 0.9
