"""Checkpoints hold what trains: frozen towers are referenced (hash-verified), not copied; every key is verified
on load; per-epoch weights only when asked."""

from __future__ import annotations

import json

import pytest
import torch
from prepared_runs import train_one_prepared
from safetensors.torch import load_file, save_file
from test_train import _interrupt_at, make_run, text_keys

from cglib.models import build_model
from cglib.train import load_trained
from cglib.train.checkpoint import load_checkpoint, save_checkpoint
from cglib.weights import load_weights, referenced_weights


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    """The demo's arrangement at tiny scale: a small ViT against the frozen pretrained MiniLM text tower."""
    run = make_run(tmp_path_factory.mktemp("minilm"), model={"name": "cglib-tiny-vit", "text_tower": "minilm"},
                   epochs=1)
    return run, train_one_prepared(run, "clip", progress=False)


def test_frozen_minilm_is_referenced_not_copied(minilm_run):
    """initial.safetensors references the MiniLM tower to its package and final.safetensors to initial, both by
    hash: the files hold the image tower only (a few MB instead of ~90 MB each), and load_trained rebuilds the
    full model: trained image tower, the package's text tower."""
    run, _ = minilm_run
    base = run.dir / "training"
    built = build_model(run.params.model).model.state_dict()
    text = text_keys(built)
    assert len(text) > 50
    for path, source in ((base / "initial.safetensors", "package"), (base / "clip/final.safetensors",
                                                                   "../initial.safetensors")):
        held = load_file(str(path))
        assert not set(held) & set(text) and set(held) | set(text) == set(built)
        reference = referenced_weights(path)
        assert reference["source"] == source and reference["keys"] == sorted(text)
    text_bytes = sum(built[k].numel() * built[k].element_size() for k in text)
    final_size = (base / "clip/final.safetensors").stat().st_size
    assert final_size < text_bytes / 10
    model = load_trained(run.params, run.dir, "clip").model.state_dict()
    final = load_file(str(base / "clip/final.safetensors"))
    assert all(torch.equal(model[k], built[k]) for k in text)
    assert all(torch.equal(model[k], final[k]) for k in final)
    assert not torch.equal(model["visual.conv1.weight"], load_file(str(base / "initial.safetensors"))[
        "visual.conv1.weight"])


def test_only_final_weights_are_kept_unless_asked(tmp_path):
    """Without train.keep_epoch_weights a run leaves final.safetensors only (no checkpoints folder); with it,
    one referenced file per epoch; the flag does not change the run's spec (a finished run is reused)."""
    plain = make_run(tmp_path / "plain", epochs=2)
    summary = train_one_prepared(plain, "clip", progress=False)
    assert not (plain.dir / "training/clip/checkpoints").exists()
    kept = make_run(tmp_path / "kept", epochs=2, keep_epoch_weights=True)
    assert train_one_prepared(kept, "clip", progress=False)["spec_hash"] == summary["spec_hash"]
    files = sorted(p.name for p in (kept.dir / "training/clip/checkpoints").iterdir())
    assert files == ["epoch-001.safetensors", "epoch-002.safetensors"]
    model = build_model(kept.params.model).model
    load_weights(model, kept.dir / "training/clip/checkpoints/epoch-002.safetensors")
    final = load_file(str(kept.dir / "training/clip/final.safetensors"))
    assert all(torch.equal(model.state_dict()[k], final[k]) for k in final)


