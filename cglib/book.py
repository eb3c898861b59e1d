"""A run as a browsable book (`cglib book RUN_DIR`): the guide's pages (`book/` of the repository: setup,
profiles, each stage, results, fidelity, teaching, ...), the run's executed notebooks and a glossary, built by
Sphinx with MyST-NB into one static site with navigation, search and cross-references.

It is built offline and read offline: no notebook is re-executed (MyST-NB reads the run's executed copies), the
theme's files ship inside its Python package, the search index is `searchindex.js` beside the pages, and MathJax
2.7 comes from the jupyter-server-mathjax package (copied into `_static/mathjax/`, never from a CDN).

The executed notebooks are prepared as `cglib report` prepares them (widget state dropped, the run folder's paths
written relative to it), then two things only a book does:
- an exercise's solution is folded: a code cell holding a `### BEGIN SOLUTION` region is shown as its student
  version (the skeleton `cglib student-version` hands out) followed by the full cell, collapsed, with its outputs
  (the check passing); a markdown region becomes a collapsed `<details>` block. Both open with a click, no script.
- the first use of each glossary term on a notebook page links to its entry (outside code, math, links and
  headings), so a reader meets "Holm" or "hard negative" with its definition one click away.

`cglib report` stays beside the book: it needs no Sphinx (nbconvert only, a main dependency), writes one
self-contained page per notebook that can be mailed alone, and puts Table 3, Table 1 and Fig. 4 on its index.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

from cglib.course.student import BEGIN_SOLUTION, END_SOLUTION, has_solution, strip_solutions
from cglib.executed_notebooks import (
    MATHJAX_DIR,
    bundle_mathjax,
    check_run_folder,
    clean_notebook,
)
from cglib.run import REPO_ROOT
from cglib.user_files import check_site_folder, mark_site_folder

GUIDE_DIR = REPO_ROOT / "book"  # the guide's MyST pages, readable on the forge as they are
README = REPO_ROOT / "README.md"
GLOSSARY_PAGE = "glossary.md"
GUIDE_CONTENTS = "index.md"  # the guide's contents page: its links give the navigation's order
NOTEBOOKS = "notebooks"  # the executed notebooks' folder in the book, as in the repository (guide links resolve)
HIDE_INPUT = "hide-input"  # MyST-NB folds such a cell's source into a closed <details> block
SOLUTION_SUMMARY = "Show the solution"
# MathJax 2.7's combined configuration shipped by jupyter-server-mathjax (the one `cglib report` uses)
MATHJAX_PATH = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Sphinx colours its warnings on a terminal
MATHJAX_CONFIG = {
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None,
                 "styles": {"@font-face": {"font-family": "MathJax_Blank", "src": "local('MathJax_Blank')"}}},
    "SVG": {"font": "STIX-Web"},
    "menuSettings": {"assistiveMML": False},
    # MyST-NB marks a notebook page tex2jax_ignore and lets MathJax 3 back in through the classes it gives math
    # (its processHtmlClass); MathJax 2 reads the same list here
    "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area"},
}
# Spans a glossary link must not enter: fenced and inline code, display and inline math, links, HTML tags
PROTECTED = re.compile(r"(```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\[[^\]]*\]\([^)]*\)|<[^>\n]+>|\{[a-z]+\}`[^`]*`)",
                       flags=re.DOTALL)


class BookDependencyMissing(RuntimeError):
    """Sphinx, MyST-NB or the book theme is not installed."""


@dataclass
class Book:
    """What `build_book` wrote: the site's folder, its notebook pages, Sphinx's warnings, the build time."""

    out_dir: Path
    notebooks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def index(self) -> Path:
        return self.out_dir / "index.html"


def build_book(run_dir: str | Path, out_dir: str | Path | None = None, guide_dir: Path = GUIDE_DIR,
               need_notebooks: bool = False) -> Book:
    """Build the book of a run into `out_dir` (default `RUN_DIR/book/`); raises NotARunDirectory without
    params.yaml, or without an executed notebook when `need_notebooks` (`cglib book`), UserFilesInTheWay when
    `out_dir` holds files an earlier book did not write, and BookDependencyMissing without Sphinx, MyST-NB or
    sphinx-book-theme."""
    run_dir = Path(run_dir)
    check_run_folder(run_dir, "book", need_notebooks)
    if out_dir is not None:
        check_site_folder(Path(out_dir), "book")
    if not (guide_dir / GUIDE_CONTENTS).is_file():
        raise FileNotFoundError(f"{guide_dir / GUIDE_CONTENTS} not found: the book reads the guide from the "
                                "repository's book/ folder; build it from a clone (`pip install -e \".[book]\"`)")
    _require_sphinx()
    from sphinx.application import Sphinx  # lazy: only a build needs Sphinx, an optional extra

    book = Book(Path(out_dir) if out_dir else run_dir / "book")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cglib-book-") as scratch:
        source = Path(scratch) / "source"
        shutil.copytree(guide_dir, source / guide_dir.name)
        if README.is_file():
            shutil.copyfile(README, source / README.name)
        terms = glossary_terms((guide_dir / GLOSSARY_PAGE).read_text(encoding="utf-8"))
        for path in sorted((run_dir / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            notebook = book_notebook(nbformat.read(path, as_version=4), run_dir, terms)
            (source / NOTEBOOKS).mkdir(exist_ok=True)
            nbformat.write(notebook, source / NOTEBOOKS / path.name)
            book.notebooks.append(path.name)
        guide = [f"{guide_dir.name}/{Path(page).with_suffix('').as_posix()}" for page in guide_order(guide_dir)]
        (source / "index.md").write_text(index_page(run_dir, guide, book.notebooks, has_readme=README.is_file()),
                                         encoding="utf-8")
        bundle_mathjax(source / "_static")
        (source / "conf.py").write_text(CONF.format(title=repr(f"CLEAR GLASS: run {_run_name(run_dir)}")),
                                        encoding="utf-8")
        if book.out_dir.exists():  # pages of an earlier build must not survive a page's removal
            shutil.rmtree(book.out_dir)
        warnings = io.StringIO()
        app = Sphinx(str(source), str(source), str(book.out_dir), str(Path(scratch) / "doctrees"), "html",
                     status=io.StringIO(), warning=warnings, freshenv=True)
        app.build()
        mark_site_folder(book.out_dir, "book")
        book.warnings = [ANSI_COLOUR.sub("", line).replace(str(source) + "/", "")
                         for line in warnings.getvalue().splitlines() if "WARNING" in line]
    book.seconds = time.perf_counter() - started
    return book


# ----------------------------------------------------------------------------------------------- notebooks
def book_notebook(notebook: nbformat.NotebookNode, run_dir: Path,
                  terms: list[str]) -> nbformat.NotebookNode:
    """An executed notebook as the book shows it: cleaned as in `cglib report`, solutions folded, the first use
    of each glossary term linked."""
    notebook = fold_solutions(clean_notebook(notebook, run_dir))
    unlinked = list(terms)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = link_glossary_terms(cell.source, unlinked)
    return notebook


def fold_solutions(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Each solution region collapsed: a code cell becomes its student version (a markdown cell with the
    skeleton) followed by the whole cell, source folded, outputs shown; a markdown region becomes a closed
    `<details>` block."""
    if not has_solution(notebook):
        return notebook
    cells = []
    for index, cell in enumerate(notebook.cells):
        if BEGIN_SOLUTION not in cell.source:
            cells.append(cell)
        elif cell.cell_type == "code":
            skeleton = strip_solutions(cell.source, "code", where=f"cell {index}")
            cells.append(nbformat.v4.new_markdown_cell(
                "**Exercise.** Complete the code below; the solution is folded under it.\n\n"
                f"```python\n{skeleton}\n```"))
            cell.source = "\n".join(line for line in cell.source.splitlines()
                                    if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION))
            cell.metadata.setdefault("tags", []).append(HIDE_INPUT)
            cells.append(cell)
        else:
            cell.source = fold_markdown_solution(cell.source)
            cells.append(cell)
    notebook.cells = cells
    return notebook


