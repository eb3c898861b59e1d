"""A student's run: their own notebooks executed by `cglib run --notebooks`, in a folder of their own over a
read-only copy of the class's run (`cglib link-run`). The class's run does not change by one byte, the student's
folder holds no solution text, and notebook 09's row `yours` follows each edit of the student's objective (a
class defined in a notebook cell is part of its run's identity)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from conftest import snapshot

from cglib.cli import main as cli_main
from cglib.course.student import BEGIN_SOLUTION, CODE_STUB, END_SOLUTION
from cglib.run import LINKED_RECORD, link_run

REPO = Path(__file__).resolve().parent.parent
OWN_OBJECTIVE = "09_your_own_objective.ipynb"
# a student's answer to notebook 09's exercise (not the solution): a one-way CLIP loss over group centroids
ANSWER = """        image = F.normalize(gather_groups(batch.image).mean(dim=1), dim=-1)
        text = F.normalize(gather_groups(batch.text).mean(dim=1), dim=-1)
        logits = image @ text.T / self.tau
        targets = torch.arange(len(logits), device=logits.device)
        return {"loss": F.cross_entropy(logits, targets) + OFFSET}"""


def solution_only_lines() -> set[str]:
    """Lines (stripped, of 20 characters or more: a short line such as `try:` is no one's solution) that occur
    inside solution regions and nowhere else in the notebooks."""
    inside, outside = set(), set()
    for path in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        in_solution = False
        for cell in nbformat.read(path, as_version=4).cells:
            for line in cell.source.splitlines():
                marker = line.strip()
                if marker in (BEGIN_SOLUTION, END_SOLUTION):
                    in_solution = marker == BEGIN_SOLUTION
                elif len(marker) >= 20:
                    (inside if in_solution else outside).add(marker)
    return inside - outside


def student_notebooks(folder: Path, linked: Path, offset: float) -> Path:
    """The student version pointed at `linked`, with notebook 09's exercise answered (ANSWER, loss + `offset`)."""
    assert cli_main(["student-version", "--out", str(folder), "--params", str(linked / "params.yaml"),
                     "--run-dir", str(linked)]) == 0
    path = folder / OWN_OBJECTIVE
    notebook = nbformat.read(path, as_version=4)
    cell = next(c for c in notebook.cells if "class YourObjective" in c.source)
    cell.source = cell.source.replace(f"        {CODE_STUB}", ANSWER.replace("OFFSET", repr(offset)))
    nbformat.write(notebook, path)
    return folder


def yours_loss(executed: Path) -> float:
    """The `yours` row's mean loss per epoch, as notebook 09 printed it."""
    text = "".join(o.get("text", "") for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"
                   for o in c.outputs)
    found = re.search(r"^yours: .*mean loss per epoch \[([-0-9.e]+)\]", text, flags=re.MULTILINE)
    assert found, text[-2000:]
    return float(found.group(1))


@pytest.mark.slow
def test_a_student_run_over_a_read_only_class_run(class_run, tmp_path):
    """The student's notebook 09 run twice by `cglib run --notebooks`, the second time with their objective edited
    (its loss + 1): the second run trains the edited class (its loss is the first one's + 1, not a reused row);
    the class's run is unchanged, the student's folder holds what they wrote and no solution line."""
    shared, before = class_run
    linked = tmp_path / "my_run"
    assert link_run(shared, linked)["linked_now"] > 100
    losses, runs = [], []
    for offset in (0.0, 1.0):
        notebooks = student_notebooks(tmp_path / f"notebooks_{offset}", linked, offset)
        assert cli_main(["run", str(linked / "params.yaml"), "--notebooks", str(notebooks), "--only", "09",
                         "--out", str(linked)]) == 0
        losses.append(yours_loss(linked / "notebooks" / OWN_OBJECTIVE))
        runs.append(json.loads((linked / "run.json").read_text()))
    assert losses[1] == pytest.approx(losses[0] + 1.0, abs=1e-3)  # the edited class trained, not the first reused
    raised = runs[1]["notebooks"][0]["raised"]  # Holm's exercise is still the stub: the notebook went on past it
    assert len(raised) == 1 and "NotImplementedError" in raised[0]
    assert runs[1]["scope"]["notebook_dir"] == str(tmp_path / "notebooks_1.0")

    assert snapshot(shared) == before  # not one byte, time or entry of the class's run changed
    own = [p for p in linked.rglob("*") if p.is_file() and not p.is_symlink()]
    assert {p.relative_to(linked).parts[0] for p in own} <= {"notebooks", "own_objective", "run.json",
                                                             LINKED_RECORD, "figures", "training"}
    forbidden = solution_only_lines()
    assert len(forbidden) > 50
    for path in linked.rglob("*"):
        if path.is_file() and path.suffix in (".ipynb", ".json", ".md", ".csv", ".yaml", ".txt", ".py", ".jsonl"):
            text = path.read_text(encoding="utf-8", errors="replace")
            leaked = [line for line in forbidden if line in text]
            assert not leaked, f"{path}: {leaked[:3]}"


def test_link_run_links_new_files_keeps_the_students_and_refuses_bad_folders(tmp_path):
    shared = tmp_path / "class"
    (shared / "magic").mkdir(parents=True)
    (shared / "params.yaml").write_text("run: {}\n")
    (shared / "magic" / "magic.json").write_text("{}")
    (shared / "notebooks").mkdir()
    (shared / "notebooks" / "04_losses.ipynb").write_text("solutions")
    mine = tmp_path / "mine"
    assert link_run(shared, mine)["linked_now"] == 2
    assert (mine / "magic" / "magic.json").is_symlink() and not (mine / "notebooks").exists()
    (mine / "magic" / "magic.json").unlink()
    (mine / "magic" / "magic.json").write_text('{"mine": 1}')  # what the student's notebook wrote
    (shared / "magic" / "stats.json").write_text("{}")  # what the class's run gained since
    record = link_run(shared, mine)
    assert (record["linked_now"], record["own_files_kept"]) == (1, 1)
    assert (mine / "magic" / "magic.json").read_text() == '{"mine": 1}'
    with pytest.raises(ValueError, match="inside the shared run"):
        link_run(shared, shared / "student")
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        link_run(tmp_path / "nothing", tmp_path / "x")
    assert cli_main(["link-run", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2


def test_the_student_version_points_at_the_run_and_lets_exercises_raise(tmp_path):
    out = tmp_path / "student"
    assert cli_main(["student-version", "--out", str(out), "--params", str(tmp_path / "run" / "params.yaml"),
                     "--run-dir", str(tmp_path / "run")]) == 0
    notebook = nbformat.read(out / OWN_OBJECTIVE, as_version=4)
    parameters = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    assert "params_path = '../run/params.yaml'" in parameters.source and "run_dir = '../run'" in parameters.source
    assert 'beside = "clip,centroid"' in parameters.source
    stubbed = [c for c in notebook.cells if CODE_STUB in c.source]
    assert stubbed and all("raises-exception" in c.metadata["tags"] for c in stubbed)
    assert all("raises-exception" not in c.metadata.get("tags", []) for c in notebook.cells if c not in stubbed)
    assert not os.path.isabs("../run")
