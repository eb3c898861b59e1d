"""params/rehearsal.yaml: validates, differs from params/paper.yaml only where documented, builds its model offline.

The model section resolves the paper's `openai` tag without downloading weights (`model.pretrained_weights:
false`) and shrinks both towers (`model.arch_overrides`) while keeping open_clip's CLIP class, tokenizer and the
tag's preprocessing and activation.
"""

from __future__ import annotations

import re
from pathlib import Path

import open_clip
import pytest
import torch
import yaml
from conftest import SHARED_DATA, hierarcaps_data
from pydantic import ValidationError

from cglib.cli import main as cli_main
from cglib.config import ModelParams, Params, TrainParams, deep_merge, parse_params
from cglib.models import build_model
from cglib.train.optim import amp_dtype

REPO = Path(__file__).resolve().parent.parent
REHEARSAL = REPO / "params" / "rehearsal.yaml"
PAPER = REPO / "params" / "paper.yaml"
SHARED = SHARED_DATA / "hierarcaps"  # the tests' copy of data/hierarcaps (tests/conftest.py)
# `train.epoch` is added to the schema by the training package's epoch definitions (issue 15); until that is
# merged the rehearsal's `epoch: pairs` line is dropped before validation, and validated as soon as it exists.
HAS_EPOCH = "epoch" in TrainParams.model_fields

# Every key (section.key) where the rehearsal may differ from the paper profile: what this machine forces, and
# train.epoch, a choice (its comment in the profile says why).
FORCED = {
    "run.name", "run.profile", "run.device",
    "data.coco_captions", "data.coco_images", "data.max_images", "data.image_cache_size", "data.hierarcaps_train_csv",
    "llm.base_url",
    "magic.min_hard_negatives",
    "model.pretrained_weights", "model.image_size", "model.arch_overrides",
    "train.epoch", "train.epochs", "train.pretrain_epochs", "train.warmup_steps", "train.num_workers", "train.runs",
    "eval.bootstrap", "eval.zoo",
    "search.trials",
}


def load(path: Path, check_paths: bool = False, overrides: dict | None = None) -> Params:
    raw = deep_merge(yaml.safe_load(path.read_text(encoding="utf-8")), overrides or {})
    if not HAS_EPOCH:
        raw.get("train", {}).pop("epoch", None)
    return parse_params(raw, REPO, check_paths=check_paths)


def flat(params: Params) -> dict[str, object]:
    """section.key -> value (nested values such as train.runs and model.arch_overrides compared whole)."""
    return {f"{section}.{key}": value for section, keys in params.model_dump(mode="json").items()
            for key, value in keys.items()}


def test_rehearsal_validates_as_its_own_profile() -> None:
    """The rehearsal file validates (paths aside) and names the rehearsal profile; the published protocol as the
    paper profile, whose fp16 is fp32 on CPU; pairs epoch."""
    params = load(REHEARSAL)
    assert params.run.profile == "rehearsal" and params.run.device == "cpu" and params.train.amp == "auto_fp16"
    assert params.run.protocol == "as_published" and amp_dtype(params.train.amp, torch.device("cpu")) is None
    assert params.llm.backend == "openai" and params.llm.base_url.startswith("http://127.0.0.1:")
    assert params.data.source == "coco" and params.eval.hierarcaps
    assert yaml.safe_load(REHEARSAL.read_text())["train"]["epoch"] == "pairs"
    if HAS_EPOCH:
        assert params.train.epoch == "pairs"


@pytest.mark.skipif(not HAS_EPOCH, reason="train.epoch (the pairs epoch) is not in this branch's schema yet")
def test_cli_validates_rehearsal() -> None:
    """`cglib validate params/rehearsal.yaml --no-check-paths` exits 0."""
    assert cli_main(["validate", str(REHEARSAL), "--no-check-paths"]) == 0


def test_rehearsal_reads_the_hierarcaps_data_where_the_hierarcaps_profile_does() -> None:
    """The rehearsal's data paths are params/hierarcaps.yaml's (data/hierarcaps, inside the repository): a params
    file names no folder outside it."""
    rehearsal = yaml.safe_load(REHEARSAL.read_text(encoding="utf-8"))["data"]
    hierarcaps = yaml.safe_load((REPO / "params" / "hierarcaps.yaml").read_text(encoding="utf-8"))["data"]
    for key in ("coco_captions", "coco_images", "hierarcaps_csv", "hierarcaps_images"):
        assert rehearsal[key] == hierarcaps[key], key
        assert rehearsal[key].startswith("data/hierarcaps/"), key


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the HierarCaps 1K data is not at {SHARED} "
                                                "(set CGLIB_SHARED_DATA to the shared/data folder)")
def test_rehearsal_paths_exist_with_shared_data() -> None:
    """With the data paths pointed at the shared copy of data/hierarcaps every input path of the rehearsal exists."""
    load(REHEARSAL, check_paths=True, overrides=hierarcaps_data(SHARED))


