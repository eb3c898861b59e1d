"""`cglib report`: a run's executed notebooks as a static HTML report (index with Table 3, Table 1, Fig. 4;
one page per notebook), checked as files: every page written, every image resolves, every link resolves, no
widget state. The browser's view of the same report is in tests/test_browser.py."""

from __future__ import annotations

import base64
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import matplotlib.pyplot as plt
import nbformat
import pytest

from cglib.cli import main as cli_main
from cglib.executed_notebooks import INJECTED_NOTE, clean_notebook
from cglib.report import nav_links

REPO = Path(__file__).resolve().parent.parent
IMAGE_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


class _Refs(HTMLParser):
    """Every `<img src>` and `<a href>` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values.get("src") or "")
        elif tag == "a" and values.get("href"):
            self.links.append(values["href"])


def page_refs(page: Path) -> _Refs:
    refs = _Refs()
    refs.feed(page.read_text(encoding="utf-8"))
    return refs


def image_problem(page: Path, src: str) -> str | None:
    """Why an `<img src>` would not load offline (None when it would): a data URI must decode to its image
    type, a relative path must name a file beside the page; remote images are problems (the report is offline)."""
    if src.startswith("data:"):
        header, _, payload = src.partition(",")
        mime = header[5:].split(";")[0]
        if ";base64" not in header:
            return f"{page.name}: data URI not base64 ({header})"
        data = base64.b64decode(payload, validate=True)
        if mime in IMAGE_MAGIC and not data.startswith(IMAGE_MAGIC[mime]):
            return f"{page.name}: data URI is not a {mime}"
        if mime == "image/svg+xml" and b"<svg" not in data[:2000]:
            return f"{page.name}: data URI is not an SVG"
        return None if data else f"{page.name}: empty data URI"
    url = urlparse(src)
    if url.scheme or not url.path:
        return f"{page.name}: image not stored in the report: {src[:80]}"
    return None if (page.parent / unquote(url.path)).is_file() else f"{page.name}: missing image file {src}"


def link_problem(page: Path, href: str) -> str | None:
    """Why a relative link of a page is broken (external links and in-page anchors are not checked)."""
    url = urlparse(href)
    if url.scheme or not url.path:
        return None
    return None if (page.parent / unquote(url.path)).is_file() else f"{page.name}: broken link {href}"


def report_problems(folder: Path) -> list[str]:
    """Every image that would not load, every broken relative link and any widget state, over all pages."""
    problems = []
    for page in sorted(folder.glob("*.html")):
        refs = page_refs(page)
        problems += [p for src in refs.images if (p := image_problem(page, src))]
        problems += [p for href in refs.links if (p := link_problem(page, href))]
        text = page.read_text(encoding="utf-8")
        for marker in ("application/vnd.jupyter.widget-state+json", "application/vnd.jupyter.widget-view+json",
                       'class="jupyter-widgets'):
            if marker in text:
                problems.append(f"{page.name}: widget output or state left ({marker})")
    return problems


@pytest.fixture(scope="session")
def partial_report(small_run, tmp_path_factory) -> tuple[Path, int]:
    """`cglib report` of the session's run of notebooks 01-03 (a run that stopped after 03): (folder, exit)."""
    out = tmp_path_factory.mktemp("report") / "report"
    return out, cli_main(["report", str(small_run), "--out", str(out)])


@pytest.mark.slow
def test_report_of_a_run_that_stopped_after_notebook_03(partial_report):
    """Exit 0; pages for 01-03 with figures inline and the explorer's static view; the index shows Table 1 and
    lists what a partial run lacks (Table 3, Fig. 4, notebooks 00 and 04-07) with the reason; every image and
    link resolves and no widget state is left."""
    folder, code = partial_report
    assert code == 0
    assert sorted(p.name for p in folder.glob("*.html")) == ["01_captions.html", "02_abstraction.html",
                                                             "03_magic_dag.html", "index.html"]
    index = (folder / "index.html").read_text(encoding="utf-8")
    assert "Table 1: the MAGIC dataset at a glance" in index and "l1 nodes" in index
    missing = index[index.index("Not in this report"):]
    for name in ("Table 3", "Fig. 4", "00_overview.ipynb", "04_losses.ipynb", "07_visualization.ipynb"):
        assert f"<b>{name}</b>" in missing, name
    assert "no evaluation (notebook 06)" in missing and "--only 04" in missing
    assert report_problems(folder) == []
    refs = page_refs(folder / "index.html")
    assert {"01_captions.html", "02_abstraction.html", "03_magic_dag.html"} <= set(refs.links)
    assert refs.images and all(src.startswith("figures/") for src in refs.images)  # the run's figures, copied
    page03 = folder / "03_magic_dag.html"
    assert "MAGIC explorer, static view" in page03.read_text(encoding="utf-8")
    # the level distributions and the subtree drawn inline (the runner gives kernels the inline backend even under
    # MPLBACKEND=Agg), and the explorer's image strip
    assert sum(src.startswith("data:image/png") for src in page_refs(page03).images) >= 3
    assert page_refs(page03).links[:2] == ["index.html", "02_abstraction.html"]  # the navigation bar, first
    assert "require.js" not in page03.read_text(encoding="utf-8")
    assert '<a href="03_magic_dag.html">03_magic_dag.html</a>' in index  # a link says what it opens


