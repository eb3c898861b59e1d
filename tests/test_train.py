"""Training runs end to end on tiny_magic with the tiny open_clip config: outputs, resume, pretraining, errors."""

from __future__ import annotations

import csv
import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import tiny_magic
from prepared_runs import train_all_prepared, train_one_prepared
from safetensors.torch import load_file

from cglib.config import Params
from cglib.distributed import DistInfo
from cglib.encoding import encode_texts
from cglib.magic.files import save_magic
from cglib.models import build_model
from cglib.prepare import load_inputs
from cglib.run import RunContext
from cglib.train import LOG_COLUMNS, load_trained, summary_table, weights_moved_note
from cglib.train.loop import GroupBatchData, GroupTask, Stepper, set_trainable, wrap
from cglib.train.objectives import objective_with
from cglib.train.optim import amp_dtype, build_optimizer, warmup_cosine
from cglib.train.sampler import GroupBatchSampler
from cglib.viz.training_figures import plot_loss_curves
from cglib.weights import load_weights

TINY_MODEL = {"name": "cglib-tiny-clip", "text_tower": "open_clip", "freeze_text": True}
TINY_TRAIN = {"groups_per_batch": 2, "pairs_per_group": 3, "epochs": 2, "lr": 1e-3, "warmup_steps": 2,
              "weight_decay": 0.01, "log_every": 2, "pretrain_epochs": 1, "pretrain_batch_size": 4,
              "pretrain_lr": 1e-3, "epoch": "groups"}


def make_run(directory: Path, model: dict | None = None, **train) -> RunContext:
    """A run folder holding tiny_magic's captions and magic.json, with params for the tiny model."""
    magic, dataset = tiny_magic()
    if not (directory / "magic" / "magic.json").is_file():
        save_magic(magic, directory / "magic" / "magic.json")
        dataset.save(directory / "captions")
    runs = train.pop("runs", [{"name": "clip", "loss": "clip"}])
    params = Params.model_validate({"run": {"name": "t", "device": "cpu", "threads": 1},
                                    "model": {**TINY_MODEL, **(model or {})},
                                    "train": {**TINY_TRAIN, **train, "runs": runs}})
    return RunContext(params=params, dir=directory)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def text_keys(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in state if not k.startswith("visual.") and k != "logit_scale"]


# ------------------------------------------------------------------------------------------------ steps
def _fixed_batch(run: RunContext):
    """Model, frozen-text table and one batch item of tiny_magic, as the training loop builds them."""
    torch.manual_seed(0)
    bundle = build_model(run.params.model)
    inputs = load_inputs(run, bundle.image_size, progress=False)
    sampler = GroupBatchSampler(inputs.magic, 3, 4, seed=0)
    texts = sampler.all_texts()
    table = torch.from_numpy(encode_texts(bundle, texts))
    data = GroupBatchData(sampler, inputs.cache, epoch=0, start=0, info=_single(),
                          text_rows={t: k for k, t in enumerate(texts)}, tokenizer=None)
    return bundle, table, data[0]


def _single() -> DistInfo:
    return DistInfo()


@pytest.mark.parametrize("loss", ["clip", "pairwise", "centroid"])
def test_one_step_lowers_the_loss_on_a_fixed_batch(tmp_path, loss):
    """One AdamW step on a batch lowers that batch's loss, for each objective (gradients reach the image tower)."""
    run = make_run(tmp_path)
    bundle, table, item = _fixed_batch(run)
    set_trainable(bundle, image=True, text=False)
    module = wrap(GroupTask(bundle, objective_with(loss, 0.1, tau_inner=0.1, alpha=0.7), table), _single())
    # Adam's first step moves every weight by about lr: small enough to stay in the descent region
    stepper = Stepper(bundle.model, module, lr=1e-4, weight_decay=0.0, warmup_steps=0, total_steps=10, amp=None,
                      grad_clip=1.0, device=torch.device("cpu"))

    def loss_fn(it):
        return module(it)

    with torch.no_grad():
        before = float(loss_fn(item)["loss"])
    result = stepper.step([item], loss_fn)
    with torch.no_grad():
        after = float(loss_fn(item)["loss"])
    assert result["loss"] == pytest.approx(before, rel=1e-5)
    assert after < before
    if loss != "clip":
        assert {"inner", "outer"} <= set(result)


