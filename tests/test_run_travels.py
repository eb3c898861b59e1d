"""A run folder travels: copied or moved to another folder (how a run reaches anyone else), its report, its book and
its executed notebooks as they render name no folder of the machine that made it or of the one that reads it
(cglib.executed_notebooks.machine_paths). The rewriting on hand-made strings, then a real run copied and built."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from cglib.executed_notebooks import REPOSITORY, clean_notebook, machine_paths, relative_to_run

MADE_AT = {"run_dir": "/home/ann/cglib/outputs/demo", "params_file": "/home/ann/cglib/params/demo.yaml",
           "repository": "/home/ann/cglib", "home": "/home/ann"}


def copied_run(folder: Path, manifest: dict) -> Path:
    """A run folder at `folder` whose run.json records that it was made elsewhere (`manifest`)."""
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text("run: {name: demo}\n", encoding="utf-8")
    (folder / "run.json").write_text(json.dumps({"status": "ok", **manifest}), encoding="utf-8")
    return folder


@pytest.fixture
def reader_home(monkeypatch) -> str:
    """The reading machine's home folder, the same on every machine that runs the tests."""
    monkeypatch.setenv("HOME", "/home/reader")
    return "/home/reader"


# ----------------------------------------------------------------------------------------------- the rewriting
def test_the_location_where_the_run_was_made_is_written_relative_to_it(tmp_path, reader_home):
    run = copied_run(tmp_path / "copy", MADE_AT)
    text = ("wrote /home/ann/cglib/outputs/demo/magic/magic.json\n"
            "run_dir = '/home/ann/cglib/outputs/demo'\n"
            "resume: cglib run /home/ann/cglib/params/demo.yaml --out /home/ann/cglib/outputs/demo.")
    assert relative_to_run(text, run) == ("wrote magic/magic.json\nrun_dir = '.'\n"
                                          "resume: cglib run demo.yaml --out ..")


def test_the_folder_where_the_run_sits_now_is_written_relative_to_it(tmp_path, reader_home):
    run = copied_run(tmp_path / "copy", MADE_AT)
    assert relative_to_run(f"{run}/figures/a.png and {run}, and {run.resolve()}/x", run) == "figures/a.png and ., and x"


def test_the_repository_and_the_home_folder_of_either_machine_print_by_short_names(tmp_path, reader_home):
    run = copied_run(tmp_path / "copy", MADE_AT)
    text = ("/home/ann/cglib/cglib/viz/umap.py:12: UserWarning\n"
            f"{REPOSITORY}/params/classroom.yaml\n"
            "numba cache: /home/ann/.cache/cglib/numba\n"
            "numba cache: /home/reader/.cache/cglib/numba")
    assert relative_to_run(text, run).splitlines() == [
        "<repo>/cglib/viz/umap.py:12: UserWarning", "<repo>/params/classroom.yaml",
        "numba cache: ~/.cache/cglib/numba", "numba cache: ~/.cache/cglib/numba"]


def test_the_temporary_folder_prints_as_tmp_and_a_kernels_cell_file_as_cell(tmp_path, reader_home):
    """IPython compiles each cell into a file under the temporary folder, which a warning raised in it names."""
    run = copied_run(tmp_path / "copy", MADE_AT)
    text = (f"/tmp/ipykernel_4242/3141592.py:3: FutureWarning: x\n"
            f"{tempfile.gettempdir()}/scratch/y")
    assert relative_to_run(text, run).splitlines() == ["<cell>:3: FutureWarning: x", "<tmp>/scratch/y"]


def test_in_html_the_short_names_are_escaped(tmp_path, reader_home):
    """A bare `<tmp>` in a DataFrame's HTML or the report's index would be read as a tag and vanish."""
    run = copied_run(tmp_path / "copy", MADE_AT)
    text = f"<td>/tmp/x</td><td>{REPOSITORY}/y</td><pre>/tmp/ipykernel_1/2.py:3:</pre><td>{run}/z</td>"
    assert relative_to_run(text, run, markup=True) == ("<td>&lt;tmp&gt;/x</td><td>&lt;repo&gt;/y</td>"
                                                       "<pre>&lt;cell&gt;:3:</pre><td>z</td>")


