"""The course of notebooks 07-09: each check passes the notebook's own solution on the practice and the grading
seeds, and fails plausible wrong answers with a message that names the mistake."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import numpy as np
import optuna
import pytest
import torch
import torch.nn.functional as F
from factories import tiny_magic

from cglib.course import GRADING_SEEDS, PRACTICE_SEEDS, CheckFailed
from cglib.course.evaluation_checks import check_holm
from cglib.course.geometry_checks import check_group_geometry, check_rollout, small_vit_maps
from cglib.course.objective_checks import (
    check_objective,
    passes_property_checks,
    property_failures,
)
from cglib.course.search_checks import check_search_value, check_validation_overlap
from cglib.evaluate.geometry import group_geometry
from cglib.losses import gather_groups
from cglib.search.validation import search_view
from cglib.train.objectives import Objective, objective_with
from cglib.viz.attention import attention_rollout

REPO = Path(__file__).resolve().parent.parent


def solution_definitions(notebook: str, name: str) -> dict:
    """The notebook's solution cell defining `name`, its imports and definitions only (the rest of the cell reads
    the run), executed; the namespace holds what the notebook's earlier cells import for it."""
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code"
                  and (f"def {name}(" in c.source or f"class {name}(" in c.source))
    tree = ast.parse(source)
    tree.body = [node for node in tree.body
                 if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))]
    namespace = {"torch": torch, "F": F, "np": np, "Objective": Objective, "gather_groups": gather_groups,
                 "__name__": "notebook"}
    exec(compile(tree, f"{notebook}:{name}", "exec"), namespace)  # noqa: S102 (the repository's own notebook)
    return namespace


def fails_with(check, answer, *words, **kwargs) -> str:
    with pytest.raises(CheckFailed) as failure:
        check(answer, **kwargs)
    for word in words:
        assert word in str(failure.value), f"{word!r} not in the message:\n{failure.value}"
    return str(failure.value)


# --- notebook 07: within and margin --------------------------------------------------------------------------------

def geometry_variant(embeddings, groups, *, include_self=False, singletons_zero=False, flip_margin=False,
                     normalize=True):
    x = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True) if normalize else embeddings
    names = sorted(set(groups))
    own = np.array([names.index(g) for g in groups])
    sums = np.stack([x[own == k].sum(axis=0) for k in range(len(names))])
    counts = np.bincount(own, minlength=len(names))
    centre = sums[own] if include_self else sums[own] - x
    with np.errstate(invalid="ignore", divide="ignore"):
        within = np.sum(x * centre, axis=1) / np.linalg.norm(centre, axis=1)
    within = np.where(counts[own] > 1, within, 0.0 if singletons_zero else np.nan)
    cosines = x @ (sums / np.linalg.norm(sums, axis=1, keepdims=True)).T
    cosines[np.arange(len(x)), own] = -np.inf
    margin = within - cosines.max(axis=1)
    return {"within": within, "margin": -margin if flip_margin else margin}


def test_the_geometry_solution_passes_and_the_slips_are_named(capsys):
    mine = solution_definitions("07_visualization.ipynb", "my_group_geometry")["my_group_geometry"]
    check_group_geometry(mine)
    check_group_geometry(mine, seeds=GRADING_SEEDS)
    assert capsys.readouterr().out.count("Correct:") == 2
    check_group_geometry(geometry_variant)  # the test's own variant, slips off, is right too
    fails_with(check_group_geometry, lambda *a: geometry_variant(*a, include_self=True), "within:",
               "*with* the image itself")
    fails_with(check_group_geometry, lambda *a: geometry_variant(*a, singletons_zero=True), "alone in its group",
               "np.nan")
    fails_with(check_group_geometry, lambda *a: geometry_variant(*a, flip_margin=True), "margin:",
               "the sign is flipped")
    fails_with(check_group_geometry, lambda *a: geometry_variant(*a, normalize=False), "differ",
               "normalize every embedding first")
    fails_with(check_group_geometry, lambda x, g: {"within": np.nanmean(group_geometry(x, g)["within"])},
               "keys within and margin")
    fails_with(check_group_geometry, lambda x, g: {k: np.nanmean(v) for k, v in group_geometry(x, g).items()},
               "has shape ()", "one value per image")


