"""Your own classes by name: a params file names an objective (`train.runs[i].loss`) or a benchmark
(`eval.benchmarks`) as "package.module:ClassName", imported from wherever Python finds it."""

from __future__ import annotations

import importlib
from typing import Any


def named(path: str) -> Any:
    """The object at `path` ("package.module:name"), its module imported now: how a lower layer reaches the class
    or function a registry names without importing it at the top (where a params file's names are checked)."""
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def load_plugin(path: str, base: type, what: str, fix: str) -> type:
    """The subclass of `base` at `path`; a ValueError naming the fix otherwise (`what` names the params key's kind,
    `fix` says how to write such a class). ValueError, not TypeError: params validation (pydantic) reports
    ValueErrors as errors of the params file."""
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name.isidentifier():
        raise ValueError(f"{what} {path!r}: write it as 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r} ({exc}); install the package "
                         "that holds it or put its folder on PYTHONPATH") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"{what} {path!r}: module {module_name!r} has no {class_name!r}; check the class name")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{what} {path!r}: {class_name} is not a subclass of "  # noqa: TRY004
                         f"{base.__module__}.{base.__name__}; {fix}")
    return cls