def test_amp_bf16_step_runs_on_cpu(tmp_path):
    """train.amp bf16 runs a step under CPU autocast with a finite loss; fp16 on CPU is refused clearly."""
    run = make_run(tmp_path)
    bundle, table, item = _fixed_batch(run)
    set_trainable(bundle, image=True, text=False)
    module = GroupTask(bundle, objective_with("pairwise", 0.1, tau_inner=0.1, alpha=0.7), table)
    dtype = amp_dtype("bf16", torch.device("cpu"))
    assert dtype is torch.bfloat16
    stepper = Stepper(bundle.model, module, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=10, amp=dtype,
                      grad_clip=1.0, device=torch.device("cpu"))
    seen = {}

    def loss_fn(it):
        image, _ = module.towers(torch.zeros(1, 3, 32, 32), None)
        seen["dtype"] = image.dtype
        return module(it)

    result = stepper.step([item], loss_fn)
    assert seen["dtype"] == torch.bfloat16  # the image tower really ran in bf16
    assert np.isfinite(result["loss"]) and np.isfinite(result["grad_norm"])
    assert amp_dtype("auto", torch.device("cpu")) is None
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        amp_dtype("fp16", torch.device("cpu"))


def test_optimizer_groups_and_schedule():
    """No weight decay on biases, norms and the logit scale; lr warms up linearly, then decays to 0 by cosine."""
    bundle = build_model(Params.model_validate({"model": TINY_MODEL}).model)
    opt = build_optimizer(bundle.model, lr=1.0, weight_decay=0.5)
    names = {id(p): n for n, p in bundle.model.named_parameters()}
    decayed = {names[id(p)] for p in opt.param_groups[0]["params"]}
    assert opt.param_groups[0]["weight_decay"] == 0.5 and opt.param_groups[1]["weight_decay"] == 0.0
    assert not any(n.endswith("bias") or ".ln" in n or n == "logit_scale" for n in decayed)
    assert "visual.conv1.weight" in decayed
    schedule = warmup_cosine(opt, warmup_steps=4, total_steps=12)
    lrs = []
    for _ in range(12):
        lrs.append(schedule.get_last_lr()[0])
        opt.step()
        schedule.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:])) and lrs[-1] < 0.05
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine(opt, warmup_steps=12, total_steps=12)


# ------------------------------------------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """clip (no pretraining) and pairwise (authors' pretraining with concept names), frozen text, 2 epochs."""
    run = make_run(tmp_path_factory.mktemp("trained"),
                   runs=[{"name": "clip", "loss": "clip"},
                         {"name": "pairwise", "loss": "pairwise", "pretrain": "with_concepts"}])
    summaries = train_all_prepared(run, progress=False)
    return run, summaries


