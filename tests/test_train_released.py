"""HierarCaps' released weights as the Table 3 HierarCaps row (`train.runs[i].options.released`): a transformers CLIPModel
state dict converted to open_clip's text tower, used when the file is present, the row trained here otherwise."""

from __future__ import annotations

import pytest
import torch
import transformers
from factories import tiny_magic, two_top_magic
from prepared_runs import train_one_prepared

from cglib import hf_clip
from cglib.config import ModelParams, Params, TrainRunParams
from cglib.evaluate.table3 import table3_notes
from cglib.magic.files import save_magic
from cglib.models import build_model
from cglib.run import RunContext
from cglib.train import load_trained
from cglib.train.checkpoint import text_keys

# the shapes of cglib-tiny-clip's open_clip text tower (models.TINY_TEXT, embed_dim 128), as a transformers config
HF_TEXT = {"vocab_size": 49408, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 2, "max_position_embeddings": 32, "hidden_act": "gelu",
           "bos_token_id": 49406, "eos_token_id": 49407, "pad_token_id": 0}
TINY_MODEL = {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True}
TEXTS = ["a dog runs on the beach", "two people share a birthday cake", ""]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A random tiny transformers CLIPModel, its state dict saved as a released-weights file would be."""
    config = transformers.CLIPConfig(text_config=HF_TEXT, projection_dim=128,
                                     vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 32,
                                                    "intermediate_size": 64, "num_hidden_layers": 1,
                                                    "num_attention_heads": 2})
    torch.manual_seed(1)
    clip = transformers.CLIPModel(config).eval()
    path = tmp_path_factory.mktemp("released") / "hierarcaps_released.pt"
    torch.save(clip.state_dict(), path)
    return clip, path


def hf_text_features(clip, bundle) -> torch.Tensor:
    with torch.no_grad():
        out = clip.get_text_features(input_ids=bundle.tokenizer(TEXTS))
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def test_converted_text_tower_gives_transformers_features(released):
    """open_clip's text transformer with the converted weights computes transformers' get_text_features."""
    clip, _ = released
    bundle = build_model(ModelParams(**TINY_MODEL))
    converted = hf_clip.open_clip_text_state(clip.state_dict())
    assert set(converted) == set(text_keys(bundle.model))
    bundle.model.load_state_dict(converted, strict=False)
    bundle.model.eval()
    with torch.no_grad():
        ours = bundle.model.encode_text(bundle.tokenizer(TEXTS))
    torch.testing.assert_close(ours, hf_text_features(clip, bundle), atol=1e-5, rtol=1e-5)


def test_a_state_dict_without_text_tower_is_refused():
    with pytest.raises(ValueError, match="not a transformers CLIPModel state dict with a text tower"):
        hf_clip.open_clip_text_state({"vision_model.post_layernorm.weight": torch.ones(4)})


def make_run(directory, released_path) -> RunContext:
    save_magic(two_top_magic(), directory / "magic" / "magic.json")
    tiny_magic()[1].save(directory / "captions")
    params = Params.model_validate({
        "run": {"name": "t", "device": "cpu", "threads": 1}, "model": TINY_MODEL,
        "train": {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 1, "epoch": "groups",
                  "runs": [{"name": "hierarcaps", "loss": "re",
                            "options": {"lr": 1e-3, "released": str(released_path)}}]}})
    return RunContext(params=params, dir=directory)


def test_present_released_weights_are_the_row(released, tmp_path):
    """With the file present the row is the base with the released text tower: no RE step, image tower and
    logit scale equal to the base, text features equal transformers', summary and Table 3 notes say released."""
    clip, path = released
    run = make_run(tmp_path, path)
    summary = train_one_prepared(run, "hierarcaps", progress=False)
    assert summary["steps"] == 0 and summary["weights_source"]["kind"] == "released"
    assert summary["weights_source"]["text_keys_loaded"] == len(text_keys(build_model(ModelParams(**TINY_MODEL)).model))
    zero, row = load_trained(run.params, tmp_path, "zero-shot"), load_trained(run.params, tmp_path, "hierarcaps")
    a, b = zero.model.state_dict(), row.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k not in set(text_keys(row.model)))
    row.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(row.model.encode_text(row.tokenizer(TEXTS)), hf_text_features(clip, row),
                                   atol=1e-5, rtol=1e-5)
    note = [n for n in table3_notes(_info([{"name": "hierarcaps", "objective": "re", "weights": "released"}]))
            if n.startswith("hierarcaps:")]
    assert note == ["hierarcaps: HierarCaps' RE alignment, the authors' released weights (options.released)."]


def test_absent_released_weights_train_the_row_here(tmp_path):
    run = make_run(tmp_path, tmp_path / "not-downloaded.pt")
    summary = train_one_prepared(run, "hierarcaps", progress=False)
    assert summary["steps"] > 0 and summary["weights_source"] == {"kind": "trained here"}
    note = [n for n in table3_notes(_info([{"name": "hierarcaps", "objective": "re", "weights": "trained here"}]))
            if n.startswith("hierarcaps:")]
    assert note and "trained here" in note[0]


def test_the_dagger_note_names_each_exposed_row_and_what_it_saw():
    """table3.md's dagger note gives each marked row its own reasons (its summary's exposure): an RE row on MAGIC
    chains, a row started from it, a row pretrained on the names; an unmarked row is not named."""
    re_chains = "RE alignment on MAGIC concept chains: the l1-l4 concept names are its positives (options.data: magic)"
    models = [{"name": "hierarcaps", "objective": "re", "exposed_to_eval_strings": True, "exposure": [re_chains]},
              {"name": "hierarcaps_ft", "exposed_to_eval_strings": True, "exposure": [f"from hierarcaps: {re_chains}"]},
              {"name": "pairwise_pretrain", "exposed_to_eval_strings": False, "exposure": []}]
    dagger = [n for n in table3_notes(_info(models)) if n.startswith("†")]
    assert dagger == [(f"† training saw the evaluation strings: hierarcaps: {re_chains}; hierarcaps_ft: from "
                      f"hierarcaps: {re_chains}.")]
    assert not [n for n in table3_notes(_info(models[2:])) if n.startswith("†")]


def test_released_is_for_re_rows_only():
    with pytest.raises(ValueError, match=r"options.released: Extra inputs are not permitted \(its options: "
                                         r"logit_scale, hierarcaps_features\)"):
        TrainRunParams(name="clip", loss="clip", options={"released": "w.pt"})


def _info(models: list[dict]) -> dict:
    """The smallest results info table3_notes reads."""
    return {"settings": {"bootstrap": 10, "choices": 2, "seeds": [0]},
            "items": {"ground_truth": False, "n_test_images": 8, "n_groups": 2},
            "models": [{"exposed_to_eval_strings": False, **m} for m in models]}
