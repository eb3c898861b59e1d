"""`cglib book`: the session's classroom run (all ten notebooks) built into a book with the network cut off, then read as a reader would:
the front page links to a notebook page, a notebook page's glossary link lands on its entry, the search index is
there, a solution is folded and no page asks the network for anything. Also the guide's own rules: every page in
its navigation, every relative link of the README and the guide resolving, the glossary holding the terms the
notebooks use, and the README kept a front door."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from test_browser import driver  # noqa: F401 - the same headless Chromium as the report's browser test

from cglib.book import (
    GUIDE_DIR,
    build_book,
    fold_markdown_solution,
    glossary_terms,
    guide_order,
    link_glossary_terms,
)
from cglib.course.student import BEGIN_SOLUTION, END_SOLUTION

REPO = Path(__file__).resolve().parent.parent
# The terms the notebooks' readers asked for most; each must have a glossary entry
REQUIRED_TERMS = ["Holm", "hierarchical bootstrap", "TPE", "fANOVA", "RE", "exposure", "as published", "MAGIC",
                  "hard negative", "generalized caption", "l1", "tau", "tau'", "alpha", "centroid", "forced choice",
                  "mAP", "CI", "zero-shot", "Table 3"]


def _page(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _follow(page: Path, href: str) -> tuple[Path, str]:
    """The file and fragment a relative link of `page` opens."""
    parsed = urllib.parse.urlparse(href)
    assert not parsed.scheme and not parsed.netloc, f"{page.name} links off the book: {href}"
    return (page.parent / urllib.parse.unquote(parsed.path)).resolve(), parsed.fragment


@pytest.fixture(scope="module")
def book(classroom_run, tmp_path_factory, request):
    """The classroom run.s book (the ten notebooks, solutions folded), built while every connection off this machine raises (and every proxy points at a
    closed port), so a build that fetched anything would fail."""
    real_connect = socket.socket.connect

    def loopback_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost") and sock.family != socket.AF_UNIX:
            raise OSError(f"the book must build offline, but it connected to {address}")
        return real_connect(sock, address)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", loopback_only)
        for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            patch.setenv(proxy, "http://127.0.0.1:9")
        built = build_book(classroom_run, tmp_path_factory.mktemp("book") / "site")
    print(f"\nbook of the classroom run: {len(built.notebooks)} notebook pages in {built.seconds:.1f} s")
    return built


def test_the_front_page_leads_to_every_executed_notebook(book, classroom_run):
    executed = sorted(p.stem for p in (classroom_run / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert executed and [Path(n).stem for n in book.notebooks] == executed
    links = {_follow(book.index, a["href"])[0] for a in _page(book.index).find_all("a", href=True)
             if not a["href"].startswith("#")}
    for stem in executed:
        assert (book.out_dir / "notebooks" / f"{stem}.html").resolve() in links, stem
    target, _ = _follow(book.index, next(a["href"] for a in _page(book.index).find_all("a", href=True)
                                         if "03_magic_dag" in a["href"]))
    assert target.is_file() and "MAGIC" in _page(target).title.get_text()


def test_a_glossary_link_lands_on_its_entry(book):
    page = book.out_dir / "notebooks" / "03_magic_dag.html"
    links = [a["href"] for a in _page(page).find_all("a", href=True) if "glossary.html#term-" in a["href"]]
    assert links, "no glossary link on notebook 03's page"
    glossary, fragment = _follow(page, links[0])
    entry = _page(glossary).find(id=fragment)
    assert entry is not None and entry.name == "dt", f"{links[0]} has no entry in the glossary"
    assert entry.find_next_sibling("dd").get_text(strip=True), "the entry has no definition"


def test_the_guide_pages_are_in_the_book_and_link_to_each_other(book):
    fidelity = book.out_dir / "book" / "fidelity.html"
    assert fidelity.is_file() and (book.out_dir / "README.html").is_file()
    contents = book.out_dir / "book" / "index.html"
    target, _ = _follow(contents, next(a["href"] for a in _page(contents).find_all("a", href=True)
                                       if a["href"].startswith("stages/05_training")))
    assert target == (book.out_dir / "book" / "stages" / "05_training.html").resolve()


def test_search_works_from_the_folder(book):
    index = (book.out_dir / "searchindex.js").read_text(encoding="utf-8")
    assert index.startswith("Search.setIndex(")
    assert '"book/glossary"' in index and '"notebooks/03_magic_dag"' in index  # the pages it searches
    assert '"holm"' in index  # a glossary term, as the indexer stores words
    assert (book.out_dir / "search.html").is_file()


def test_a_solution_is_folded(book, classroom_run):
    """Notebook 03's first solution line appears on its page only inside closed <details> blocks."""
    notebook = nbformat.read(classroom_run / "notebooks" / "03_magic_dag.ipynb", as_version=4)
    region = next(c.source for c in notebook.cells if c.cell_type == "code" and BEGIN_SOLUTION in c.source)
    first = region.split(BEGIN_SOLUTION, 1)[1].split(END_SOLUTION, 1)[0].strip().splitlines()[0].strip()
    page = _page(book.out_dir / "notebooks" / "03_magic_dag.html")
    folded = page.find_all("details")
    assert folded and all(not d.has_attr("open") for d in folded)
    assert any(first in d.get_text() for d in folded), first
    for block in page.find_all("details"):
        block.decompose()
    assert first not in page.get_text(), "the solution is also shown unfolded"