def fold_markdown_solution(source: str) -> str:
    """The solution regions of a markdown cell as closed `<details>` blocks (blank lines around the content so
    it is still read as markdown, math included)."""
    lines = []
    for line in source.splitlines():
        if line.strip() == BEGIN_SOLUTION:
            lines += [f'<details class="cglib-solution">\n<summary>{SOLUTION_SUMMARY}</summary>', ""]
        elif line.strip() == END_SOLUTION:
            lines += ["", "</details>"]
        else:
            lines.append(line)
    return "\n".join(lines)


def glossary_terms(glossary: str) -> list[str]:
    """The terms of the glossary page's `{glossary}` block: its unindented lines (definitions are indented)."""
    block = re.search(r"```\{glossary\}\n(.*?)\n```", glossary, flags=re.DOTALL)
    if block is None:
        raise ValueError("the glossary page has no ```{glossary} block; add one (terms unindented, definitions "
                         "indented)")
    return [line.strip() for line in block[1].splitlines() if line.strip() and not line[0].isspace()
            and not line.startswith(":")]


def link_glossary_terms(text: str, unlinked: list[str]) -> str:
    """`text` with the first use of each term still in `unlinked` written as a glossary link (and removed from
    `unlinked`); terms are matched whole-word, case-sensitively, plural allowed, longest first, never inside code,
    math, links, HTML or headings."""
    pieces = PROTECTED.split(text)
    for at in range(0, len(pieces), 2):  # the even pieces lie outside the protected spans
        lines = pieces[at].split("\n")
        for number, line in enumerate(lines):
            starts_line = number > 0 or at == 0 or pieces[at - 1].endswith("\n")
            if not (starts_line and line.lstrip().startswith("#")):
                lines[number] = _link_first_uses(line, unlinked)
        pieces[at] = "\n".join(lines)
    return "".join(pieces)


