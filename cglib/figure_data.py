"""A figure's data saved beside it, and the figure redrawn from those files alone.

A drawing function decorated with `@replottable` takes only tables (pandas DataFrames), arrays (numpy) and
JSON-able values, and the figure it returns remembers the call (`figure.cglib_replot`). `write_figure_data` saves
that call next to the figure's images: each table as `<stem>.csv` (the first) or `<stem>.<argument>.csv`, the arrays
in `<stem>.npz`, and `<stem>.figure.json` naming the function, its JSON-able arguments and every column's type (a
CSV keeps no types). `replot(<stem>.figure.json)` reads them back and calls the same function: a reader can re-plot
any figure, or plot the CSV with another tool, without the run's models or results.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ATTRIBUTE = "cglib_replot"
SPEC_SUFFIX = ".figure.json"
FORMAT_VERSION = 1


@dataclass
class Replot:
    """The call that drew a figure: `module:qualname` of the drawing function and its bound arguments."""

    function: str
    arguments: dict[str, Any]


def replottable(draw: Callable) -> Callable:
    """Decorate a drawing function whose arguments are tables, arrays and JSON-able values: the figure it returns
    carries the call (its `cglib_replot` attribute), which `write_figure_data` saves. A None result stays None."""
    signature = inspect.signature(draw)

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        fig = draw(*args, **kwargs)
        if fig is not None:
            arguments = dict(signature.bind(*args, **kwargs).arguments)
            setattr(fig, ATTRIBUTE, Replot(f"{draw.__module__}:{draw.__qualname__}", arguments))
        return fig

    return drawn


def replot_of(fig: Any) -> Replot | None:
    """The call a figure was drawn by, or None for a figure no `@replottable` function returned."""
    return getattr(fig, ATTRIBUTE, None)


def _json_value(name: str, value: Any, function: str) -> Any:
    """`value` as JSON (tuples become lists, numpy scalars numbers); a specific error for anything else."""
    def plain(x: Any) -> Any:
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (set, frozenset)):
            return sorted(plain(v) for v in x)
        return x

    value = plain(value)
    try:
        json.dumps(value, allow_nan=True)
    except TypeError as exc:
        raise TypeError(f"argument {name!r} of {function} is a {type(value).__name__}, which a figure's data file "
                        "cannot hold: pass a DataFrame, a numpy array or JSON-able values to a @replottable "
                        "function") from exc
    return value


def _column_types(frame: pd.DataFrame) -> dict[str, str]:
    """Each column's dtype; for object columns what they hold (`infer_dtype`: string, boolean, mixed, ...)."""
    return {str(c): (f"object:{pd.api.types.infer_dtype(frame[c], skipna=True)}" if frame[c].dtype == object
                     else str(frame[c].dtype)) for c in frame.columns}


def write_figure_data(fig: Any, directory: str | Path, stem: str) -> list[Path]:
    """Save the call that drew `fig` as `<stem>.csv` (+ `<stem>.<argument>.csv`, `<stem>.npz`) and
    `<stem>.figure.json` under `directory`; return the paths written (none for a figure without a recorded call)."""
    record = replot_of(fig)
    if record is None:
        return []
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob(f"{stem}.*"):  # a previous save of this stem may have had other tables
        if old.name.endswith(SPEC_SUFFIX) or old.suffix in (".csv", ".npz"):
            old.unlink()
    tables, arrays, values, lists = {}, {}, {}, {}
    paths = []
    for name, value in record.arguments.items():
        if isinstance(value, pd.Series):
            value = value.to_frame()
        if isinstance(value, pd.DataFrame):
            path = directory / (f"{stem}.csv" if not tables else f"{stem}.{name}.csv")
            index = [str(n) for n in value.index.names if n is not None]
            frame = value.reset_index() if index else value
            frame.to_csv(path, index=False)
            tables[name] = {"file": path.name, "types": _column_types(frame), "index": index,
                            "series": isinstance(record.arguments[name], pd.Series)}
            paths.append(path)
        elif isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
            lists[name] = len(value)  # arrays of different shapes (images of different sizes): one entry each
            arrays.update({f"{name}.{k}": v for k, v in enumerate(value)})
        else:
            values[name] = _json_value(name, value, record.function)
    if arrays:
        path = directory / f"{stem}.npz"
        np.savez_compressed(path, **arrays)
        paths.append(path)
    spec = {"format": FORMAT_VERSION, "function": record.function, "arguments": values, "tables": tables,
            "arrays": {name: f"{stem}.npz" for name in arrays if "." not in name},
            "array_lists": {name: {"file": f"{stem}.npz", "length": n} for name, n in lists.items()}}
    path = directory / f"{stem}{SPEC_SUFFIX}"
    path.write_text(json.dumps(spec, indent=1, allow_nan=True) + "\n")
    return [*paths, path]


