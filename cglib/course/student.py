"""The student version of the notebooks: every solution region replaced by a stub, as nbgrader's ClearSolutions does.

A solution region runs from a line `### BEGIN SOLUTION` to a line `### END SOLUTION` (the markers nbgrader reads,
so a course can also grade with nbgrader). In a code cell the region becomes `raise NotImplementedError(...)` at the
marker's indentation; in a markdown cell it becomes "YOUR ANSWER HERE". Outputs are cleared. Only nbformat is used:
no grading tool is needed to produce the student version.

nbgrader also wants every cell holding a solution region marked as a solution cell in its metadata (a written
answer as a manually graded one); `mark_solution_cells` writes that metadata, and the committed notebooks carry it,
so `nbgrader generate_assignment` accepts them as they are.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from cglib.pipeline import (
    ALLOWED_TO_RAISE,  # Jupyter's tag for a cell that may raise: Run All goes on past it
)
from cglib.user_files import UserFilesInTheWay, existing_targets, keep_backup, names

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
CODE_STUB = 'raise NotImplementedError("Exercise: write your solution here")'
TEXT_STUB = "YOUR ANSWER HERE"


class SolutionMarkerError(ValueError):
    """A solution region that does not close, or closes without opening."""


def strip_solutions(source: str, cell_type: str, where: str = "cell") -> str:
    """`source` with each solution region replaced by the stub of its cell type; `where` names the cell in errors."""
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(), start=1):
        marker = line.strip()
        if marker == BEGIN_SOLUTION:
            if inside:
                raise SolutionMarkerError(f"{where}, line {number}: {BEGIN_SOLUTION} inside an open solution region; "
                                          f"close the first with {END_SOLUTION}")
            inside = True
            indent = line[:len(line) - len(line.lstrip())]
            out.append(indent + CODE_STUB if cell_type == "code" else TEXT_STUB)
        elif marker == END_SOLUTION:
            if not inside:
                raise SolutionMarkerError(f"{where}, line {number}: {END_SOLUTION} without {BEGIN_SOLUTION}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SolutionMarkerError(f"{where}: {BEGIN_SOLUTION} is never closed; add a line {END_SOLUTION}")
    return "\n".join(out)


def nbgrader_metadata(cell_type: str, grade_id: str) -> dict:
    """nbgrader's metadata of a solution cell: code is checked by the cell's own check (autograded by running it),
    a written answer is graded by hand (one point)."""
    written = cell_type == "markdown"
    return {"grade": written, "grade_id": grade_id, "locked": False, "schema_version": 3, "solution": True,
            "task": False, **({"points": 1} if written else {})}


def mark_solution_cells(path: str | Path) -> int:
    """Mark every cell of the notebook at `path` that holds a solution region as an nbgrader solution cell (grade
    ids `<notebook>-<n>`, in cell order), leaving other cells as they are; returns how many are marked."""
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    marked = 0
    for cell in notebook.cells:
        if BEGIN_SOLUTION in cell.source:
            marked += 1
            cell.metadata["nbgrader"] = nbgrader_metadata(cell.cell_type, f"{path.stem}-{marked}")
        else:
            cell.metadata.pop("nbgrader", None)
    nbformat.write(notebook, path)
    return marked


def has_solution(notebook: nbformat.NotebookNode) -> bool:
    return any(BEGIN_SOLUTION in cell.source for cell in notebook.cells)




def student_notebook(notebook: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """A copy of `notebook` with its solutions stubbed and its outputs cleared. Each stubbed code cell is tagged
    `raises-exception`, so an exercise not yet done (or a check not yet passed) stops neither JupyterLab's Run All
    nor `cglib run --notebooks`: the rest of the notebook still runs, and the run lists the cells that raised."""
    student = copy.deepcopy(notebook)
    for index, cell in enumerate(student.cells):
        stubbed = strip_solutions(cell.source, cell.cell_type, where=f"{name}, cell {index}")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if stubbed != cell.source:
                tags = cell.metadata.setdefault("tags", [])
                if ALLOWED_TO_RAISE not in tags:
                    tags.append(ALLOWED_TO_RAISE)
        cell.source = stubbed
    return student


def with_run(notebook: nbformat.NotebookNode, params_path: str | None, run_dir: str | None) -> nbformat.NotebookNode:
    """`notebook` with its parameters cell pointing at a params file and a run folder (those given): the run a
    student's notebooks read (e.g. a folder made by `cglib link-run` over the class's run)."""
    cell = next((c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])), None)
    if cell is None:
        return notebook
    lines = cell.source.splitlines()
    for key, value in (("params_path", params_path), ("run_dir", run_dir)):
        if value is None:
            continue
        line = f"{key} = {str(value)!r}"
        at = next((k for k, text in enumerate(lines) if text.split("=")[0].strip() == key), None)
        if at is None:
            lines.append(line)
        else:
            lines[at] = line
    cell.source = "\n".join(lines)
    return notebook


@dataclass
class StudentVersion:
    """What `write_student_version` did: the notebooks written, those it left as they were (present with `update`,
    or already identical to the student version), the backups of those it replaced (`force`), and the written
    notebooks that hold exercises."""

    written: list[Path] = field(default_factory=list)
    left: list[Path] = field(default_factory=list)
    backups: list[Path] = field(default_factory=list)
    with_exercises: list[Path] = field(default_factory=list)


def write_student_version(notebooks: str | Path, out: str | Path, params_path: str | None = None,
                          run_dir: str | None = None, force: bool = False, update: bool = False) -> StudentVersion:
    """Write the student version of every notebook of the folder `notebooks` into `out` (the same file names; a
    notebook without exercises is copied with its outputs cleared, so the series stays whole), their parameters
    cells pointing at `params_path` and `run_dir` when given (`with_run`).

    A notebook already in `out` is a student's work: it is never replaced silently. By default the call refuses
    (UserFilesInTheWay, naming the notebooks) before writing anything, unless each such notebook is exactly the
    student version it would write; `update` writes only the notebooks absent from `out`; `force` replaces them,
    each kept first as `NAME.ipynb.bak` (`.bak2`, ... when earlier backups exist)."""
    if force and update:
        raise ValueError("--force replaces the notebooks already in the folder and --update leaves them: choose one")
    notebooks, out = Path(notebooks), Path(out)
    sources = sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebooks}; pass the notebooks folder")
    if out.resolve() == notebooks.resolve():
        raise ValueError(f"the student version would overwrite the solutions in {notebooks}; choose another --out")
    # relative to the notebooks' folder, where a kernel (JupyterLab, papermill) starts: the folders can move together
    params_path, run_dir = (None if p is None else os.path.relpath(os.path.abspath(p), os.path.abspath(out))
                            for p in (params_path, run_dir))
    versions = {}
    for source in sources:
        notebook = nbformat.read(source, as_version=4)
        text = nbformat.writes(with_run(student_notebook(notebook, name=source.name), params_path, run_dir))
        versions[out / source.name] = (text if text.endswith("\n") else text + "\n", has_solution(notebook))
    existing = existing_targets(list(versions))
    present = [path for path in existing if path.read_text(encoding="utf-8", errors="replace") != versions[path][0]]
    if present and not (force or update):
        raise UserFilesInTheWay(
            f"{out} already holds {len(present)} of these notebooks, which differ from the student version "
            f"({names(present)}): a student's work would be lost. Nothing was written. Pass --update to write only "
            "the notebooks that are absent, or --force to replace them (each kept first as NAME.ipynb.bak)")
    done = StudentVersion()
    out.mkdir(parents=True, exist_ok=True)
    for path, (text, exercises) in versions.items():
        if path in existing and (update or path not in present):  # kept, or already this very notebook
            done.left.append(path)
            continue
        if path in present:
            done.backups.append(keep_backup(path))
        path.write_text(text, encoding="utf-8")
        done.written.append(path)
        if exercises:
            done.with_exercises.append(path)
    return done
