"""cglib.widget_state: a notebook save keeps the saved widget models that its outputs still show (ipywidgets
issue 3270: JupyterLab drops the models it restored from the file). The hook on notebook JSON built from real
ipywidgets models, then through jupyter_server's own contents manager, then the shipped server config."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import ipywidgets
import nbformat
import tomllib
from ipywidgets.embed import dependency_state
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from nbformat.sign import NotebookNotary

from cglib.widget_state import WIDGET_STATE_MIME, keep_shown_widget_models, restore_shown_models

REPO = Path(__file__).resolve().parent.parent
SERVER_CONFIG = REPO / "jupyter-config" / "jupyter_server_config.d" / "cglib.json"


def _view(widget) -> nbformat.NotebookNode:
    """A display_data output showing `widget`, as the kernel sends it."""
    data = {k: v for k, v in widget._repr_mimebundle_().items()}
    return nbformat.v4.new_output("display_data", data=data)


def _explorer():
    """A small explorer of real widgets: a box holding a dropdown and an Output widget that shows a button (a
    model reached only through the Output widget's own outputs)."""
    button = ipywidgets.Button(description="inside the output")
    output = ipywidgets.Output()
    output.outputs = (dict(_view(button)),)
    dropdown = ipywidgets.Dropdown(options=["a", "b"], description="node")
    box = ipywidgets.VBox([dropdown, output])
    state = {**dependency_state(box), **dependency_state(button)}
    return box, json.loads(json.dumps(state))  # as read from a file: tuples become lists


def _notebook(outputs: list, state: dict | None) -> dict:
    """A saved notebook's JSON: one code cell with `outputs`, and `state` as its saved widget models."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("display(explorer)", outputs=outputs, execution_count=1)]
    if state is not None:
        nb.metadata["widgets"] = {WIDGET_STATE_MIME: {"version_major": 2, "version_minor": 0, "state": state}}
    return json.loads(nbformat.writes(nb))


def _saved_models(notebook: dict) -> dict:
    return notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})


def test_a_shown_model_survives_a_save_without_state():
    """A reopened notebook saved by JupyterLab with no widget state (the models were restored, not live): every
    model its output shows comes back from disk, the box's children and layouts and the button inside the Output
    widget's outputs included, with the version fields; the notebook is valid."""
    box, state = _explorer()
    on_disk = _notebook([_view(box)], state)
    incoming = _notebook([_view(box)], None)
    assert restore_shown_models(incoming, on_disk) == len(state) == 10  # 4 widgets, 4 layouts, 2 styles
    assert _saved_models(incoming) == state
    assert incoming["metadata"]["widgets"][WIDGET_STATE_MIME]["version_major"] == 2
    nbformat.validate(nbformat.from_dict(incoming))
    # JupyterLab 4 writes an empty state rather than none: the same
    empty = _notebook([_view(box)], {})
    assert restore_shown_models(empty, on_disk) == 10 and _saved_models(empty) == state


def test_a_model_no_output_shows_is_not_carried_over():
    """The cell was re-run without its widget (or its output cleared): the old models stay out of the file."""
    box, state = _explorer()
    other = ipywidgets.Dropdown(options=["x"])
    on_disk = _notebook([_view(box)], {**state, **dependency_state(other)})
    incoming = _notebook([nbformat.v4.new_output("stream", text="no widget now\n")], None)
    assert restore_shown_models(incoming, on_disk) == 0
    assert "widgets" not in incoming["metadata"]
    # only the shown explorer's models come back, not the dropdown shown nowhere
    shown = _notebook([_view(box)], None)
    restore_shown_models(shown, on_disk)
    assert set(_saved_models(shown)) == set(state)


def test_a_kernel_live_save_keeps_its_fresh_state():
    """A save with a live kernel: the front end's models win over the file's (the dropdown's new value stays),
    a model it lacks that an output shows is still added."""
    box, state = _explorer()
    dropdown = box.children[0]
    on_disk = _notebook([_view(box)], state)
    fresh = copy.deepcopy(state)
    fresh[dropdown.model_id]["state"]["index"] = 1
    button_id = next(i for i, m in state.items() if m["model_name"] == "ButtonModel")
    del fresh[button_id]
    incoming = _notebook([_view(box)], fresh)
    assert restore_shown_models(incoming, on_disk) == 1
    saved = _saved_models(incoming)
    assert saved[dropdown.model_id]["state"]["index"] == 1
    assert saved[button_id] == state[button_id]
    # the whole state fresh: nothing to restore, nothing changed
    complete = _notebook([_view(box)], copy.deepcopy(fresh) | {button_id: state[button_id]})
    before = copy.deepcopy(complete)
    assert restore_shown_models(complete, on_disk) == 0 and complete == before


def test_the_hook_runs_in_jupyter_servers_contents_manager(tmp_path):
    """Through the contents manager JupyterLab's server uses (AsyncLargeFileManager): saved with state, then
    saved again without it (what JupyterLab sends after a reopen), the file still holds every shown model and
    its signature (trust) covers them; a new file (nothing on disk yet) saves as it came."""
    manager = AsyncLargeFileManager(root_dir=str(tmp_path))
    (tmp_path / "data").mkdir()
    manager.notary = NotebookNotary(data_dir=str(tmp_path / "data"), parent=manager)
    manager.register_pre_save_hook(keep_shown_widget_models)
    box, state = _explorer()

    async def save(notebook: dict, path: str) -> None:
        for cell in notebook["cells"]:
            cell["metadata"]["trusted"] = True  # as JupyterLab sends the cells it ran: the server signs the file
        await manager.save({"type": "notebook", "format": "json", "content": notebook}, path)

    asyncio.run(save(_notebook([_view(box)], state), "explorer.ipynb"))
    asyncio.run(save(_notebook([_view(box)], None), "explorer.ipynb"))
    written = nbformat.read(tmp_path / "explorer.ipynb", as_version=4)
    assert _saved_models(written) == state
    assert manager.notary.check_signature(written)
    asyncio.run(save(_notebook([_view(box)], None), "new.ipynb"))
    assert "widgets" not in nbformat.read(tmp_path / "new.ipynb", as_version=4).metadata


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyter_server_with_the_shipped_config_keeps_the_models(tmp_path):
    """A real `jupyter server` reading the config that installing cglib puts into the environment (pyproject's
    data-files; the Makefile copies it, as editable installs skip data-files), with this environment's other
    extensions (Jupytext's replaces the contents manager): a notebook PUT with its widget state, then PUT again
    without it as JupyterLab sends it after a reopen, keeps every shown model on disk."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    data_files = pyproject["tool"]["setuptools"]["data-files"]
    assert data_files["etc/jupyter/jupyter_server_config.d"] == [str(SERVER_CONFIG.relative_to(REPO))]
    assert f"$(VENV)/etc/jupyter/jupyter_server_config.d/{SERVER_CONFIG.name}" in (REPO / "Makefile").read_text()

    root = tmp_path / "root"
    root.mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(SERVER_CONFIG.parents[1]),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "server", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", *(["--allow-root"] if os.geteuid() == 0 else [])],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            box, state = _explorer()
            base = f"http://127.0.0.1:{port}/api"
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, log_path.read_text()[-3000:]
                try:
                    urllib.request.urlopen(f"{base}/status?token={token}", timeout=2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "jupyter server did not answer in 60 s"
                    time.sleep(0.5)
            for notebook in (_notebook([_view(box)], state), _notebook([_view(box)], None)):
                body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
                request = urllib.request.Request(f"{base}/contents/explorer.ipynb?token={token}", data=body,
                                                 method="PUT", headers={"Content-Type": "application/json"})
                urllib.request.urlopen(request, timeout=30).close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    assert _saved_models(json.loads((root / "explorer.ipynb").read_text())) == state
    assert "cglib: notebook saves keep the saved widget models" in log_path.read_text()
