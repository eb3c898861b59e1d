"""Live Jupyter front end or headless run: how explorers and progress bars decide what to draw.

The headless rule (`headless()`), first match wins:

1. `CGLIB_HEADLESS` in the environment: `1`/`true`/`yes` forces headless, `0`/`false`/`no` forces live
   widgets. `cglib run` sets `CGLIB_HEADLESS=1` for its kernels unless the variable is already set.
2. Inside a Jupyter kernel, the request being executed: JupyterLab (3 and later) and Notebook 7 tag every
   execute request with the cell's id (`cellId` metadata); nbclient, which papermill and
   `jupyter nbconvert --execute` use, sends none. A request without `cellId` is headless. A front end that
   sends no `cellId` (classic Notebook 6, possibly others) therefore gets the static view: set
   `CGLIB_HEADLESS=0` (in the kernel's environment, or `%env CGLIB_HEADLESS=0` in a cell) or pass
   `interactive=True` for the widgets.
3. Outside a kernel (plain Python, pytest, terminal IPython): live. No kernel means no comm can be opened,
   so widgets built there cannot block anything, and their objects stay inspectable.

Headless, the explorers open no widget comm at all (a comm message that no front end answers is a known
cause of hung headless runs: nbclient #312, papermill #723) and render static HTML and images; progress bars
are plain text bars that are left at their final count, so an executed notebook never shows a frozen 0%.
Libraries draw widget bars too (transformers' "Loading weights", sentence-transformers' batches, through
`tqdm.auto`): `text_bars_if_headless()`, called by `cglib.run.open_run` (the first cell of every notebook),
points `tqdm.auto` and `tqdm.autonotebook` at the text bar in a headless kernel, so they open no comm either.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

HEADLESS_ENV = "CGLIB_HEADLESS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
HEADLESS_MININTERVAL_S = 2.0  # text bars in saved notebooks: one update every 2 s keeps the file small
# JupyterLab prefers a widget view to the static HTML beside it; a notebook saved without widget state reopens
# with "Error displaying widget: model not found" in place of every explorer and bar. Saving the state fixes it
# for everyone who opens the file (JupyterLab restores saved state whatever their own setting).
LAB_OVERRIDES = {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}
LAB_OVERRIDES_FILE = "cglib.json"


def headless() -> bool:
    """Whether no widget front end is attached (see the module docstring for the rule and how to force it)."""
    forced = os.environ.get(HEADLESS_ENV, "").strip().lower()
    if forced in _TRUE:
        return True
    if forced in _FALSE:
        return False
    if forced:
        raise ValueError(f"{HEADLESS_ENV}={os.environ[HEADLESS_ENV]!r}: use 1 (headless) or 0 (live widgets)")
    kernel = _kernel()
    if kernel is None:
        return False
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else getattr(kernel, "_parent_header", {})
    return "cellId" not in ((parent or {}).get("metadata") or {})


def _kernel() -> Any | None:
    """The running ipykernel, or None outside a kernel."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """A progress bar: `tqdm.auto` (widget bars) in a live session; headless, a plain text bar that is left
    showing its final count (`leave=True`) and redraws at most every 2 s."""
    if headless():
        from tqdm.std import tqdm as text_tqdm  # lazy: tqdm (~30 ms); cglib --help imports this module

        kwargs["leave"] = True
        kwargs.setdefault("mininterval", HEADLESS_MININTERVAL_S)
        return text_tqdm(*args, **kwargs)
    from tqdm.auto import tqdm as auto_tqdm  # lazy: tqdm.auto (~50 ms); cglib --help imports this module

    return auto_tqdm(*args, **kwargs)


def text_bars_if_headless() -> bool:
    """Headless: make `tqdm.auto`/`tqdm.autonotebook` text bars for every library that uses them (looked up at
    call time, as transformers does, or imported after this call) and silence Hugging Face's loading bars;
    returns whether it did."""
    if not headless():
        return False
    # Hugging Face's own bars ("Loading weights") say nothing about our work and interleave with ours
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:  # imported before this call: it read the setting already
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    import tqdm.auto  # lazy: tqdm.auto (~50 ms); cglib --help imports this module
    import tqdm.autonotebook  # lazy: tqdm (~50 ms); cglib --help imports this module
    from tqdm.std import tqdm as text_tqdm  # lazy: tqdm (~30 ms); cglib --help imports this module
    from tqdm.std import trange as text_trange  # lazy: tqdm (~30 ms); cglib --help imports this module

    for module in (tqdm.auto, tqdm.autonotebook):
        module.tqdm, module.trange = text_tqdm, text_trange
    return True


def figure_png(fig: Any, dpi: int = 90) -> bytes:
    """A matplotlib figure as PNG bytes (for static renderings that need no kernel)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def png_img_tag(png: bytes, alt: str) -> str:
    """An <img> tag with the PNG inlined, so the HTML reads without any file beside it."""
    return (f'<img alt="{html.escape(alt)}" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"/>')


def explorer_mimebundle(plain: str, static_html: str, widget: Any | None) -> dict:
    """An explorer's display: its static HTML always (executed notebooks read without a kernel), plus the widget
    view when a live front end renders widgets (others fall back to the HTML, so no stale copy sits under it)."""
    bundle = {"text/plain": plain, "text/html": static_html}
    if widget is not None:
        bundle.update({k: v for k, v in widget._repr_mimebundle_().items() if k != "text/plain"})
    return bundle


def ensure_lab_settings(settings_dir: str | Path | None = None) -> Path:
    """Make JupyterLab in this environment save widget state with notebooks (`LAB_OVERRIDES`), as a default in
    `<settings_dir>/overrides.d/cglib.json` (default: this environment's JupyterLab app settings folder; a user's
    own settings still win). `make install` calls it; returns the file written."""
    if settings_dir is None:
        from jupyterlab.commands import get_app_dir  # lazy: jupyterlab takes ~0.3 s to import

        settings_dir = Path(get_app_dir()) / "settings"
    path = Path(settings_dir) / "overrides.d" / LAB_OVERRIDES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LAB_OVERRIDES, indent=2) + "\n", encoding="utf-8")
    return path
