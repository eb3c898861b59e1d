"""Models: cglib configs build offline, freezing works, every trainable parameter gets a gradient (DDP), I/O."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
from open_clip.transformer import QuickGELU

from cglib.config import ModelParams
from cglib.embed import MINILM_DIM, embed_texts
from cglib.encoding import TEXT_BATCH, _run_text_tower, encode_images, encode_texts, pixels_to_tensor
from cglib.losses import pairwise_group_loss
from cglib.models import Towers, architecture_params, build_model, resolve_activation
from cglib.weights import load_weights, save_weights


@pytest.fixture(scope="module")
def tiny_clip():
    torch.manual_seed(0)
    return build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip", freeze_text=False))


@pytest.fixture(scope="module")
def tiny_minilm():
    torch.manual_seed(0)
    return build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm", freeze_text=False))


def test_configs_have_the_documented_shapes(tiny_clip, tiny_minilm):
    """tiny-clip: 32 px, 128-d joint space, CLIP tokenizer; tiny-vit + MiniLM: 384-d, the MiniLM tower."""
    assert (tiny_clip.image_size, tiny_clip.embed_dim, tiny_clip.text_tower) == (32, 128, "open_clip")
    assert (tiny_minilm.image_size, tiny_minilm.embed_dim, tiny_minilm.text_tower) == (32, MINILM_DIM, "minilm")
    pixels = np.random.default_rng(0).integers(0, 256, size=(3, 40, 40, 3), dtype=np.uint8)
    for bundle in (tiny_clip, tiny_minilm):
        image = encode_images(bundle, pixels)
        text = encode_texts(bundle, ["a cake", "a dog on a beach"])
        assert image.shape == (3, bundle.embed_dim) and text.shape == (2, bundle.embed_dim)
        np.testing.assert_allclose(np.linalg.norm(image, axis=1), 1.0, rtol=1e-5)


def test_minilm_tower_equals_sentence_transformers(tiny_minilm):
    """The MiniLM text tower reproduces all-MiniLM-L6-v2 sentence embeddings (so frozen ones can be precomputed)."""
    texts = ["a child next to a cake and balloons", "two skiers on a snowy slope"]
    np.testing.assert_allclose(encode_texts(tiny_minilm, texts), embed_texts(texts), atol=1e-5)


@pytest.mark.parametrize("which", ["tiny_clip", "tiny_minilm"])
def test_every_trainable_parameter_gets_a_gradient(which, request):
    """After freeze_logit_scale, a group loss reaches every trainable parameter (DDP errors otherwise)."""
    bundle = request.getfixturevalue(which)
    bundle.set_text_trainable(True)
    bundle.freeze_logit_scale()
    bundle.model.zero_grad(set_to_none=True)
    towers = Towers(bundle.model)
    images = torch.randn(6, 3, bundle.image_size, bundle.image_size)
    tokens = bundle.tokenizer([f"text number {k}" for k in range(6)])
    image, text = towers(images, tokens)
    pairwise_group_loss(image.reshape(2, 3, -1), text.reshape(2, 3, -1)).backward()
    missing = [n for n, p in bundle.model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert not bundle.model.logit_scale.requires_grad


def test_freeze_text_freezes_exactly_the_text_tower():
    """freeze_text: the text tower has no trainable parameter left; the image tower still trains."""
    bundle = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip", freeze_text=True))
    text_ids = {id(p) for p in bundle.text_parameters()}
    assert text_ids and all(not p.requires_grad for p in bundle.text_parameters())
    assert all(p.requires_grad for n, p in bundle.model.named_parameters() if n.startswith("visual."))
    untouched = [n for n, p in bundle.model.named_parameters() if id(p) not in text_ids and not n.startswith("visual.")]
    assert untouched == ["logit_scale"]


def test_weights_round_trip_safetensors_and_torch(tmp_path, tiny_clip):
    """save_weights/load_weights restore every tensor; a torch state dict (DDP 'module.' prefix) loads too."""
    fresh = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))
    load_weights(fresh.model, save_weights(tiny_clip.model, tmp_path / "w.safetensors"))
    want = tiny_clip.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in fresh.model.state_dict().items())
    torch.save({"state_dict": {f"module.{k}": v for k, v in want.items()}}, tmp_path / "w.pt")
    other = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))
    load_weights(other.model, tmp_path / "w.pt")
    assert all(torch.equal(v, want[k]) for k, v in other.model.state_dict().items())
    with pytest.raises(ValueError, match="does not fit the model"):
        load_weights(build_model(ModelParams(name="cglib-tiny-vit")).model, tmp_path / "w.safetensors")
    with pytest.raises(FileNotFoundError):
        load_weights(other.model, tmp_path / "missing.safetensors")


def test_pixels_to_tensor_normalises_and_resizes(tiny_clip):
    """uint8 (n, H, W, 3) -> (n, 3, S, S) float, normalised with the model's mean/std; bad input is refused."""
    pixels = np.full((2, 48, 48, 3), 255, dtype=np.uint8)
    x = pixels_to_tensor(pixels, tiny_clip)
    assert x.shape == (2, 3, 32, 32)
    expected = (1 - torch.tensor(tiny_clip.mean)) / torch.tensor(tiny_clip.std)
    torch.testing.assert_close(x[0, :, 5, 5], expected)
    with pytest.raises(ValueError, match="uint8"):
        pixels_to_tensor(pixels.astype(np.float32), tiny_clip)


