"""A real browser: JupyterLab on 127.0.0.1 driven through Debian's Chromium (Selenium with Debian's chromedriver;
nothing is downloaded). Opens notebook 03 on the session's small run, runs all cells from the Run menu,
changes a dropdown of the DAG explorer and checks that its output changed and no cell errored; the same for
notebook 07's concept explorer through a one-cell notebook (a tiny seeded model: notebook 07 itself needs a
trained run, minutes of training that the test session does not have); checks that the status bar says "Busy"
while a cell runs after a widget was shown (the ipykernel 7 subshell quirk, see pyproject.toml); saves, reopens,
saves untouched and reopens a notebook of widgets, with cglib's widget state server extension and without it
(ipywidgets issue 3270); then opens `cglib report`'s pages and checks that every image loaded.

Skips with the install command when Chromium, chromedriver or selenium is missing (`.ci/run` installs them).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from cglib.frontend import HEADLESS_ENV, ensure_lab_settings
from cglib.pipeline import ensure_kernel
from cglib.widget_state import _references, _shown_model_ids

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
INSTALL = "apt-get install -y --no-install-recommends chromium chromium-driver (as root; .ci/run does this)"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").is_file() else shutil.which("chromedriver")
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

EXPLORER_07 = """\
import torch
from IPython.display import display
from cglib.config import ModelParams
from cglib.models import build_model
from cglib.viz.explorer import build_explorer
from tests.factories import tiny_magic
magic, dataset = tiny_magic()
torch.manual_seed(0)
model = build_model(ModelParams(name="cglib-tiny-clip", text_tower="open_clip"))
ids = magic.split_ids("test")
explorer = build_explorer({"vit": model}, magic, ids, dataset.subset(ids).pixels, top_k=3)
display(explorer)
"""

# In-page state of the open notebook, read from JupyterLab's own model (exposed by --LabApp.expose_app_in_browser):
# the kernel status bar is not trusted (jupyterlab#10701 shows "Idle" while cells run).
NOTEBOOK_STATE = """
const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
if (!panel || !panel.content || !panel.content.model || !panel.sessionContext) { return null; }
const cells = [];
const model = panel.content.model;
for (let i = 0; i < model.cells.length; i++) {
  const cell = model.cells.get(i);
  if (cell.type !== 'code') { continue; }
  const outputs = cell.outputs.toJSON();
  cells.push({count: cell.executionCount,
              errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
              widget: outputs.some(o => o.data && 'application/vnd.jupyter.widget-view+json' in o.data)});
}
const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
const running = panel.content.widgets.some(w => w.model.type === 'code' && w.promptNode &&
                                                w.promptNode.textContent.includes('*'));
return {path: panel.context.path, ready: panel.sessionContext.isReady, kernel: kernel ? kernel.name : null, running: running,
        cells: cells};
"""

IMAGES_LOADED = """
const images = Array.from(document.images);
return {total: images.length, pending: images.filter(i => !i.complete).length,
        broken: images.filter(i => i.complete && i.naturalWidth === 0).map(i => i.src.slice(0, 80))};
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, timeout: float, what: str, interval: float = 0.5):
    """Poll `condition()` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """Headless Chromium through Debian's chromedriver (explicit paths: selenium-manager downloads nothing)."""
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip(f"Chromium or chromedriver not found: install them with `{INSTALL}`")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing: pip install -e '.[dev]'")
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium-manager, were it ever called, must not reach the network
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--window-size=1400,1000", "--disable-dev-shm-usage", "--disable-gpu",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", *(["--no-sandbox"] if AS_ROOT else [])):
        options.add_argument(arg)
    # DevTools' network events, read by _failed_requests: file:// requests do not appear in the page's own
    # performance.getEntriesByType('resource')
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    options.page_load_strategy = "eager"  # images and MathJax are polled below, each with its own message
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.set_script_timeout(30)
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def lab(small_run, tmp_path_factory):
    """JupyterLab on 127.0.0.1 (free port, a token) over a temp root with a copy of the small run, notebook 03
    parameterised to it and a one-cell notebook of 07's explorer, with the server config installing cglib puts
    into the environment (the widget state extension): yields (base URL, token, root)."""
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip(f"Chromium or chromedriver not found: install them with `{INSTALL}`")
    root = tmp_path_factory.mktemp("lab")
    run = root / "run"
    shutil.copytree(small_run, run)  # notebook 03 rewrites magic/: keep the session's run untouched
    nb = nbformat.read(REPO / "notebooks" / "03_magic_dag.ipynb", as_version=4)
    parameters = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    parameters.source = f"params_path = {str(run / 'params.yaml')!r}\nrun_dir = {str(run)!r}"
    nbformat.write(nb, root / "03_magic_dag.ipynb")
    tiny = nbformat.v4.new_notebook(metadata=nb.metadata)
    tiny.cells = [nbformat.v4.new_code_cell(EXPLORER_07)]
    nbformat.write(tiny, root / "07_explorer.ipynb")

    with _jupyterlab(root) as server:
        yield server