@pytest.mark.slow
def test_report_pages_name_no_folder_of_the_machine(partial_report, small_run):
    """No page holds the run folder's absolute path or that of the params file the run started from: papermill's
    parameters cell shows them relative to the run (the params file by its name), and so do printed paths."""
    folder, _ = partial_report
    params_file = json.loads((small_run / "run.json").read_text(encoding="utf-8"))["params_file"]
    assert str(small_run.resolve()) in (small_run / "notebooks" / "01_captions.ipynb").read_text(encoding="utf-8")
    for page in sorted(folder.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        assert str(small_run.resolve()) not in text and params_file not in text, page.name
    parameters = next(c for c in clean_notebook(nbformat.read(small_run / "notebooks" / "01_captions.ipynb", 4),
                                                small_run).cells if "injected-parameters" in c.metadata.tags)
    assert parameters.source.splitlines() == [INJECTED_NOTE, f'params_path = "{Path(params_file).name}"',
                                              'run_dir = "."']


@pytest.mark.slow
def test_report_with_evaluation_and_a_broken_notebook(small_run, tmp_path):
    """A run folder with a hand-made evaluation (table3.md, Fig. 4) shows both up front; a notebook that cannot be
    read costs only its own page: it is listed with the reason and the command exits 1."""
    run = tmp_path / "run"
    (run / "notebooks").mkdir(parents=True)
    shutil.copy(small_run / "params.yaml", run / "params.yaml")
    shutil.copytree(small_run / "magic", run / "magic")
    shutil.copy(small_run / "notebooks" / "03_magic_dag.ipynb", run / "notebooks")
    (run / "notebooks" / "06_evaluation.ipynb").write_text("{not json", encoding="utf-8")
    (run / "evaluation").mkdir()
    (run / "evaluation" / "table3.md").write_text(
        "# Table 3 (regenerated)\n\n| model | HierarCaps R@1 |\n|---|---|\n| clip | 41.0 [38.2, 44.1] |\n\n"
        "- values in percent, 95% bootstrap CIs\n", encoding="utf-8")
    (run / "figures").mkdir()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2, 3, 4], [0.6, 0.5, 0.4, 0.3])
    fig.savefig(run / "figures" / "06_fig4_accuracy_by_level.png")
    plt.close(fig)
    (run / "run.json").write_text(json.dumps({"status": "ok", "notebooks": [
        {"name": "03_magic_dag.ipynb", "status": "ok", "duration_s": 12.0},
        {"name": "06_evaluation.ipynb", "status": "ok", "duration_s": 30.0}]}), encoding="utf-8")

    assert cli_main(["report", str(run)]) == 1
    folder = run / "report"
    index = (folder / "index.html").read_text(encoding="utf-8")
    assert index.index("Table 3") < index.index("Table 1") < index.index("Fig. 4") < index.index("Notebooks")
    assert "<td>41.0 [38.2, 44.1]</td>" in index and "95% bootstrap CIs" in index
    assert 'src="figures/06_fig4_accuracy_by_level.png"' in index
    assert "<b>06_evaluation.ipynb</b>: page not written" in index and not (folder / "06_evaluation.html").exists()
    assert (folder / "03_magic_dag.html").is_file() and report_problems(folder) == []


def test_report_needs_a_run_directory(tmp_path, capsys):
    """A folder without params.yaml is not a run: exit 2 and a message naming what to pass."""
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "not a run directory (no params.yaml); pass outputs/<run>" in capsys.readouterr().err


def test_clean_notebook_drops_widget_state_and_views_keeps_static_renderings():
    """Widget state and views go; an output's static HTML stays; a bare widget says where it lives."""
    nb = nbformat.v4.new_notebook(metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}})
    nb.cells = [nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "a"},
                                                     "text/html": "<p>static view</p>"}),
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "b"}}),
    ])]
    outputs = clean_notebook(nb).cells[0].outputs
    assert "widgets" not in nb.metadata
    assert outputs[0]["data"] == {"text/html": "<p>static view</p>"}
    assert outputs[1]["data"] == {"text/plain": "(interactive widget: open the notebook in Jupyter)"}


def math_run(root: Path) -> Path:
    """A run folder whose only executed notebook is notebook 04 (Eqs. 1-8 in its markdown): enough for a report."""
    (root / "notebooks").mkdir(parents=True)
    (root / "params.yaml").write_text("run: {name: math}\n", encoding="utf-8")
    shutil.copy(Path(__file__).parents[1] / "notebooks" / "04_losses.ipynb", root / "notebooks")
    return root