def test_loading_verifies_every_key_and_the_frozen_hash(tmp_path):
    """A weights file with a missing or an unexpected key, or whose referenced frozen tower no longer matches
    its hash, is an error naming the file."""
    run = make_run(tmp_path, epochs=1)
    train_one_prepared(run, "clip", progress=False)
    final = run.dir / "training/clip/final.safetensors"
    state = load_file(str(final))
    meta = {"cglib_referenced": json.dumps(referenced_weights(final))}
    model = build_model(run.params.model).model

    broken = tmp_path / "training/clip/missing.safetensors"
    save_file({k: v for k, v in state.items() if k != "visual.conv1.weight"}, str(broken), metadata=meta)
    with pytest.raises(ValueError, match=r"missing.safetensors does not fit the model: missing \['visual.conv1"):
        load_weights(model, broken)
    extra = tmp_path / "training/clip/extra.safetensors"
    save_file({**state, "visual.extra": torch.zeros(1)}, str(extra), metadata=meta)
    with pytest.raises(ValueError, match=r"extra.safetensors does not fit the model: .*unexpected \['visual.extra"):
        load_weights(model, extra)

    initial = run.dir / "training/initial.safetensors"
    weights = load_file(str(initial))
    key = next(k for k in weights if not k.startswith("visual.") and k != "logit_scale")
    weights[key] = weights[key] + 1.0  # the frozen source changed after training
    save_file(weights, str(initial))
    with pytest.raises(ValueError, match=r"final.safetensors references frozen weights from ../initial.safetensors"):
        load_trained(run.params, run.dir, "clip")


def test_evaluation_fingerprints_see_the_referenced_tower(minilm_run, tmp_path):
    """The embedding cache's text fingerprint of a weights file covers a referenced frozen tower: a final file
    shares its initial file's (same tower, so text embeddings are shared), and two files referencing different
    package towers differ."""
    from cglib.evaluate.embeddings import file_fingerprints

    run, _ = minilm_run
    initial = run.dir / "training/initial.safetensors"
    final = run.dir / "training/clip/final.safetensors"
    assert file_fingerprints(final, "p")[1] == file_fingerprints(initial, "p")[1]
    assert file_fingerprints(final, "p")[0] != file_fingerprints(initial, "p")[0]
    other = tmp_path / "other.safetensors"
    save_file(load_file(str(initial)), str(other), metadata={"cglib_referenced": json.dumps(
        {**referenced_weights(initial), "sha1": "0" * 40})})
    assert file_fingerprints(other, "p")[1] != file_fingerprints(initial, "p")[1]

    # a run that trained part of the text tower alone (train.text_trains: projection) holds that part and references
    # the rest and the whole image tower: its text fingerprint is its own, its image fingerprint the initial's
    model = build_model(run.params.model).model
    load_weights(model, initial)
    part = next(k for k in text_keys(model.state_dict()) if k.startswith("text."))
    reference = {"source": "initial.safetensors", "keys": sorted(set(model.state_dict()) - {part})}
    fingerprints = []
    for shift in (0.0, 0.01):
        partial = run.dir / "training" / f"partial-{shift}.safetensors"
        save_file({part: (model.state_dict()[part] + shift).contiguous()}, str(partial),
                  metadata={"cglib_referenced": json.dumps(reference)})
        fingerprints.append(file_fingerprints(partial, "p"))
    assert fingerprints[0][0] == fingerprints[1][0] == file_fingerprints(initial, "p")[0]
    assert len({fingerprints[0][1], fingerprints[1][1], file_fingerprints(initial, "p")[1]}) == 3


def test_a_checkpoint_missing_a_trained_key_is_not_resumed_silently(tmp_path):
    """last.pt holds every trained key (not the frozen tower's); one missing is an error naming the file."""
    run = make_run(tmp_path, epochs=1)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(run, "clip", progress=False, on_step=_interrupt_at(2))
    path = run.dir / "training/clip/checkpoints/last.pt"
    state = load_checkpoint(path)
    assert "visual.conv1.weight" in state["model"] and not set(state["model"]) & set(text_keys(state["model"]))
    del state["model"]["visual.conv1.weight"]
    save_checkpoint(path, state)
    with pytest.raises(ValueError, match=r"last.pt does not fit the model: missing \['visual.conv1.weight'\]"):
        train_one_prepared(run, "clip", progress=False)
