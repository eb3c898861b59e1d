"""The objective registry and protocol (cglib/train/objectives): every objective behind one interface, your own
loaded from outside the library, trained, resumed exactly, and run under 2-process DDP like the built-in ones."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from float_tolerance import ADAM_EPS, trained_tolerance
from prepared_runs import train_all_prepared, train_one_prepared
from pydantic import ValidationError
from test_train import _final_and_log, _interrupt_at, make_run
from test_train_distributed import free_port

from cglib.config import TrainRunParams
from cglib.distributed import DistInfo
from cglib.encoding import encode_texts
from cglib.models import build_model
from cglib.prepare import load_inputs
from cglib.prepare.inputs import keyword_permuter
from cglib.train import ensure_initial
from cglib.train.checkpoint import load_checkpoint
from cglib.train.inputs import related_methods, run_spec
from cglib.train.loop import GroupBatchData, GroupTask, Stepper, set_trainable, wrap
from cglib.train.objectives import FAMILIES, OBJECTIVES, Objective, Setup, build_objective, objective_class
from cglib.train.sampler import GroupBatchSampler
from cglib.weights import load_weights

PLUGINS = Path(__file__).parent / "plugins"
OWN = "my_objectives:CentroidTriplet"
WORLD_SIZE = 2
LR = 0.1  # with ADAM_EPS (float_tolerance.py) the gradient, not the weight decay, moves the weights


@pytest.fixture
def plugin_path(monkeypatch):
    """tests/plugins on the Python path of this process and of the processes it starts (DDP workers)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))


def test_every_built_in_objective_describes_itself():
    """Each registered objective has its registry name, a label and a family of FAMILIES; the names the params
    accept are exactly the registry's, and the paper's rows (clip, pairwise, centroid, re) are no related method."""
    assert list(OBJECTIVES)[:4] == ["clip", "pairwise", "centroid", "re"]
    for name, cls in OBJECTIVES.items():
        assert issubclass(cls, Objective) and cls.name == name and cls.label and cls.family in FAMILIES
        assert TrainRunParams(name="r", loss=name,
                              options={"memory_momentum": 0.5} if name == "memory_centroid" else {})
    assert [n for n, c in OBJECTIVES.items() if not c.related] == ["clip", "pairwise", "centroid", "re"]
    memory = TrainRunParams(name="r", loss="centroid", options={"memory_momentum": 0.9})
    assert memory.objective() is OBJECTIVES["memory_centroid"] and memory.options.memory_momentum == 0.9


@pytest.mark.parametrize(("loss", "message"), [
    ("centroidd", "unknown loss 'centroidd'; did you mean 'centroid'?"),
    ("no_such_package.module:Thing", "cannot import module 'no_such_package.module'"),
    ("my_objectives:Missing", "module 'my_objectives' has no 'Missing'; check the class name"),
    ("my_objectives:NotAnObjective", "NotAnObjective is not a subclass of cglib.train.objectives.base.Objective"),
    ("my_objectives:OddFamily", "family 'pairs' is not one of clip, group, text"),
])
def test_a_bad_loss_is_a_params_error_naming_the_fix(plugin_path, loss, message):
    """An unknown name, a module that does not import, a class that is not an Objective and an unknown family are
    errors of the params file at train.runs[i].loss."""
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("?", r"\?")):
        TrainRunParams(name="r", loss=loss)


def test_an_option_of_another_objective_is_refused():
    """memory_momentum belongs to the centroid objectives and released to re: on another loss, the error names
    the option and the options that loss takes."""
    with pytest.raises(ValidationError, match=r"run 'r' \(loss: clip\): options.memory_momentum: Extra inputs are "
                                              r"not permitted \(its options: logit_scale, hierarcaps_features\)"):
        TrainRunParams(name="r", loss="clip", options={"memory_momentum": 0.5})
    with pytest.raises(ValidationError, match=r"options.released: Extra inputs.*its options: tau_inner, alpha, "
                                              "alpha_on, normalize_products"):
        TrainRunParams(name="r", loss="pairwise", options={"released": "x.bin"})


def test_an_entry_key_that_became_an_option_names_its_new_place():
    """Keys that concern one objective left the run entry for its options: an older params file is told where."""
    with pytest.raises(ValidationError, match=r"run 'p': these keys are now options of its objective: alpha_on -> "
                                              r"options.alpha_on \(pairwise, centroid, memory_centroid\); "
                                              r"memory_momentum -> options.memory_momentum"):
        TrainRunParams(name="p", loss="pairwise", alpha_on="outer", memory_momentum=0.9)


