"""The paper as published and as corrected (issue #32 item 1): run.protocol sets every protocol key a params file
leaves unset, a key the file sets wins, corrected is the schema's defaults, the authors' optimizer is built as their
main.py builds it, and the guide's fidelity page (book/fidelity.md) lists every key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from prepared_runs import train_one_prepared

from cglib.cli import main as cli_main
from cglib.config import MagicParams, Params, TrainParams, load_params
from cglib.config.protocol import DIFFERENCES, OPTION_PREFIX, UNKEYED_DIFFERENCES, protocol_value
from cglib.train.inputs import run_spec
from cglib.train.objectives import objective_with
from cglib.train.optim import amp_dtype, build_optimizer

REPO = Path(__file__).resolve().parent.parent
RUNS = [{"name": "clip", "loss": "clip"}, {"name": "pairwise", "loss": "pairwise"},
        {"name": "centroid", "loss": "centroid"}]


def options_of(params: Params, name: str) -> dict:
    entry = next(r for r in params.train.runs if r.name == name)
    return run_spec(params, entry)["run"].get("options", {})


def value_of(params: Params, key: str):
    section, name = key.split(".")
    return getattr(getattr(params, section), name)


def test_corrected_is_the_schema_default():
    """Every corrected value equals what a params file without run.protocol gets and what the schema's own
    defaults are: the umbrella's default changes nothing, and the default runs' options resolve to the printed
    equations."""
    schema_defaults = Params.model_construct(train=TrainParams(), magic=MagicParams())
    for d in DIFFERENCES:
        if not d.key.startswith(OPTION_PREFIX):
            assert value_of(schema_defaults, d.key) == pytest.approx(d.corrected), d.key
            assert value_of(Params(), d.key) == pytest.approx(d.corrected), d.key
    params = Params.model_validate({"train": {"runs": RUNS}})
    assert params.run.protocol == "corrected"
    assert options_of(params, "pairwise")["alpha_on"] == "inner" and not options_of(params, "pairwise")["normalize_products"]


def test_as_published_sets_every_key_the_file_leaves_unset_and_a_set_key_wins():
    params = Params.model_validate({"run": {"protocol": "as_published"},
                                    "train": {"weight_decay": 0.05, "runs": [
                                        *RUNS, {"name": "inner", "loss": "centroid", "options": {"alpha_on": "inner"}}]}})
    t = params.train
    assert t.weight_decay == 0.05  # the file's own value
    assert (t.warmup_steps, t.adam_betas, t.adam_eps, t.amp, t.tau_inner) == (1430, (0.9, 0.999), 1e-8, "auto_fp16",
                                                                              0.07)
    assert params.magic.generalize == "level"
    assert Params.model_validate({"run": {"protocol": "as_published"},
                                  "magic": {"generalize": "image"}}).magic.generalize == "image"
    assert options_of(params, "pairwise") == {"tau_inner": 0.07, "alpha": 0.7, "alpha_on": "outer",
                                              "normalize_products": True}
    assert options_of(params, "centroid")["alpha_on"] == "outer"
    assert options_of(params, "inner")["alpha_on"] == "inner"  # the entry's own option
    assert run_spec(params, params.train.runs[0])["run"]["options"] == {"logit_scale": "learned",
                                                                        "hierarcaps_features": "raw"}
    with pytest.raises(ValueError, match="run.protocol must be one of corrected, as_published"):
        protocol_value("train.amp", "published")


def test_the_protocol_changes_the_spec_of_the_runs_it_changes():
    """A group-loss run's spec (so its cached weights) differs between the protocols; built outside a run, the
    objective takes the protocol's options too."""
    plain = Params.model_validate({"train": {"runs": RUNS}})
    published = Params.model_validate({"run": {"protocol": "as_published"}, "train": {"runs": RUNS}})
    assert run_spec(plain, plain.train.runs[1]) != run_spec(published, published.train.runs[1])
    built = objective_with("pairwise", 0.1, protocol="as_published", tau_inner=0.07, alpha=0.7)
    assert (built.alpha_on, built.options.normalize_products) == ("outer", True)
    assert objective_with("pairwise", 0.1, tau_inner=0.1, alpha=0.7).alpha_on == "inner"


