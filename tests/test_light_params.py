"""Params load without the heavy stack: validating a file imports neither torch nor open_clip (the objectives'
declarations live in cglib/config/objectives, their nn.Modules are imported only to train), an outside objective is
still checked when its file is validated, and a file's mistakes are all reported in one pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cglib.cli import main as cli_main
from cglib.config import ParamsError, parse_params
from cglib.config.objectives import OBJECTIVE_SPECS, ObjectiveSpec, trained_by
from cglib.train.objectives import OBJECTIVES, Objective

REPO = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).parent / "plugins"
HEAVY = ("torch", "open_clip")


def fresh_python(code: str, extra_path: Path | None = None) -> str:
    """stdout of `code` run by a new interpreter from the repo root (nothing imported beforehand)."""
    path = [str(p) for p in (extra_path, REPO) if p is not None] + [os.environ.get("PYTHONPATH", "")]
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("profile", sorted(p.name for p in (REPO / "params").glob("*.yaml")))
def test_load_params_imports_neither_torch_nor_open_clip(profile):
    """Every shipped profile loads (its run entries' objectives and options checked) without torch or open_clip."""
    out = fresh_python("import sys; from cglib.config import load_params; "
                       f"load_params('params/{profile}', check_paths=False); "
                       f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert out.strip() == "[]"


def test_cglib_validate_imports_neither_torch_nor_open_clip():
    """`cglib validate params/demo.yaml`, as the console script calls it (cglib.cli:main), stays light."""
    out = fresh_python("import sys; from cglib.cli import main; code = main(['validate', 'params/demo.yaml']); "
                       f"print(code, [m for m in {HEAVY!r} if m in sys.modules])")
    assert out.strip().splitlines()[-1] == "0 []"


def test_cglib_book_imports_neither_torch_nor_open_clip(tmp_path):
    """`cglib book` (cglib.cli:main) reads executed notebooks and builds pages: everything it imports up to the
    build (Sphinx comes next, and imports neither) stays light. A folder that is not a run ends the command there."""
    out = fresh_python("import sys; from cglib.cli import main; "
                       f"code = main(['book', {str(tmp_path)!r}]); "
                       f"print(code, [m for m in {HEAVY!r} if m in sys.modules])")
    assert out.strip().splitlines()[-1] == "2 []"


def test_each_built_in_declaration_is_its_objectives_base():
    """The nn.Module of every built-in objective subclasses its declaration (so the two cannot disagree), and the
    declarations' registry names the same objectives in the same order as the training registry."""
    assert list(OBJECTIVE_SPECS) == list(OBJECTIVES)
    for name, spec in OBJECTIVE_SPECS.items():
        assert trained_by(spec) is OBJECTIVES[name] and issubclass(OBJECTIVES[name], spec)
        assert not issubclass(spec, Objective) and issubclass(Objective, ObjectiveSpec)


def test_an_outside_objective_is_checked_when_its_file_is_validated(tmp_path, monkeypatch):
    """`loss: package.module:Class` is imported at validation: its options are validated by its own model, and a
    name that does not import is an error at train.runs[i].loss."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    own = {"name": "triplet", "loss": "my_objectives:CentroidTriplet"}
    params = parse_params({"train": {"runs": [own]}}, tmp_path, check_paths=False)
    assert params.train.runs[0].objective().__name__ == "CentroidTriplet"
    with pytest.raises(ParamsError) as err:  # CentroidTriplet declares no options
        parse_params({"train": {"runs": [{**own, "options": {"margin": 0.3}}]}}, tmp_path, check_paths=False)
    assert "train.runs[0]: run 'triplet' (loss: my_objectives:CentroidTriplet): options.margin" in str(err.value)
    with pytest.raises(ParamsError) as err:
        parse_params({"train": {"runs": [{"name": "x", "loss": "my_objectivez:CentroidTriplet"}]}}, tmp_path)
    assert str(err.value).startswith("train.runs[0].loss: loss 'my_objectivez:CentroidTriplet': cannot import")


def test_several_mistakes_in_one_pass_through_cglib_validate(tmp_path, capsys):
    """A misspelt key in train, a rule of the train section that it would otherwise hide, a misspelt key of a run
    entry and a bad value in eval: one `cglib validate`, exit code 2, each at its path, in the file's order."""
    path = tmp_path / "p.yaml"
    path.write_text("train:\n  epochz: 3\n  runs:\n    - {name: a, loss: clip, groups: ngram}\n"
                    "    - {name: b, loss: pairwise, taux: 1}\neval:\n  choices: 1\n", encoding="utf-8")
    assert cli_main(["validate", str(path), "--no-check-paths"]) == 2
    lines = capsys.readouterr().err.splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["train", "train.epochz", "train.runs[1].taux",
                                                              "eval.choices"]
    assert "has groups: ngram" in lines[0] and "did you mean 'epoch'" in lines[1]
    assert "did you mean 'tau'" in lines[2] and "greater than or equal to 2" in lines[3]


def test_a_rule_on_a_key_with_a_bad_value_is_not_guessed(tmp_path):
    """The second pass leaves a bad value at its default: a rule reading it is not reported (a guess); a key
    inside a run entry is left out as well, so it is reported once."""
    with pytest.raises(ParamsError) as err:
        parse_params({"train": {"text_source": 5, "runs": [{"name": "a", "loss": "clip", "groups": "ngram",
                                                             "taux": 1}]}}, tmp_path, check_paths=False)
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["train.text_source", "train.runs[0].taux"]
