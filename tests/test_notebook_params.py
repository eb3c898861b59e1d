"""A notebook finds its params file and run folder from any folder it is copied to (`cglib.run.notebook_run_paths`):
the parameters cell's value when it was changed from the shipped one, else CGLIB_PARAMS / CGLIB_RUN_DIR, else the
shipped relative path, else the repository's params/; when nothing is found, one line says what to set. A real
notebook's first cells are run in a kernel from a student-version folder and an nbgrader course folder."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import cglib.run
from cglib.course.student import write_student_version
from cglib.run import (
    PARAMS_ENV,
    RUN_DIR_ENV,
    SHIPPED_PARAMS_PATH,
    SHIPPED_RUN_DIR,
    NotebookParamsNotFound,
    notebook_run_paths,
)

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "04_losses.ipynb"


@pytest.fixture
def no_env(monkeypatch):
    """Neither variable set, whatever the caller's shell exports."""
    monkeypatch.delenv(PARAMS_ENV, raising=False)
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    return monkeypatch


@pytest.fixture
def course(tmp_path) -> Path:
    """A teacher's folder: a params file (the classroom profile) in its params/ and a run folder beside it."""
    (tmp_path / "course" / "params").mkdir(parents=True)
    shutil.copy(REPO / "params" / "classroom.yaml", tmp_path / "course" / "params" / "classroom.yaml")
    return tmp_path / "course"


def cell_values(source: str) -> dict:
    """The literals a parameters cell assigns (it holds nothing else), read as papermill reads them."""
    return {target.id: ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for target in node.targets}


def in_folder(monkeypatch, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)
    return folder


# --- the resolution, case by case -----------------------------------------------------------------------------------
def test_the_shipped_path_is_used_where_it_exists(no_env, tmp_path):
    """A notebook in a notebooks/ folder beside params/ (the repository's layout) reads the shipped path."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "demo.yaml").write_text("run: {name: here}\n")
    no_env.setattr(cglib.run, "REPO_ROOT", tmp_path / "elsewhere")
    in_folder(no_env, tmp_path / "notebooks")
    assert notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR) == (Path(SHIPPED_PARAMS_PATH), None)


def test_the_environment_variables_win_over_the_shipped_values(no_env, tmp_path, course):
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "demo.yaml").write_text("run: {name: here}\n")  # found, but the teacher's file wins
    in_folder(no_env, tmp_path / "notebooks")
    no_env.setenv(PARAMS_ENV, str(course / "params" / "classroom.yaml"))
    no_env.setenv(RUN_DIR_ENV, str(course / "run"))
    assert notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR) == (course / "params" / "classroom.yaml",
                                                                        course / "run")


def test_a_changed_value_wins_over_the_environment(no_env, tmp_path, course):
    """What papermill, `cglib run` (absolute paths) or the student writes into the cell is used as given."""
    no_env.setenv(PARAMS_ENV, str(REPO / "params" / "demo.yaml"))
    no_env.setenv(RUN_DIR_ENV, str(tmp_path / "teachers_run"))
    mine = str(course / "params" / "classroom.yaml")
    assert notebook_run_paths(mine, str(tmp_path / "mine")) == (Path(mine), tmp_path / "mine")
    # each value on its own: a changed params_path with the shipped run_dir keeps CGLIB_RUN_DIR, and the reverse
    assert notebook_run_paths(mine, SHIPPED_RUN_DIR) == (Path(mine), tmp_path / "teachers_run")
    assert notebook_run_paths(SHIPPED_PARAMS_PATH, str(tmp_path / "mine")) == (REPO / "params" / "demo.yaml",
                                                                               tmp_path / "mine")
    # a relative value is read from the working directory, as the cell's author sees it
    in_folder(no_env, course / "notebooks")
    assert notebook_run_paths("../params/classroom.yaml", "") == (Path("../params/classroom.yaml"),
                                                                  tmp_path / "teachers_run")


def test_the_repository_params_are_found_by_the_package_location(no_env, tmp_path):
    """A copy in a folder with no params/ beside it (outputs/student/, Colab) reads the repository's demo.yaml."""
    in_folder(no_env, tmp_path / "outputs" / "student")
    params, run_dir = notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR)
    assert params == REPO / "params" / "demo.yaml" and params.is_file() and run_dir is None


def test_nothing_found_is_one_line_naming_what_to_set(no_env, tmp_path):
    no_env.setattr(cglib.run, "REPO_ROOT", tmp_path / "installed_without_the_repository")
    here = in_folder(no_env, tmp_path / "autograded" / "alice" / "04")
    with pytest.raises(NotebookParamsNotFound) as raised:
        notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR)
    message = str(raised.value)
    assert "\n" not in message and str(here) in message
    assert f"set {PARAMS_ENV}=/path/to/params/classroom.yaml (and {RUN_DIR_ENV}=" in message
    assert "edit params_path in the first cell" in message
    assert raised.value._render_traceback_() == [f"NotebookParamsNotFound: {message}"]  # what Jupyter shows
    assert isinstance(raised.value, cglib.run.ParamsError)  # the CLI's handler and callers' `except` still catch it