def test_paper_profiles_differ_only_in_name_and_protocol():
    """params/paper_corrected.yaml is params/paper.yaml with run.protocol corrected (and its own run name); the
    pretraining rows take their targets from the protocol (the authors' with_concepts, our leakage_free)."""
    def flat(tree, prefix=""):
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    paper, corrected = (flat(yaml.safe_load((REPO / "params" / f).read_text())) for f in
                        ("paper.yaml", "paper_corrected.yaml"))
    assert {k for k in paper.keys() | corrected.keys() if paper.get(k) != corrected.get(k)} == {
        "run.name", "run.protocol"}
    assert (paper["run.protocol"], corrected["run.protocol"]) == ("as_published", "corrected")
    published = load_params(REPO / "params" / "paper.yaml", check_paths=False)
    corrected = load_params(REPO / "params" / "paper_corrected.yaml", check_paths=False)
    for d in DIFFERENCES:
        if not d.key.startswith(OPTION_PREFIX):
            assert value_of(published, d.key) == pytest.approx(d.as_published), d.key
            assert value_of(corrected, d.key) == pytest.approx(d.corrected), d.key
    assert {r.pretrain for r in published.train.runs} == {"none", "with_concepts"}
    assert {r.pretrain for r in corrected.train.runs} == {"none", "leakage_free"}