# --- notebook 07: attention rollout --------------------------------------------------------------------------------

def rollout_variant(attentions, *, identity=True, renormalize=True, reverse=False, reduce="mean"):
    layers = attentions.mean(dim=2) if reduce == "mean" else attentions.amax(dim=2)
    eye = torch.eye(layers.shape[-1], dtype=layers.dtype)
    if identity:
        layers = layers + eye
    if renormalize:
        layers = layers / layers.sum(dim=-1, keepdim=True)
    product = eye.expand_as(layers[0])
    for layer in (layers.flip(0) if reverse else layers):
        product = layer @ product
    return product


def test_the_rollout_solution_passes_and_the_slips_are_named(capsys):
    mine = solution_definitions("07_visualization.ipynb", "my_rollout")["my_rollout"]
    check_rollout(mine, seeds=GRADING_SEEDS[:3])
    assert "Correct:" in capsys.readouterr().out
    maps = small_vit_maps(PRACTICE_SEEDS[0])
    torch.testing.assert_close(mine(maps.attentions), attention_rollout(maps.attentions))
    fails_with(check_rollout, lambda a: rollout_variant(a, identity=False), "without the identity")
    fails_with(check_rollout, lambda a: rollout_variant(a, renormalize=False), "rows not renormalized",
               "your rows sum to 4")
    fails_with(check_rollout, lambda a: rollout_variant(a, reverse=True), "wrong order")
    fails_with(check_rollout, lambda a: rollout_variant(a, reduce="max"), "average the heads")
    fails_with(check_rollout, lambda a: rollout_variant(a)[:, 0], "class-token row only")
    fails_with(check_rollout, lambda a: rollout_variant(a).numpy(), "return a tensor")


# --- notebook 08: the validation slice and MAGIC test ------------------------------------------------------------

@pytest.fixture(scope="module")
def magic_files(tmp_path_factory) -> tuple[Path, Path]:
    """A small MAGIC (6 groups of 12 images, a quarter of them test) and the validation.json of its search."""
    folder = tmp_path_factory.mktemp("search")
    magic, _ = tiny_magic(per_group=12)
    magic_path, validation_path = folder / "magic.json", folder / "validation.json"
    magic_path.write_text(magic.model_dump_json())
    validation_path.write_text(json.dumps(search_view(magic, 0.25, seed=0)[1]))
    return magic_path, validation_path


def overlap_variant(magic_path, validation_path, *, validation_from="file", test_from="magic"):
    images = json.loads(Path(magic_path).read_text())["images"]
    test = {i for i, image in images.items() if image["split"] == "test"}
    train = {i for i, image in images.items() if image["split"] == "train"}
    listed = set(json.loads(Path(validation_path).read_text())["validation_ids"])
    validation = {"file": listed, "magic test": test, "magic train": train}[validation_from]
    test = listed if test_from == "file" else test
    return {"validation": validation, "test": test, "shared": validation & test}


def test_the_overlap_solution_passes_and_the_slips_are_named(magic_files, capsys):
    magic_path, validation_path = magic_files
    mine = solution_definitions("08_search.ipynb", "my_overlap")["my_overlap"]
    for seeds in (PRACTICE_SEEDS, GRADING_SEEDS):
        check_validation_overlap(mine, magic_path, validation_path, 0.25, seeds=seeds)
    assert capsys.readouterr().out.count("Correct:") == 2
    check = lambda answer: check_validation_overlap(answer, magic_path, validation_path, 0.25)
    message = fails_with(check, lambda *p: overlap_variant(*p, validation_from="magic test"),
                         "this run's validation.json", "MAGIC's test images", "'validation_ids'")
    assert "yours holds 18 images, the library's slice 12" in message
    fails_with(check, lambda *p: overlap_variant(*p, validation_from="magic train"), "that is MAGIC train")
    fails_with(check, lambda *p: overlap_variant(*p, test_from="file"), "'test': yours holds 12 images, MAGIC test 18",
               "you read the validation file's ids")
    fails_with(check, lambda *p: {**overlap_variant(*p), "shared": {"img-00-00"}}, "it is their intersection")
    fails_with(check, lambda *p: {"validation": "img-00-00", "test": set(), "shared": set()}, "return a set")


