"""The HierarCaps baseline rows as train.runs entries: `loss: re` (RE alignment of the text tower) and `init`."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from factories import tiny_magic, two_top_magic
from prepared_runs import train_all_prepared, train_one_prepared

from cglib.config import Params, ParamsError, parse_params
from cglib.distributed import DistInfo
from cglib.magic.files import save_magic
from cglib.models import Towers
from cglib.prepare import load_inputs, re_items
from cglib.radial import radial_embedding_loss
from cglib.run import RunContext
from cglib.train import load_trained
from cglib.train.checkpoint import FINAL, INITIAL, RunFiles, spec_hash, text_keys
from cglib.train.inputs import run_entry, run_spec
from cglib.train.re_run import REBatchSampler, re_texts
from cglib.weights import referenced_weights

TINY_MODEL = {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True}
TINY_TRAIN = {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 1, "lr": 1e-3, "warmup_steps": 2,
              "weight_decay": 0.01, "log_every": 2, "epoch": "groups"}
RE_OPTIONS = {"lr": 1e-3, "batch_size": 8}
RE_ROWS = [{"name": "hierarcaps", "loss": "re", "options": RE_OPTIONS},
           {"name": "hierarcaps_ft", "loss": "clip", "init": "hierarcaps"}]


def make_run(directory: Path, runs: list[dict], **train) -> RunContext:
    if not (directory / "magic" / "magic.json").is_file():
        save_magic(two_top_magic(), directory / "magic" / "magic.json")
        tiny_magic()[1].save(directory / "captions")
    params = Params.model_validate({"run": {"name": "t", "device": "cpu", "threads": 1}, "model": TINY_MODEL,
                                    "train": {**TINY_TRAIN, **train, "runs": runs}})
    return RunContext(params=params, dir=directory)


def state(bundle) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in bundle.model.state_dict().items()}


def test_re_run_trains_the_text_tower_only(tmp_path, capsys):
    """An re run moves text weights only (image tower bitwise unchanged and referenced to the initial weights),
    logs finite loss parts per step, prints its steps per epoch and records its role and data in summary.json."""
    run = make_run(tmp_path, RE_ROWS[:1])
    summary = train_one_prepared(run, "hierarcaps", progress=False)
    out = capsys.readouterr().out
    steps = summary["steps_per_epoch"]
    assert f"hierarcaps: RE alignment (text tower), {steps} optimizer steps per epoch x 1 epochs" in out
    items = summary["re_training"]["items"]
    assert items == 36 and steps == math.ceil(items / 8) == summary["steps"]  # 36 training images, one item each

    initial, trained = load_trained(run.params, tmp_path, "zero-shot"), load_trained(run.params, tmp_path, "hierarcaps")
    a, b = state(initial), state(trained)
    text = set(text_keys(initial.model))
    assert all(torch.equal(a[k], b[k]) for k in a if k not in text)  # image tower and logit scale: bitwise
    assert any(not torch.equal(a[k], b[k]) for k in text)
    ref = referenced_weights(tmp_path / "training" / "hierarcaps" / FINAL)
    assert ref["source"] == f"../{INITIAL}" and set(ref["keys"]) == set(a) - text
    moved = summary["weights_moved"]
    assert moved["image"] == {**moved["image"], "trained": False, "fraction_changed": 0.0}
    assert moved["text"]["trained"] and moved["text"]["fraction_changed"] > 0.5

    assert summary["objective"] == "re" and summary["fine_tuned_on_magic"] is False
    assert summary["init"] == "zero-shot" and summary["exposed_to_eval_strings"] is True
    assert "concept names" in summary["exposure"][0] and summary["re_training"]["re_data"] == "magic"
    assert summary["images_seen"] == 0 and summary["text_frozen"] is False
    with (tmp_path / "training" / "hierarcaps" / "log.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == steps and {r["phase"] for r in rows} == {"re"}
    for r in rows:
        for part in ("loss", "re_mean", "re_minimax", "re_reg", "re_angle_pos", "re_angle_neg"):
            assert math.isfinite(float(r[part])), (part, r)
    assert float(rows[0]["re_reg"]) < 1e-6 < float(rows[-1]["re_reg"])  # 0 before the first update, then moved


def test_root_is_recomputed_and_receives_gradient(tmp_path):
    """The root is the trainable tower's embedding of "" in the same forward pass: the loss has a gradient
    with respect to it, and it reaches the token embedding row of the empty string's tokens."""
    run = make_run(tmp_path, RE_ROWS[:1])
    inputs = load_inputs(run, progress=False)
    items, _ = re_items(run.params, "magic", inputs.magic)
    files = RunFiles(run, "hierarcaps", {}, DistInfo(), {})
    from cglib.train.loop import ensure_initial

    ensure_initial(run, DistInfo(), progress=False)
    bundle = files.fresh_model()
    bundle.set_text_trainable(True)
    batch = REBatchSampler(items, 4, seed=0).batch(0, 0)
    b, k = len(batch), len(batch[0].positives)
    _, text = Towers(bundle.model)(None, bundle.tokenizer(re_texts(batch)))
    root, pos, neg = text[-1], text[:b * k].reshape(b, k, -1), text[b * k:].narrow(0, 0, b * k).reshape(b, k, -1)
    alone = bundle.model.encode_text(bundle.tokenizer([""]), normalize=True)[0]
    torch.testing.assert_close(root, alone)
    loss = radial_embedding_loss(root, pos, neg, w_reg=0)
    (grad,) = torch.autograd.grad(loss, root, retain_graph=True)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    loss.backward()
    assert bundle.model.token_embedding.weight.grad.abs().sum() > 0