@pytest.mark.parametrize("profile, protocol", [("paper.yaml", "as_published"), ("paper_corrected.yaml", "corrected")])
def test_cglib_validate_shows_every_protocol_key_with_its_value(profile, protocol, capsys):
    """`cglib validate` prints each protocol key as the params resolve it: the paper profiles set none themselves,
    so every line is the protocol's value, unmarked; a key a file sets is marked."""
    assert cli_main(["validate", "--no-check-paths", str(REPO / "params" / profile)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"run.protocol: {protocol} ")
    shown = dict(line.strip().split(": ", 1) for line in lines[2:])
    assert list(shown) == [d.key for d in DIFFERENCES]
    for d in DIFFERENCES:
        assert shown[d.key].startswith(str(protocol_value(d.key, protocol))) and "set in the file" not in shown[d.key]
    assert shown["train.pretrain_features"] == ("raw" if protocol == "as_published" else "normalized")
    params_file = REPO / "params" / "demo.yaml"
    assert cli_main(["validate", "--no-check-paths", str(params_file)]) == 0
    demo = yaml.safe_load(params_file.read_text())["train"]
    assert f"train.warmup_steps: {demo['warmup_steps']} (set in the file)" in capsys.readouterr().out


def test_pretrain_true_takes_the_protocols_targets_and_an_explicit_value_stays():
    runs = [{"name": "p", "loss": "pairwise", "pretrain": True}, {"name": "q", "loss": "pairwise", "pretrain": False},
            {"name": "r", "loss": "centroid", "pretrain": "leakage_free"}]
    published = Params.model_validate({"run": {"protocol": "as_published"}, "train": {"runs": runs}})
    assert [r.pretrain for r in published.train.runs] == ["with_concepts", "none", "leakage_free"]
    own = Params.model_validate({"run": {"protocol": "as_published"},
                                 "train": {"pretrain_targets": "leakage_free", "runs": runs}})
    assert own.train.runs[0].pretrain == "leakage_free"
    explicit = Params.model_validate({"run": {"protocol": "as_published"},
                                      "train": {"runs": [{**runs[0], "pretrain": "with_concepts"}]}})
    plain = Params.model_validate({"run": {"protocol": "as_published"}, "train": {"runs": runs[:1]}})
    assert run_spec(explicit, explicit.train.runs[0])["run"] == run_spec(plain, plain.train.runs[0])["run"]


def test_the_authors_optimizer_as_their_main_py_builds_it():
    """As published: AdamW with no decay on gains, biases and the logit scale, decay 4.53e-5 elsewhere, betas (0.9,
    0.999), eps 1e-8 (their main.py, literally); fp16 on a GPU and fp32 on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model.logit_scale = torch.nn.Parameter(torch.ones([]))
    t = Params.model_validate({"run": {"protocol": "as_published"}}).train
    ours = build_optimizer(model, 1e-8, t.weight_decay, betas=t.adam_betas, eps=t.adam_eps)
    # their main.py
    exclude = lambda n, p: p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n
    named = list(model.named_parameters())
    theirs = torch.optim.AdamW([{"params": [p for n, p in named if exclude(n, p)], "weight_decay": 0.0},
                                {"params": [p for n, p in named if not exclude(n, p)], "weight_decay": 4.5269353639276774e-05}],
                               lr=1e-8, betas=(0.9, 0.999), eps=1e-8)
    def groups(opt):
        return sorted((g["weight_decay"], g["betas"], g["eps"], sorted(id(p) for p in g["params"]))
                      for g in opt.param_groups)
    assert groups(ours) == groups(theirs)
    assert amp_dtype("auto_fp16", torch.device("cpu")) is None


def test_the_fidelity_page_lists_every_protocol_key():
    text = (REPO / "book" / "fidelity.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    missing = [d.key for d in DIFFERENCES if not any(line.startswith(f"| `{d.key}` |") for line in rows)]
    assert not missing, f"book/fidelity.md's table lacks {missing}: add a row for each (key, both values, source)"


def test_the_fidelity_page_lists_every_unkeyed_difference():
    """The table "Differences that are not protocol keys" has one row per name of UNKEYED_DIFFERENCES (its first
    cell), no other row, and every row as many cells as its header."""
    lines = (REPO / "book" / "fidelity.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("**Differences that are not protocol keys"))
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    header, rows = table[0], table[2:]
    assert [c.strip() for c in header.split("|")[1:-1]] == ["what differs", "the authors' code", "ours",
                                                          "what it changes", "why it is not a key"]
    assert all(len(row.split("|")) == len(header.split("|")) for row in rows), "a row's cells differ from the header"
    names = [row.split("|")[1].strip() for row in rows]
    assert len(set(UNKEYED_DIFFERENCES)) == len(UNKEYED_DIFFERENCES) and len(set(names)) == len(names)
    missing = [n for n in UNKEYED_DIFFERENCES if n not in names]
    extra = [n for n in names if n not in UNKEYED_DIFFERENCES]
    assert not missing, f"book/fidelity.md's table of differences that are not protocol keys lacks rows {missing}"
    assert not extra, f"rows {extra} of that table are not in cglib.config.protocol.UNKEYED_DIFFERENCES: add them"


def test_a_learned_clip_scale_trains_clamps_saves_and_resumes_exactly(tmp_path):
    """options.logit_scale: learned (as published) starts from the model's scale, moves, stays within [0, ln 100],
    is saved beside the final weights and in the summary, and an interrupted run resumes to the same weights, scale
    and log."""
    import math

    from safetensors.torch import load_file
    from test_train import _final_and_log, _interrupt_at, make_run



    runs = [{"name": "c", "loss": "clip", "options": {"logit_scale": "learned"}}]
    whole = make_run(tmp_path / "whole", runs=runs, lr=5e-2)
    summary = train_one_prepared(whole, "c", progress=False)
    start = float(load_file(str(tmp_path / "whole" / "training" / "initial.safetensors"))["logit_scale"])
    saved = load_file(str(tmp_path / "whole" / "training" / "c" / "logit_scale.safetensors"))["logit_scale"]
    assert 0 <= float(saved) <= math.log(100) and float(saved) != pytest.approx(min(start, math.log(100)), abs=1e-6)
    assert summary["logit_scale"]["final_exp"] == pytest.approx(math.exp(float(saved)))
    parts = make_run(tmp_path / "parts", runs=runs, lr=5e-2)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "c", progress=False, on_step=_interrupt_at(3))
    train_one_prepared(parts, "c", progress=False)
    (w1, log1), (w2, log2) = _final_and_log(whole, "c"), _final_and_log(parts, "c")
    assert log1 == log2 and all(torch.equal(w1[k], w2[k]) for k in w1)
    again = load_file(str(tmp_path / "parts" / "training" / "c" / "logit_scale.safetensors"))["logit_scale"]
    assert torch.equal(saved, again)


class RecordingObjective(torch.nn.Module):
    """Stands in for a run's objective inside GroupTask: keeps the text ids it is handed."""

    unit_features = True

    def forward(self, batch):
        self.text_ids = batch.text_ids
        return {"loss": batch.image.sum() * 0}


@pytest.mark.parametrize("mask", [True, False])
def test_unmasked_as_published_hands_the_objective_no_text_ids(mask):
    """train.mask_identical_texts (as published: false) decides whether the batch's text ids reach the objective;
    the as-published protocol sets it false, corrected true, and a true value leaves the run's spec as before."""
    from cglib.config import ModelParams
    from cglib.models import build_model
    from cglib.train.step import GroupTask

    torch.manual_seed(0)
    bundle = build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm"))
    table = torch.nn.functional.normalize(torch.randn(3, bundle.embed_dim), dim=-1)
    objective = RecordingObjective()
    task = GroupTask(bundle, objective, table, mask_identical_texts=mask)
    ids = torch.tensor([0, 1, 1, 2])  # the second group repeats a caption of the first
    task({"pixels": torch.zeros(4, 32, 32, 3, dtype=torch.uint8), "m": 2, "n": 2,
          "text_rows": torch.tensor([0, 1, 1, 2]), "text_ids": ids})
    assert torch.equal(objective.text_ids, ids.reshape(2, 2)) if mask else objective.text_ids is None
    protocol = "corrected" if mask else "as_published"
    params = Params.model_validate({"run": {"protocol": protocol}, "train": {"runs": RUNS}})
    assert params.train.mask_identical_texts is mask
    assert ("mask_identical_texts" in run_spec(params, params.train.runs[0])["train"]) is not mask


def test_the_unmasked_clip_loss_is_the_authors_cliploss_on_a_batch_with_a_repeated_caption():
    """Their train.py's open_clip ClipLoss: cross-entropy over cos * scale with labels arange, both directions,
    averaged; ours without text ids is that loss, and masking the repeated caption changes it."""
    from cglib.losses import clip_loss

    torch.manual_seed(0)
    image = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    text[2] = text[1]  # two pairs share a caption
    logits = image @ text.T / 0.07
    labels = torch.arange(4)
    theirs = (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)) / 2
    assert torch.allclose(clip_loss(image, text, tau=0.07), theirs, atol=1e-6)
    masked = clip_loss(image, text, tau=0.07, text_ids=torch.tensor([0, 1, 1, 2]))
    assert not torch.allclose(masked, theirs, atol=1e-3)


