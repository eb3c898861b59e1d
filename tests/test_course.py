"""The course: each exercise check passes the notebooks' solutions on the practice and grading seeds, and fails
plausible wrong answers with a message that names the mistake; the student version holds no solution text; its
exercise cells fail with the stub's error and the solution version's checks all pass, on the shared small run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import snapshot
from nbclient import NotebookClient

from cglib.cli import main as cli_main
from cglib.course import GRADING_SEEDS, PRACTICE_SEEDS, CheckFailed
from cglib.course.loss_checks import (
    DUAL_EFFECT_SETTINGS,
    check_centroid_loss,
    check_dual_effect_table,
    check_pairwise_inner,
    dual_effect_factors,
)
from cglib.course.magic_checks import check_hard_negatives, check_merge_setting
from cglib.course.student import (
    BEGIN_SOLUTION,
    CODE_STUB,
    END_SOLUTION,
    TEXT_STUB,
    SolutionMarkerError,
    strip_solutions,
)
from cglib.magic.schema import node_id
from cglib.run import link_run
from cglib.viz.dual_effect import optimize_points

REPO = Path(__file__).resolve().parent.parent
EXERCISE_NOTEBOOKS = ("00_overview.ipynb", "01_captions.ipynb", "02_abstraction.ipynb", "03_magic_dag.ipynb",
                      "04_losses.ipynb", "05_training.ipynb", "06_evaluation.ipynb", "07_visualization.ipynb",
                      "08_search.ipynb", "09_your_own_objective.ipynb")
EXPECTED_CHECKS = {"00_overview.ipynb": 2, "01_captions.ipynb": 2, "02_abstraction.ipynb": 3,
                   "03_magic_dag.ipynb": 2, "04_losses.ipynb": 3, "05_training.ipynb": 3,
                   "06_evaluation.ipynb": 2, "07_visualization.ipynb": 2, "08_search.ipynb": 2,
                   "09_your_own_objective.ipynb": 2}  # the check calls of each notebook


def solution_function(notebook: str, name: str):
    """The function `name` as the notebook's solution cell defines it (the cell's check runs too)."""
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)
    namespace = {"torch": torch, "F": F, "pd": pd, "optimize_points": optimize_points}
    exec(compile(source, f"{notebook}:{name}", "exec"), namespace)  # noqa: S102 (the repository's own notebook)
    return namespace[name]


def fails_with(check, answer, *words):
    with pytest.raises(CheckFailed) as failure:
        check(answer)
    for word in words:
        assert word in str(failure.value), f"{word!r} not in the message:\n{failure.value}"
    return str(failure.value)


# --- notebook 04: the centroid loss -------------------------------------------------------------------------------

def centroid_variant(image, text, tau, tau_inner, alpha, *, outer_scale=1.0, swap=False, alpha_on_outer=False,
                     normalize=True, per_anchor=False):
    """The centroid loss with one of the classic slips switched on."""
    if swap:
        tau, tau_inner = tau_inner, tau
    if normalize:
        image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    groups, pairs, dim = image.shape
    mu_image, mu_text = image.mean(1), text.mean(1)
    cos = lambda a, b: F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    own = torch.arange(groups)
    logits = cos(mu_image, mu_text) / tau
    outer = outer_scale * (F.cross_entropy(logits, own) + F.cross_entropy(logits.T, own)) / 2
    own_group = own.repeat_interleave(pairs)
    reduction = "none" if per_anchor else "mean"
    inner = (F.cross_entropy(cos(image.reshape(-1, dim), mu_image) / tau_inner, own_group, reduction=reduction)
             + F.cross_entropy(cos(text.reshape(-1, dim), mu_text) / tau_inner, own_group, reduction=reduction)) / 2
    loss = (1 - alpha) * inner + alpha * outer if alpha_on_outer else alpha * inner + (1 - alpha) * outer
    return {"loss": loss, "inner": inner, "outer": outer}


def slip(**mistake):
    return lambda *args: centroid_variant(*args, **mistake)


def test_the_notebook_solutions_pass_on_the_practice_and_the_grading_seeds(capsys):
    assert set(PRACTICE_SEEDS).isdisjoint(GRADING_SEEDS)
    for notebook, name, check in (("04_losses.ipynb", "my_centroid_loss", check_centroid_loss),
                                  ("04_losses.ipynb", "my_pairwise_inner", check_pairwise_inner),
                                  ("03_magic_dag.ipynb", "my_hard_negatives", check_hard_negatives)):
        fn = solution_function(notebook, name)
        check(fn, seeds=GRADING_SEEDS)
    assert capsys.readouterr().out.count("Correct:") == 6  # each cell's own practice check, then the grading one
    check_centroid_loss(slip())  # the test's own variant, slips off, is right too


def test_centroid_check_names_the_term_and_the_slip():
    fails_with(check_centroid_loss, slip(outer_scale=0.5), "the 'outer' term differs", "exactly half",
               "these terms match: inner")
    fails_with(check_centroid_loss, slip(swap=True), "tau and tau' swapped")
    fails_with(check_centroid_loss, slip(alpha_on_outer=True), "the 'loss' term differs",
               "these terms match: outer, inner", "Eq. 8 puts alpha on the inner term")
    fails_with(check_centroid_loss, slip(normalize=False), "differs", "L2-normalized first")
    fails_with(check_centroid_loss, slip(per_anchor=True), "'inner' has shape", "average it")
    fails_with(check_centroid_loss, lambda *args: {"loss": 0.0}, "return a dict with the keys outer, inner, loss")


def test_a_wrong_answer_fails_on_the_grading_seeds_too():
    with pytest.raises(CheckFailed, match="tau and tau' swapped"):
        check_centroid_loss(slip(swap=True), seeds=GRADING_SEEDS)


# --- notebook 04: the pairwise inner term -------------------------------------------------------------------------

def pairwise_inner_variant(image, text, tau, tau_inner, *, temperature="inner", normalize_products=False, scale=1.0):
    image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    groups, pairs, dim = image.shape
    products = (image[:, :, None] * text[:, None]).reshape(groups, pairs * pairs, dim)
    if normalize_products:
        products = F.normalize(products, dim=-1)
    centroids = products.mean(1)
    logits = F.normalize(products.reshape(-1, dim), dim=-1) @ F.normalize(centroids, dim=-1).T
    t = tau_inner if temperature == "inner" else tau
    return scale * F.cross_entropy(logits / t, torch.arange(groups).repeat_interleave(pairs * pairs))


def test_pairwise_inner_check_recognizes_the_outer_temperature_and_the_authors_variant():
    check_pairwise_inner(pairwise_inner_variant)
    fails_with(check_pairwise_inner, lambda *a: pairwise_inner_variant(*a, temperature="outer"),
               "the 'inner' term differs", "tau and tau' swapped", "divides by tau'")
    fails_with(check_pairwise_inner, lambda *a: pairwise_inner_variant(*a, normalize_products=True),
               "normalize_products=True")
    fails_with(check_pairwise_inner, lambda *a: pairwise_inner_variant(*a, scale=0.5), "exactly half")


# --- notebook 04: the dual-effect table ---------------------------------------------------------------------------

def test_dual_effect_check_reads_the_factors_and_catches_them_inverted():
    rows = {s: dual_effect_factors("centroid", 0.1, *s, seed=0) for s in DUAL_EFFECT_SETTINGS}
    table = pd.DataFrame.from_dict(rows, orient="index")
    check_dual_effect_table(table, "centroid", 0.1, seed=0)
    inverted = 1 / table
    with pytest.raises(CheckFailed, match="divide after by before"):
        check_dual_effect_table(inverted, "centroid", 0.1, seed=0)
    with pytest.raises(CheckFailed, match="rows missing"):
        check_dual_effect_table(table.iloc[:2], "centroid", 0.1, seed=0)
    with pytest.raises(CheckFailed, match="spread_factor at tau'="):
        check_dual_effect_table(table.assign(spread_factor=table.spread_factor * 1.1), "centroid", 0.1, seed=0)


# --- notebook 03: hard negatives ----------------------------------------------------------------------------------

def negatives_variant(ids, vectors, threshold, *, ties_win=False, with_self=False, one_way=False, by_name=False,
                      skip_empty=False):
    cosines = vectors @ vectors.T
    out = {}
    for i, node in enumerate(ids):
        keep = [j for j in range(len(ids))
                if (with_self or j != i) and (cosines[i, j] >= threshold if ties_win else cosines[i, j] > threshold)
                and (not one_way or j > i)]
        row = cosines[i]
        keep.sort(key=(lambda j: ids[j]) if by_name else (lambda j, row=row: (-row[j], ids[j])))
        if keep or not skip_empty:
            out[node] = [ids[j] for j in keep]
    return out


def test_hard_negatives_check_names_ties_self_one_way_order_and_missing_nodes():
    check_hard_negatives(negatives_variant)
    variant = lambda **slip: lambda *a: negatives_variant(*a, **slip)
    fails_with(check_hard_negatives, variant(ties_win=True), "exactly at the threshold", "strictly above")
    fails_with(check_hard_negatives, variant(with_self=True), "its own hard negative")
    fails_with(check_hard_negatives, variant(one_way=True), "one-way pairs", "symmetric")
    fails_with(check_hard_negatives, variant(by_name=True), "another order", "most similar first")
    fails_with(check_hard_negatives, variant(skip_empty=True), "no entry for", "an empty one")


# --- notebook 03: merges and removals -----------------------------------------------------------------------------

def toy_level():
    """l1 'party' (5 images), 'fete' (2, cosine 0.9 with party), 'rock' (1, far from both); one l2 parent."""
    chains = {}
    for name, count in (("party", 5), ("fete", 2), ("rock", 1)):
        for k in range(count):
            chains[f"{name}-{k}"] = [name, "event"]
    unit = lambda *x: np.array(x) / np.linalg.norm(x)
    vectors = {node_id(1, "party"): unit(1.0, 0.0, 0.0), node_id(1, "fete"): unit(0.9, np.sqrt(1 - 0.81), 0.0),
               node_id(1, "rock"): unit(0.0, 0.0, 1.0), node_id(2, "event"): unit(0.0, 1.0, 0.0)}
    return chains, vectors


def test_merge_check_says_which_setting_to_move():
    from cglib.course.magic_checks import library_merges

    chains, vectors = toy_level()
    merges, removals = library_merges(chains, 2, vectors, size_min=3, sim_min=0.8)
    assert [(m.source, m.target) for m in merges] == [("l1:fete", "l1:party")]
    assert [r.node for r in removals] == ["l1:rock"]
    check_merge_setting(merges, removals, 3, 0.8, chains, 2, vectors)
    with pytest.raises(CheckFailed, match="no node is small"):
        check_merge_setting([], [], 1, 0.8, chains, 2, vectors)
    with pytest.raises(CheckFailed, match=r"none merged.*closest any removed node came was cosine 0\.900"):
        check_merge_setting([], removals, 3, 0.95, chains, 2, vectors)
    with pytest.raises(CheckFailed, match=r"none was removed.*cosine 0\.000"):
        check_merge_setting(merges, [], 3, 0.0, chains, 2, vectors)
    with pytest.raises(CheckFailed, match="your removals .* differ from the library's"):
        check_merge_setting(merges, [], 3, 0.8, chains, 2, vectors)


# --- the student version ------------------------------------------------------------------------------------------

def test_strip_solutions_keeps_the_indentation_and_names_a_bad_marker():
    code = f"def f(x):\n    {BEGIN_SOLUTION}\n    return x + 1\n    {END_SOLUTION}\n\ncheck(f)"
    assert strip_solutions(code, "code") == f"def f(x):\n    {CODE_STUB}\n\ncheck(f)"
    assert strip_solutions(f"Answer:\n\n{BEGIN_SOLUTION}\nforty-two\n{END_SOLUTION}", "markdown") == \
        f"Answer:\n\n{TEXT_STUB}"
    with pytest.raises(SolutionMarkerError, match="never closed"):
        strip_solutions(f"{BEGIN_SOLUTION}\nx = 1", "code", where="04, cell 3")
    with pytest.raises(SolutionMarkerError, match="without"):
        strip_solutions(f"x = 1\n{END_SOLUTION}", "code")


def solution_lines(notebook: nbformat.NotebookNode) -> list[str]:
    lines, inside = [], False
    for cell in notebook.cells:
        for line in cell.source.splitlines():
            if line.strip() in (BEGIN_SOLUTION, END_SOLUTION):
                inside = line.strip() == BEGIN_SOLUTION
            elif inside and len(line.strip()) > 3:
                lines.append(line.strip())
    return lines


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("student")
    assert cli_main(["student-version", "--out", str(out)]) == 0
    return out


def test_student_version_holds_no_solution_line(student_dir):
    assert sorted(p.name for p in student_dir.glob("*.ipynb")) == sorted(p.name for p in (REPO / "notebooks").glob(
        "[0-9][0-9]_*.ipynb"))
    for name in EXERCISE_NOTEBOOKS:
        solution = nbformat.read(REPO / "notebooks" / name, as_version=4)
        student_text = (student_dir / name).read_text()
        lines = solution_lines(solution)
        assert len(lines) > 20
        leaked = [line for line in lines if line in student_text]
        assert not leaked, f"{name}: solution lines in the student version: {leaked[:5]}"
        assert BEGIN_SOLUTION not in student_text and "YOUR ANSWER HERE" in student_text


def test_student_version_refuses_to_overwrite_the_solutions(capsys):
    assert cli_main(["student-version", "--out", str(REPO / "notebooks")]) == 2
    assert "would overwrite the solutions" in capsys.readouterr().err


@pytest.fixture(scope="module")
def run_copy(class_run, tmp_path_factory) -> Path:
    """A student's folder over the class's read-only run (`cglib link-run`): the student notebooks rewrite their
    stage's files (03 rewrites magic/) in it, never in the class's run (checked after them)."""
    linked = tmp_path_factory.mktemp("course") / "run"
    link_run(class_run[0], linked)
    return linked


def with_parameters(notebook: nbformat.NotebookNode, run: Path) -> nbformat.NotebookNode:
    cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    # appended, not replaced: the cell's other parameters (notebook 09's `beside`) keep their defaults
    cell.source += f"\nparams_path = {str(run / 'params.yaml')!r}\nrun_dir = {str(run)!r}"
    return notebook


@pytest.mark.slow
@pytest.mark.parametrize("name", EXERCISE_NOTEBOOKS)
def test_every_student_exercise_fails_with_the_stub_error(student_dir, run_copy, name):
    notebook = with_parameters(nbformat.read(student_dir / name, as_version=4), run_copy)
    NotebookClient(notebook, kernel_name="cglib", allow_errors=True, timeout=600,
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    stubbed = [c for c in notebook.cells if c.cell_type == "code" and CODE_STUB in c.source]
    assert len(stubbed) >= EXPECTED_CHECKS[name]  # every checked exercise has its stub (some have an unchecked one too)
    for cell in stubbed:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert [e.ename for e in errors] == ["NotImplementedError"], cell.source[:200]
    others = [c for c in notebook.cells if c.cell_type == "code" and c not in stubbed
              and any(o.output_type == "error" for o in c.outputs)]
    assert not others, f"cells without an exercise failed: {[c.source[:80] for c in others]}"


@pytest.mark.slow
def test_the_student_notebooks_left_the_class_run_unchanged(class_run, run_copy):
    """After every student notebook ran in a folder linked to the class's read-only run: the class's run is the
    same, entry by entry (content, size, modification time), and the student's folder holds what they wrote."""
    shared, before = class_run
    assert snapshot(shared) == before
    own = {p.relative_to(run_copy).parts[0] for p in run_copy.rglob("*") if p.is_file() and not p.is_symlink()}
    assert {"figures", "magic", "own_objective"} <= own