def test_the_overlap_check_follows_the_slice_of_each_seed(magic_files):
    """An answer that reproduces the run's own slice from its seed, ignoring the file, fails on the other seeds."""
    magic_path, validation_path = magic_files
    run_slice = set(json.loads(validation_path.read_text())["validation_ids"])
    fixed = lambda *p: {**overlap_variant(*p), "validation": run_slice,
                        "shared": run_slice & overlap_variant(*p)["test"]}
    fails_with(lambda a: check_validation_overlap(a, magic_path, validation_path, 0.25), fixed,
               "the slice search_view carves with seed")


# --- notebook 08: a trial's objective value -----------------------------------------------------------------------

def finished_study() -> optuna.Study:
    """A study with one complete and one pruned trial, as the search stores them."""
    study = optuna.create_study(direction="maximize")
    distributions = {"lr": optuna.distributions.FloatDistribution(1e-6, 1e-3, log=True)}
    columns = {"l1": 0.5, "l2": 0.75, "l3": 0.25}
    study.add_trial(optuna.trial.create_trial(params={"lr": 1e-4}, distributions=distributions, value=0.5,
                                              intermediate_values={0: 0.5},
                                              user_attrs={"validation_by_field": columns}))
    study.add_trial(optuna.trial.create_trial(params={"lr": 1e-6}, distributions=distributions,
                                              state=optuna.trial.TrialState.PRUNED, intermediate_values={0: 0.25},
                                              user_attrs={"validation_by_field": {"l1": 0.25, "l2": 0.25}}))
    return study


def test_the_search_value_solution_passes_and_the_slips_are_named(capsys):
    study = finished_study()
    mine = solution_definitions("08_search.ipynb", "my_search_value")["my_search_value"]
    check_search_value(mine, study)
    check_search_value(mine, study, seeds=GRADING_SEEDS)
    assert capsys.readouterr().out.count("Correct: the library agrees with your objective values (2 trials") == 2
    check = lambda answer: check_search_value(answer, study)
    fails_with(check, lambda by_field: 100 * mine(by_field), "trial 0 of the study", "in percent")
    fails_with(check, lambda by_field: float(np.median(list(by_field.values()))), "the median")
    only_levels = lambda b: float(np.mean([v for k, v in b.items() if k.startswith("l")]))
    fails_with(check, only_levels, "search.objective table3", "generalized and caption columns count too")
    fails_with(check, lambda by_field: max(by_field.values()), "off by", "each with weight 1")
    fails_with(check, lambda by_field: by_field, "return one number")


# --- notebook 09: your own objective ------------------------------------------------------------------------------

class Broken(Objective):
    """A plausible slip per switch: the sign of the similarity, a per-group vector, detached numbers, an angle
    (acos has no finite slope at cosine 1), a division by the length without a floor."""

    name, label, family = "broken", "a broken objective", "group"
    slip = "none"

    def forward(self, batch):
        if self.slip == "unfloored length":
            image = batch.image / batch.image.norm(dim=-1, keepdim=True)
            text = batch.text / batch.text.norm(dim=-1, keepdim=True)
            image, text = image.mean(dim=1), text.mean(dim=1)
        else:
            image, text = batch.image.mean(dim=1), batch.text.mean(dim=1)
        image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
        logits = image @ text.T / self.tau
        own = torch.arange(len(logits))
        if self.slip == "sign":
            return {"loss": F.cross_entropy(-logits, own)}
        if self.slip == "per group":
            return {"loss": F.cross_entropy(logits, own, reduction="none")}
        if self.slip == "detached":
            return {"loss": torch.tensor(F.cross_entropy(logits, own).item())}
        if self.slip == "angle":
            return {"loss": F.cross_entropy(-torch.acos(logits * self.tau) / self.tau, own)}
        return {"loss": F.cross_entropy(logits, own)}


