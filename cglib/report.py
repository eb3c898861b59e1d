"""A run as a static HTML report (`cglib report RUN_DIR`): an index with Table 3, Table 1 and Fig. 4 up front,
then one page per executed notebook (nbconvert), for readers who do not run Jupyter.

Pages name no folder of the machine that ran the notebooks, nor of the one that builds the report: paths inside
the run folder are written relative to it, where it was made and wherever it was copied since (papermill's injected
parameters too, where the params file outside the run is named by its file name); the repository, the home folder
and the temporary folder print as `<repo>`, `~` and `<tmp>` (`cglib.executed_notebooks.machine_paths`).
Pages are self-contained: figures in notebook outputs (and the explorers' static renderings) are inline data
URIs; the index's figures are copied beside it (`figures/`) and linked relatively, so the report folder can be
zipped and shared, and read offline: MathJax 2.7 comes from the jupyter-server-mathjax package (PyPI), copied
into `mathjax/` beside the pages, never from a CDN. Widget state is dropped (it would be a disconnected
snapshot), and so are require.js (only widgets need it) and nbconvert's mermaid loader (no notebook draws a
diagram; `templates/report_page.html.j2`). Missing pieces, e.g. a run stopped after notebook 03, are listed on
the index with the reason; only a page that fails to convert is an error.
"""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pandas as pd
import yaml

from cglib.config.evaluation import EvalParams
from cglib.evaluate.floor import base_origin, chance_floor
from cglib.executed_notebooks import (
    MATHJAX_DIR,
    bundle_mathjax,
    check_run_folder,
    clean_notebook,
    relative_to_run,
)
from cglib.magic import load_magic, table1
from cglib.pipeline import default_notebook_dir, discover_notebooks
from cglib.user_files import check_site_folder, mark_site_folder