# What installing cglib puts into the environment's jupyter_server_config.d: the widget state extension
SERVER_CONFIG_PATH = REPO / "jupyter-config"
WIDGET_STATE_EXTENSION = "cglib.widget_state"


@contextlib.contextmanager
def _jupyterlab(root: Path, *arguments: str):
    """JupyterLab on 127.0.0.1 (free port, a token) over `root`, with cglib's JupyterLab defaults and its server
    config, plus `arguments`: yields (base URL, token, root)."""
    kernel = ensure_kernel("cglib")
    # `make install` writes cglib's JupyterLab defaults into the environment; here into a folder of the test's own
    app_settings = ensure_lab_settings(root / ".app-settings").parents[1]
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "JUPYTER_CONFIG_PATH": str(SERVER_CONFIG_PATH)}
    env.pop(HEADLESS_ENV, None)  # a front end is attached: the explorers must be live widgets
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", f"--MappingKernelManager.default_kernel_name={kernel}",
               f"--LabApp.user_settings_dir={root / '.settings'}", f"--LabApp.workspaces_dir={root / '.ws'}",
               f"--LabApp.app_settings_dir={app_settings}",
               "--LabApp.expose_app_in_browser=True", *(["--allow-root"] if AS_ROOT else []), *arguments]
    log = (root / "jupyterlab.log").open("w")
    server = subprocess.Popen(command, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert server.poll() is None, f"JupyterLab exited: {(root / 'jupyterlab.log').read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    try:
        _wait(up, 60, "JupyterLab to answer on /api/status")
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def lab_without_widget_state(tmp_path_factory):
    """JupyterLab as `lab`, but with cglib's widget state extension disabled: what ipywidgets does on its own."""
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip(f"Chromium or chromedriver not found: install them with `{INSTALL}`")
    root = tmp_path_factory.mktemp("lab-without-widget-state")
    with _jupyterlab(root, f"--ServerApp.jpserver_extensions={WIDGET_STATE_EXTENSION}=False") as server:
        yield server


def _open(driver, lab, notebook: str) -> dict:
    """Open a notebook in a workspace of its own (reset: only this notebook is open, so Run > Run All Cells
    applies to it) and wait for its kernel; return the notebook's state."""
    base, token, _ = lab
    driver.get(f"{base}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?reset&token={token}")
    state = _wait(lambda: (s := driver.execute_script(NOTEBOOK_STATE)) and s["path"] == notebook and s["ready"]
                  and s["kernel"] and s, 90, f"{notebook} to open with a ready kernel")
    assert state["kernel"] == "cglib", state  # the notebook's kernelspec: Python (cglib)
    return state


def _run_all(driver) -> None:
    """Run > Run All Cells, from JupyterLab's menu bar."""
    from selenium.webdriver.common.by import By

    menu = _wait(lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel")
                          if e.text == "Run"], 30, "the Run menu")
    menu[0].click()
    run_all = 'li.lm-Menu-item[data-command="runmenu:run-all"]'
    _wait(lambda: driver.find_elements(By.CSS_SELECTOR, run_all), 10, "Run > Run All Cells")[0].click()