def test_bad_model_params_are_refused():
    """Unknown names, MiniLM with an open_clip architecture and weights for a cglib config name the fix."""
    with pytest.raises(ValueError, match="neither a cglib config"):
        build_model(ModelParams(name="ViT-Q-99"))
    with pytest.raises(ValueError, match="text_tower: minilm is only available"):
        build_model(ModelParams(name="ViT-B-32", text_tower="minilm"))
    with pytest.raises(ValueError, match="pretrained must be null"):
        build_model(ModelParams(name="cglib-demo-vit", pretrained="openai"))


@pytest.mark.slow
def test_paper_architecture_builds_without_download():
    """ViT-B-32 (the paper's model) builds with random weights offline: 151M parameters, 224 px, 512-d."""
    bundle = build_model(ModelParams(name="ViT-B-32", text_tower="open_clip", freeze_text=False))
    n = sum(p.numel() for p in bundle.model.parameters())
    assert 150e6 < n < 152e6
    assert (bundle.image_size, bundle.embed_dim) == (224, 512)


# ------------------------------------------------------------------------------------- activation (issue 15)
def activations(model: torch.nn.Module) -> set[str]:
    """Class names of every GELU-family module in the model (the MLPs of both towers)."""
    return {type(m).__name__ for m in model.modules() if isinstance(m, (torch.nn.GELU, QuickGELU))}


OPENAI_ARCHS = ["RN50", "RN101", "RN50x4", "RN50x16", "RN50x64", "ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-L-14-336"]


@pytest.mark.parametrize("arch", OPENAI_ARCHS)
def test_openai_weights_resolve_to_quickgelu(arch: str) -> None:
    """Every OpenAI checkpoint was trained with QuickGELU: a plain architecture + `openai` resolves to it, from
    open_clip's registry alone (no download), and is built as the plain architecture + force_quick_gelu."""
    choice = resolve_activation(arch, "openai")
    assert (choice.activation, choice.arch, choice.force_quick_gelu) == ("quick_gelu", arch, True)
    assert choice.source == "pretrained tag 'openai'"
    assert resolve_activation(f"{arch}-quickgelu", "openai").activation == "quick_gelu"


def test_activation_follows_gelu_tags_and_architectures() -> None:
    """A GELU-trained tag keeps GELU; with no tag (or a local file) the architecture decides."""
    assert resolve_activation("ViT-B-32", "laion2b_s34b_b79k").activation == "gelu"
    assert resolve_activation("ViT-B-32", None).activation == "gelu"
    assert resolve_activation("ViT-B-32-quickgelu", None).activation == "quick_gelu"
    assert resolve_activation("ViT-B-32-quickgelu", __file__).source == "architecture"
    assert resolve_activation("cglib-demo-vit", None).activation == "gelu"