def _link_first_uses(line: str, unlinked: list[str]) -> str:
    for term in sorted(unlinked, key=len, reverse=True):
        parts = PROTECTED.split(line)  # a link written for a longer term is protected from the shorter ones
        for at in range(0, len(parts), 2):
            match = re.search(rf"(?<![\w'-]){re.escape(term)}s?(?![\w'-])", parts[at])
            if match:
                link = f"{{term}}`{match[0]} <{term}>`"
                parts[at] = parts[at][:match.start()] + link + parts[at][match.end():]
                unlinked.remove(term)
                break
        line = "".join(parts)
    return line


# ----------------------------------------------------------------------------------------------- pages
def guide_order(guide_dir: Path) -> list[str]:
    """The guide's pages in the order of its contents page's list (`book/index.md`), that page first;
    a page the list lacks is an error (it would be missing from the navigation)."""
    contents = (guide_dir / GUIDE_CONTENTS).read_text(encoding="utf-8")
    listed = re.findall(r"^\s*- \[[^\]]*\]\(([^)#]+\.md)\)", contents, flags=re.MULTILINE)  # the list's items
    order = [GUIDE_CONTENTS, *listed]
    order = list(dict.fromkeys(page for page in order if not page.startswith("..")))  # first mention counts
    unlisted = sorted(p.relative_to(guide_dir).as_posix() for p in guide_dir.rglob("*.md")
                      if p.relative_to(guide_dir).as_posix() not in order)
    if unlisted:
        raise ValueError(f"{guide_dir / GUIDE_CONTENTS} does not link {', '.join(unlisted)}: add a line "
                         "`- [Title](page.md)` where it belongs in the navigation")
    return order


def index_page(run_dir: Path, guide: list[str], notebooks: list[str], has_readme: bool) -> str:
    """The book's front page: the run's name, what the book holds, and the tables of contents."""
    executed = [f"{NOTEBOOKS}/{Path(name).stem}" for name in notebooks]
    missing = "" if notebooks else ("\nThis run has no executed notebooks yet (`cglib run PARAMS --out "
                                    f"{run_dir.name}` writes them).\n")
    return "\n".join([
        f"# CLEAR GLASS on MAGIC: run `{_run_name(run_dir)}`", "",
        ("This book holds the guide to the collection, the run's executed notebooks (their outputs are this "
         "run's results) and a glossary. Search from the box at the top of the navigation; the exercises' "
         "solutions are folded under each exercise."), missing,
        _toctree("The executed notebooks", executed),
        _toctree("Guide", ["README"] * has_readme + guide), ""])


def _toctree(caption: str, entries: list[str]) -> str:
    if not entries:
        return ""
    return "\n".join(["```{toctree}", f":caption: {caption}", ":maxdepth: 1", "", *entries, "```", ""])


def _run_name(run_dir: Path) -> str:
    try:
        return str(yaml.safe_load((run_dir / "params.yaml").read_text(encoding="utf-8"))["run"]["name"])
    except (yaml.YAMLError, KeyError, TypeError):
        return run_dir.name


def _require_sphinx() -> None:
    missing = []
    for module in ("sphinx", "myst_nb", "sphinx_book_theme"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise BookDependencyMissing(f"{', '.join(missing)} not installed: the book needs the `book` extra; run "
                                    "`pip install -e \".[book]\"` (`make install` includes it)")


CONF = '''# Written by `cglib book`: the book is built from these settings alone, offline.
project = {title}
extensions = ["myst_nb"]
nb_execution_mode = "off"  # the run's notebooks are already executed: show their outputs as they are
nb_merge_streams = True
nb_code_prompt_show = "Show the solution ({{type}})"  # only solution cells are folded (cglib.book.fold_solutions)
nb_code_prompt_hide = "Hide the solution ({{type}})"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "myst.xref_missing", "mystnb.unknown_mime_type"]
html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {{"show_toc_level": 2, "use_download_button": False, "use_fullscreen_button": False}}
html_static_path = ["_static"]
html_copy_source = False
html_show_sourcelink = False
mathjax_path = "{mathjax}"  # relative to _static: the bundled MathJax 2.7, never a CDN
# The bundled MathJax ships only the STIX-Web fonts: ask for those, never for the TeX fonts it lacks (the reasons,
# one by one, are in cglib/templates/report_page.html.j2, which sets the same for the report)
mathjax2_config = {mathjax_config}
'''.replace("{mathjax}", MATHJAX_PATH).replace("{mathjax_config}", repr(MATHJAX_CONFIG).replace("{", "{{").replace(
    "}", "}}"))
