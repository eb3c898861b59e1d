"""A user's files are never overwritten: `student-version` into a folder holding a student's notebooks refuses, or
keeps a `.bak` (`--force`), or writes only the absent ones (`--update`); `report --out` and `book --out` refuse a
folder they did not build; `report` and `book` need an executed notebook; a figure that cannot be redrawn from its
data names the file and says its earlier images are kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from cglib.cli import main as cli_main
from cglib.user_files import keep_backup

REPO = Path(__file__).resolve().parent.parent
SERIES = ("02_abstraction.ipynb", "04_losses.ipynb", "05_training.ipynb")  # three notebooks with exercises


@pytest.fixture
def notebooks(tmp_path) -> Path:
    folder = tmp_path / "solutions"
    folder.mkdir()
    for name in SERIES:
        shutil.copy(REPO / "notebooks" / name, folder)
    return folder


def _student(notebooks: Path, out: Path, *flags: str) -> int:
    return cli_main(["student-version", "--notebooks", str(notebooks), "--out", str(out), *flags])


def _edit(path: Path) -> str:
    """A student's edit of a notebook: a cell of their own at the end; returns the edited text."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("my_answer = 42  # my own work"))
    nbformat.write(notebook, path)
    return path.read_text(encoding="utf-8")


def test_student_version_refuses_a_folder_holding_an_edited_notebook(notebooks, tmp_path, capsys):
    """A rerun into a folder where a student edited 02: exit 2 naming it, nothing written, the edit intact; a rerun
    over the unedited notebooks alone is allowed (they are already the student version)."""
    out = tmp_path / "student"
    assert _student(notebooks, out) == 0
    assert _student(notebooks, out) == 0  # nothing edited: nothing to lose
    assert "left as they were: " + ", ".join(SERIES) in capsys.readouterr().out
    edited = _edit(out / SERIES[0])
    (out / SERIES[2]).unlink()
    assert _student(notebooks, out) == 2
    err = capsys.readouterr().err
    assert f"already holds 1 of these notebooks, which differ from the student version ({SERIES[0]})" in err
    assert "Nothing was written. Pass --update" in err and "--force" in err
    assert (out / SERIES[0]).read_text(encoding="utf-8") == edited and not (out / SERIES[2]).exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(SERIES[:2])


def test_student_version_update_writes_only_the_absent_notebooks(notebooks, tmp_path, capsys):
    out = tmp_path / "student"
    assert _student(notebooks, out) == 0
    edited = _edit(out / SERIES[0])
    (out / SERIES[2]).unlink()
    capsys.readouterr()
    assert _student(notebooks, out, "--update") == 0
    text = capsys.readouterr().out
    assert f"1 notebooks written; solutions replaced by stubs in {SERIES[2]}" in text
    assert f"left as they were: {SERIES[0]}, {SERIES[1]}" in text
    assert (out / SERIES[0]).read_text(encoding="utf-8") == edited and (out / SERIES[2]).is_file()
    assert not list(out.glob("*.bak*"))


def test_student_version_force_keeps_a_bak_of_each_replaced_notebook(notebooks, tmp_path, capsys):
    """--force replaces the edited notebook with the student version and keeps the edit as NAME.ipynb.bak; a second
    --force over a second edit keeps .bak2, never overwriting the first backup."""
    out = tmp_path / "student"
    assert _student(notebooks, out) == 0
    fresh = (out / SERIES[0]).read_text(encoding="utf-8")
    first = _edit(out / SERIES[0])
    assert _student(notebooks, out, "--force") == 0
    assert f"the earlier copy kept as {out / (SERIES[0] + '.bak')}" in capsys.readouterr().out
    assert (out / SERIES[0]).read_text(encoding="utf-8") == fresh
    assert (out / f"{SERIES[0]}.bak").read_text(encoding="utf-8") == first
    second = _edit(out / SERIES[0])
    assert _student(notebooks, out, "--force") == 0
    assert (out / f"{SERIES[0]}.bak").read_text(encoding="utf-8") == first
    assert (out / f"{SERIES[0]}.bak2").read_text(encoding="utf-8") == second
    assert _student(notebooks, out, "--force", "--update") == 2
    assert "choose one" in capsys.readouterr().err


