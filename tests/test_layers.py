"""The layer contract of cglib (pyproject.toml, [tool.importlinter]): a module imports only from layers below it."""

from __future__ import annotations

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
    """import-linter keeps the contract: cli > report > pipeline > viz > search > evaluate > train > magic > llm >
    data > models > ... > config, with only the params validation's plug-in loading as named exceptions."""
    done = lint_imports()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in done.stdout


def test_the_contract_catches_an_upward_import(tmp_path):
    """The contract is not vacuous: a config that also forbids config -> train's objectives (the one exception)
    is broken by the params validation's lazy import."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    strict = text.replace('    "cglib.config -> cglib.train.objectives",\n', "")
    assert strict != text
    config = tmp_path / "strict.toml"
    config.write_text(strict, encoding="utf-8")
    done = lint_imports("--config", str(config))
    assert done.returncode != 0 and "cglib.config is not allowed to import cglib.train" in done.stdout