def test_training_writes_the_output_contract(trained):
    """initial/final weights, per-step log.csv, summary.json, epoch checkpoints and TensorBoard events exist."""
    run, summaries = trained
    base = run.dir / "training"
    assert (base / "initial.safetensors").is_file()
    for name in ("clip", "pairwise"):
        out = base / name
        assert (out / "final.safetensors").is_file()
        assert not (out / "checkpoints").exists()  # no epoch weights unless asked; last.pt removed when done
        assert any((out / "tensorboard").iterdir())
        summary = json.loads((out / "summary.json").read_text())
        assert summary == json.loads(json.dumps(summaries[name], default=str)) | {"provenance": summary["provenance"]}
        assert summary["steps"] == 2 * 6 and summary["images_seen"] == 12 * 2 * 3
        assert summary["images_per_s"] > 0 and summary["wall_time_s"] > 0
        assert summary["provenance"]["params"]["train"]["groups_per_batch"] == 2
        with (out / "log.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == LOG_COLUMNS
        train_rows = [r for r in rows if r["phase"] == "train"]
        assert [int(r["step"]) for r in train_rows] == list(range(1, 13))
        assert all(float(r["images_per_s"]) > 0 and float(r["data_wait_s"]) >= 0 for r in train_rows)
    clip_rows = list(csv.DictReader((base / "clip" / "log.csv").open()))
    assert all(r["inner"] == "" and r["outer"] == "" for r in clip_rows)  # the CLIP loss has no parts
    pair_rows = list(csv.DictReader((base / "pairwise" / "log.csv").open()))
    assert [r["phase"] for r in pair_rows[:1]] == ["pretrain"]
    assert all(r["inner"] != "" and r["outer"] != "" for r in pair_rows if r["phase"] == "train")


def test_pretraining_trains_the_text_tower_and_marks_exposure(trained):
    """with_concepts pretraining changes the (otherwise frozen) text tower and is marked exposed; clip is not."""
    run, summaries = trained
    base = run.dir / "training"
    initial = weights(base / "initial.safetensors")
    plain = load_trained(run.params, run.dir, "clip").model.state_dict()
    pre = load_trained(run.params, run.dir, "pairwise").model.state_dict()
    assert all(torch.equal(plain[k], initial[k]) for k in text_keys(initial))  # frozen: untouched
    assert not all(torch.equal(pre[k], initial[k]) for k in text_keys(initial))
    for state in (plain, pre):
        assert not torch.equal(state["visual.conv1.weight"], initial["visual.conv1.weight"])
        assert torch.equal(state["logit_scale"], initial["logit_scale"])  # fixed tau: logit_scale frozen
    assert summaries["pairwise"]["exposed_to_eval_strings"] is True
    assert summaries["pairwise"]["pretrain_steps"] >= 1
    assert summaries["clip"]["exposed_to_eval_strings"] is False and summaries["clip"]["pretrain_steps"] == 0
    assert summaries["clip"]["precomputed_texts"] == 12  # 6 groups x 2 generalized captions, encoded once


def test_load_trained_round_trip(trained):
    """load_trained gives the saved final weights of a run, or the initial ones for 'zero-shot', in eval mode."""
    run, _ = trained
    for name, file in (("pairwise", "pairwise/final.safetensors"), ("zero-shot", "initial.safetensors")):
        bundle = load_trained(run.params, run.dir, name)
        assert not bundle.model.training and bundle.device.type == "cpu"
        saved = weights(run.dir / "training" / file)
        state = bundle.model.state_dict()
        assert all(torch.equal(state[k], saved[k]) for k in saved)
    with pytest.raises(ValueError, match="no run named 'nope'"):
        load_trained(run.params, run.dir, "nope")
    with pytest.raises(FileNotFoundError, match="05_training"):
        load_trained(run.params, run.dir / "elsewhere", "clip")


def test_a_finished_run_is_reused_not_retrained(trained):
    """Calling train_all again with the same params returns the saved summaries without training."""
    run, summaries = trained
    final = run.dir / "training" / "clip" / "final.safetensors"
    stamp = final.stat().st_mtime_ns
    again = train_one_prepared(run, "clip", progress=False)
    assert final.stat().st_mtime_ns == stamp
    assert again["spec_hash"] == summaries["clip"]["spec_hash"]


def test_loss_curves_figure(trained):
    """plot_loss_curves draws one panel per run (total loss, inner and outer terms) and one of the pretraining
    losses, from log.csv."""
    run, _ = trained
    fig = plot_loss_curves(run.dir)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in shown]
    assert titles[:2] == ["clip", "pairwise"] and "text pretraining" in titles[2]
    def labels(ax):
        return {line.get_label() for line in ax.lines if not line.get_label().startswith("_")}

    assert labels(shown[0]) == {"total loss"}  # clip has no parts
    assert labels(shown[1]) == {"total loss", "inner term", "outer term"}
    assert labels(shown[2]) == {"pairwise"}


# ---------------------------------------------------------------------------------------------- resume
def _final_and_log(run: RunContext, name: str) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    out = run.dir / "training" / name
    rows = [[r[k] for k in ("phase", "step", "loss", "inner", "outer", "lr", "grad_norm")]
            for r in csv.DictReader((out / "log.csv").open())]
    return weights(out / "final.safetensors"), rows


def _interrupt_at(global_step: int):
    def hook(row):
        if row["global_step"] == global_step:
            raise KeyboardInterrupt

    return hook


def test_resume_after_interrupt_is_bit_exact(tmp_path):
    """Interrupted in pretraining and again mid-epoch (grad accumulation, trainable text), a resumed run ends
    with exactly the weights and log of an uninterrupted one (CPU)."""
    settings = {"model": {"freeze_text": False}, "grad_accum": 2,
                "runs": [{"name": "pw", "loss": "pairwise", "pretrain": "leakage_free"}], "pretrain_epochs": 2}
    whole = make_run(tmp_path / "whole", **settings)
    train_one_prepared(whole, "pw", progress=False)

    parts = make_run(tmp_path / "parts", **settings)
    pre_steps = json.loads((whole.dir / "training/pw/summary.json").read_text())["pretrain_steps"]
    assert pre_steps >= 2
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "pw", progress=False, on_step=_interrupt_at(1))  # inside textual pretraining
    assert (parts.dir / "training/pw/checkpoints/last.pt").is_file()
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "pw", progress=False, on_step=_interrupt_at(pre_steps + 2))  # mid image-text epoch 1
    summary = train_one_prepared(parts, "pw", progress=False)
    assert summary["resumed_from_step"] == pre_steps + 2
    assert not (parts.dir / "training/pw/checkpoints/last.pt").exists()

    expected, expected_log = _final_and_log(whole, "pw")
    got, got_log = _final_and_log(parts, "pw")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert got_log == expected_log