def test_group_options_default_to_the_train_section(tmp_path):
    """A group loss's tau_inner and alpha left null are train's in the run's spec (so tuning train.alpha retrains
    it), an entry's own value wins, and clip's spec holds no group option at all."""
    run = make_run(tmp_path, runs=[{"name": "c", "loss": "clip"}, {"name": "p", "loss": "pairwise"},
                                   {"name": "q", "loss": "centroid", "options": {"alpha": 0.25, "alpha_on": "outer"}}])
    clip, pairwise, centroid = (run_spec(run.params, e)["run"] for e in run.params.train.runs)
    t = run.params.train
    assert clip["options"] == {"logit_scale": "fixed"}  # none of the group losses' options
    assert pairwise["options"] == {"tau_inner": t.tau_inner, "alpha": t.alpha, "alpha_on": "inner",
                                   "normalize_products": False}
    assert centroid["options"]["alpha"] == 0.25 and centroid["options"]["alpha_on"] == "outer"
    built = build_objective(run.params, run.params.train.runs[2], centroid)
    assert (built.tau_inner, built.alpha, built.alpha_on) == (t.tau_inner, 0.25, "outer")
    with pytest.raises(ValueError, match="needs options tau_inner, alpha, alpha_on, normalize_products"):
        OBJECTIVES["pairwise"]({"tau": 0.1})


def test_your_own_objective_trains_resumes_exactly_and_is_reported(tmp_path, plugin_path):
    """`loss: my_objectives:CentroidTriplet` (a class defined outside cglib) trains with the library's loop,
    writes its name, family and label into the summary, is a related row (in no paper gain set), and resumed
    after an interruption it ends with exactly the weights and log of an uninterrupted run."""
    settings = {"runs": [{"name": "triplet", "loss": OWN}]}
    whole = make_run(tmp_path / "whole", **settings)
    assert objective_class(OWN).__module__ == "my_objectives"
    summary = train_one_prepared(whole, "triplet", progress=False)
    assert summary["objective"] == "centroid_triplet" and summary["objective_family"] == "group"
    assert summary["objective_label"] == "triplet loss over group centroids"
    assert summary["related"] == [f"your own objective ({OWN})"] == related_methods(whole.params.train.runs[0])
    expected, expected_log = _final_and_log(whole, "triplet")
    assert len({row[2] for row in expected_log}) > 1  # the loss moved

    parts = make_run(tmp_path / "parts", **settings)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "triplet", progress=False, on_step=_interrupt_at(3))
    assert load_checkpoint(parts.dir / "training/triplet/checkpoints/last.pt")["objective"] == {}
    assert train_one_prepared(parts, "triplet", progress=False)["resumed_from_step"] == 3
    got, got_log = _final_and_log(parts, "triplet")
    assert all(torch.equal(expected[k], got[k]) for k in expected) and got_log == expected_log


# ------------------------------------------------------------------ every objective under 2-process DDP
IMAGE_TEXT = [name for name, cls in OBJECTIVES.items() if cls.phase == "train"] + [OWN, "clip learned scale"]
OPTIONS = {"memory_centroid": {"memory_momentum": 0.5}, "clip learned scale": {"logit_scale": "learned"}}


def one_step_each(run_dir: Path, info: DistInfo) -> dict:
    """One optimizer step on batch 0 (M=4 groups, N=3) per image-text objective, set up as the trainer does:
    loss, the model's parameters and the objective's own state (mcc's head, the memory's rows)."""
    results = {}
    for loss in IMAGE_TEXT:  # "clip learned scale": the clip objective with its own trained logit scale
        run = make_run(run_dir, runs=[{"name": "r", "loss": loss.split()[0], "options": OPTIONS.get(loss, {})}])
        entry = run.params.train.runs[0]
        bundle = build_model(run.params.model)
        load_weights(bundle.model, run_dir / "training" / "initial.safetensors")
        inputs = load_inputs(run, bundle.image_size, progress=False, info=info)
        inputs.permuter = keyword_permuter(run.params, [entry])  # as prepare_inputs adds it for clip_hn
        sampler = GroupBatchSampler(inputs.magic, 4, 3, seed=0)
        objective = build_objective(run.params, entry, run_spec(run.params, entry)["run"])
        objective.setup(Setup(bundle, lambda bundle=bundle: bundle, sampler, inputs, run.params, entry, 0, 1,
                              torch.device("cpu")))
        set_trainable(bundle, image=True, text=False)
        texts = sorted(set(sampler.all_texts()) | (objective.replacement_texts() or set()))
        table = torch.from_numpy(encode_texts(bundle, texts))
        module = wrap(GroupTask(bundle, objective, table), info)
        stepper = Stepper(bundle.model, module, lr=LR, weight_decay=0.1, warmup_steps=0, total_steps=10, amp=None,
                          grad_clip=1.0, device=torch.device("cpu"), head=objective, eps=ADAM_EPS)
        item = GroupBatchData(sampler, inputs.cache, 0, 0, info, {t: k for k, t in enumerate(texts)}, None,
                              objective.pair_replacements())[0]
        result = stepper.step([item], module, lambda r, o=objective: o.after_step(bool(r["skipped"])))
        results[loss] = {"loss": result["loss"],
                         "params": {k: v.detach().clone() for k, v in bundle.model.state_dict().items()},
                         "objective": {k: v for k, v in objective.state_dict().items() if torch.is_tensor(v)},
                         "extra": objective.get_extra_state() if loss == "memory_centroid" else {}}
    return results


