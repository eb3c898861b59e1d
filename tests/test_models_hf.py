"""Hugging Face transformers CLIP checkpoints (`model.source: hf`) behind the ClipModel interface, fully offline.

A tiny random CLIPConfig (32 px ViT, patch 8, width 32, 2 layers; a 2-layer text tower over a hand-written BPE
vocabulary) is saved with its tokenizer and image processor to a temporary directory, as a Hub checkpoint is.
"""

from __future__ import annotations

import json
import pickle
import string

import numpy as np
import pytest
import torch
import transformers
from prepared_runs import train_all_prepared

from cglib.config import ModelParams, Params, ParamsError, parse_params
from cglib.encoding import encode_images, encode_texts, pixels_to_tensor
from cglib.losses import pairwise_group_loss
from cglib.models import Towers, architecture_params, build_model
from cglib.train.checkpoint import text_keys
from cglib.train.inputs import model_image_size
from cglib.viz.attention import attention_rollout, extract_attention
from cglib.weights import load_weights, save_weights

TEXTS = ["a cat", "a dog", "cat dog cat", "zebra", "a cat on a dog in a box with a very long caption to truncate"]
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _tiny_tokenizer_files(directory) -> dict[str, int]:
    """vocab.json + merges.txt of a byte-level BPE over lowercase letters (no download)."""
    vocab: dict[str, int] = {}
    for suffix in ("", "</w>"):
        for c in string.ascii_lowercase:
            vocab[c + suffix] = len(vocab)
    merges = ["c a", "ca t</w>", "d o", "do g</w>"]
    for m in merges:
        vocab[m.replace(" ", "")] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return vocab


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-clip")
    vocab = _tiny_tokenizer_files(d)
    tokenizer = transformers.CLIPTokenizer(vocab=str(d / "vocab.json"), merges=str(d / "merges.txt"))
    eos = vocab["<|endoftext|>"]
    config = transformers.CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 16, "hidden_act": "quick_gelu",
                     "bos_token_id": vocab["<|startoftext|>"], "eos_token_id": eos, "pad_token_id": eos},
        vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_act": "quick_gelu"},
        projection_dim=16)
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(d)
    tokenizer.save_pretrained(d)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                    image_mean=list(MEAN), image_std=list(STD)).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def bundle(hf_dir):
    return build_model(ModelParams(source="hf", name=str(hf_dir), freeze_text=False))