INDEX = "index.html"
FIG4_STEM = "06_fig4_accuracy_by_level"  # cglib.viz.figures.STEMS["accuracy"]
PAGE_TEMPLATE = Path(__file__).parent / "templates" / "report_page.html.j2"  # lab, less its CDN scripts
# nbconvert's own CDN default is 2.7.7 with TeX-AMS_CHTML-full; the packaged 2.7 tree ships this combined config
MATHJAX_URL = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1240px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.8em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img.figure { max-width: 100%; border: 1px solid #eee; }
.missing { color: #a33; }
.floor { border-left: 4px solid #D55E00; background: #fff4ec; padding: 0.2em 1em; margin: 1em 0; }
.gallery { display: flex; flex-wrap: wrap; gap: 1em 2%; align-items: flex-start; }
.gallery figure { width: 49%; margin: 0; }
.gallery figure.wide { width: 100%; }
.gallery img { max-width: 100%; border: 1px solid #eee; }
.gallery figcaption { font-size: 0.8em; color: #555; }
"""
NAV_STYLE = """
nav.cglib-report { font-family: system-ui, sans-serif; padding: 0.5em 1em; background: #f3f3f3;
                   border-bottom: 1px solid #ccc; position: sticky; top: 0; z-index: 10; }
nav.cglib-report a { margin-right: 1.5em; }
"""


@dataclass
class Report:
    """What `build_report` wrote and what it could not include (name -> reason)."""

    out_dir: Path
    pages: list[Path] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def index(self) -> Path:
        return self.out_dir / INDEX


def build_report(run_dir: str | Path, out_dir: str | Path | None = None, need_notebooks: bool = False) -> Report:
    """Write the HTML report of a run (default `RUN_DIR/report/`); raises NotARunDirectory without params.yaml, or
    without an executed notebook when `need_notebooks` (`cglib report`), and UserFilesInTheWay when `out_dir` holds
    files an earlier report did not write."""
    run_dir = Path(run_dir)
    check_run_folder(run_dir, "report", need_notebooks)
    report = Report(Path(out_dir) if out_dir else run_dir / "report")
    if out_dir is not None:
        check_site_folder(report.out_dir, "report")
    mark_site_folder(report.out_dir, "report")
    for stale in [*report.out_dir.glob("[0-9][0-9]_*.html"), report.index]:  # pages of an earlier report
        stale.unlink(missing_ok=True)
    manifest = _read_json(run_dir / "run.json") or {}

    entries = _notebook_entries(run_dir, manifest)
    bundle_mathjax(report.out_dir)
    bodies = {}
    for name, path, _ in entries:
        if path is None:
            continue
        try:
            bodies[name] = notebook_html(path, run_dir=run_dir)
        except Exception as exc:  # noqa: BLE001 - one unreadable notebook must not cost the others their pages
            report.failed[name] = f"{type(exc).__name__}: {exc}"
    for name, body in bodies.items():  # navigation between the pages that exist
        report.pages.append(report.out_dir / page_name(name))
        report.pages[-1].write_text(with_nav(body, nav_links(name, list(bodies))), encoding="utf-8")

    sections = [_floor_section(run_dir), _table3_section(run_dir, report), _table1_section(run_dir, report),
                _fig4_section(run_dir, report), _notebooks_section(entries, report),
                _figures_section(run_dir, report), _missing_section(report)]
    title = f"Run {_run_name(run_dir)}"
    index = _page(title, _run_header(run_dir, manifest) + "".join(sections))
    report.index.write_text(relative_to_run(index, run_dir, markup=True), encoding="utf-8")
    return report


# ----------------------------------------------------------------------------------------------- notebooks
def page_name(notebook: str) -> str:
    """The report page of an executed notebook: `03_magic_dag.ipynb` -> `03_magic_dag.html`."""
    return Path(notebook).with_suffix(".html").name


def nav_links(name: str, names: list[str]) -> list[tuple[str, str]]:
    """(label, href) of a notebook page's navigation bar: the index, the previous and the next page."""
    links = [("index", INDEX)]
    at = names.index(name)
    if at > 0:
        links.append((f"previous: {page_name(names[at - 1])}", page_name(names[at - 1])))
    if at + 1 < len(names):
        links.append((f"next: {page_name(names[at + 1])}", page_name(names[at + 1])))
    return links


def notebook_html(path: Path, mathjax_url: str = MATHJAX_URL, run_dir: Path | None = None) -> str:
    """One executed notebook as a standalone HTML page (nbconvert's lab template, images inline); math typeset by
    the MathJax at `mathjax_url` (relative: the copy `bundle_mathjax` puts beside the pages); paths of `run_dir`
    written relative to it."""
    from nbconvert import HTMLExporter

    nb = clean_notebook(nbformat.read(path, as_version=4), run_dir)
    exporter = HTMLExporter(template_name="lab", template_file=str(PAGE_TEMPLATE), embed_images=True,
                            mathjax_url=mathjax_url)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(path.parent),
                                                                      "name": path.stem}})
    return body


def with_nav(body: str, links: list[tuple[str, str]]) -> str:
    """A page with a navigation bar (index, previous, next) at the top of its body."""
    nav = ('<nav class="cglib-report">' + "".join(f'<a href="{html.escape(href)}">{html.escape(label)}</a>'
                                                  for label, href in links) + "</nav>")
    body = body.replace("</head>", f"<style>{NAV_STYLE}</style></head>", 1)
    at = body.find(">", body.find("<body")) + 1
    return body[:at] + nav + body[at:]


def _notebook_entries(run_dir: Path, manifest: dict) -> list[tuple[str, Path | None, str]]:
    """(name, executed copy or None, status line) for every notebook of the series, executed or not."""
    executed = {p.name: p for p in sorted((run_dir / "notebooks").glob("*.ipynb"))}
    recorded = {nb["name"]: nb for nb in manifest.get("notebooks", [])}
    try:
        series = [p.name for p in discover_notebooks(default_notebook_dir())]
    except FileNotFoundError:  # an installed package without the repository's notebooks
        series = []
    entries = []
    for name in sorted(set(series) | set(executed) | set(recorded)):
        record = recorded.get(name, {})
        status = record.get("status")
        if name in executed:
            line = {"ok": f"ok, {record.get('duration_s', 0):.0f} s",
                    None: "executed copy without a status in run.json (still running, or interrupted)"}.get(
                status, f"{status}: {record.get('error') or 'see the page'}")
            entries.append((name, executed[name], line))
        elif status:
            entries.append((name, None, f"{status}, no executed copy in notebooks/"
                            + (f": {record['error']}" if record.get("error") else "")))
        else:
            why = f"not executed in this run (run it with `cglib run PARAMS --out RUN_DIR --only {name[:2]}`)"
            entries.append((name, None, why))
    return entries


# ----------------------------------------------------------------------------------------------- index
def _floor_section(run_dir: Path) -> str:
    """The usability floor's warning, before Table 3, when the zero-shot base is near chance (else nothing)."""
    path = run_dir / "evaluation" / "metrics.csv"
    if not path.is_file():
        return ""
    raw = yaml.safe_load((run_dir / "params.yaml").read_text(encoding="utf-8")) or {}
    margin = (raw.get("eval") or {}).get("chance_margin", EvalParams.model_fields["chance_margin"].default)
    floor = chance_floor(pd.read_csv(path, dtype={"level": str}), float(margin))
    if floor is None or not floor.near_chance:
        return ""
    import mistune  # lazy: mistune only renders the index's markdown

    return '<div class="floor">' + mistune.html(floor.message(base_origin(run_dir))) + "</div>"


def _table3_section(run_dir: Path, report: Report) -> str:
    directory = run_dir / "evaluation"
    if (directory / "table3.md").is_file():
        import mistune

        html = "<h2>Table 3: retrieval accuracy</h2>" + mistune.html((directory / "table3.md").read_text(
            encoding="utf-8").replace("# Table 3 (regenerated)", "", 1))
        published = directory / "table3_as_published.md"
        if published.is_file():  # the same models under the authors' evaluation protocol, the paper's rows beside
            text = published.read_text(encoding="utf-8").split("\n", 1)[1]
            html += "<h2>Table 3 as published: the authors' evaluation protocol, with the paper's rows</h2>"
            html += mistune.html(text)
        return html
    if (directory / "table3.csv").is_file():
        table = pd.read_csv(directory / "table3.csv", index_col="model")
        return "<h2>Table 3: retrieval accuracy</h2>" + table.to_html()
    report.missing["Table 3"] = f"{directory / 'table3.md'} not found: the run has no evaluation (notebook 06)"
    return ""


def _table1_section(run_dir: Path, report: Report) -> str:
    path = run_dir / "magic" / "magic.json"
    if not path.is_file():
        report.missing["Table 1"] = f"{path} not found: the run has no MAGIC dataset (notebook 03)"
        return ""
    try:
        table = table1(load_magic(path))
    except (ValueError, KeyError) as exc:
        report.missing["Table 1"] = f"{path} could not be read: {exc}"
        return ""
    return "<h2>Table 1: the MAGIC dataset at a glance</h2>" + table.rename_axis(None).to_html(na_rep="")


def _fig4_section(run_dir: Path, report: Report) -> str:
    path = run_dir / "figures" / f"{FIG4_STEM}.png"
    if not path.is_file():
        report.missing["Fig. 4"] = f"{path} not found: the run has no evaluation figures (notebook 06)"
        return ""
    return ("<h2>Fig. 4: each model minus the zero-shot model, by abstraction level</h2>"
            f'<img class="figure" src="{_copy_figure(path, report)}" alt="Fig. 4">')


WIDE_FIGURE = 1.8  # width / height above which a figure takes a whole row: at half a row its text is too small


def is_wide(path: Path) -> bool:
    """Whether the PNG at `path` is wider than `WIDE_FIGURE` times its height (read from its header only)."""
    from PIL import Image  # lazy: only the gallery needs it

    with Image.open(path) as image:
        width, height = image.size
    return width > WIDE_FIGURE * height


def _figures_section(run_dir: Path, report: Report) -> str:
    """Every figure of the run, two a row, a wide one alone on its row; each captioned by its name and linked to
    the full-size image."""
    figures = [p for p in sorted((run_dir / "figures").glob("*.png")) if p.stem != FIG4_STEM]
    if not figures:
        return ""
    items = "".join(f'<figure class="{"wide" if is_wide(p) else "half"}"><a href="{src}"><img src="{src}" '
                    f'alt="{name}" title="{name}"></a><figcaption><a href="{src}">{name}</a></figcaption></figure>'
                    for p in figures for src, name in [(_copy_figure(p, report), html.escape(p.stem))])
    return f'<h2>All figures</h2><div class="gallery">{items}</div>'


def _notebooks_section(entries: list[tuple[str, Path | None, str]], report: Report) -> str:
    rows = []
    for name, path, line in entries:
        if name in report.failed:
            cell, line = html.escape(name), f"page not written: {report.failed[name]}"
        elif path is not None:
            cell = (f'<a href="{page_name(name)}">{page_name(name)}</a> (from {html.escape(name)})'
                    + _explorer_note(path))
        else:
            cell = html.escape(name)
            report.missing[name] = line
        rows.append(f"<tr><td>{cell}</td><td>{html.escape(line)}</td></tr>")
    return ("<h2>Notebooks</h2><table><tr><th>page (executed notebook)</th><th>status</th></tr>" + "".join(rows)
            + "</table>")


def _explorer_note(path: Path) -> str:
    """' (explorer: static view)' when the executed notebook holds an explorer's static rendering."""
    text = path.read_text(encoding="utf-8")
    return " (with the explorer's static view)" if "static view" in text and "explorer" in text.lower() else ""


def _missing_section(report: Report) -> str:
    if not report.missing and not report.failed:
        return ""
    items = {**report.missing, **{k: f"page not written: {v}" for k, v in report.failed.items()}}
    return ('<h2>Not in this report</h2><ul class="missing">'
            + "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in items.items()) + "</ul>")


def _run_header(run_dir: Path, manifest: dict) -> str:
    facts = {"status": manifest.get("status"), "started": manifest.get("started"),
             "finished": manifest.get("finished"), "git commit": manifest.get("git_commit"),
             # the file names only: the folders are those of the machine that ran it
             "params": Path(manifest["params_file"]).name if manifest.get("params_file") else None,
             "run folder": run_dir.resolve().name}
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items() if v)
    return f"<table>{rows}</table>"


def _copy_figure(path: Path, report: Report) -> str:
    """Copy a figure beside the index (the report folder travels alone) and return its relative link."""
    target = report.out_dir / "figures" / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    return f"figures/{path.name}"


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def _run_name(run_dir: Path) -> str:
    try:
        return str(yaml.safe_load((run_dir / "params.yaml").read_text(encoding="utf-8"))["run"]["name"])
    except (yaml.YAMLError, KeyError, TypeError):
        return run_dir.name


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
