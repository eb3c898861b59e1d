"""The MCC objective (C3, loss: mcc) and n-gram group runs (groups: ngram): the loss against its loop reference,
the concept head, tiny training runs and an exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from prepared_runs import train_one_prepared
from reference_losses import ref_mcc_loss
from safetensors.torch import load_file
from test_train import _final_and_log, _interrupt_at, make_run

from cglib.losses import mcc_loss
from cglib.train.objectives.concept_head import ConceptBank, build_head


@pytest.mark.parametrize(("m", "n", "dim", "tau"), [(2, 2, 3, 0.1), (3, 4, 5, 0.5), (4, 3, 8, 1.0)])
def test_mcc_loss_equals_its_loop_reference(m, n, dim, tau):
    """The vectorized MCC equals the term-by-term SupCon-in-the-concept's-space loop, in float64."""
    g = torch.Generator().manual_seed(m * 100 + n)
    image = torch.randn(m, n, dim, generator=g, dtype=torch.float64)
    concept = torch.randn(m, dim, generator=g, dtype=torch.float64)
    got = mcc_loss(image, concept, tau)
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(float(ref_mcc_loss(image, concept, tau)), rel=1e-12, abs=1e-12)


def test_mcc_loss_is_scale_free_and_reaches_the_concepts():
    """Rescaling an image or a concept vector changes nothing (both are normalized); gradients reach both inputs."""
    g = torch.Generator().manual_seed(0)
    image = torch.randn(3, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    concept = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    loss = mcc_loss(image, concept, 0.2)
    scaled = mcc_loss(image * torch.rand(3, 4, 1, generator=g, dtype=torch.float64) * 5, concept * 3.0, 0.2)
    assert scaled.item() == pytest.approx(loss.item(), rel=1e-12)
    loss.backward()
    assert image.grad.abs().sum() > 0 and concept.grad.abs().sum() > 0


def test_mcc_loss_errors_name_the_fix():
    """One image per group has no positive; a concept matrix of the wrong shape is refused."""
    with pytest.raises(ValueError, match="pairs_per_group >= 2"):
        mcc_loss(torch.randn(2, 1, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match="one vector per group"):
        mcc_loss(torch.randn(2, 3, 4), torch.randn(3, 4))


def test_the_concept_head_starts_at_all_ones_from_its_seed():
    """h = 1 + MLP(t) is all ones at init (zero last layer); the seed fixes W1 without touching the global RNG."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = build_head(6, 5, seed=0), build_head(6, 5, seed=0), build_head(6, 5, seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a.net[0].weight, b.net[0].weight) and not torch.equal(a.net[0].weight, c.net[0].weight)
    bank = ConceptBank({"l1:x": 0, "l1:y": 1}, torch.randn(2, 6))
    assert torch.equal(a(bank(["l1:y", "l1:x"])), torch.ones(2, 6))
    with pytest.raises(KeyError, match="not training groups"):
        bank(["l1:z"])


# ------------------------------------------------------------------------------------------ training runs
def test_an_mcc_run_trains_its_head_and_resumes_bit_exactly(tmp_path):
    """loss: mcc on MAGIC groups trains the image tower and the concept head (saved beside, not in, the model);
    interrupted mid-epoch, the resumed run ends with exactly the weights, head and log of an uninterrupted one;
    it is marked exposed (l1 concept names condition it)."""
    runs = [{"name": "mcc", "loss": "mcc"}]
    whole = make_run(tmp_path / "whole", runs=runs)
    summary = train_one_prepared(whole, "mcc", progress=False)
    assert summary["mcc"]["concepts"] == 6 and summary["exposed_to_eval_strings"] is True
    assert summary["steps"] == 2 * 6 and summary["sampler"]["group_source"] == "magic"
    out = whole.dir / "training" / "mcc"
    head = load_file(str(out / "mcc_head.safetensors"))
    assert head["net.2.weight"].abs().sum() > 0  # the zero-initialized last layer moved: the head trained
    final = load_file(str(out / "final.safetensors"))
    assert not any(k.startswith(("net.", "head")) for k in final)

    parts = make_run(tmp_path / "parts", runs=runs)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "mcc", progress=False, on_step=_interrupt_at(4))  # inside image-text epoch 0
    resumed = train_one_prepared(parts, "mcc", progress=False)
    assert resumed["resumed_from_step"] == 4
    expected, expected_log = _final_and_log(whole, "mcc")
    got, got_log = _final_and_log(parts, "mcc")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert got_log == expected_log
    got_head = load_file(str(parts.dir / "training" / "mcc" / "mcc_head.safetensors"))
    assert all(torch.equal(head[k], got_head[k]) for k in head)


def test_ngram_group_runs_train_on_original_captions(tmp_path):
    """groups: ngram builds magic/ngram.json from the run's magic.json when absent (MiniLM concept embedder) and
    trains clip and mcc on its groups with the images' original captions; the summary says which groups."""
    runs = [{"name": "ng_clip", "loss": "clip", "groups": "ngram", "text_source": "original"},
            {"name": "ng_mcc", "loss": "mcc", "groups": "ngram", "text_source": "original"}]
    run = make_run(tmp_path, runs=runs, epochs=1)
    clip = train_one_prepared(run, "ng_clip", progress=False)
    ngram = json.loads((run.dir / "magic" / "ngram.json").read_text())
    groups = [k for k, n in ngram["nodes"].items() if n["level"] == 1]
    assert clip["sampler"]["group_source"] == "ngram" and clip["sampler"]["group_source"] == clip["spec"]["run"]["groups"]
    assert clip["sampler"]["text_source"] == "original" and clip["sampler"]["groups_per_batch"] == 2
    assert clip["sampler"]["ngram"]["l1_groups"] == len(groups) >= 2
    assert clip["steps"] == len(groups)  # train.epoch groups: one batch per training group
    mcc = train_one_prepared(run, "ng_mcc", progress=False)
    assert mcc["mcc"]["concepts"] == len(groups) and mcc["exposed_to_eval_strings"] is False
    assert mcc["data_fingerprint"] == clip["data_fingerprint"]  # the same n-gram file, reused


def test_a_run_refuses_inputs_of_other_groups(tmp_path):
    """A groups: ngram run given MAGIC inputs (e.g. by the search) fails naming the fix; the search never tunes
    an n-gram run (its validation split is carved from MAGIC)."""
    from cglib.config import ParamsError, parse_params
    from cglib.distributed import DistInfo
    from cglib.prepare import load_inputs
    from cglib.train.inputs import run_entry
    from cglib.train.trainer import Trainer

    run = make_run(tmp_path, runs=[{"name": "ng", "loss": "clip", "groups": "ngram", "text_source": "original"}])
    inputs = load_inputs(run, 32, progress=False)
    with pytest.raises(ValueError, match=r"these inputs hold magic groups; prepare them with "
                                         r"cglib\.prepare\.prepare_inputs\(run, names=\['ng'\]\)"):
        Trainer(run, run_entry(run.params, "ng"), inputs, DistInfo(), None, False)
    runs = [{"name": "ng", "loss": "clip", "groups": "ngram", "text_source": "original"}]
    with pytest.raises(ParamsError, match="tune a groups: magic run"):
        parse_params({"train": {"runs": runs}, "search": {"run": "ng"}}, tmp_path)


def test_an_mcc_run_after_textual_pretraining_resumes_bit_exactly(tmp_path):
    """With textual pretraining first, the concept embeddings come from the run's starting text tower (not the
    pretrained one), so a run interrupted in pretraining and again mid image-text epoch ends exactly as an
    uninterrupted one (weights, log, head)."""
    runs = [{"name": "mccp", "loss": "mcc", "pretrain": "leakage_free"}]
    whole = make_run(tmp_path / "whole", runs=runs)
    summary = train_one_prepared(whole, "mccp", progress=False)
    pre_steps = summary["pretrain_steps"]
    assert pre_steps >= 2
    parts = make_run(tmp_path / "parts", runs=runs)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "mccp", progress=False, on_step=_interrupt_at(1))
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "mccp", progress=False, on_step=_interrupt_at(pre_steps + 3))
    assert train_one_prepared(parts, "mccp", progress=False)["resumed_from_step"] == pre_steps + 3
    expected, expected_log = _final_and_log(whole, "mccp")
    got, got_log = _final_and_log(parts, "mccp")
    assert all(torch.equal(expected[k], got[k]) for k in expected) and got_log == expected_log
    heads = [load_file(str(r.dir / "training" / "mccp" / "mcc_head.safetensors")) for r in (whole, parts)]
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