def test_without_shared_data_the_synthetic_coco_files_stand_in(tmp_path: Path) -> None:
    """The synthetic world written as COCO files satisfies the rehearsal's paths and loads through its COCO loader
    and HierarCaps reader with nothing skipped (how the rehearsal runs where the HierarCaps data is absent)."""
    from cglib.data.coco_export import write_synthetic_coco
    from cglib.data.hierarcaps import load_hierarcaps
    from cglib.magic.sources import load_captions

    files = write_synthetic_coco(tmp_path / "data", images_per_concept=2, image_size=32, hierarcaps_per_concept=1)
    raw = yaml.safe_load(REHEARSAL.read_text(encoding="utf-8"))
    raw["data"].update(files.data_params())
    if not HAS_EPOCH:
        raw["train"].pop("epoch")
    params = parse_params(raw, REPO, check_paths=True)
    dataset, truth = load_captions(params)
    assert truth is None and not dataset.skipped and len(dataset) == files.n_images == 104
    hc = load_hierarcaps(params.data.hierarcaps_csv, params.data.hierarcaps_images)
    assert not hc.skipped and len(hc) == 52


def test_differs_from_paper_only_where_forced_and_commented() -> None:
    """Every key equal to paper.yaml except the forced ones; each forced difference carries a REHEARSAL comment."""
    rehearsal, paper = flat(load(REHEARSAL)), flat(load(PAPER))
    differing = {k for k in rehearsal if rehearsal[k] != paper[k]}
    assert differing == FORCED, (f"undocumented differences {sorted(differing - FORCED)}; "
                                 f"forced keys now equal to paper.yaml {sorted(FORCED - differing)}")
    lines = REHEARSAL.read_text().splitlines()
    for key in FORCED:
        section, name = key.split(".")
        start = lines.index(f"{section}:")
        row = next(i for i in range(start + 1, len(lines)) if re.match(rf"\s+{name}:", lines[i]))
        above = []
        for line in reversed(lines[:row]):
            if not line.strip().startswith("#"):
                break
            above.append(line)
        assert "REHEARSAL:" in lines[row] or any("REHEARSAL:" in a for a in above), f"{key} has no REHEARSAL comment"


def test_rehearsal_model_is_the_paper_code_path_shrunk() -> None:
    """Built offline from the `openai` tag: open_clip CLIP with ViT + text transformer, the tag's preprocessing and
    activation, CLIP's tokenizer and context; the text tower trains (one step moves it)."""
    params = load(REHEARSAL)
    bundle = build_model(params.model)  # HF_HUB_OFFLINE / no network: a download attempt would fail here
    model = bundle.model
    assert type(model) is open_clip.CLIP and bundle.text_tower == "open_clip"
    assert isinstance(model.visual, open_clip.transformer.VisionTransformer)
    assert model.visual.patch_size == (32, 32) and bundle.image_size == 64 and bundle.embed_dim == 512
    assert model.context_length == 77 and model.vocab_size == 49408
    tag = open_clip.get_pretrained_cfg("ViT-B-32", "openai")
    assert bundle.mean == tuple(tag["mean"]) and bundle.std == tuple(tag["std"])
    assert sum(p.numel() for p in model.parameters()) < 10_000_000  # the full ViT-B-32 has 151M
    # the same activation as the paper profile's full-size model (weights skipped there too: no download)
    paper = load(PAPER).model.model_copy(update={"pretrained_weights": False})
    full = build_model(paper).model
    act = type(model.transformer.resblocks[0].mlp.gelu)
    assert act is type(full.transformer.resblocks[0].mlp.gelu) is type(full.visual.transformer.resblocks[0].mlp.gelu)
    del full
    text = bundle.text_parameters()
    assert text and all(p.requires_grad for p in text)
    before = [p.detach().clone() for p in text]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    images = model.encode_image(torch.randn(4, 3, 64, 64), normalize=True)
    texts = model.encode_text(bundle.tokenizer(["a dog", "a cat", "a cake", "a ski"]), normalize=True)
    torch.nn.functional.cross_entropy(images @ texts.T / 0.1, torch.arange(4)).backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, text))


def test_weights_skip_and_overrides_reject_mistakes() -> None:
    """Overrides with weights to load, an unknown tag, an unknown config key: each an error naming the fix."""
    with pytest.raises(ValidationError, match="pretrained_weights: false"):
        ModelParams(name="ViT-B-32", pretrained="openai", text_tower="open_clip",
                    arch_overrides={"text_cfg": {"layers": 2}})
    with pytest.raises(ValueError, match="not a tag of ViT-B-32"):
        build_model(ModelParams(name="ViT-B-32", pretrained="no-such-tag", pretrained_weights=False,
                                text_tower="open_clip"))
    with pytest.raises(ValueError, match="unknown keys \\['layerz'\\]"):
        build_model(ModelParams(name="ViT-B-32", pretrained="openai", pretrained_weights=False, text_tower="open_clip",
                                arch_overrides={"text_cfg": {"layerz": 2}}))
    with pytest.raises(ValueError, match="open_clip architectures"):
        build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip", arch_overrides={"text_cfg": {"layers": 1}}))