class _Scripts(HTMLParser):
    """Every `<script src>` and `<link href>` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        key = {"script": "src", "link": "href"}.get(tag)
        value = dict(attrs).get(key) if key else None
        if value:
            self.sources.append(value)


def test_report_math_is_bundled_and_no_script_comes_from_the_network(tmp_path):
    """The report folder holds MathJax (from the jupyter-server-mathjax package); every page's scripts and style
    sheets are relative paths that resolve inside the folder, none http(s) or protocol-relative."""
    from cglib.report import build_report

    report = build_report(math_run(tmp_path / "run"), tmp_path / "report")
    assert report.pages == [tmp_path / "report" / "04_losses.html"] and not report.failed
    for page in [*report.pages, report.index]:
        text = page.read_text(encoding="utf-8")
        parser = _Scripts()
        parser.feed(text)
        for src in parser.sources:
            assert not urlparse(src).scheme and not src.startswith("//"), (page.name, src)
            assert (page.parent / unquote(urlparse(src).path)).is_file(), (page.name, src)
        assert "cdnjs" not in text and "mermaid" not in text, page.name
    assert any(src.startswith("mathjax/MathJax.js?config=") for src in _sources(report.pages[0]))
    config = _sources(report.pages[0])[0].split("config=")[1].split(",")
    assert all((tmp_path / "report" / "mathjax" / "config" / f"{name}.js").is_file() for name in config)
    assert "$$" in report.pages[0].read_text(encoding="utf-8")  # the equations are left for MathJax to typeset


def _sources(page: Path) -> list[str]:
    parser = _Scripts()
    parser.feed(page.read_text(encoding="utf-8"))
    return [s for s in parser.sources if "mathjax" in s.lower()]


def test_nav_links_index_previous_next():
    names = ["01_a.ipynb", "03_b.ipynb", "07_c.ipynb"]
    assert nav_links("01_a.ipynb", names) == [("index", "index.html"), ("next: 03_b.html", "03_b.html")]
    assert [href for _, href in nav_links("03_b.ipynb", names)] == ["index.html", "01_a.html", "07_c.html"]


def test_clean_notebook_writes_the_run_folder_relative_to_it(tmp_path):
    """Sources, streams, rich text and tracebacks write the run folder's paths relative to it; the injected
    parameters name the params file outside the run by its file name; other paths are left as they are."""
    run = tmp_path / "outputs" / "demo"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f'# Parameters\nparams_path = "{tmp_path}/params/demo.yaml"\nrun_dir = "{run}"\n',
                                  metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell(f"load('{run}/magic/magic.json')", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text=f"run: {run}   wrote {run}/magic/stats.json\n"),
            nbformat.v4.new_output("display_data", data={"text/plain": f"{run}/figures/a.png",
                                                         "text/html": f"<code>{run}/figures/a.png</code>"}),
            nbformat.v4.new_output("error", ename="OSError", evalue=f"{run}/x missing",
                                   traceback=[f"File /usr/lib/python3/x.py, reading {run}/x"])])]
    source, code = clean_notebook(nb, run).cells
    assert source.source.splitlines() == [INJECTED_NOTE, 'params_path = "demo.yaml"', 'run_dir = "."']
    assert code.source == "load('magic/magic.json')"
    stream, display, error = code.outputs
    assert stream["text"] == "run: .   wrote magic/stats.json\n"
    assert display["data"] == {"text/plain": "figures/a.png", "text/html": "<code>figures/a.png</code>"}
    assert error["evalue"] == "x missing" and error["traceback"] == ["File /usr/lib/python3/x.py, reading x"]


def test_the_index_gallery_gives_wide_figures_a_row_and_every_figure_a_caption_and_link(tmp_path):
    """In the index's gallery a figure wider than 1.8 times its height takes a whole row (at half a row its text
    is unreadable), the others half a row; each is captioned by its name and links to its full-size image."""
    from PIL import Image

    from cglib.report import build_report

    run = tmp_path / "run"
    (run / "figures").mkdir(parents=True)
    shutil.copy(REPO / "params" / "classroom.yaml", run / "params.yaml")
    for stem, size in (("03_magic_levels", (840, 200)), ("07_umap_centroids", (600, 500)),
                       ("just_wide_enough", (370, 200)), ("not_quite_wide", (350, 200))):
        Image.new("RGB", size, "steelblue").save(run / "figures" / f"{stem}.png")
    index = (build_report(run).index).read_text(encoding="utf-8")
    gallery = index[index.index('<div class="gallery">'):]
    for stem, kind in (("03_magic_levels", "wide"), ("07_umap_centroids", "half"), ("just_wide_enough", "wide"),
                      ("not_quite_wide", "half")):
        src = f"figures/{stem}.png"
        assert (f'<figure class="{kind}"><a href="{src}"><img src="{src}" alt="{stem}" title="{stem}"></a>'
                f'<figcaption><a href="{src}">{stem}</a></figcaption></figure>') in gallery, stem
    assert ".gallery figure.wide { width: 100%; }" in index
    assert report_problems(run / "report") == []