def test_keep_backup_never_overwrites(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("v1")
    assert keep_backup(path) == tmp_path / "a.txt.bak"
    path.write_text("v2")
    assert keep_backup(path) == tmp_path / "a.txt.bak2"
    assert [(tmp_path / n).read_text() for n in ("a.txt.bak", "a.txt.bak2")] == ["v1", "v2"]


def _run_folder(root: Path, with_notebook: bool) -> Path:
    run = root / "run"
    (run / "notebooks").mkdir(parents=True)
    shutil.copy(REPO / "params" / "classroom.yaml", run / "params.yaml")
    if with_notebook:
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 04 · Losses\n\nA page.")])
        nbformat.write(notebook, run / "notebooks" / "04_losses.ipynb")
    return run


@pytest.mark.parametrize("command", ["report", "book"])
def test_report_and_book_need_an_executed_notebook(tmp_path, capsys, command):
    """A folder holding only params.yaml: exit 2, naming what is missing and the command that writes it."""
    run = _run_folder(tmp_path, with_notebook=False)
    assert cli_main([command, str(run)]) == 2
    err = capsys.readouterr().err
    assert "holds no executed notebook (notebooks/NN_*.ipynb)" in err and f"cglib run PARAMS --out {run}" in err
    assert not (run / command).exists()


@pytest.mark.parametrize("command", ["report", "book"])
def test_report_and_book_refuse_an_out_folder_of_someone_else(tmp_path, capsys, command):
    """--out naming a folder with a user's file: exit 2 naming it, the file untouched, nothing built there."""
    run = _run_folder(tmp_path, with_notebook=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("my own page")
    assert cli_main([command, str(run), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"{mine} already holds 1 files or folders that cglib {command} did not write (index.html)" in err
    assert sorted(p.name for p in mine.iterdir()) == ["index.html"] and (mine / "index.html").read_text() == \
        "my own page"


def test_a_report_folder_it_built_is_rebuilt_in_place(tmp_path, capsys):
    run = _run_folder(tmp_path, with_notebook=True)
    out = tmp_path / "site"
    assert cli_main(["report", str(run), "--out", str(out)]) == 0
    assert (out / ".cglib-report").is_file() and (out / "04_losses.html").is_file()
    assert cli_main(["report", str(run), "--out", str(out)]) == 0


def test_a_figure_that_cannot_be_redrawn_names_its_data_file_and_keeps_its_images(tmp_path, capsys):
    """A figure whose table is damaged: the failure names the CSV and says the earlier PNG and PDF are kept (they
    are, byte for byte); exit 1."""
    from cglib.viz.data_figures import draw_caption_lengths
    from cglib.viz.style import apply_style, save_figure

    apply_style()
    figures = tmp_path / "figures"
    lengths = pd.DataFrame({"words": [3, 5, 5, 8, 9, 12]})
    save_figure(draw_caption_lengths(lengths, "test"), figures, "01_caption_lengths", formats=("png", "pdf"))
    images = {fmt: (figures / f"01_caption_lengths.{fmt}").read_bytes() for fmt in ("png", "pdf")}
    spec = json.loads((figures / "01_caption_lengths.figure.json").read_text())
    table = figures / next(iter(spec["tables"].values()))["file"]
    table.write_bytes(b"\x00\x01 not a table")
    assert cli_main(["figures", str(tmp_path), "--from-data"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED 01_caption_lengths: FigureDataError: cannot read {table} (" in out
    assert "the earlier 01_caption_lengths.png and 01_caption_lengths.pdf are kept as they were" in out
    assert all((figures / f"01_caption_lengths.{fmt}").read_bytes() == data for fmt, data in images.items())
