"""An executed notebook as readers see it outside Jupyter, shared by `cglib report` and `cglib book`: widget views
dropped (a page has no kernel), the run folder's paths written relative to it, MathJax copied beside the pages so
equations typeset offline. Light on purpose (nbformat and the standard library): the book imports it, and a book
needs neither torch nor the evaluation."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
INJECTED_PARAMETERS = "injected-parameters"  # the tag papermill gives the cell of parameters it inserts
INJECTED_NOTE = "# Parameters given by `cglib run` (paths relative to the run folder; the params file by its name)"
TEXT_OUTPUTS = ("text/plain", "text/html", "text/markdown", "text/latex")
MATHJAX_DIR = "mathjax"


class NotARunDirectory(ValueError):
    """The folder has no params.yaml (it is not a run directory written by `cglib run`), or no executed notebook
    where one is needed."""


def check_run_folder(run_dir: Path, command: str, need_notebooks: bool) -> None:
    """Raise NotARunDirectory when `run_dir` is not a run folder, or (`need_notebooks`) holds no executed notebook
    for `cglib COMMAND` to show."""
    if not (run_dir / "params.yaml").is_file():
        raise NotARunDirectory(f"{run_dir} is not a run directory (no params.yaml); pass outputs/<run>")
    if need_notebooks and not any((run_dir / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        raise NotARunDirectory(f"{run_dir} holds no executed notebook (notebooks/NN_*.ipynb), so cglib {command} "
                               f"would have no page to show: run `cglib run PARAMS --out {run_dir}` first")


def relative_to_run(text: str, run_dir: Path) -> str:
    """`text` with the run folder's absolute path written relative to the run: `<run>/magic/magic.json` ->
    `magic/magic.json`, `<run>` alone -> `.` (a report is read on other machines than the one that ran it)."""
    for absolute in sorted({str(run_dir.resolve()), str(run_dir.absolute())}, key=len, reverse=True):
        text = text.replace(absolute + os.sep, "").replace(absolute, ".")
    return text


def injected_parameters(source: str, run_dir: Path) -> str:
    """Papermill's parameters cell as a report shows it: paths inside the run relative to it, any other absolute
    path (the params file a run was started with) by its file name, and a first line that says so."""
    source = relative_to_run(source, run_dir)
    source = re.sub(r"""(["'])(/[^"'\n]*)\1""", lambda m: f"{m[1]}{Path(m[2]).name}{m[1]}", source)
    lines = [line for line in source.splitlines() if line.strip() != "# Parameters"]
    return "\n".join([INJECTED_NOTE, *lines])


def clean_notebook(nb: nbformat.NotebookNode, run_dir: Path | None = None) -> nbformat.NotebookNode:
    """Drop widget state and widget views (a report has no kernel); outputs keep their static renderings. With
    `run_dir`, sources and text outputs write the run folder's paths relative to it (`relative_to_run`)."""
    nb.metadata.pop("widgets", None)
    if run_dir is not None:
        _paths_relative_to_run(nb, run_dir)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data and WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                if not data:  # a widget with no static rendering: say so rather than show nothing
                    data["text/plain"] = "(interactive widget: open the notebook in Jupyter)"
    return nb


def _paths_relative_to_run(nb: nbformat.NotebookNode, run_dir: Path) -> None:
    for cell in nb.cells:
        if INJECTED_PARAMETERS in cell.metadata.get("tags", []):
            cell.source = injected_parameters(cell.source, run_dir)
        else:
            cell.source = relative_to_run(cell.source, run_dir)
        for output in cell.get("outputs", []):
            if "text" in output:  # a stream
                output["text"] = relative_to_run(output["text"], run_dir)
            for mime in TEXT_OUTPUTS:
                if isinstance(output.get("data", {}).get(mime), str):
                    output["data"][mime] = relative_to_run(output["data"][mime], run_dir)
            if output.get("output_type") == "error":
                output["evalue"] = relative_to_run(output["evalue"], run_dir)
                output["traceback"] = [relative_to_run(line, run_dir) for line in output["traceback"]]


def bundle_mathjax(out_dir: Path) -> Path:
    """Copy MathJax (from the jupyter-server-mathjax package) to `out_dir/mathjax/`, so equations typeset offline;
    the localization folder (menus in other languages, 2 MB) is left out."""
    import jupyter_server_mathjax  # lazy: only a report needs MathJax's files

    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (source / "MathJax.js").is_file():
        raise FileNotFoundError(f"{source / 'MathJax.js'} not found: reinstall it with "
                                "`pip install --force-reinstall jupyter-server-mathjax`")
    target = out_dir / MATHJAX_DIR
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("localization", "*.py"))
    return target