def test_activation_mismatch_is_an_error_before_any_download() -> None:
    """A -quickgelu architecture with a GELU-trained tag is a ValueError naming both and the fix, raised by
    build_model before open_clip would download (offline, a download attempt would be a RuntimeError instead)."""
    pattern = ("ViT-B-32-quickgelu.*quick_gelu.*laion2b_s34b_b79k.*trained with gelu.*model.name: ViT-B-32"
               ".*force_activation")
    with pytest.raises(ValueError, match=pattern):
        resolve_activation("ViT-B-32-quickgelu", "laion2b_s34b_b79k")
    with pytest.raises(ValueError, match=pattern):
        build_model(ModelParams(name="ViT-B-32-quickgelu", pretrained="laion2b_s34b_b79k", text_tower="open_clip"))


def test_force_activation_overrides_with_a_warning() -> None:
    """model.force_activation wins over tag and architecture; contradicting the tag warns that features differ."""
    with pytest.warns(UserWarning, match="overrides pretrained tag 'openai'.*quick_gelu"):
        choice = resolve_activation("ViT-B-32", "openai", "gelu")
    assert (choice.activation, choice.source) == ("gelu", "model.force_activation")
    with pytest.warns(UserWarning, match="trained with gelu"):
        choice = resolve_activation("ViT-B-32-quickgelu", "laion2b_s34b_b79k", "quick_gelu")
    assert (choice.activation, choice.arch) == ("quick_gelu", "ViT-B-32")  # the tag is registered under the base
    assert resolve_activation("ViT-B-32-quickgelu", None, "gelu").arch == "ViT-B-32"
    with pytest.raises(ValueError, match="force_activation must be"):
        resolve_activation("ViT-B-32", None, "relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="force_activation"):
        ModelParams(force_activation="relu")


def test_force_activation_builds_quickgelu_modules() -> None:
    """The built MLPs use the resolved activation (tiny config: default GELU, forced QuickGELU) and the bundle
    records it with its reason."""
    gelu = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))
    quick = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip", force_activation="quick_gelu"))
    assert activations(gelu.model) == {"GELU"} and gelu.info()["activation"] == "gelu"
    assert activations(quick.model) == {"QuickGELU"}
    assert (quick.activation, quick.activation_source) == ("quick_gelu", "model.force_activation")


def test_architecture_params_keep_the_tag_activation() -> None:
    """Rebuilding a pretrained model to load saved weights into it keeps the tag's activation and config, never
    its weights (no download)."""
    shell = architecture_params(ModelParams(name="ViT-B-32", pretrained="openai", text_tower="open_clip"))
    assert (shell.pretrained, shell.pretrained_weights, shell.checkpoint, shell.force_activation) == (
        "openai", False, None, "quick_gelu")
    local = architecture_params(ModelParams(name="ViT-B-32", pretrained="/tmp/weights.pt", text_tower="open_clip"))
    assert local.pretrained is None  # a local file is no registry tag: nothing to keep
    plain = architecture_params(ModelParams(name="ViT-B-32", text_tower="open_clip"))
    assert plain.force_activation == "gelu"


def test_paper_model_builds_with_quickgelu_offline() -> None:
    """ViT-B-32 + openai, built as the tag dictates but with random weights: every MLP of both towers is QuickGELU,
    as in OpenAI's CLIP (open_clip's plain ViT-B-32 config alone would build nn.GELU)."""
    params = architecture_params(ModelParams(name="ViT-B-32", pretrained="openai", text_tower="open_clip"))
    bundle = build_model(params)
    assert activations(bundle.model) == {"QuickGELU"}
    blocks = [*bundle.model.visual.transformer.resblocks, *bundle.model.transformer.resblocks]
    assert len(blocks) == 24 and all(isinstance(b.mlp.gelu, QuickGELU) for b in blocks)
    assert bundle.info()["activation"] == "quick_gelu" and 150e6 < bundle.info()["parameters"] < 152e6
    assert open_clip.get_pretrained_cfg("ViT-B-32", "openai")["quick_gelu"] is True  # the registry fact relied on


