"""What code produced a result: a digest of the library's own source, and of a user's class named in a params file.

A trained run is reused when its spec is unchanged (`cglib.train.inputs.run_spec`). A spec that names a class only
by its path (`loss: my_objectives:Triplet`, `__main__:YourObjective`) would let an edited class reuse the weights of
the old one, so the spec carries the digest of that class's code:

- a class in a module file: the bytes of that file (and of the file the class is defined in, when it differs);
- a class defined interactively (`__main__` in a notebook or IPython): the source of every cell that defines one of
  its functions, read through the cells' line cache (`linecache`, which IPython fills), plus the source of the
  functions and classes of `__main__` those functions name, and the value of the plain constants they name, so a
  helper or a MARGIN set in another cell counts too; its plain class attributes enter by value;
- code whose source cannot be read (a class whose functions come from nowhere readable, a compiled module) gets
  no digest: `CodeDigest.digest` is None and `why` says what was missing. Such a run is never reused.

The library itself is identified by `library_digest()`: the sha1 over every `cglib/**/*.py` file (path and bytes),
which provenance records beside the git commit, so a result made by other library code says so even where the
package is installed without git.
"""

from __future__ import annotations

import hashlib
import inspect
import linecache
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
PLAIN = (int, float, str, bool, bytes, type(None))


@dataclass(frozen=True)
class CodeDigest:
    """The identity of one named class's code: `digest` (sha1 hex), or None with `why` it cannot be read."""

    path: str  # "package.module:ClassName" as the params file names it
    digest: str | None
    how: str  # "module file" | "notebook cells" | "unreadable"
    why: str = ""

    def spec_value(self) -> dict[str, str | None]:
        """What enters a run's spec (and so its hash)."""
        return {"path": self.path, "sha1": self.digest}

    def unreadable_note(self, run: str) -> str:
        """The line that says why run `run` is never reused, and how to make it reusable."""
        name = self.path.partition(":")[2]
        return (f"run {run!r}: the source of {self.path} cannot be read ({self.why}), so its trained weights are "
                f"never reused and it trains again on every call; to make it reusable, move {name} into a file "
                f"(e.g. my_objectives.py beside the notebook) and name it 'my_objectives:{name}'")


@lru_cache(maxsize=1)
def library_digest() -> str:
    """sha1 over the library's Python source (every cglib/**/*.py file's path relative to the package and bytes)."""
    digest = hashlib.sha1()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def class_digest(path: str, cls: type) -> CodeDigest:
    """The identity of `cls`'s code (named `path` in the params); see the module docstring."""
    module = sys.modules.get(cls.__module__)
    files = _source_files(module, cls)
    if files is not None:
        digest = hashlib.sha1()
        for file in files:
            digest.update(file.read_bytes() + b"\0")
        return CodeDigest(path, digest.hexdigest(), "module file")
    cells, why = _interactive_source(cls)
    if cells is None:
        return CodeDigest(path, None, "unreadable", why)
    return CodeDigest(path, hashlib.sha1(cells.encode()).hexdigest(), "notebook cells")


def _source_files(module: types.ModuleType | None, cls: type) -> list[Path] | None:
    """The module's source file and the class's own (when they differ), or None for an interactive module."""
    module_file = getattr(module, "__file__", None)
    if not module_file or not module_file.endswith(".py") or not Path(module_file).is_file():
        return None
    files = [Path(module_file).resolve()]
    try:
        own = Path(inspect.getsourcefile(cls) or module_file).resolve()
    except TypeError:
        own = files[0]
    return files if own == files[0] or not own.is_file() else [*files, own]


def _interactive_source(cls: type) -> tuple[str | None, str]:
    """The source text that defines an interactively defined class (see the module docstring), or None and why."""
    namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    parts: list[str] = []
    seen_cells: set[str] = set()
    seen_objects: set[int] = set()

    def add_class(klass: type) -> None:
        if id(klass) in seen_objects:
            return
        seen_objects.add(id(klass))
        parts.append(f"class {klass.__qualname__}({', '.join(b.__module__ + '.' + b.__qualname__ for b in klass.__bases__)})")
        for name, value in sorted(vars(klass).items()):
            function = _function_of(value)
            if function is not None:
                add_function(function)
            elif isinstance(value, PLAIN) and not name.startswith("__"):
                parts.append(f"{name} = {value!r}")
        for base in klass.__bases__:
            if base.__module__ == klass.__module__:
                add_class(base)

    def add_function(function: types.FunctionType) -> None:
        if id(function) in seen_objects:
            return
        seen_objects.add(id(function))
        code = function.__code__
        if code.co_filename not in seen_cells:
            lines = linecache.getlines(code.co_filename)
            if not lines:
                raise LookupError(f"no source for {function.__qualname__} in {code.co_filename}")
            seen_cells.add(code.co_filename)
            parts.append("".join(lines))
        for name in sorted(_names(code)):
            value = namespace.get(name)
            if isinstance(value, types.FunctionType) and value.__module__ == cls.__module__:
                add_function(value)
            elif isinstance(value, type) and value.__module__ == cls.__module__:
                add_class(value)
            elif isinstance(value, PLAIN):
                parts.append(f"{name} = {value!r}")

    try:
        add_class(cls)
    except LookupError as exc:
        return None, str(exc)
    if not seen_cells:
        return None, f"{cls.__qualname__} defines no function whose source is recorded"
    return "\n".join(parts), ""


def _function_of(value: object) -> types.FunctionType | None:
    """The plain function behind a class attribute (method, static or class method, property getter), or None."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    return value if isinstance(value, types.FunctionType) else None


def _names(code: types.CodeType) -> set[str]:
    """Global names a code object and its nested code objects (comprehensions, inner functions) refer to."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names