def _pixels(n: int = 4, size: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def test_build_gives_unit_norm_features_of_the_checkpoints_size(bundle):
    assert bundle.embed_dim == 16 and bundle.image_size == 32 and bundle.text_tower == "hf"
    assert bundle.mean == pytest.approx(MEAN) and bundle.std == pytest.approx(STD)
    images, texts = encode_images(bundle, _pixels()), encode_texts(bundle, TEXTS)
    assert images.shape == (4, 16) and texts.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(np.linalg.norm(images, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(texts, axis=1), 1, atol=1e-5)
    tokens = bundle.tokenizer(TEXTS)
    assert tokens.dtype == torch.long and tokens.shape == (len(TEXTS), 16)
    assert int(tokens[-1, -1]) == bundle.tokenizer.tokenizer.eos_token_id  # truncated, still ends with EOS
    assert torch.equal(pickle.loads(pickle.dumps(bundle.tokenizer))(TEXTS), tokens)  # DataLoader workers


def test_features_equal_transformers_own(bundle, hf_dir):
    """encode_image / encode_text = get_image_features / get_text_features (with the attention mask), normalised."""
    reference = transformers.CLIPModel.from_pretrained(hf_dir).eval()
    processor = transformers.CLIPImageProcessor.from_pretrained(hf_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    pixels = _pixels(size=32)
    x = pixels_to_tensor(pixels, bundle)
    hf_x = processor(images=list(pixels), return_tensors="pt", do_rescale=True)["pixel_values"]
    torch.testing.assert_close(x, hf_x, atol=1e-5, rtol=1e-5)  # same normalisation at the native size
    with torch.no_grad():
        want_i = reference.get_image_features(pixel_values=x).pooler_output
        inputs = tokenizer(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="pt")
        want_t = reference.get_text_features(**inputs).pooler_output
    torch.testing.assert_close(torch.from_numpy(encode_images(bundle, pixels)),
                               torch.nn.functional.normalize(want_i, dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(encode_texts(bundle, TEXTS)),
                               torch.nn.functional.normalize(want_t, dim=-1), atol=1e-5, rtol=1e-5)


def test_activation_and_info_come_from_the_config(bundle, hf_dir):
    assert bundle.activation == "quick_gelu" and "hidden_act" in bundle.activation_source
    info = bundle.info()
    assert info["activation"] == "quick_gelu" and info["text_tower"] == "hf"
    config = json.loads((hf_dir / "config.json").read_text())
    config["vision_config"]["hidden_act"] = "gelu"
    config["text_config"]["hidden_act"] = "gelu"
    gelu_dir = hf_dir.parent / "gelu-clip"
    gelu_dir.mkdir(exist_ok=True)
    for f in hf_dir.iterdir():
        (gelu_dir / f.name).write_bytes(f.read_bytes())
    (gelu_dir / "config.json").write_text(json.dumps(config))
    assert build_model(ModelParams(source="hf", name=str(gelu_dir))).activation == "gelu"


def test_text_parameters_are_the_text_tower_and_freeze(hf_dir, bundle):
    names = {id(p) for p in bundle.text_parameters()}
    text = {n for n, p in bundle.model.named_parameters() if id(p) in names}
    assert text and all(n.startswith(("text_model.", "text_projection.")) for n in text)
    assert set(text_keys(bundle.model)) >= text and not any(k.startswith("visual.") for k in text_keys(bundle.model))
    frozen = build_model(ModelParams(source="hf", name=str(hf_dir)))  # freeze_text defaults to true
    assert not any(p.requires_grad for p in frozen.text_parameters())
    assert all(p.requires_grad for p in frozen.model.visual.parameters())


def test_training_step_through_the_project_loss_changes_weights(hf_dir):
    torch.manual_seed(0)
    b = build_model(ModelParams(source="hf", name=str(hf_dir), freeze_text=False))
    b.freeze_logit_scale()
    before = {k: v.clone() for k, v in b.model.state_dict().items()}
    towers = Towers(b.model).train()
    images = pixels_to_tensor(_pixels(n=4, size=32), b)
    tokens = b.tokenizer(["a cat", "a dog", "cat", "dog"])
    image, text = towers(images, tokens)
    loss = pairwise_group_loss(image.reshape(2, 2, -1), text.reshape(2, 2, -1), 0.07, 0.5, 0.5)
    opt = torch.optim.SGD([p for p in b.model.parameters() if p.requires_grad], lr=0.5)
    loss.backward()
    trainable = [n for n, p in b.model.named_parameters() if p.requires_grad]
    assert all(dict(b.model.named_parameters())[n].grad is not None for n in trainable)
    opt.step()
    after = b.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("visual.") for k in changed) and any(k.startswith("text_model.") for k in changed)
    assert "logit_scale" not in changed
    assert torch.equal(b.model.hf_model.visual_projection.weight, b.model.visual.visual_projection.weight)


def test_save_load_round_trip_through_architecture_params(hf_dir, bundle, tmp_path):
    params = ModelParams(source="hf", name=str(hf_dir), freeze_text=False)
    shell_params = architecture_params(params)
    assert shell_params.pretrained_weights is False and shell_params.source == "hf"
    with torch.no_grad():  # weights that differ from the checkpoint's, as after training
        for p in bundle.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = save_weights(bundle.model, tmp_path / "w.safetensors")
    torch.manual_seed(123)
    shell = build_model(shell_params)
    assert not torch.equal(shell.model.visual.visual_projection.weight, bundle.model.visual.visual_projection.weight)
    load_weights(shell.model, path)
    np.testing.assert_array_equal(encode_images(shell, _pixels()), encode_images(bundle, _pixels()))
    np.testing.assert_array_equal(encode_texts(shell, TEXTS), encode_texts(bundle, TEXTS))
    from_ckpt = build_model(params.model_copy(update={"checkpoint": path}))
    np.testing.assert_array_equal(encode_texts(from_ckpt, TEXTS), encode_texts(bundle, TEXTS))


def test_hf_state_dict_is_applied_on_top(hf_dir, tmp_path):
    reference = transformers.CLIPModel.from_pretrained(hf_dir)
    state = {k: v + 0.5 for k, v in reference.state_dict().items() if k.startswith("text_model.")}
    state["text_model.embeddings.position_ids"] = torch.arange(16)[None]  # saved by older transformers: skipped
    torch.save(state, tmp_path / "hierarcaps.bin")
    b = build_model(ModelParams(source="hf", name=str(hf_dir), hf_state_dict=tmp_path / "hierarcaps.bin"))
    own = b.model.hf_model.state_dict()
    for key, value in state.items():
        if key in own:
            assert torch.equal(own[key], value), key
    torch.testing.assert_close(own["visual_projection.weight"], reference.state_dict()["visual_projection.weight"])
    from safetensors.torch import save_file

    save_file({"text_projection.weight": torch.zeros(16, 32)}, str(tmp_path / "proj.safetensors"))
    b = build_model(ModelParams(source="hf", name=str(hf_dir), hf_state_dict=tmp_path / "proj.safetensors"))
    assert torch.equal(b.model.text_projection.weight, torch.zeros(16, 32))


def test_bad_hf_state_dicts_are_clear_errors(hf_dir, tmp_path):
    torch.save({"text_projection.weight": torch.zeros(8, 32)}, tmp_path / "shape.bin")
    with pytest.raises(ValueError, match=r"model.hf_state_dict .*does not fit.*text_projection.weight: file \(8, 32\)"):
        build_model(ModelParams(source="hf", name=str(hf_dir), hf_state_dict=tmp_path / "shape.bin"))
    torch.save({"clip.text_projection.weight": torch.zeros(16, 32)}, tmp_path / "keys.bin")
    with pytest.raises(ValueError, match=r"model.hf_state_dict .*not transformers CLIPModel keys.*clip.text_proj"):
        build_model(ModelParams(source="hf", name=str(hf_dir), hf_state_dict=tmp_path / "keys.bin"))
    with pytest.raises(FileNotFoundError, match="model.hf_state_dict not found"):
        build_model(ModelParams(source="hf", name=str(hf_dir), hf_state_dict=tmp_path / "missing.bin"))


def test_attention_maps_of_the_hf_vision_tower(bundle, hf_dir):
    """Shapes, rows on the simplex, equal to transformers' eager output_attentions, outputs unchanged."""
    pixels = _pixels(n=3, size=32)
    maps = extract_attention(bundle, pixels, batch_size=2)
    assert maps.attentions.shape == (2, 3, 2, 17, 17) and maps.grid == (4, 4)
    torch.testing.assert_close(maps.attentions.sum(-1), torch.ones(2, 3, 2, 17))
    assert maps.cls_attention().shape == (2, 3, 2, 4, 4) and maps.rollout().shape == (3, 4, 4)
    torch.testing.assert_close(attention_rollout(maps.attentions).sum(-1), torch.ones(3, 17))
    assert maps.patch_embeddings.shape == (3, 16, 16)
    torch.testing.assert_close(maps.class_embeddings, maps.image_embeddings)
    np.testing.assert_allclose(torch.nn.functional.normalize(maps.image_embeddings, dim=-1).numpy(),
                               encode_images(bundle, pixels), atol=1e-6)
    assert maps.text_maps(encode_texts(bundle, ["a cat"])[0]).shape == (3, 4, 4)
    eager = transformers.CLIPModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    eager.load_state_dict(bundle.model.hf_model.state_dict())
    with torch.no_grad():
        out = eager.vision_model(pixel_values=pixels_to_tensor(pixels, bundle), output_attentions=True)
    torch.testing.assert_close(maps.attentions, torch.stack(out.attentions), atol=1e-5, rtol=1e-4)


def test_image_size_without_weights(hf_dir):
    params = Params(model=ModelParams(source="hf", name=str(hf_dir)))
    assert model_image_size(params) == 32


@pytest.mark.parametrize(("model", "message"), [
    ({"source": "hf", "name": "openai/clip-vit-base-patch32", "pretrained": "openai"}, "model.pretrained is an open_clip"),
    ({"source": "hf", "name": "x/y", "arch_overrides": {"text_cfg": {"layers": 2}}}, "remove model.arch_overrides"),
    ({"source": "hf", "name": "x/y", "text_tower": "minilm"}, "text_tower: minilm is not available with source: hf"),
    ({"source": "hf", "name": "x/y", "force_activation": "gelu"}, "hidden_act; remove model.force_activation"),
    ({"source": "hf", "name": "x/y", "image_size": 64}, "remove model.image_size"),
    ({"source": "hf"}, "cglib-demo-vit' is a cglib config"),
    ({"name": "ViT-B-32", "hf_state_dict": "w.bin"}, "model.hf_state_dict applies to Hugging Face checkpoints only"),
])
def test_invalid_params_name_the_key_and_the_fix(model, message, tmp_path):
    with pytest.raises(ParamsError, match=message):
        parse_params({"model": model}, tmp_path, check_paths=False)


def test_hf_source_defaults_text_tower_and_checks_paths(tmp_path):
    params = parse_params({"model": {"source": "hf", "name": "openai/clip-vit-base-patch32"}}, tmp_path)
    assert params.model.text_tower == "open_clip"
    with pytest.raises(ParamsError, match="model.hf_state_dict: path does not exist"):
        parse_params({"model": {"source": "hf", "name": "x/y", "hf_state_dict": "w.bin"}}, tmp_path)


def test_local_path_that_is_not_a_clip_directory(tmp_path, hf_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json, so it is not a Hugging Face checkpoint directory"):
        build_model(ModelParams(source="hf", name=str(tmp_path / "empty")))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type 'bert', not 'clip'"):
        build_model(ModelParams(source="hf", name=str(tmp_path / "bert")))
    with pytest.raises(ValueError, match="no such directory"):
        build_model(ModelParams(source="hf", name=str(tmp_path / "absent")))
    (tmp_path / "w.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file"):
        build_model(ModelParams(source="hf", name=str(tmp_path / "w.bin")))
    with pytest.raises(ValueError, match="model.name 'nobody/no-such-clip' could not be loaded"):
        build_model(ModelParams(source="hf", name="nobody/no-such-clip"))  # offline (conftest): no download
    # a directory relative to the repo root resolves against it
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "clip").symlink_to(hf_dir)
    params = parse_params({"model": {"source": "hf", "name": "models/clip"}}, tmp_path)
    assert params.model.name == str(tmp_path / "models" / "clip")


def test_training_and_load_trained_with_an_hf_checkpoint(hf_dir, tmp_path):
    """The training loop end to end on tiny_magic (textual pretraining included), then load_trained."""
    from safetensors.torch import load_file
    from test_train import make_run

    from cglib.train import load_trained

    runs = [{"name": "clip", "loss": "clip"}, {"name": "pw", "loss": "pairwise", "pretrain": "leakage_free"}]
    run = make_run(tmp_path, model={"source": "hf", "name": str(hf_dir)}, epochs=1, runs=runs)
    summaries = train_all_prepared(run, progress=False)
    assert summaries["clip"]["model"]["activation"] == "quick_gelu"
    initial = load_file(str(tmp_path / "training" / "initial.safetensors"))
    reference = transformers.CLIPModel.from_pretrained(hf_dir).state_dict()
    assert torch.equal(initial["visual.visual_projection.weight"], reference["visual_projection.weight"])
    pixels = _pixels(n=2, size=32)
    zero = load_trained(run.params, run.dir, "zero-shot")
    for name in ("clip", "pw"):
        trained = load_trained(run.params, run.dir, name)
        assert not np.array_equal(encode_images(trained, pixels), encode_images(zero, pixels)), name
    pw = load_trained(run.params, run.dir, "pw")
    assert not np.array_equal(encode_texts(pw, TEXTS), encode_texts(zero, TEXTS))  # pretraining moved the text tower