def test_init_starts_from_the_named_run_and_inherits_exposure(tmp_path):
    """hierarcaps_ft (clip, init hierarcaps) starts from hierarcaps' final weights, references its frozen text
    tower to them, and is exposed because hierarcaps is; training it alone trains hierarcaps first."""
    run = make_run(tmp_path, RE_ROWS)
    summaries = train_all_prepared(run, ["hierarcaps_ft"], progress=False)  # the init is trained on demand
    assert (tmp_path / "training" / "hierarcaps" / FINAL).is_file()
    ft = summaries["hierarcaps_ft"]
    assert (ft["objective"], ft["fine_tuned_on_magic"], ft["init"]) == ("clip", True, "hierarcaps")
    assert ft["exposed_to_eval_strings"] is True and ft["exposure"][0].startswith("from hierarcaps:")

    start = RunFiles(run, "hierarcaps_ft", {}, DistInfo(), {}).fresh_model()
    base = load_trained(run.params, tmp_path, "hierarcaps")
    zero = load_trained(run.params, tmp_path, "zero-shot")
    a, b, z = state(start), state(base), state(zero)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], z[k]) for k in text_keys(start.model))
    final = tmp_path / "training" / "hierarcaps_ft" / FINAL
    ref = referenced_weights(final)
    assert ref["source"] == f"../hierarcaps/{FINAL}" and set(ref["keys"]) == set(text_keys(start.model))
    trained = state(load_trained(run.params, tmp_path, "hierarcaps_ft"))
    assert all(torch.equal(trained[k], b[k]) for k in ref["keys"])  # frozen text tower: hierarcaps'
    assert any(not torch.equal(trained[k], b[k]) for k in trained if k.startswith("visual."))

    # a run without init and without exposure stays unexposed; the spec of the init is part of this run's spec
    spec = run_spec(run.params, run_entry(run.params, "hierarcaps_ft"))
    assert spec["init"] == run_spec(run.params, run_entry(run.params, "hierarcaps"))