def _open_and_run_all(driver, lab, notebook: str, timeout: float) -> dict:
    """Open a notebook in JupyterLab, run all cells from the Run menu, wait until every code cell ran; return
    the notebook's state (per code cell: execution count, errors, whether it shows a widget)."""
    _open(driver, lab, notebook)
    _run_all(driver)

    def finished() -> dict | None:
        s = driver.execute_script(NOTEBOOK_STATE)
        errors = [e for c in s["cells"] for e in c["errors"]]
        assert not errors, f"{notebook}: a cell failed: {errors}"
        return s if all(c["count"] for c in s["cells"]) and not s["running"] else None

    return _wait(finished, timeout, f"all cells of {notebook} to run")


# The explorer's rendered output without its dropdowns (their selection is a DOM property, not markup): what a
# redraw changes. The explorer is the last output area holding a <select>; nested Output widgets hold none.
EXPLORER_VIEW = """
const outputs = Array.from(document.querySelectorAll('.jp-OutputArea-output')).filter(o => o.querySelector('select'));
if (!outputs.length) { return null; }
const copy = outputs[outputs.length - 1].cloneNode(true);
copy.querySelectorAll('.widget-dropdown').forEach(d => d.remove());
return {html: copy.innerHTML, text: copy.innerText, images: copy.querySelectorAll('img').length};
"""


def _change_dropdown(driver, label: str) -> dict:
    """Pick another option of the explorer's dropdown described `label`; wait for the explorer to redraw and
    return its new view (html, text, number of images)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    before = _wait(lambda: (v := driver.execute_script(EXPLORER_VIEW)) and v["images"] and v, 60,
                   "the explorer widget to render with its images")
    boxes = [d for d in driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-dropdown")
             if d.find_element(By.TAG_NAME, "label").text.strip() == label]
    assert boxes, f"no dropdown labelled {label!r} in the explorer"
    select = Select(boxes[-1].find_element(By.TAG_NAME, "select"))
    assert len(select.options) > 1, f"the {label} dropdown has a single option"
    current = select.first_selected_option.text
    select.select_by_index(next(i for i, o in enumerate(select.options) if o.text != current))
    return _wait(lambda: (v := driver.execute_script(EXPLORER_VIEW)) and v["html"] != before["html"]
                 and v["images"] and v, 60, f"the explorer to redraw after changing {label}")


def test_notebook_03_runs_in_jupyterlab_and_its_explorer_redraws(driver, lab):
    """Notebook 03 in JupyterLab: Run All finishes without an error cell, the DAG explorer is a live widget, and
    picking another node in its dropdown redraws the node summary."""
    start = time.monotonic()
    state = _open_and_run_all(driver, lab, "03_magic_dag.ipynb", timeout=240)
    assert any(c["widget"] for c in state["cells"]), "the explorer cell shows no widget"
    after = _change_dropdown(driver, "node")
    assert "chain" in after["text"]  # the node summary of the node picked
    assert not [e for c in driver.execute_script(NOTEBOOK_STATE)["cells"] for e in c["errors"]]
    print(f"notebook 03 in JupyterLab: {time.monotonic() - start:.1f} s")


def test_concept_explorer_runs_in_jupyterlab_and_redraws(driver, lab):
    """Notebook 07's concept explorer (cglib.viz.explorer.build_explorer, a tiny seeded model) in JupyterLab:
    a live widget; picking another concept redraws the retrieval grid; no error cell."""
    state = _open_and_run_all(driver, lab, "07_explorer.ipynb", timeout=180)
    assert state["cells"][0]["widget"]
    _change_dropdown(driver, "concept")
    assert not [e for c in driver.execute_script(NOTEBOOK_STATE)["cells"] for e in c["errors"]]


STATUS_BAR = """return Array.from(document.querySelectorAll('.jp-StatusBar-TextItem'))
  .map(e => e.textContent).filter(t => t.includes('|')).map(t => t.split('|').pop().trim());"""


def test_status_bar_says_busy_while_a_cell_runs_after_a_widget(driver, lab):
    """jupyterlab#10701 as our users met it: once a widget is shown, JupyterLab's widget manager asks an
    ipykernel 7 kernel for a subshell (create_subshell_request on the control channel) and the kernel's
    busy/idle status for that request leaves the status bar at "Idle" while the next cell runs. pyproject.toml
    keeps ipykernel below 7 for this; this test fails if the quirk comes back."""
    root = lab[2]
    nb = nbformat.v4.new_notebook(metadata=nbformat.read(REPO / "notebooks" / "03_magic_dag.ipynb",
                                                         as_version=4).metadata)
    nb.cells = [nbformat.v4.new_code_cell("import time\nimport ipywidgets\ndisplay(ipywidgets.Dropdown(options=['a', 'b']))"),
                nbformat.v4.new_code_cell("time.sleep(8)")]
    nbformat.write(nb, root / "busy.ipynb")
    _open(driver, lab, "busy.ipynb")
    _run_all(driver)
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        counts = [c["count"] for c in driver.execute_script(NOTEBOOK_STATE)["cells"]]
        if counts[1]:
            break
        if counts[0]:  # the widget is shown and the sleep runs
            seen += driver.execute_script(STATUS_BAR)
        time.sleep(0.5)
    assert seen and set(seen) == {"Busy"}, f"status bar while a cell ran: {seen}"


REPORT_PAGE_STATE = """
const images = Array.from(document.images);
const mathjax = window.MathJax && MathJax.Hub && MathJax.Hub.queue;
return {images: images.length, pending: images.filter(i => !i.complete).length,
        broken: images.filter(i => i.complete && i.naturalWidth === 0).map(i => i.src.slice(0, 80)),
        math_pending: mathjax ? MathJax.Hub.queue.pending + MathJax.Hub.queue.running : 0,
        typeset: document.querySelectorAll(".MathJax_Display, .MathJax, .MathJax_CHTML").length,
        math_errors: (document.body.innerText.match(/\\[Math Processing Error\\]/g) || []).length,
        raw_math: document.body.innerText.includes("$$"),
        scroll_width: document.documentElement.scrollWidth};
