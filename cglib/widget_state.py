"""A Jupyter server extension that keeps a notebook's saved widget state through saves that would drop it.

JupyterLab saves widget models with a notebook (cglib turns this on: `frontend.LAB_OVERRIDES`), and a reopened
notebook draws its explorers and progress bars from them. But ipywidgets' JupyterLab manager serializes only
the models connected to a live kernel, so once the notebook is reopened (its models restored from the file, no
kernel behind them) any save writes the file without them: an untouched Ctrl-S, a save after editing a cell,
the autosave. The next reopen shows "Error displaying widget: model not found" in place of every widget
(ipywidgets issue 3270; the fix, ipywidgets pull request 4015, serializes restored models too).

This module is a Jupyter server extension whose pre-save hook (`keep_shown_widget_models`) runs before a notebook
is written: every widget model that an output of the incoming notebook still shows (an
`application/vnd.jupyter.widget-view+json` output's `model_id`, and the models those reach: a box's children, a
widget's layout and style, an Output widget's own outputs) but that the incoming state lacks is copied from the
version on disk. The front end's state wins wherever it has a model (a live kernel's fresh state); a model no
output reaches any more is not carried over, so the saved state does not grow with stale models.

`jupyter-config/jupyter_server_config.d/cglib.json` enables it; installing the package copies that file into the
environment's `etc/jupyter/jupyter_server_config.d/`, so `jupyter lab` started from the environment loads it
(`jupyter server extension list` shows it). The hook is registered when the extension loads and again when the
server starts if the contents manager was replaced in between (Jupytext's extension replaces it after the others
have loaded).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
MODEL_REFERENCE_PREFIX = "IPY_MODEL_"  # how a widget's state names another model (children, layout, style)
HOOKED_MARK = "_cglib_keeps_widget_state"  # set on a contents manager that runs the hook already


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "cglib.widget_state"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    _hook_contents_manager(serverapp)


async def _start_jupyter_server_extension(serverapp: Any) -> None:
    _hook_contents_manager(serverapp)  # again: another extension may have replaced the contents manager


def _hook_contents_manager(serverapp: Any) -> None:
    manager = serverapp.contents_manager
    if not getattr(manager, HOOKED_MARK, False):  # an attribute: Jupytext's contents manager is unhashable
        manager.register_pre_save_hook(keep_shown_widget_models)
        setattr(manager, HOOKED_MARK, True)
        serverapp.log.info("cglib: notebook saves keep the saved widget models their outputs still show (%s)",
                           type(manager).__name__)


def keep_shown_widget_models(model: dict, path: str, contents_manager: Any, **kwargs: Any) -> None:
    """A pre-save hook of jupyter_server's contents manager (`register_pre_save_hook`): add to the notebook being
    saved the widget models its outputs show that it lacks, from the file on disk. Changes `model` in place."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    if not any(_shown_model_ids(model["content"])):  # most saves: no widget shown, no file to read
        return
    os_path = _os_path(contents_manager, path)
    # a Jupytext text notebook (.py, .md) keeps no widget state on disk
    if os_path is None or not os_path.endswith(".ipynb") or not os.path.isfile(os_path):
        return
    try:
        with open(os_path, encoding="utf-8") as file:
            on_disk = json.load(file)
    except (ValueError, OSError) as error:  # not notebook JSON (yet): nothing saved to keep
        contents_manager.log.warning("cglib: kept no widget models of %s, unreadable on disk: %s", path, error)
        return
    restored = restore_shown_models(model["content"], on_disk)
    if restored:
        contents_manager.log.info("cglib: kept %d saved widget models that %s still shows", restored, path)


def _os_path(contents_manager: Any, path: str) -> str | None:
    """Where a file-backed contents manager keeps `path`; None for other managers (their files are not ours to
    read)."""
    get_os_path = getattr(contents_manager, "_get_os_path", None)  # jupyter_server's FileManagerMixin
    return get_os_path(path) if get_os_path is not None else None


def restore_shown_models(incoming: dict, on_disk: dict) -> int:
    """Copy into the `incoming` notebook (a notebook's JSON, changed in place) the widget models that its outputs
    show, directly or through other models, that its saved state lacks and `on_disk` (the notebook's previous
    version) has. Returns how many were copied."""
    incoming_widgets = _widget_state(incoming)
    disk_widgets = _widget_state(on_disk)
    incoming_models = incoming_widgets.get("state", {})
    disk_models = disk_widgets.get("state", {})
    if not disk_models:
        return 0
    missing = {}
    pending = list(_shown_model_ids(incoming))
    seen = set()
    while pending:
        model_id = pending.pop()
        if model_id in seen:
            continue
        seen.add(model_id)
        saved = incoming_models[model_id] if model_id in incoming_models else disk_models.get(model_id)
        if saved is None:
            continue
        if model_id not in incoming_models:
            missing[model_id] = saved
        pending.extend(_references(saved.get("state", {})))
    if not missing:
        return 0
    widgets = incoming.setdefault("metadata", {}).setdefault("widgets", {})
    state = widgets.setdefault(WIDGET_STATE_MIME, {
        key: value for key, value in disk_widgets.items() if key != "state"})  # version_major, version_minor
    state.setdefault("state", {}).update(missing)
    return len(missing)


def _shown_model_ids(notebook: dict) -> Iterator[str]:
    """The widget models that a notebook's outputs show (not those they reach)."""
    for cell in notebook.get("cells", []):
        yield from _references(cell.get("outputs", []))


def _widget_state(notebook: dict) -> dict:
    """A notebook's saved widget state: {"state": {model_id: model}, "version_major": ..., ...}, or {}."""
    return ((notebook.get("metadata") or {}).get("widgets") or {}).get(WIDGET_STATE_MIME) or {}


def _references(value: Any) -> Iterator[str]:
    """Every widget model id that a piece of notebook JSON names: a widget view's `model_id` (in an output, or in
    an Output widget's own outputs) and an `IPY_MODEL_<id>` reference in a widget's state."""
    if isinstance(value, str):
        if value.startswith(MODEL_REFERENCE_PREFIX):
            yield value[len(MODEL_REFERENCE_PREFIX):]
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)
    elif isinstance(value, dict):
        view = value.get(WIDGET_VIEW_MIME)
        if isinstance(view, dict) and isinstance(view.get("model_id"), str):
            yield view["model_id"]
        for key, item in value.items():
            if key != WIDGET_VIEW_MIME:
                yield from _references(item)