def test_the_hierarcaps_fine_tune_as_published_trains_on_raw_features(tmp_path):
    """options.hierarcaps_features: raw (as published) gives the CLIP loss of a run started from the re run the
    towers' unnormalized outputs (the frozen text table included): from the same weights and batch its first loss
    differs from the normalized twin's, and its summary says so; the normalized twin's summary says nothing."""
    runs = [*RE_ROWS, {"name": "hierarcaps_ft_raw", "loss": "clip", "init": "hierarcaps",
                       "options": {"hierarcaps_features": "raw"}}]
    run = make_run(tmp_path, runs)
    summaries = train_all_prepared(run, ["hierarcaps_ft", "hierarcaps_ft_raw"], progress=False)
    assert summaries["hierarcaps_ft_raw"]["features"].startswith("raw") and "features" not in summaries["hierarcaps_ft"]

    def first_loss(name: str) -> float:
        with (tmp_path / "training" / name / "log.csv").open() as f:
            return float(next(csv.DictReader(f))["loss"])

    normalized, raw = first_loss("hierarcaps_ft"), first_loss("hierarcaps_ft_raw")
    assert math.isfinite(raw) and abs(raw - normalized) > 1e-3


def test_finished_re_run_is_reused_and_spec_keys(tmp_path, monkeypatch):
    """A finished re run is reused, not retrained; train.re_* keys retrain re runs (and runs starting from one)
    but leave the hash of a MAGIC run without init unchanged."""
    run = make_run(tmp_path, RE_ROWS[:1])
    first = train_one_prepared(run, "hierarcaps", progress=False)
    mtime = (tmp_path / "training" / "hierarcaps" / FINAL).stat().st_mtime_ns
    from cglib.train import trainer

    monkeypatch.setattr(trainer.Trainer, "__call__", lambda self: pytest.fail("retrained a finished run"))
    again = train_one_prepared(run, "hierarcaps", progress=False)
    assert again["spec_hash"] == first["spec_hash"]
    assert (tmp_path / "training" / "hierarcaps" / FINAL).stat().st_mtime_ns == mtime

    def hashes(**options):
        rows = [{**RE_ROWS[0], "options": {**RE_OPTIONS, **options}}, RE_ROWS[1], {"name": "clip", "loss": "clip"}]
        p = make_run(tmp_path, rows).params
        return {r.name: spec_hash(run_spec(p, r)) for r in p.train.runs}

    base, changed = hashes(), hashes(lr=2e-3)
    assert base["clip"] == changed["clip"]
    assert base["hierarcaps"] != changed["hierarcaps"] and base["hierarcaps_ft"] != changed["hierarcaps_ft"]
    assert "init" not in run_spec(run.params, run_entry(run.params, "hierarcaps"))["run"]


@pytest.mark.parametrize(("runs", "message"), [
    ([{"name": "ft", "loss": "clip", "init": "nope"}], r"train.runs\[0\].init: no run named 'nope'"),
    ([{"name": "ft", "loss": "clip", "init": "hc"}, {"name": "hc", "loss": "re"}],
     r"train.runs\[0\].init: 'hc' is not an earlier entry.*move 'hc' above 'ft'"),
    ([{"name": "ft", "loss": "clip", "init": "ft"}], r"'ft' is not an earlier entry"),
    ([{"name": "hc", "loss": "re", "pretrain": "leakage_free"}], r"loss re .* set pretrain: none"),
])
def test_init_and_re_validation(tmp_path, runs, message):
    with pytest.raises(ParamsError, match=message):
        parse_params({"train": {"runs": runs}}, tmp_path, check_paths=False)