HIERARCAPS_RUNS = [{"name": "clip", "loss": "clip"}, {"name": "hierarcaps", "loss": "re"},
                   {"name": "hierarcaps_ft", "loss": "clip", "init": "hierarcaps"},
                   {"name": "hierarcaps_ft2", "loss": "clip", "init": "hierarcaps_ft"}]


def clip_step_loss(protocol: str, run: str):
    """The loss GroupTask hands back for one batch of run `run` under `protocol`, and the towers' raw features."""
    from cglib.config import ModelParams
    from cglib.encoding import pixels_to_tensor
    from cglib.models import build_model
    from cglib.train.objectives import Setup, build_objective
    from cglib.train.step import GroupTask

    params = Params.model_validate({"run": {"protocol": protocol}, "train": {"runs": HIERARCAPS_RUNS}})
    entry = next(r for r in params.train.runs if r.name == run)
    torch.manual_seed(0)
    bundle = build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm"))
    objective = build_objective(params, entry, run_spec(params, entry)["run"])
    objective.setup(Setup(bundle, None, None, None, params, entry, 0, 1, torch.device("cpu")))
    texts = ["a red ball", "a blue cube", "two green cones", "a dog on grass"]
    pixels = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    item = {"pixels": pixels, "m": 2, "n": 2, "tokens": bundle.tokenizer(texts), "text_inverse": torch.arange(4),
            "text_ids": torch.arange(4)}
    loss = GroupTask(bundle, objective, None, params.train.mask_identical_texts)(item)["loss"].detach()
    with torch.no_grad():
        image = bundle.model.encode_image(pixels_to_tensor(pixels, bundle))
        text = bundle.model.encode_text(bundle.tokenizer(texts))
    return loss, image, text, float(bundle.model.logit_scale.detach().exp()), objective