def test_a_value_that_names_no_file_says_which(no_env, tmp_path):
    """A changed params_path or a CGLIB_PARAMS that names no file is an error naming it, never passed over."""
    in_folder(no_env, tmp_path)
    with pytest.raises(NotebookParamsNotFound, match=r"params_path '\.\./params/mine\.yaml' of the first cell is "
                                                     r"not a file seen from .*put back '\.\./params/demo\.yaml'"):
        notebook_run_paths("../params/mine.yaml", "")
    no_env.setenv(PARAMS_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(NotebookParamsNotFound, match=rf"^{PARAMS_ENV}=.*missing\.yaml is not a file"):
        notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR)
    no_env.setenv(PARAMS_ENV, "")
    no_env.setenv(RUN_DIR_ENV, "")  # set but empty counts as not set
    assert notebook_run_paths(SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR) == (REPO / "params" / "demo.yaml", None)


def test_every_notebook_ships_the_values_the_library_compares_with():
    """The library tells a changed value from the shipped one by SHIPPED_PARAMS_PATH / SHIPPED_RUN_DIR: every
    notebook's parameters cell holds them, and its next cell opens the run through open_notebook_run."""
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), path.name
        values = cell_values(code[0].source)
        assert (values["params_path"], values["run_dir"]) == (SHIPPED_PARAMS_PATH, SHIPPED_RUN_DIR), path.name
        assert "run = open_notebook_run(params_path, run_dir)" in code[1].source, path.name


# --- cglib student-version's --params / --run-dir --------------------------------------------------------------------
def test_student_version_points_its_notebooks_at_the_given_run(no_env, tmp_path, course):
    """The values written into the parameters cells (relative to --out) resolve, from --out, to the files given,
    and win over the environment variables."""
    out = tmp_path / "outputs" / "student"
    write_student_version(REPO / "notebooks", out, params_path=str(course / "params" / "classroom.yaml"),
                          run_dir=str(course / "run"))
    cell = next(c for c in nbformat.read(out / NOTEBOOK.name, as_version=4).cells
                if "parameters" in c.metadata.get("tags", []))
    values = cell_values(cell.source)
    in_folder(no_env, out)
    no_env.setenv(PARAMS_ENV, str(REPO / "params" / "demo.yaml"))
    no_env.setenv(RUN_DIR_ENV, str(tmp_path / "other_run"))
    params, run_dir = notebook_run_paths(values["params_path"], values["run_dir"])
    assert params.resolve() == (course / "params" / "classroom.yaml").resolve()
    assert run_dir.resolve() == (course / "run").resolve()


# --- a real notebook's first cells, in a kernel -------------------------------------------------------------------
def first_cells(*before: str) -> nbformat.NotebookNode:
    """Notebook 04's parameters cell and the cell that opens the run, as shipped, then a cell that prints the run
    (`before`: cells run first)."""
    code = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"][:2]
    report = ("import json\nprint(json.dumps({'params': str(run.params_path.resolve()), 'dir': str(run.dir.resolve()),"
              " 'name': run.params.run.name}))")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in before] + code + [
        nbformat.v4.new_code_cell(report)]
    return notebook


def run_in(notebook: nbformat.NotebookNode, folder: Path) -> nbformat.NotebookNode:
    folder.mkdir(parents=True, exist_ok=True)
    NotebookClient(notebook, kernel_name="cglib", allow_errors=True, timeout=300,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return notebook


@pytest.mark.parametrize("folder", ["outputs/student", "autograded/alice/04"])
def test_a_copied_notebook_opens_the_run_the_teacher_set(no_env, tmp_path, course, folder):
    no_env.setenv(PARAMS_ENV, str(course / "params" / "classroom.yaml"))
    no_env.setenv(RUN_DIR_ENV, str(course / "run"))
    notebook = run_in(first_cells(), tmp_path / folder)
    errors = [o for c in notebook.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    opened = json.loads(notebook.cells[-1].outputs[0].text)
    assert opened == {"params": str((course / "params" / "classroom.yaml").resolve()),
                      "dir": str((course / "run").resolve()), "name": "classroom"}
    assert (course / "run" / "params.yaml").is_file()  # open_run saved the params into the teacher's run folder


def test_a_copied_notebook_with_nothing_to_find_fails_in_one_line(no_env, tmp_path):
    """No variables, no params/ beside the folder, and cglib installed without its repository (simulated in the
    kernel): the cell that opens the run fails with the one line, and shows nothing else."""
    without_repository = f"import cglib.run, pathlib\ncglib.run.REPO_ROOT = pathlib.Path({str(tmp_path / 'site')!r})"
    notebook = run_in(first_cells(without_repository), tmp_path / "autograded" / "alice" / "04")
    opening = notebook.cells[2]
    assert "open_notebook_run" in opening.source
    (error,) = [o for o in opening.outputs if o.output_type == "error"]
    assert error.ename == "NotebookParamsNotFound" and PARAMS_ENV in error.evalue
    assert error.traceback == [f"NotebookParamsNotFound: {error.evalue}"]
    assert not any(o.output_type == "error" for c in notebook.cells[:2] for o in c.outputs)