def test_hierarcaps_train_data_path_is_checked(tmp_path):
    """A loss: re run with options.data: hierarcaps_train needs data.hierarcaps_train_csv to exist."""
    raw = {"train": {"runs": [{"name": "hc", "loss": "re", "options": {"data": "hierarcaps_train"}}]}}
    with pytest.raises(ParamsError, match="data.hierarcaps_train_csv: required by this profile but not set"):
        parse_params(raw, tmp_path)
    raw["data"] = {"hierarcaps_train_csv": "missing.csv.gz"}
    with pytest.raises(ParamsError, match="data.hierarcaps_train_csv: path does not exist"):
        parse_params(raw, tmp_path)
    raw["train"]["runs"] = [{"name": "clip", "loss": "clip"}]  # no re run: the file is not needed
    assert parse_params(raw, tmp_path).train.runs[0].loss == "clip"


@pytest.mark.parametrize(("raw", "message"), [
    ({"train": {"re_epochs": 2}}, r"train.re_epochs -> train.runs\[i\].options.epochs of the loss: re run"),
    ({"train": {"mcc_weight": 0.5}}, r"train.mcc_weight -> train.runs\[i\].options.weight of the loss: mcc run"),
    ({"train": {"runs": [{"name": "hc", "loss": "re", "options": {"epoch": 2}}]}},
     r"run 'hc' \(loss: re\): options.epoch: Extra inputs are not permitted \(its options: data, epochs"),
    ({"train": {"runs": [{"name": "c", "loss": "clip", "options": {"lr": 1.0}}]}},
     r"run 'c' \(loss: clip\): options.lr: Extra inputs are not permitted \(its options: logit_scale, hierarcaps_"),
])
def test_objective_options_are_checked_and_moved_keys_named(tmp_path, raw, message):
    """An objective's options are validated by its own model; the train.re_* / train.mcc_* keys of older params
    files are an error that says which run entry's option each became."""
    with pytest.raises(ParamsError, match=message):
        parse_params(raw, tmp_path, check_paths=False)


def test_single_top_node_drops_the_top_tier(tmp_path):
    """On tiny_magic (one l4 node) the re items leave the top tier out (K = l_max) instead of skipping every image;
    with two top nodes they keep it (K = l_max + 1)."""
    params = make_run(tmp_path, RE_ROWS[:1]).params
    magic = tiny_magic()[0]
    items, described = re_items(params, "magic", magic)
    assert len(items) == len(magic.split_ids("train")) and described["tiers"] == 4
    assert "top tier is left out" in described["data"]
    items, described = re_items(params, "magic", two_top_magic())
    assert described["tiers"] == 5 and "left out" not in described["data"]


def test_re_run_resumes_bit_exactly(tmp_path):
    """An re run interrupted mid-epoch and again in its second epoch ends with the weights and log of an
    uninterrupted run (the frozen tower's embeddings are rebuilt from the starting weights on resume)."""
    from safetensors.torch import load_file

    def final_and_log(run: RunContext):
        out = run.dir / "training" / "hierarcaps"
        with (out / "log.csv").open(newline="") as f:
            rows = [[r[k] for k in ("phase", "step", "loss", "re_mean", "re_reg", "lr", "grad_norm")]
                    for r in csv.DictReader(f)]
        return load_file(str(out / FINAL)), rows

    def interrupt_at(step: int):
        def hook(row):
            if row["global_step"] == step:
                raise KeyboardInterrupt
        return hook

    rows = [{**RE_ROWS[0], "options": {**RE_OPTIONS, "epochs": 2}}]
    whole = make_run(tmp_path / "whole", rows)
    assert train_one_prepared(whole, "hierarcaps", progress=False)["steps"] == 10  # 36 items / 8: 5 steps per epoch
    parts = make_run(tmp_path / "parts", rows)
    for step in (3, 7):
        with pytest.raises(KeyboardInterrupt):
            train_one_prepared(parts, "hierarcaps", progress=False, on_step=interrupt_at(step))
    summary = train_one_prepared(parts, "hierarcaps", progress=False)
    assert summary["resumed_from_step"] == 7 and len(summary["epoch_loss"]) == 2
    (expected, expected_log), (got, got_log) = final_and_log(whole), final_and_log(parts)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert got_log == expected_log
