"""Bad inputs give a clear message naming the file and the fix (issue 14): the catalogue of tests/bad_inputs.py,
plus the details each fix promises (duplicate keys at any depth, YAML's merge keys still fine, a corrupt cache
moved aside with nothing else lost)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from cglib.cli import main as cli_main
from cglib.config import ParamsError, load_params
from cglib.llm.base import Outcome
from cglib.llm.cache import CacheRebuiltWarning, ResultCache

sys.path.insert(0, str(Path(__file__).parent))
from bad_inputs import CASES, markdown, run_case


@pytest.mark.parametrize("case", CASES, ids=[f"{c.file}: {c.problem}" for c in CASES])
def test_bad_input_gives_its_exit_code_and_message(case, tmp_path: Path, monkeypatch, capsys) -> None:
    """Each broken file: the documented exit code and a message naming the file and the fix, no traceback."""
    code, message = run_case(case, tmp_path)
    assert code == case.exit_code, message
    assert case.message in message
    assert "Traceback" not in message and "UnicodeDecodeError" not in message
    if case.reader in ("params", "magic", "chains", "export"):
        assert case.make(tmp_path).name in message  # the file is named
    if case.reader == "params":  # `cglib run` stops the same way, before creating anything
        monkeypatch.chdir(tmp_path)
        assert cli_main(["run", str(case.make(tmp_path))]) == case.exit_code
        assert case.message in capsys.readouterr().err and not (tmp_path / "outputs").exists()


def test_catalogue_renders_as_markdown() -> None:
    """`python tests/bad_inputs.py` prints one table row per case (book/troubleshooting.md's table)."""
    table = markdown().splitlines()
    assert len(table) == 2 + len(CASES) and table[0].startswith("| file | what is wrong | exit code |")
    assert all(row.count("|") >= 5 for row in table)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, key, lines", [
    ("run:\n  name: a\ntrain:\n  epochs: 1\nrun:\n  name: b\n", "run", (1, 5)),
    ("train:\n  lr: 1e-5\n  epochs: 2\n  lr: 2e-5\n", "train.lr", (2, 4)),
    ("train:\n  runs:\n    - name: a\n      loss: clip\n      loss: pairwise\n", "train.runs[0].loss", (4, 5)),
    ("magic:\n  l_max: 3\n'magic':\n  l_max: 4\n", "magic", (1, 3)),  # quoting does not make a new key
])
def test_duplicate_keys_rejected_at_any_depth(tmp_path: Path, text: str, key: str, lines: tuple[int, int]) -> None:
    """A repeated key names its dotted path and both lines; PyYAML alone keeps the last silently."""
    with pytest.raises(ParamsError) as err:
        load_params(write(tmp_path, text))
    assert f"duplicate key '{key}' at lines {lines[0]} and {lines[1]}" in str(err.value)
    assert str(tmp_path / "p.yaml") in str(err.value)


def test_strict_loader_keeps_yaml_11_numbers_and_merge_keys(tmp_path: Path) -> None:
    """Everything but duplicates reads as before: `1e-5` (a string in YAML 1.1) still becomes a float, and a
    merge key (`<<: *base`) may be overridden without counting as a duplicate."""
    text = "base: &base\n  epochs: 2\n  lr: 1e-5\n"
    with pytest.raises(ParamsError, match="base: unknown key"):  # the anchor trick itself is not a params key
        load_params(write(tmp_path, text + "train:\n  <<: *base\n  epochs: 3\n"))
    from cglib.strict_yaml import load_yaml

    assert load_yaml(text + "train:\n  <<: *base\n  epochs: 3\n")["train"] == {"epochs": 3, "lr": "1e-5"}
    params = load_params(write(tmp_path, "train:\n  lr: 1e-5\n  pretrain_lr: 2E-6\n"))
    assert params.train.lr == 1e-5 and params.train.pretrain_lr == 2e-6


def test_corrupt_cache_moved_aside_and_nothing_else_lost(tmp_path: Path) -> None:
    """A corrupt cache.sqlite is renamed beside itself, a new cache works at once, the warning names both
    paths, and the other files of the run folder are untouched."""
    folder = tmp_path / "abstraction"
    folder.mkdir()
    (folder / "chains.jsonl").write_text('{"image_id": "a"}\n')
    (folder / "cache.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.warns(CacheRebuiltWarning) as caught:
        cache = ResultCache(folder / "cache.sqlite")
    cache.put("k", "concept", "openai", "m", "v1", Outcome(ok=True, value="dog"))
    assert cache.get_many(["k"])["k"].value == "dog"
    cache.close()
    moved = sorted(p.name for p in folder.iterdir() if ".corrupt-" in p.name)
    assert len(moved) == 1
    assert (folder / moved[0]).read_bytes() == b"this is not a database" * 100
    message = str(caught[0].message)
    assert str(folder / "cache.sqlite") in message and str(folder / moved[0]) in message
    assert (folder / "chains.jsonl").read_text() == '{"image_id": "a"}\n'
    with warnings.catch_warnings():  # the rebuilt cache opens cleanly next time
        warnings.simplefilter("error")
        assert ResultCache(folder / "cache.sqlite").count() == 1


def test_locked_cache_is_not_mistaken_for_corruption(tmp_path: Path) -> None:
    """A healthy cache opened twice stays where it is (only unreadable files are moved aside)."""
    path = tmp_path / "cache.sqlite"
    with ResultCache(path) as first:
        first.put("k", "concept", "openai", "m", "v1", Outcome(ok=True, value="dog"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with ResultCache(path) as second:
                assert second.count() == 1
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """A params file saved as UTF-8 with a byte-order mark (Windows Notepad) reads like any other."""
    path = tmp_path / "p.yaml"
    path.write_bytes(b"\xef\xbb\xbfrun:\n  name: bom\n")
    assert load_params(path).run.name == "bom"


def test_runner_failure_line_redacts_keys():
    """A key inside any notebook exception (not only the LLM layer's) never reaches the terminal or run.json."""
    from papermill.exceptions import PapermillExecutionError

    from cglib.pipeline import _failure_summary

    exc = PapermillExecutionError(cell_index=3, exec_count=4, source="client.call()", ename="HTTPError",
                                  evalue="401 for Authorization: Bearer sk-test-0123456789abcdefghij", traceback=[])
    line = _failure_summary(exc)
    assert "sk-test-0123456789abcdefghij" not in line
    assert line.startswith("cell In [4] [client.call()]: HTTPError: 401") and "[REDACTED]" in line