@pytest.mark.parametrize("protocol", ["as_published", "corrected"])
def test_the_hierarcaps_fine_tune_trains_on_raw_features_as_published(protocol):
    """options.hierarcaps_features: as published, a run fine-tuning the HierarCaps model (its init chain reaches the
    re run) gives open_clip's ClipLoss the towers' unnormalized features with the model's logit scale, as the
    authors' train.py did with their transformers CLIPModel; corrected, the unit-norm features at the fixed tau.
    The plain clip run is normalized under both."""
    from open_clip.loss import ClipLoss

    def their_loss(image, text, scale):
        return ClipLoss()(image, text, torch.tensor(scale))

    normalize = torch.nn.functional.normalize
    for run in ("hierarcaps_ft", "hierarcaps_ft2", "clip"):
        loss, image, text, model_scale, objective = clip_step_loss(protocol, run)
        assert float(image.norm(dim=-1).sub(1).abs().min()) > 1e-2  # the raw features are far from unit norm
        raw = protocol == "as_published" and run != "clip"
        scale = model_scale if protocol == "as_published" else 1 / 0.1  # the learned scale starts at the model's
        expected = their_loss(image, text, scale) if raw else their_loss(normalize(image, dim=-1),
                                                                          normalize(text, dim=-1), scale)
        other = their_loss(normalize(image, dim=-1), normalize(text, dim=-1), scale) if raw else their_loss(
            image, text, scale)
        assert float(loss) == pytest.approx(float(expected), rel=1e-5), run
        assert float(loss) != pytest.approx(float(other), rel=1e-2), run
        assert objective.unit_features is not raw
        assert (objective.describe() or {}).get("features", "").startswith("raw") is raw


def test_hierarcaps_features_leave_the_corrected_spec_as_before():
    """normalized (corrected, or set in the file) leaves a clip run's spec as it was before the key existed, so the
    corrected runs' cached weights stay valid; raw enters the spec and retrains the run."""
    corrected = Params.model_validate({"train": {"runs": HIERARCAPS_RUNS}})
    for entry in corrected.train.runs:
        assert "hierarcaps_features" not in run_spec(corrected, entry)["run"].get("options", {})
    assert options_of(corrected, "hierarcaps_ft") == {"logit_scale": "fixed"}
    published = Params.model_validate({"run": {"protocol": "as_published"}, "train": {"runs": HIERARCAPS_RUNS}})
    assert options_of(published, "hierarcaps_ft")["hierarcaps_features"] == "raw"
    explicit = Params.model_validate({"run": {"protocol": "as_published"}, "train": {"runs": [
        *HIERARCAPS_RUNS[:2], {**HIERARCAPS_RUNS[2], "options": {"hierarcaps_features": "normalized"}}]}})
    assert "hierarcaps_features" not in options_of(explicit, "hierarcaps_ft")
    assert run_spec(published, published.train.runs[2]) != run_spec(explicit, explicit.train.runs[2])