"""


def _drain_network_log(driver) -> None:
    """Forget the DevTools events of earlier pages (reading the log empties it)."""
    driver.get_log("performance")


def _failed_requests(driver) -> list[str]:
    """Every request of the pages loaded since the last drain that failed (DevTools' Network.loadingFailed: a
    missing file, a refused scheme), and every file:// request naming a file that is not there."""
    urls, failed = {}, []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed":
            failed.append(f"{urls.get(params['requestId'], params['requestId'])}: {params['errorText']}")
    for url in urls.values():
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme == "file" and not Path(urllib.parse.unquote(parsed.path)).exists():
            failed.append(f"{url}: no such file")
    return sorted(set(failed))


def _load_report_page(driver, page: Path) -> dict:
    """Open a report page from disk; wait for its images to load and MathJax to finish; return its state."""
    # leave the page before first: requests still in flight there (a JupyterLab page polls its server) fail when
    # the browser leaves it, and must not be counted against this page
    driver.get("about:blank")
    _drain_network_log(driver)
    driver.get(page.as_uri())
    return _wait(lambda: (s := driver.execute_script(REPORT_PAGE_STATE)) and not s["pending"]
                 and not s["math_pending"] and s, 60, f"the images and equations of {page.name}")


def _report_page_problems(driver, page: Path) -> list[str]:
    """What a reader of a report page opened offline would meet: a "[Math Processing Error]", equations left as
    raw `$$`, a failed request (a file the page asks for that is not in the folder) or a broken image."""
    state = _load_report_page(driver, page)
    problems = [f"{page.name}: {state['math_errors']} [Math Processing Error]"] if state["math_errors"] else []
    problems += [f"{page.name}: raw $$ left"] if state["raw_math"] else []
    problems += [f"{page.name}: failed request {r}" for r in _failed_requests(driver)]
    problems += [f"{page.name}: broken image {src}" for src in state["broken"]]
    return problems


REPORT_WIDTH = 1300  # the report is read at this window width without sideways scrolling


