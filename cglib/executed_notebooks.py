"""An executed notebook as readers see it outside Jupyter, shared by `cglib report` and `cglib book`: widget views
dropped (a page has no kernel), the run folder's paths written relative to it, MathJax copied beside the pages so
equations typeset offline. Light on purpose (nbformat and the standard library): the book imports it, and a book
needs neither torch nor the evaluation."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
INJECTED_PARAMETERS = "injected-parameters"  # the tag papermill gives the cell of parameters it inserts
INJECTED_NOTE = "# Parameters given by `cglib run` (paths relative to the run folder; the params file by its name)"
TEXT_OUTPUTS = ("text/plain", "text/html", "text/markdown", "text/latex")
MATHJAX_DIR = "mathjax"
# the repository (cglib.run.REPO_ROOT, a layer above this light module): params files usually sit in its params/
REPOSITORY = Path(__file__).resolve().parent.parent
# The short names pages give the folders of a machine (`machine_paths`); a path inside the run is relative to it
RUN_NAME, REPOSITORY_NAME, HOME_NAME, TEMP_NAME = ".", "<repo>", "~", "<tmp>"
# The file IPython compiles a cell into, under the temporary folder: a warning raised in a cell names it, with a
# kernel's process id and a hash that say nothing to a reader (`<tmp>/ipykernel_20516/2325027600.py:11: ...`)
KERNEL_CELL_FILE, KERNEL_CELL_NAME = r"/ipykernel_\d+/\d+\.py", "<cell>"


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


def machine_paths(run_dir: Path) -> list[tuple[str, str]]:
    """(absolute path, what a page writes instead) for every folder of the machines a run was made and read on
    that its pages may name. The run folder where it is now and where it was made (run.json's `run_dir`: a copied
    or moved run still prints its first location) -> relative to the run (`.`); the params file the run started
    from (run.json's `params_file`) -> its file name; the repository -> `<repo>` and the home folder -> `~`, those
    of the machine that made the run (run.json's `repository`, `home`) and of this one; the temporary folder
    (kernels' cell files in warnings, scratch folders) -> `<tmp>`."""
    manifest = _read_manifest(run_dir)
    rewrites = {str(run_dir.resolve()): RUN_NAME, str(run_dir.absolute()): RUN_NAME}
    if isinstance(manifest.get("run_dir"), str):
        rewrites[manifest["run_dir"]] = RUN_NAME
    if isinstance(manifest.get("params_file"), str):
        rewrites[manifest["params_file"]] = Path(manifest["params_file"]).name
    repositories = [manifest.get("repository")]  # where the run was made, then here
    if (REPOSITORY / "pyproject.toml").is_file():  # not where cglib is installed without its repository
        repositories.append(str(REPOSITORY))
    for folder in repositories:
        if isinstance(folder, str):
            rewrites.setdefault(folder, REPOSITORY_NAME)
    home = os.path.expanduser("~")  # "~" itself where no home is known (Path.home() would raise)
    for folder in [manifest.get("home"), home, os.path.realpath(home)]:
        if isinstance(folder, str):
            rewrites.setdefault(folder, HOME_NAME)
    # $TMPDIR where set, and /tmp, which kernels and tools may use whatever $TMPDIR says
    for folder in {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir()), "/tmp"}:
        rewrites.setdefault(folder, TEMP_NAME)
    # a path of one part ("/", a home folder of "/") would turn every absolute path into nonsense
    return [(path, short) for path, short in rewrites.items() if len(Path(path).parts) > 1]


def _read_manifest(run_dir: Path) -> dict:
    """run.json of `run_dir` ({} when it is absent or unreadable: a report still shows what it can)."""
    try:
        manifest = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def rewrite_machine_paths(text: str, rewrites: list[tuple[str, str]], markup: bool = False) -> str:
    """`text` with each absolute path of `rewrites` (`machine_paths`) replaced where it is a whole path or a path's
    leading folders: `<run>/magic/magic.json` -> `magic/magic.json`, `<run>` alone -> `.`, `/home/ann/x` -> `~/x`;
    `/tmp/run2` is not the run folder `/tmp/run`, so only its `/tmp` is rewritten. A kernel's cell file (in a
    warning raised by a cell) becomes `<cell>`. `markup`: `text` is HTML, where a bare `<tmp>` would be read as a
    tag and vanish, so the short names are escaped."""
    if not rewrites:
        return text
    name = html.escape if markup else str
    shown = {path: name(short) for path, short in rewrites}
    # One pass, the longest path first at each place: a rewritten path is not read again (`<repo>/tmp/x` stays).
    # A path starts where no name character (nor `~`) precedes it (`/var/tmp` is not `/tmp`; `sqlite:////tmp/x` is)
    # and ends at a separator or where no name character follows (a dot only where it ends a sentence).
    paths = "|".join(re.escape(path) for path in sorted(shown, key=len, reverse=True))
    pattern = rf"(?<![\w.~-])(?P<path>{paths})(?:(?P<sep>{re.escape(os.sep)})|(?![\w-]|\.\w))"
    text = re.sub(pattern, lambda match: _shortened(shown[match["path"]], match["sep"]), text)
    return re.sub(re.escape(name(TEMP_NAME)) + KERNEL_CELL_FILE, name(KERNEL_CELL_NAME), text)


def _shortened(shown: str, separator: str | None) -> str:
    if separator is None:
        return shown
    return "" if shown == RUN_NAME else shown + separator  # a path inside the run is written relative to it


def relative_to_run(text: str, run_dir: Path, markup: bool = False) -> str:
    """`text` with every folder of the machine written relative to the run or by a short name (`machine_paths`):
    `<run>/magic/magic.json` -> `magic/magic.json`, `<run>` alone -> `.`, wherever the run folder was made or sits
    now (a report is read on other machines than the one that ran it, and a run folder is copied to reach them).
    `markup`: `text` is HTML (`rewrite_machine_paths`)."""
    return rewrite_machine_paths(text, machine_paths(run_dir), markup)


def injected_parameters(source: str, rewrites: list[tuple[str, str]]) -> str:
    """Papermill's parameters cell as a report shows it: paths rewritten (`machine_paths`: inside the run relative
    to it, the params file a run was started with by its name), any other path outside the run (absolute, or under
    a short-named folder: `<tmp>/a/demo.yaml`) by its file name, and a first line that says so."""
    source = rewrite_machine_paths(source, rewrites)
    outside = "|".join(re.escape(start) for start in (os.sep, *(name + os.sep for name in
                                                                (REPOSITORY_NAME, HOME_NAME, TEMP_NAME))))
    source = re.sub(rf"""(["'])((?:{outside})[^"'\n]*)\1""", lambda m: f"{m[1]}{Path(m[2]).name}{m[1]}", source)
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
    rewrites = machine_paths(run_dir)  # once per notebook: it reads run.json

    def rewrite(text: str, markup: bool = False) -> str:
        return rewrite_machine_paths(text, rewrites, markup)

    for cell in nb.cells:
        if INJECTED_PARAMETERS in cell.metadata.get("tags", []):
            cell.source = injected_parameters(cell.source, rewrites)
        else:
            cell.source = rewrite(cell.source)
        for output in cell.get("outputs", []):
            if "text" in output:  # a stream
                output["text"] = rewrite(output["text"])
            for mime in TEXT_OUTPUTS:
                if isinstance(output.get("data", {}).get(mime), str):
                    output["data"][mime] = rewrite(output["data"][mime], markup=mime == "text/html")
            if output.get("output_type") == "error":
                output["evalue"] = rewrite(output["evalue"])
                output["traceback"] = [rewrite(line) for line in output["traceback"]]


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