def test_no_page_loads_anything_from_the_network(book):
    pages = list(book.out_dir.rglob("*.html"))
    assert len(pages) > 20
    for path in pages:
        for tag in _page(path).find_all(["script", "link", "img", "iframe"]):
            source = tag.get("src") or tag.get("href") or ""
            assert not re.match(r"^(https?:)?//", source), f"{path.name} loads {source}"


@pytest.mark.slow
def test_the_book_reads_offline_in_a_browser(book, driver):  # noqa: F811 - the fixture imported above
    """Chromium opens the pages from disk: no request fails, MathJax typesets without errors, a solution opens
    with a click, and the search page finds a glossary term from the folder alone."""
    from selenium.webdriver.common.by import By
    from test_browser import REPORT_PAGE_STATE, _drain_network_log, _report_page_problems, _wait

    # A fresh browser's first tab loads Chromium's new-tab page, whose failed lookup would be counted against the
    # first page checked: settle on a blank page and forget its events first
    driver.get("about:blank")
    time.sleep(2)
    _drain_network_log(driver)
    pages = [book.index, book.out_dir / "notebooks" / "03_magic_dag.html", book.out_dir / "book" / "glossary.html"]
    problems = []
    for page in pages:
        problems += _report_page_problems(driver, page)
        if page.parent.name == "notebooks":  # notebook 03's equations, typeset by the bundled MathJax
            assert driver.execute_script(REPORT_PAGE_STATE)["typeset"] > 0
    assert problems == []
    driver.get(pages[1].as_uri())
    summary = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "details summary"), 30, "a folded solution")[0]
    folded = summary.find_element(By.XPATH, "..")
    assert folded.get_attribute("open") is None
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", summary)
    summary.click()
    assert folded.get_attribute("open") is not None
    driver.get((book.out_dir / "search.html").as_uri() + "?q=Holm")
    hits = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#search-results li a"), 30, "search results")
    assert any("glossary" in hit.get_attribute("href") for hit in hits)


# ----------------------------------------------------------------------------------------------- the guide
def test_every_guide_page_is_in_the_navigation():
    order = guide_order(GUIDE_DIR)
    pages = sorted(p.relative_to(GUIDE_DIR).as_posix() for p in GUIDE_DIR.rglob("*.md"))
    assert sorted(order) == pages and order[0] == "index.md"


def test_an_unlisted_guide_page_is_an_error(tmp_path):
    (tmp_path / "index.md").write_text("- [A](a.md)\n")
    (tmp_path / "a.md").write_text("# A\n")
    (tmp_path / "b.md").write_text("# B\n")
    with pytest.raises(ValueError, match=r"does not link b\.md: add a line"):
        guide_order(tmp_path)


def test_relative_links_of_the_readme_and_the_guide_resolve():
    pages = [REPO / "README.md", *GUIDE_DIR.rglob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for section in ("## Profiles", "## How to read the results", "## The book", "## Teaching with this collection"):
        assert section in readme
    assert "cglib student-version" in readme and "params/classroom.yaml" in readme and "cglib book" in readme


def test_the_glossary_defines_the_notebooks_terms():
    terms = glossary_terms((GUIDE_DIR / "glossary.md").read_text(encoding="utf-8"))
    assert not [t for t in REQUIRED_TERMS if t not in terms]
    assert len(terms) == len(set(terms))


# ----------------------------------------------------------------------------------------------- the pieces
def test_glossary_links_go_to_first_uses_outside_code_math_links_and_headings():
    unlinked = ["hard negative", "MAGIC", "tau", "tau'"]
    text = ("## MAGIC's hard negatives\n"
            "`MAGIC` and $\\tau$ and [MAGIC](x.md) stay. The MAGIC DAG keeps hard negatives; MAGIC again.\n"
            "tau' is not tau.")
    linked = link_glossary_terms(text, unlinked)
    assert linked.splitlines()[0] == "## MAGIC's hard negatives"
    assert "`MAGIC` and $\\tau$ and [MAGIC](x.md) stay. The {term}`MAGIC <MAGIC>` DAG keeps " \
           "{term}`hard negatives <hard negative>`; MAGIC again." in linked
    assert linked.endswith("{term}`tau' <tau'>` is not {term}`tau <tau>`.")
    assert unlinked == []


def test_a_markdown_solution_becomes_a_closed_details_block():
    folded = fold_markdown_solution(f"**Your answer.**\n\n{BEGIN_SOLUTION}\nIt is $x$.\n{END_SOLUTION}")
    assert folded == ('**Your answer.**\n\n<details class="cglib-solution">\n<summary>Show the solution</summary>'
                      "\n\nIt is $x$.\n\n</details>")


def test_a_folder_that_is_not_a_run_is_refused_by_name(tmp_path, capsys):
    from cglib.cli import main as cli_main

    assert cli_main(["book", str(tmp_path)]) == 2
    assert "is not a run directory (no params.yaml); pass outputs/<run>" in capsys.readouterr().err