def test_the_parameters_cell_names_a_params_file_outside_the_run_by_its_name(tmp_path, reader_home):
    """Where run.json is lost, the params file under the temporary or home folder is still named by its name."""
    from cglib.executed_notebooks import INJECTED_NOTE, injected_parameters

    run = tmp_path / "run"
    run.mkdir()
    for params in ("/tmp/a/demo.yaml", "/home/reader/p/demo.yaml", f"{REPOSITORY}/params/demo.yaml", "/srv/demo.yaml"):
        source = f'# Parameters\nparams_path = "{params}"\nrun_dir = "{run}"\n'
        assert injected_parameters(source, machine_paths(run)).splitlines() == [
            INJECTED_NOTE, 'params_path = "demo.yaml"', 'run_dir = "."'], params


def test_a_rewritten_path_is_not_read_again_and_a_url_keeps_its_slashes(tmp_path, reader_home):
    """`<repo>/tmp/x` does not become `<repo><tmp>/x`; optuna's storage URL `sqlite:////<run>/search/a.sqlite3`
    becomes one relative to the run."""
    run = copied_run(tmp_path / "copy", MADE_AT)
    text = "/home/ann/cglib/tmp/x sqlite:////home/ann/cglib/outputs/demo/search/a.sqlite3 sqlite:////tmp/b.db"
    assert relative_to_run(text, run) == "<repo>/tmp/x sqlite:///search/a.sqlite3 sqlite:///<tmp>/b.db"


def test_only_whole_folder_names_are_rewritten(tmp_path, reader_home):
    """`/data/runs/demo2` is not the run `/data/runs/demo`, `/var/tmp` is not `/tmp`; other folders stay as they
    are."""
    run = copied_run(tmp_path / "copy", {"run_dir": "/data/runs/demo"})
    text = ("/data/runs/demo2/x /data/runs/demo_b /data/runs/demo.json /usr/lib/python3/x.py /home/reader2/y "
            "/var/tmp/z ~/tmp/z /srv/data/runs/demo/z")
    assert relative_to_run(text, run) == text


def test_a_home_of_one_part_rewrites_nothing(tmp_path, monkeypatch):
    """A service account's home of `/` must not turn every absolute path into `~`."""
    monkeypatch.setenv("HOME", "/")
    run = copied_run(tmp_path / "copy", {})
    assert relative_to_run("/usr/lib/python3/x.py", run) == "/usr/lib/python3/x.py"
    assert all(len(Path(path).parts) > 1 for path, _ in machine_paths(run))


def test_a_run_without_run_json_rewrites_the_folders_of_this_machine(tmp_path, reader_home):
    run = tmp_path / "run"
    run.mkdir()
    assert relative_to_run(f"{run}/a /home/reader/b /tmp/c", run) == "a ~/b <tmp>/c"


def test_the_books_input_has_no_folder_of_either_machine(tmp_path, reader_home):
    """The notebook the book gives MyST-NB (book_notebook: clean_notebook, then the solutions folded)."""
    from cglib.book import book_notebook

    run = copied_run(tmp_path / "copy", MADE_AT)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('# Parameters\nparams_path = "/home/ann/cglib/params/demo.yaml"\n'
                                  'run_dir = "/home/ann/cglib/outputs/demo"\n',
                                  metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell("print(run.dir)", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="/home/ann/cglib/outputs/demo\n"),
            nbformat.v4.new_output("stream", name="stderr", text="/tmp/ipykernel_7/1.py:2: UserWarning: w\n"),
            nbformat.v4.new_output("display_data", data={"text/html": f"<code>{run}/figures/a.png</code>"})])]
    text = rendered_text(book_notebook(nb, run, []))
    assert_no_machine_folder(text, "book input", [MADE_AT["run_dir"], str(run), "/home/ann", "/home/reader"])
    assert 'params_path = "demo.yaml"' in text and 'run_dir = "."' in text and "<code>figures/a.png</code>" in text


# ----------------------------------------------------------------------------------------------- a real run, copied
def rendered_text(nb: nbformat.NotebookNode) -> str:
    """What a rendering of `nb` shows as text: cell sources and text outputs (not the metadata no page shows, nor
    images, whose base64 may spell `/tmp/` by chance)."""
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts += [value for mime, value in output.get("data", {}).items()
                      if mime.startswith("text/") and isinstance(value, str)]
            parts += [output.get("evalue", ""), *output.get("traceback", [])]
    return "\n".join(parts)


DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")  # an inline image's bytes, not text a page shows


def page_text(page: Path) -> str:
    return DATA_URI.sub("data:", page.read_text(encoding="utf-8"))


def machine_folders_in(text: str, folders: list[str]) -> list[str]:
    """Each of `folders` where `text` names it, with its context."""
    return [text[max(0, m.start() - 40):m.end() + 40] for folder in folders
            for m in re.finditer(re.escape(folder), text)]


def assert_no_machine_folder(text: str, where: str, folders: list[str]) -> None:
    """None of `folders`, nor `/tmp/`, in `text`."""
    found = machine_folders_in(text, [*folders, "/tmp/"])
    assert not found, f"{where} names {len(found)} folder(s) of a machine: {found[:5]}"


@pytest.fixture(scope="module")
def travelled_run(small_run, tmp_path_factory) -> tuple[Path, dict]:
    """The session's run of notebooks 01-03, copied to another folder (its report and book left out), with the
    run.json it records where it was made."""
    copy = tmp_path_factory.mktemp("elsewhere") / "a copied run"
    shutil.copytree(small_run, copy, ignore=shutil.ignore_patterns("report", "book"))
    return copy, json.loads((copy / "run.json").read_text(encoding="utf-8"))


def machine_folders(copy: Path, manifest: dict) -> list[str]:
    """The folders no page may name: where the run was made and now sits, the params file's, the repository's,
    the home folder (with a separator: `/root` is also a prefix of `/rootfs`)."""
    return [manifest["run_dir"], str(copy), str(copy.resolve()), str(Path(manifest["params_file"]).parent),
            str(REPOSITORY) + os.sep, os.path.expanduser("~") + os.sep]


@pytest.mark.slow
def test_a_copied_run_renders_no_folder_of_either_place(travelled_run):
    """The executed notebooks name the folder where the run was made (papermill's parameters, printed paths); as
    the report and the book render them, no text does."""
    copy, manifest = travelled_run
    assert manifest["run_dir"] != str(copy) and manifest["repository"] == str(REPOSITORY)
    notebooks = sorted((copy / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(notebooks) == 3
    raw = "\n".join(rendered_text(nbformat.read(path, as_version=4)) for path in notebooks)
    assert manifest["run_dir"] in raw  # what there is to rewrite
    for path in notebooks:
        assert_no_machine_folder(rendered_text(clean_notebook(nbformat.read(path, as_version=4), copy)),
                                 path.name, machine_folders(copy, manifest))


@pytest.mark.slow
def test_the_report_of_a_copied_run_names_no_folder_of_either_place(travelled_run, tmp_path):
    from cglib.cli import main as cli_main

    copy, manifest = travelled_run
    out = tmp_path / "report"
    started = time.perf_counter()
    assert cli_main(["report", str(copy), "--out", str(out)]) == 0
    print(f"\nreport of the copied run in {time.perf_counter() - started:.1f} s")
    pages = sorted(out.glob("*.html"))
    assert len(pages) == 4
    for page in pages:
        assert_no_machine_folder(page_text(page), page.name, machine_folders(copy, manifest))


@pytest.mark.slow
def test_the_book_of_a_copied_run_names_no_folder_of_either_place(travelled_run, tmp_path):
    """Every page built from the run (its notebooks and the front page); the guide's pages are the repository's
    own text, whose examples may write `--out /tmp/run1`, so only the run's and the repository's folders count
    there."""
    from cglib.book import build_book

    copy, manifest = travelled_run
    book = build_book(copy, tmp_path / "book")
    print(f"\nbook of the copied run in {book.seconds:.1f} s")
    pages = sorted(book.out_dir.rglob("*.html"))
    from_run = [book.index, *sorted((book.out_dir / "notebooks").glob("*.html"))]
    assert len(from_run) == 4
    for page in pages:
        if page in from_run:
            assert_no_machine_folder(page_text(page), page.name, machine_folders(copy, manifest))
        else:
            found = machine_folders_in(page_text(page), machine_folders(copy, manifest))
            assert not found, f"{page.name} names a folder of a machine: {found[:5]}"