def _read_table(path: Path, types: dict[str, str]) -> pd.DataFrame:
    """A table written by `write_figure_data`, each column back to its recorded type."""
    texts = {c: object for c, t in types.items() if t.startswith("object")}
    frame = pd.read_csv(path, dtype=texts, keep_default_na=False, na_values=[""])
    for column, kind in types.items():
        if kind in ("object:boolean", "object:mixed"):  # True/False (possibly with gaps) came back as text
            frame[column] = frame[column].map(lambda v: {"True": True, "False": False}.get(v, v))
        elif kind in ("object:floating", "object:integer", "object:mixed-integer-float"):  # numbers with None
            frame[column] = pd.to_numeric(frame[column]).astype(object).where(frame[column].notna(), None)
        elif not kind.startswith("object"):
            frame[column] = frame[column].astype(kind)
    return frame


class FigureDataError(ValueError):
    """A figure's data file cannot be read, or the figure cannot be drawn from it; the message names the file."""


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """`read(path)`, with any failure raised as a FigureDataError that names the file."""
    try:
        return read(path)
    except Exception as exc:  # pandas, numpy and zip errors alike: raised again naming the file
        raise FigureDataError(f"cannot read {path} ({type(exc).__name__}: {exc})") from exc


def _load_array(path: Path, names: list[str]) -> list[np.ndarray]:
    with np.load(path, allow_pickle=False) as stored:
        return [stored[name] for name in names]


def load_call(spec_path: str | Path) -> tuple[Callable, dict[str, Any]]:
    """The drawing function and its arguments, read from `<stem>.figure.json` and the files beside it (a file
    that cannot be read is a FigureDataError naming it)."""
    spec_path = Path(spec_path)
    spec = _read(spec_path, lambda path: json.loads(path.read_text()))
    if spec.get("format") != FORMAT_VERSION:
        raise ValueError(f"{spec_path} has format {spec.get('format')!r}; this cglib reads format {FORMAT_VERSION}: "
                         "save the figure again with this version")
    module, _, qualname = spec["function"].partition(":")
    function = importlib.import_module(module)
    for part in qualname.split("."):
        function = getattr(function, part)
    arguments = dict(spec["arguments"])
    for name, table in spec["tables"].items():
        frame = _read(spec_path.parent / table["file"], functools.partial(_read_table, types=table["types"]))
        if table["index"]:
            frame = frame.set_index(table["index"])
        arguments[name] = frame.iloc[:, 0] if table.get("series") else frame
    for name, file in spec["arrays"].items():
        (arguments[name],) = _read(spec_path.parent / file, functools.partial(_load_array, names=[name]))
    for name, entry in spec.get("array_lists", {}).items():
        members = [f"{name}.{k}" for k in range(entry["length"])]
        arguments[name] = _read(spec_path.parent / entry["file"], functools.partial(_load_array, names=members))
    return function, arguments


def replot(spec_path: str | Path) -> Any:
    """Redraw a figure from its saved data alone (`<stem>.figure.json` and the files it names)."""
    function, arguments = load_call(spec_path)
    try:
        return function(**arguments)
    except Exception as exc:  # raised again naming the data it was drawn from
        raise FigureDataError(f"drawing {Path(spec_path).name} with {function.__module__}.{function.__qualname__} "
                              f"failed ({type(exc).__name__}: {exc})") from exc


def data_files(directory: str | Path, stem: str) -> list[Path]:
    """The data files of figure `stem` under `directory` (tables, arrays, then the `.figure.json`)."""
    directory = Path(directory)
    found = sorted(p for p in directory.glob(f"{stem}.*") if p.suffix in (".csv", ".npz"))
    spec = directory / f"{stem}{SPEC_SUFFIX}"
    return found + ([spec] if spec.is_file() else [])


def saved_stems(directory: str | Path) -> list[str]:
    """The stems of every figure whose data is saved under `directory`, sorted."""
    return sorted(p.name[: -len(SPEC_SUFFIX)] for p in Path(directory).glob(f"*{SPEC_SUFFIX}"))