def test_a_checkpoint_of_other_params_is_not_resumed(tmp_path):
    """Changed params make the old checkpoint stale: the run starts over with a warning instead of resuming it."""
    run = make_run(tmp_path, epochs=1)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(run, "clip", progress=False, on_step=_interrupt_at(2))
    changed = make_run(tmp_path, epochs=1, lr=5e-4)
    with pytest.warns(UserWarning, match="written for other params"):
        summary = train_one_prepared(changed, "clip", progress=False)
    assert summary["resumed_from_step"] is None and summary["steps"] == 6


# ---------------------------------------------------------------------------------------------- errors
def test_bad_params_give_clear_errors(tmp_path):
    """M above the number of groups, a group loss with M = 1 and an unknown run name fail before training."""
    with pytest.raises(ValueError, match="groups_per_batch .*exceeds the number of training groups"):
        train_one_prepared(make_run(tmp_path / "a", groups_per_batch=7), "clip", progress=False)
    with pytest.raises(ValueError, match="groups_per_batch >= 2"):
        train_one_prepared(make_run(tmp_path / "b", groups_per_batch=1, runs=[{"name": "c", "loss": "centroid"}]), "c",
                  progress=False)
    with pytest.raises(ValueError, match="no run named 'pairwise'"):
        train_all_prepared(make_run(tmp_path / "c"), ["pairwise"], progress=False)