def test_report_pages_load_offline_without_errors(driver, small_run, tmp_path):
    """`cglib report` of the small run, opened from disk at a 1,300 px window: on every page every image has
    loaded, MathJax typeset without a "[Math Processing Error]", no request failed, and no page scrolls
    sideways; the index links to each page."""
    from selenium.webdriver.common.by import By

    from cglib.cli import main as cli_main

    folder = tmp_path / "report"
    assert cli_main(["report", str(small_run), "--out", str(folder)]) == 0
    pages = sorted(folder.glob("*.html"))
    assert len(pages) >= 4
    driver.set_window_size(REPORT_WIDTH, 1000)
    try:
        problems = []
        for page in pages:
            problems += _report_page_problems(driver, page)
            state = driver.execute_script(REPORT_PAGE_STATE)
            if page.name in ("index.html", "03_magic_dag.html"):  # the run's figures; the explorer's static view
                assert state["images"] > 0, page.name
            if page.name == "index.html":
                assert state["scroll_width"] <= REPORT_WIDTH, state["scroll_width"]
                linked = {a.get_attribute("href") for a in driver.find_elements(By.TAG_NAME, "a")}
                assert {p.as_uri() for p in pages if p.name != "index.html"} <= linked
    finally:
        driver.set_window_size(1400, 1000)
    assert problems == []


GALLERY_STATE = """
const gallery = document.querySelector(".gallery");
return {width: gallery.clientWidth, scroll_width: document.documentElement.scrollWidth,
        figures: Array.from(gallery.querySelectorAll("figure")).map(f => {
            const img = f.querySelector("img"), caption = f.querySelector("figcaption");
            return {kind: f.className, shown: img.clientWidth, natural: img.naturalWidth, top: f.offsetTop,
                    caption: caption ? caption.innerText : "", caption_height: caption ? caption.offsetHeight : 0};
        })};
"""


def test_the_report_gallery_at_1300_px(driver, tmp_path):
    """The index's gallery in a 1,300 px window: a wide figure (1,260 x 500 px) is shown across the whole row,
    nearly at its own size; two ordinary ones share a row at half of it; every figure shows its caption, and the
    page does not scroll sideways."""
    from PIL import Image
    from test_report import REPO

    from cglib.report import build_report

    run = tmp_path / "run"
    (run / "figures").mkdir(parents=True)
    shutil.copy(REPO / "params" / "classroom.yaml", run / "params.yaml")
    for stem, size in (("06_gains", (1260, 500)), ("07_umap_centroids", (900, 750)), ("search_history", (1200, 900))):
        Image.new("RGB", size, "steelblue").save(run / "figures" / f"{stem}.png")
    report = build_report(run)
    driver.set_window_size(REPORT_WIDTH, 1000)
    try:
        _load_report_page(driver, report.index)
        state = driver.execute_script(GALLERY_STATE)
    finally:
        driver.set_window_size(1400, 1000)
    wide, *halves = state["figures"]
    assert [f["caption"] for f in state["figures"]] == ["06_gains", "07_umap_centroids", "search_history"]
    assert all(f["caption_height"] > 0 for f in state["figures"])
    assert wide["kind"] == "wide" and wide["natural"] == 1260 and wide["shown"] >= 0.95 * state["width"], wide
    assert [f["kind"] for f in halves] == ["half", "half"] and halves[0]["top"] == halves[1]["top"] > wide["top"]
    assert all(0.4 * state["width"] <= f["shown"] <= 0.5 * state["width"] for f in halves), halves
    assert state["scroll_width"] <= REPORT_WIDTH


def test_report_math_typesets_offline_from_the_folder(driver, tmp_path):
    """Notebook 04's page (Eqs. 1-8), opened from disk: MathJax (bundled in the report folder) typesets every
    equation with no "[Math Processing Error]" and no raw `$$` left, and every file it asked for was there."""
    from test_report import math_run

    from cglib.report import build_report

    report = build_report(math_run(tmp_path / "run"), tmp_path / "report")
    assert _report_page_problems(driver, report.pages[0]) == []
    assert driver.execute_script(REPORT_PAGE_STATE)["typeset"] >= 8