def worker(rank: int, port: int, run_dir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.path.insert(0, str(PLUGINS))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.set_num_threads(1)
        torch.save(one_step_each(Path(run_dir), DistInfo(rank, WORLD_SIZE, 0, torch.device("cpu"))),
                   Path(run_dir) / f"objectives-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_image_text_objective_under_ddp_equals_one_process(tmp_path, plugin_path):
    """For every registered image-text objective and a user's own: 2 gloo ranks holding 2 groups each end one
    step with the loss, model parameters and objective state (mcc's concept head, the memory's rows) of one
    process holding all 4 groups: what an objective owns is synchronized because DDP wraps it with the towers."""
    ensure_initial(make_run(tmp_path))
    torch.set_num_threads(1)
    single = one_step_each(tmp_path, DistInfo())
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(tmp_path / f"objectives-rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    assert single["mcc"]["objective"] and single["memory_centroid"]["extra"]  # state that must stay in step
    assert set(single["clip learned scale"]["objective"]) == {"logit_scale"}
    for loss, expected in single.items():
        for rank in ranks:
            got = rank[loss]
            assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5), loss
            # one optimizer step: at most one ulp apart, which rtol = EPS32 admits (tests/float_tolerance.py);
            # measured 69% (AVX2) and 91% (AVX-512) of the tolerance, each one ulp. The
            # memory's rows are forward values (no optimizer): 2e-6 / 1e-5, far above their rounding
            for part in ("params", "objective"):
                for name, value in expected[part].items():
                    torch.testing.assert_close(got[part][name], value, **trained_tolerance(1, LR), msg=f"{loss} {name}")
            for key in ("image", "text"):
                if expected["extra"]:
                    torch.testing.assert_close(got["extra"][key], expected["extra"][key], atol=2e-6, rtol=1e-5)


def test_a_trial_run_reuses_the_rows_beside_and_trains_only_yours(tmp_path, plugin_path):
    """trial_run (notebook 09) shares the run's data, copies the base and the named trained rows (train_all
    reuses them: same spec, same summary) and trains only the new entry; unknown or clashing names are errors."""

    from cglib.train.trial_run import trial_run

    run = make_run(tmp_path / "run", runs=[{"name": "clip", "loss": "clip"}, {"name": "pw", "loss": "pairwise"}])
    trained = train_one_prepared(run, "clip", progress=False)
    trial = trial_run(run, [{"name": "triplet", "loss": OWN}], beside=["clip"])
    assert [r.name for r in trial.params.train.runs] == ["clip", "triplet"]
    assert (trial.dir / "magic").resolve() == (run.dir / "magic").resolve()
    summaries = train_all_prepared(trial, progress=False)
    reused = summaries["clip"]  # reused, not retrained: the summary written by the first training
    assert (reused["spec_hash"], reused["wall_time_s"]) == (trained["spec_hash"], trained["wall_time_s"])
    assert summaries["triplet"]["objective"] == "centroid_triplet" and summaries["triplet"]["steps"] > 0
    with pytest.raises(ValueError, match="beside names \\['nope'\\]"):
        trial_run(run, [{"name": "triplet", "loss": OWN}], beside=["nope"])
    with pytest.raises(ValueError, match="already taken"):
        trial_run(run, [{"name": "clip", "loss": OWN}], beside=["clip"])