def test_every_notebook_has_exercises():
    """Exercises in every notebook of the series, each counted here."""
    assert sorted(EXERCISE_NOTEBOOKS) == sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert set(EXPECTED_CHECKS) == set(EXERCISE_NOTEBOOKS) and min(EXPECTED_CHECKS.values()) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", EXERCISE_NOTEBOOKS)
def test_the_solution_version_runs_on_the_classroom_profile_and_every_check_passes(classroom_run, name):
    """`cglib run params/classroom.yaml` executed the notebooks as committed (the solution version): each check
    printed its "Correct:" line and no cell failed (the run would have stopped)."""
    executed = nbformat.read(classroom_run / "notebooks" / name, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert text.count("Correct:") == EXPECTED_CHECKS[name], text[-3000:]


def test_every_solution_cell_is_an_nbgrader_solution_cell():
    """nbgrader refuses a solution region outside a cell marked as a solution cell: each committed one is marked
    (`cglib.course.student.mark_solution_cells` writes it), with a grade id unique across the series."""
    ids = []
    for name in EXERCISE_NOTEBOOKS:
        for cell in nbformat.read(REPO / "notebooks" / name, as_version=4).cells:
            meta = cell.metadata.get("nbgrader")
            if BEGIN_SOLUTION in cell.source:
                assert meta and meta["solution"], (f"{name}: a solution cell without nbgrader's metadata; run "
                                                   "python -c \"from cglib.course.student import mark_solution_cells; "
                                                   f"mark_solution_cells('notebooks/{name}')\"")
                assert meta["grade"] == (cell.cell_type == "markdown")  # a written answer is graded by hand
                ids.append(meta["grade_id"])
            else:
                assert meta is None, f"{name}: nbgrader metadata on a cell without a solution region"
    assert len(ids) == len(set(ids)) > 2 * len(EXERCISE_NOTEBOOKS)


def test_nbgrader_generates_the_assignment_from_the_notebooks(tmp_path):
    """`nbgrader generate_assignment` (the dev extra installs it) accepts the ten notebooks as committed and releases
    them with no line of any solution left."""
    bin_dir = Path(sys.executable).parent
    nbgrader = shutil.which("nbgrader", path=str(bin_dir))
    if nbgrader is None:
        pytest.skip("nbgrader is not installed: pip install -e '.[dev]' (or '.[nbgrader]')")
    source = tmp_path / "source" / "lesson"
    source.mkdir(parents=True)
    for name in EXERCISE_NOTEBOOKS:
        shutil.copy(REPO / "notebooks" / name, source / name)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # its gradebook runs alembic
    done = subprocess.run([nbgrader, "generate_assignment", "lesson", "--force"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    for name in EXERCISE_NOTEBOOKS:
        released = (tmp_path / "release" / "lesson" / name).read_text(encoding="utf-8")
        leaked = [line for line in solution_lines(nbformat.read(REPO / "notebooks" / name, as_version=4))
                  if line in released]
        assert not leaked, f"{name}: solution lines in nbgrader's release: {leaked[:5]}"
        assert "YOUR CODE HERE" in released and "YOUR ANSWER HERE" in released