def slipped(kind: str) -> type:
    return type(f"Broken_{kind.replace(' ', '_')}", (Broken,), {"slip": kind})


def test_the_objective_solution_passes_and_the_library_objectives_have_the_same_properties(capsys):
    yours = solution_definitions("09_your_own_objective.ipynb", "YourObjective")["YourObjective"]
    check_objective(yours)
    check_objective(yours, seeds=GRADING_SEEDS)
    out = capsys.readouterr().out
    assert out.count("Correct:") == 2 and "centroid" in out and "clip" in out
    assert passes_property_checks(yours)
    for name in ("clip", "pairwise", "centroid"):  # what the check asks of yours, the library's objectives have
        library = objective_with(name, 0.1, **({} if name == "clip" else {"tau_inner": 0.1, "alpha": 0.7}))
        assert not any(property_failures(library, seed) for seed in (*PRACTICE_SEEDS, *GRADING_SEEDS)), name
    check_objective(Broken)


def test_the_objective_check_names_each_missing_property():
    fails_with(check_objective, slipped("sign"), "does not fall as the groups separate", "sign")
    fails_with(check_objective, slipped("per group"), "the 'loss' entry is (4,)", ".mean()")
    fails_with(check_objective, slipped("detached"), "has no gradient", ".item()")
    angle = fails_with(check_objective, slipped("angle"), "misses 1 property",
                       "not finite with every text equal to its image")
    assert "zero feature vector" not in angle
    fails_with(check_objective, slipped("unfloored length"), "misses 1 property", "not finite with a zero feature",
               "F.normalize")
    fails_with(check_objective, lambda batch: batch, "subclass of Objective")
    assert not passes_property_checks(slipped("sign"))


def test_an_unfinished_objective_is_not_trained():
    """The student version's stub raises NotImplementedError: the gate of notebook 09's training says no."""

    class Unfinished(Objective):
        name, label, family = "unfinished", "an unfinished objective", "group"

        def forward(self, batch):
            raise NotImplementedError("Exercise: write your solution here")

    assert not passes_property_checks(Unfinished)
    with pytest.raises(NotImplementedError):
        check_objective(Unfinished)


# --- notebook 09: Holm's correction --------------------------------------------------------------------------------

def holm_variant(p_values, *, bonferroni=False, step_down=True, cap=True, nan_in_m=False, sorted_output=False):
    """Holm's adjusted p-values with one of the classic slips switched on."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(p) if nan_in_m else len(order)
    factor = np.full(len(order), m) if bonferroni else m - np.arange(len(order))
    scaled = factor * p[order]
    if cap:
        scaled = np.minimum(1.0, scaled)
    if step_down:
        scaled = np.maximum.accumulate(scaled) if len(scaled) else scaled
    out[tested if sorted_output else order] = scaled
    return out


def test_the_holm_solution_passes_on_the_practice_and_the_grading_seeds(capsys):
    my_holm = solution_definitions("09_your_own_objective.ipynb", "my_holm")["my_holm"]
    check_holm(my_holm)
    check_holm(my_holm, seeds=GRADING_SEEDS)
    assert capsys.readouterr().out.count("Correct:") == 2
    check_holm(holm_variant)  # the reference of the wrong answers below is right when no slip is on


@pytest.mark.parametrize(("slip", "words"), [
    ({"bonferroni": True}, ["Bonferroni", "(m - i + 1)"]),
    ({"step_down": False}, ["step-down is missing", "running maximum"]),
    ({"cap": False}, ["probability", "cap"]),
    ({"sorted_output": True}, ["sorted order", "position"]),
    ({"nan_in_m": True, "bonferroni": True}, ["NaNs counted in m"]),
])
def test_the_holm_check_names_the_slip(slip, words):
    fails_with(check_holm, lambda p: holm_variant(p, **slip), *words, seeds=PRACTICE_SEEDS + GRADING_SEEDS)
    fails_with(check_holm, lambda p: holm_variant(p, **slip), seeds=GRADING_SEEDS)  # and when grading