def test_paper_profile_uses_openai_activation_and_authors_tau_inner() -> None:
    """params/paper.yaml: ViT-B-32 + openai resolves to QuickGELU; tau' is the authors' 0.07 (the paper gives none)."""
    from pathlib import Path

    from cglib.config import load_params

    paper = load_params(Path(__file__).resolve().parent.parent / "params/paper.yaml", check_paths=False)
    model = paper.model
    assert resolve_activation(model.name, model.pretrained, model.force_activation).activation == "quick_gelu"
    assert paper.train.tau_inner == 0.07


def test_minilm_outputs_are_remembered_per_tower_weights():
    """encode_texts on a MiniLM model runs the tower once per text and tower weights: a second call (another model
    on the same weights, or a changed projection) only runs the projection and gives what the tower would; changed
    tower weights are never served outputs of the old ones."""
    params = ModelParams(name="cglib-tiny-vit", text_tower="minilm", freeze_text=True, text_projection="identity")
    first, second = build_model(params), build_model(params)
    texts = ["a dog on a sofa", "two red cars in the street", "a dog on a sofa", "a bowl of fruit on a table"]
    calls = []
    for bundle in (first, second):
        bundle.model.text.transformer.register_forward_hook(
            lambda module, args, kwargs, out: calls.append(len(kwargs["input_ids"])), with_kwargs=True)
    direct = _run_text_tower(first, texts, True)
    once = len(calls)  # one call per token length, each of TEXT_BATCH rows
    calls.clear()
    assert np.array_equal(encode_texts(first, texts), direct)
    assert calls == [TEXT_BATCH] * once  # three distinct texts, run once
    with torch.no_grad():
        second.text_projection().weight.mul_(2.0)
    assert np.allclose(encode_texts(second, texts, normalize=False), 2 * encode_texts(first, texts, normalize=False))
    assert calls == [TEXT_BATCH] * once  # the projection changed, the tower did not: no tower call
    with torch.no_grad():
        embedding = second.model.text.transformer.embeddings.word_embeddings.weight
        embedding.add_(0.1 * torch.randn(embedding.shape, generator=torch.Generator().manual_seed(0)))
    changed = encode_texts(second, texts)
    assert len(calls) == 2 * once and not np.allclose(changed, encode_texts(first, texts), atol=1e-4)
    assert np.allclose(changed, _run_text_tower(second, texts, True), atol=1e-6)


@pytest.mark.parametrize("params", [
    ModelParams(name="convnext_tiny", text_tower="open_clip", arch_overrides={"text_cfg": {"layers": 1}}),
    ModelParams(name="coca_ViT-B-32", text_tower="open_clip",
                arch_overrides={"vision_cfg": {"layers": 1}, "text_cfg": {"layers": 1}}),
], ids=["timm-image-tower", "coca"])
def test_zoo_architectures_build_and_embed(params):
    """Reference-zoo architectures that are not plain open_clip CLIPs: a timm image tower (ConvNeXt; EVA02 is
    built the same way) has no `output_dim`, and CoCa's own text transformer is also called `model.text`; both build
    offline and embed both modalities into the architecture's joint space, with their own text tower."""
    bundle = build_model(params)
    assert bundle.text_tower == "open_clip"
    assert bundle.embed_dim == open_clip.get_model_config(params.name)["embed_dim"]
    texts = encode_texts(bundle, ["a dog on a sofa", "two red cars"])
    images = encode_images(bundle, np.zeros((2, bundle.image_size, bundle.image_size, 3), np.uint8))
    assert texts.shape == images.shape == (2, bundle.embed_dim)
    assert np.allclose(np.linalg.norm(texts, axis=1), 1.0, atol=1e-5)