def test_too_long_warmup_is_shortened_with_a_warning(tmp_path):
    """warmup_steps beyond the run's steps is cut to a tenth of them, warned and recorded in the summary."""
    run = make_run(tmp_path, epochs=1, warmup_steps=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train_one_prepared(run, "clip", progress=False)
    assert any("warmup_steps (100)" in str(w.message) for w in caught)
    assert summary["warmup_steps_used"] == {"train": 0}


def test_trainable_text_tower_is_trained(tmp_path):
    """With freeze_text false the text tower is encoded per step and updated; no texts are precomputed."""
    run = make_run(tmp_path, model={"freeze_text": False}, epochs=1)
    summary = train_one_prepared(run, "clip", progress=False)
    assert summary["precomputed_texts"] == 0 and summary["text_frozen"] is False
    initial = weights(run.dir / "training" / "initial.safetensors")
    final = weights(run.dir / "training" / "clip" / "final.safetensors")
    assert not all(torch.equal(final[k], initial[k]) for k in text_keys(initial))
    load_weights(build_model(run.params.model).model, run.dir / "training" / "clip" / "final.safetensors")


def test_dataloader_workers_give_the_same_training(tmp_path):
    """Batches assembled in DataLoader worker processes (memmap cache, tokenizer) train exactly the same weights."""
    inline = make_run(tmp_path / "inline", epochs=1, model={"freeze_text": False})
    workers = make_run(tmp_path / "workers", epochs=1, model={"freeze_text": False}, num_workers=2)
    train_one_prepared(inline, "clip", progress=False)
    train_one_prepared(workers, "clip", progress=False)
    a = weights(inline.dir / "training/clip/final.safetensors")
    b = weights(workers.dir / "training/clip/final.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- epoch kinds
def test_steps_per_epoch_are_printed_and_stored(tmp_path, capsys):
    """A pairs epoch (the default) takes ceil(pairs / N) batches per group; the count is printed before training
    and stored in summary.json, next to the groups epoch's one batch per group."""
    run = make_run(tmp_path / "pairs", epoch="pairs", epochs=1)
    summary = train_one_prepared(run, "clip", progress=False)
    # tiny_magic: 6 groups x 6 training images x 2 node captions = 12 pairs per group, N = 3 -> 4 chunks
    assert summary["epoch_kind"] == "pairs" and summary["steps_per_epoch"] == 6 * 4 == summary["steps"]
    assert summary["sampler"]["training_pairs"] == 72
    assert "clip: image-text, 24 optimizer steps per epoch x 1 epochs (train.epoch: pairs" in capsys.readouterr().out
    groups = train_one_prepared(make_run(tmp_path / "groups", epochs=1), "clip", progress=False)
    assert groups["epoch_kind"] == "groups" and groups["steps_per_epoch"] == 6
    saved = json.loads((run.dir / "training/clip/summary.json").read_text())
    assert saved["steps_per_epoch"] == 24
    assert Params.model_validate({}).train.epoch == "pairs"


# ---------------------------------------------------------------------------------------- weights moved
def test_weights_moved_figures_per_tower(trained):
    """summary.json and summary_table give, per tower, the fraction of parameters changed and ||w - w0|| / ||w0||,
    computed against the initial weights; a frozen tower reports exactly 0; no sentence when weights moved."""
    run, summaries = trained
    initial = weights(run.dir / "training" / "initial.safetensors")
    for name in ("clip", "pairwise"):
        moved = summaries[name]["weights_moved"]
        final = load_trained(run.params, run.dir, name).model
        params = {k: p.detach() for k, p in final.named_parameters()}
        for tower, keys in (("image", [k for k in params if k.startswith("visual.")]),
                            ("text", [k for k in params if k in text_keys(initial)])):
            changed = sum(int((params[k] != initial[k]).sum()) for k in keys)
            total = sum(params[k].numel() for k in keys)
            delta = torch.sqrt(sum(((params[k].double() - initial[k].double()) ** 2).sum() for k in keys))
            norm = torch.sqrt(sum((initial[k].double() ** 2).sum() for k in keys))
            assert moved[tower]["fraction_changed"] == pytest.approx(changed / total)
            assert moved[tower]["relative_update"] == pytest.approx(float(delta / norm))
    assert summaries["clip"]["weights_moved"]["text"] == {**summaries["clip"]["weights_moved"]["text"],
                                                          "trained": False, "fraction_changed": 0.0}
    assert summaries["pairwise"]["weights_moved"]["text"]["trained"] is True
    assert summaries["clip"]["weights_moved"]["image"]["fraction_changed"] > 0.9
    table = summary_table(summaries)
    assert {"steps per epoch", "image params changed", "image relative update", "text params changed",
            "skipped steps"} <= set(table.columns)
    assert weights_moved_note(summaries) is None


def test_a_learning_rate_too_small_to_move_weights_is_reported(tmp_path):
    """At lr 1e-12 in fp32 AdamW's updates (about lr) are below half an ulp of almost every weight: the summary
    shows most image parameters unchanged and weights_moved_note says so, naming the run."""
    run = make_run(tmp_path, epochs=1, lr=1e-12)
    summary = train_one_prepared(run, "clip", progress=False)
    moved = summary["weights_moved"]["image"]
    assert moved["fraction_changed"] < 0.5 and moved["relative_update"] < 1e-9
    note = weights_moved_note({"clip": summary})
    assert note is not None and "clip (image tower" in note and "round away" in note


# ------------------------------------------------------------------------------------------------ text ids
def test_batch_items_carry_text_ids_of_identical_strings(tmp_path):
    """Every batch item carries text ids over the whole batch's distinct texts: equal id <=> identical string,
    and the same numbering on every DDP rank's shard (what the losses use to never contrast identical texts)."""
    run = make_run(tmp_path)
    inputs = load_inputs(run, 32, progress=False)
    sampler = GroupBatchSampler(inputs.magic, 4, 3, seed=0)
    for index in range(len(sampler)):
        batch = sampler.batch(0, index)
        ids, texts = [], []
        for rank in range(2):
            data = GroupBatchData(sampler, inputs.cache, 0, 0, DistInfo(rank=rank, world_size=2), None,
                                  lambda t: torch.zeros(len(t), 4, dtype=torch.long))
            ids += data[index]["text_ids"].tolist()
        texts = [t for row in batch.texts for t in row]
        assert len(ids) == len(texts) == 12
        for a, b in itertools.combinations(range(12), 2):
            assert (ids[a] == ids[b]) == (texts[a] == texts[b])
        assert len(set(texts)) < len(texts)  # node captions cycle to N: identical texts do occur


def test_a_run_overrides_the_text_source(tmp_path):
    """train.runs[i].text_source: original trains that run on its images' own captions (the summary says so) while
    the other runs keep train.text_source; at its default the key leaves a run's spec (and cached weights) as before."""
    from cglib.train.inputs import run_entry, run_spec

    run = make_run(tmp_path, epochs=1, runs=[{"name": "clip", "loss": "clip"},
                                             {"name": "clip_own", "loss": "clip", "text_source": "original"}])
    assert "text_source" not in run_spec(run.params, run_entry(run.params, "clip"))["run"]
    assert run_spec(run.params, run_entry(run.params, "clip_own"))["run"]["text_source"] == "original"
    summaries = {name: train_one_prepared(run, name, progress=False) for name in ("clip", "clip_own")}
    assert summaries["clip"]["text_source"] == "generalized"
    assert summaries["clip_own"]["text_source"] == "original"
    assert summaries["clip_own"]["sampler"]["text_source"] == "original"