def test_the_report_check_sees_a_missing_file(driver, tmp_path):
    """The check above can fail: a report page whose MathJax font data was deleted shows the failed request."""
    from test_report import math_run

    from cglib.report import build_report

    report = build_report(math_run(tmp_path / "run"), tmp_path / "report")
    fontdata = tmp_path / "report" / "mathjax" / "jax" / "output" / "HTML-CSS" / "fonts" / "STIX-Web" / "fontdata.js"
    fontdata.unlink()
    problems = _report_page_problems(driver, report.pages[0])
    assert any("fontdata.js" in p and "failed request" in p for p in problems), problems


WIDGET_ERRORS = """
const text = document.body.innerText;
return {errors: (text.match(/Error displaying widget[^\\n]*/g) || []), loading: text.includes("Loading widget..."),
        images: document.querySelectorAll('.jp-OutputArea-output img').length,
        views: document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length};
"""
SAVED_NOTEBOOK = EXPLORER_07 + "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='bar'):\n    pass\n"


def _shut_down_kernels(lab) -> None:
    """Close every kernel session through the server's REST API (a reopened notebook gets a fresh kernel)."""
    base, token, _ = lab
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as reply:
        sessions = json.loads(reply.read())
    for session in sessions:
        request = urllib.request.Request(f"{base}/api/sessions/{session['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(request, timeout=10).close()


def test_a_saved_live_notebook_reopens_without_widget_errors(driver, lab):
    """Run All in JupyterLab (the concept explorer and a tqdm.auto bar, live widgets), save, shut the kernel
    down, reopen: JupyterLab saved the widget state (cglib's default, `frontend.ensure_lab_settings`) and draws
    every widget from it, no "Error displaying widget". The same trusted file without the state shows the error:
    the check can fail. (Someone the file is sent to opens it untrusted and sees the static views.)"""
    root = lab[2]
    nb = nbformat.v4.new_notebook(metadata=nbformat.read(REPO / "notebooks" / "03_magic_dag.ipynb",
                                                         as_version=4).metadata)
    nb.cells = [nbformat.v4.new_code_cell(SAVED_NOTEBOOK)]
    nbformat.write(nb, root / "saved.ipynb")
    state = _open_and_run_all(driver, lab, "saved.ipynb", timeout=180)
    assert state["cells"][0]["widget"]
    _save_after_run_all(driver, root / "saved.ipynb")
    _shut_down_kernels(lab)

    _open(driver, lab, "saved.ipynb")
    shown = _wait(lambda: (s := driver.execute_script(WIDGET_ERRORS)) and not s["loading"] and s["views"] and s, 60,
                  "the reopened notebook to draw its widgets")
    assert shown["errors"] == [] and shown["images"] > 0, shown

    stateless = nbformat.read(root / "saved.ipynb", as_version=4)
    del stateless.metadata["widgets"]
    # signed as JupyterLab signs what it saves: an untrusted notebook shows only the static HTML anyway
    NotebookNotary().sign(stateless)
    nbformat.write(stateless, root / "stateless.ipynb")
    _shut_down_kernels(lab)
    _open(driver, lab, "stateless.ipynb")
    broken = _wait(lambda: (s := driver.execute_script(WIDGET_ERRORS)) and s["errors"] and s, 60,
                   "the notebook saved without widget state to show the widget error")
    assert "Error displaying widget: model not found" in broken["errors"]




def _saved_models(path: Path) -> dict:
    widgets = nbformat.read(path, as_version=4).metadata.get("widgets", {})
    return widgets.get("application/vnd.jupyter.widget-state+json", {}).get("state", {})


def _save(driver) -> None:
    """File > Save of the notebook open (JupyterLab saves an unmodified notebook too); returns once it is saved."""
    driver.execute_async_script("window.jupyterapp.commands.execute('docmanager:save').then(arguments[0]);")


def _unsaved_shown_models(path: Path) -> set[str]:
    """The widget models that the saved notebook's outputs show, directly or through saved models, and that its
    saved widget state lacks (a reopen would show "model not found" for them)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    saved = _saved_models(path)
    pending, seen = list(_shown_model_ids(notebook)), set()
    while pending:
        model_id = pending.pop()
        if model_id not in seen:
            seen.add(model_id)
            pending.extend(_references(saved.get(model_id, {}).get("state", {})))
    return seen - set(saved)


def _save_after_run_all(driver, path: Path) -> None:
    """Save a notebook that has just run, again until its file holds every widget model its outputs show: a save
    that follows the kernel's last message at once can precede the front end's registering of the last models."""
    def complete() -> bool:
        _save(driver)
        return bool(_saved_models(path)) and not _unsaved_shown_models(path)

    _wait(complete, 30, f"{path.name} to be saved with the model of every widget it shows", interval=1.0)


def _reopen(driver, lab, notebook: str) -> dict:
    """Shut the kernel down and reopen `notebook`; wait for its widgets to be drawn or to show an error and
    return what the page shows (WIDGET_ERRORS)."""
    _shut_down_kernels(lab)
    _open(driver, lab, notebook)
    return _wait(lambda: (s := driver.execute_script(WIDGET_ERRORS)) and not s["loading"]
                 and (s["errors"] or s["views"]) and s, 60, f"the reopened {notebook} to draw its widgets")


def _save_reopen_save_untouched_reopen(driver, lab) -> tuple[int, dict, int, dict]:
    """ipywidgets issue 3270 as our users met it: Run All (the concept explorer and a tqdm.auto bar), save, shut
    the kernel down, reopen (the widgets are drawn from the saved state), save untouched, shut down, reopen.
    Returns the widget models in the file after the first save, what the first reopen draws, the models after
    the untouched save and what the second reopen draws."""
    root = lab[2]
    nb = nbformat.v4.new_notebook(metadata=nbformat.read(REPO / "notebooks" / "03_magic_dag.ipynb",
                                                         as_version=4).metadata)
    nb.cells = [nbformat.v4.new_code_cell(SAVED_NOTEBOOK)]
    nbformat.write(nb, root / "resaved.ipynb")
    state = _open_and_run_all(driver, lab, "resaved.ipynb", timeout=180)
    assert state["cells"][0]["widget"]
    _save_after_run_all(driver, root / "resaved.ipynb")
    first = len(_saved_models(root / "resaved.ipynb"))
    reopened = _reopen(driver, lab, "resaved.ipynb")
    _save(driver)
    resaved = len(_saved_models(root / "resaved.ipynb"))
    return first, reopened, resaved, _reopen(driver, lab, "resaved.ipynb")


def test_a_reopened_notebook_saved_again_keeps_its_widgets(driver, lab):
    """Saved, reopened, saved untouched, reopened: JupyterLab sends the second save without the models it
    restored from the file (ipywidgets issue 3270), cglib's server extension keeps those its outputs show, and
    the second reopen draws the explorer and the bar again, no "Error displaying widget: model not found"."""
    first, reopened, resaved, again = _save_reopen_save_untouched_reopen(driver, lab)
    print(f"with the extension: {first} widget models saved, {resaved} after the reopened notebook's save")
    assert first > 0 and reopened["errors"] == [] and reopened["images"] > 0, (first, reopened)
    assert resaved == first, f"{first} widget models saved, {resaved} after saving the reopened notebook"
    assert again["errors"] == [] and again["images"] > 0 and again["views"] >= reopened["views"], again
    assert "cglib: kept" in (lab[2] / "jupyterlab.log").read_text()  # the extension did it, not JupyterLab


def test_without_the_extension_a_reopened_notebook_loses_its_widgets(driver, lab_without_widget_state):
    """The check above can fail: with cglib's widget state extension disabled, the untouched save of the
    reopened notebook writes it without its widget models and the next reopen shows "model not found"."""
    lab = lab_without_widget_state
    first, reopened, resaved, again = _save_reopen_save_untouched_reopen(driver, lab)
    print(f"without the extension: {first} widget models saved, {resaved} after the reopened notebook's save")
    assert first > 0 and reopened["errors"] == [], (first, reopened)
    assert resaved < first, f"{first} widget models saved, {resaved} after saving the reopened notebook"
    assert "Error displaying widget: model not found" in again["errors"], again
    assert "cglib: notebook saves keep" not in (lab[2] / "jupyterlab.log").read_text()
