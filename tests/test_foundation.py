"""Foundation: params validation, the papermill runner, CLI exit codes, repo hygiene (env sync, notebooks, README)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
import tomllib
import yaml
from conftest import hierarcaps_data

from cglib.cli import main as cli_main
from cglib.config import Params, ParamsError, load_params, parse_params, schema_table
from cglib.pipeline import discover_notebooks, select_notebooks

REPO = Path(__file__).resolve().parent.parent


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------- params
def test_shipped_profiles_validate():
    """demo validates with its paths checked; paper and hierarcaps validate once paths are not required."""
    assert load_params(REPO / "params/demo.yaml").run.profile == "demo"
    hierarcaps = load_params(REPO / "params/hierarcaps.yaml", check_paths=False)
    assert hierarcaps.data.coco_captions == REPO / "data/hierarcaps/coco_captions_hc1k.json"
    paper = load_params(REPO / "params/paper.yaml", check_paths=False)
    assert (paper.model.name, paper.model.pretrained, paper.train.groups_per_batch, paper.train.pairs_per_group,
            paper.train.lr, paper.train.tau, paper.train.alpha) == ("ViT-B-32", "openai", 2, 10, 1e-8, 0.1, 0.7)


def test_hierarcaps_profile_finds_the_shared_data(shared_data):
    """hierarcaps.yaml reads data/hierarcaps (what `cglib download hierarcaps-1k` writes); with its four data
    paths pointed at the shared copy, every path exists."""
    params = load_params(REPO / "params/hierarcaps.yaml", overrides=hierarcaps_data(shared_data / "hierarcaps"))
    assert params.eval.hierarcaps and params.data.hierarcaps_csv == shared_data / "hierarcaps/hierarcaps_test.csv"


def test_paper_profile_needs_its_data_unless_told():
    """paper.yaml names COCO paths that do not exist here: an error naming each key, unless --no-check-paths."""
    with pytest.raises(ParamsError) as err:
        load_params(REPO / "params/paper.yaml")
    assert "data.coco_captions: path does not exist" in str(err.value)
    assert "--no-check-paths" in str(err.value)


@pytest.mark.parametrize("text, expected", [
    ("run:\n  nmae: x\n", "run.nmae: unknown key; did you mean 'name'?"),
    ("trian:\n  epochs: 1\n", "trian: unknown key; did you mean 'train'?"),
    ("train:\n  groups_per_batch: -2\n", "train.groups_per_batch: Input should be greater than or equal to 1"),
    ("run:\n  profile: demoo\n", "run.profile: Input should be 'demo', 'paper', 'hierarcaps', 'rehearsal', 'related' or 'custom'"),
    ("train:\n  epochs: many\n", "train.epochs: Input should be a valid integer"),
    ("train:\n  runs: [{name: a, loss: clipp}]\n", "train.runs[0].loss: unknown loss 'clipp'; did you mean 'clip'?"),
    ("train:\n  runs: [{name: a, loss: clip}, {name: a, loss: pairwise}]\n", "duplicate names ['a']; give every entry of train.runs"),
    ("data:\n  synthetic: {min_objects: 4, max_objects: 2}\n", "min_objects (4) exceeds max_objects (2)"),
    ("data:\n  source: coco\n", "source 'coco' needs data.coco_captions and data.coco_images"),
    ("llm:\n  api_key_env: sk-abc123\n", "llm.api_key_env: String should match pattern"),
    ("magic:\n  sim_min: 1.5\n", "magic.sim_min: Input should be less than or equal to 1"),
    ("- just\n- a list\n", "params must be a YAML mapping"),
])
def test_each_broken_field_gets_its_own_message(tmp_path, text, expected):
    """Every kind of bad value yields one line that names the key and what is wrong."""
    with pytest.raises(ParamsError) as err:
        load_params(write_yaml(tmp_path / "p.yaml", text))
    assert expected in str(err.value)


def test_several_problems_reported_together(tmp_path):
    """All problems of a file are listed, one line each, not only the first."""
    path = write_yaml(tmp_path / "p.yaml", "run:\n  seed: -1\ntrain:\n  epochs: 0\n  lr: -1.0\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and {ln.split(":")[0] for ln in lines} == {"run.seed", "train.epochs", "train.lr"}


def test_every_kind_of_problem_reported_in_one_pass_in_file_order(tmp_path):
    """A bad value, two missing COCO paths, a rule between sections (the base corpus) and a rule involving a
    default (viz.color_level above magic.l_max) are all listed at once, each with its key and fix, in the
    order of the file; a rule that involves a key with a bad value is not guessed at."""
    text = ("run:\n  seed: -1\ndata:\n  source: coco\n  coco_captions: nope.json\n  coco_images: imgs\n"
            "train:\n  base:\n    corpus: synthetic\n  epochs: 0\nviz:\n  color_level: 7\n")
    with pytest.raises(ParamsError) as err:
        load_params(write_yaml(tmp_path / "p.yaml", text))
    lines = str(err.value).splitlines()
    assert [ln.split(":")[0].split(" ")[0] for ln in lines] == [
        "run.seed", "data.coco_captions", "data.coco_images", "train.base.corpus", "train.epochs", "viz.color_level"]
    assert "use train.base.corpus: magic_train" in lines[3] and "fix the path" in lines[1]
    with pytest.raises(ParamsError) as err:  # l_max itself is bad: its rule with color_level is not checked
        load_params(write_yaml(tmp_path / "p.yaml", "magic:\n  l_max: lots\nviz:\n  color_level: 7\n"))
    assert str(err.value).splitlines() == [("magic.l_max: Input should be a valid integer, unable to parse string "
                                           "as an integer (got 'lots')")]


def test_yaml_11_exponent_strings_are_numbers(tmp_path):
    """PyYAML reads `1e-5` as a string (YAML 1.1); the schema coerces it to the float the user meant."""
    params = load_params(write_yaml(tmp_path / "p.yaml", "train:\n  lr: 1e-5\n  pretrain_lr: 2E-6\n"))
    assert params.train.lr == 1e-5 and params.train.pretrain_lr == 2e-6


def test_missing_input_path_is_named(tmp_path):
    """A COCO profile whose files are absent says which key points nowhere."""
    text = "data:\n  source: coco\n  coco_captions: nope.json\n  coco_images: imgs\n"
    with pytest.raises(ParamsError) as err:
        load_params(write_yaml(tmp_path / "p.yaml", text))
    assert "data.coco_captions: path does not exist" in str(err.value)
    assert "data.coco_images: path does not exist" in str(err.value)
    assert load_params(tmp_path / "p.yaml", check_paths=False).data.coco_captions == tmp_path / "nope.json"


def test_relative_paths_resolve_against_repo_root():
    """Paths in params/*.yaml are relative to the repository root, wherever the process runs."""
    params = load_params(REPO / "params/paper.yaml", check_paths=False)
    assert params.data.coco_images == REPO / "data/coco/train2017"
    assert params.run_dir() == REPO / "outputs" / "paper"


@pytest.mark.parametrize("text, message", [
    ("run: [\n", "not valid YAML at line 2"),
    ("train:\n  groupz_per_batch: 3\n", "did you mean 'groups_per_batch'"),
    ("train:\n  groups_per_batch: -1\n", "train.groups_per_batch"),
    ("run:\n  profile: laptop\n", "run.profile"),
])
def test_cli_validate_exit_2_and_writes_nothing(tmp_path, capsys, monkeypatch, text, message):
    """Bad params: exit code 2, one clear line, and no outputs/ folder created by validate or run."""
    monkeypatch.chdir(tmp_path)
    path = write_yaml(tmp_path / "bad.yaml", text)
    assert cli_main(["validate", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert cli_main(["run", str(path)]) == 2
    assert not (tmp_path / "outputs").exists()


def test_cli_validate_missing_file_and_good_file(tmp_path, capsys):
    """A missing file is exit 2 with its name; a good file is exit 0."""
    assert cli_main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "params file not found" in capsys.readouterr().err
    assert cli_main(["validate", str(REPO / "params/demo.yaml")]) == 0


def test_cli_is_installed_as_a_command():
    """`cglib validate` works as a console script (the README's entry point)."""
    exe = Path(sys.executable).parent / "cglib"
    result = subprocess.run([str(exe), "validate", str(REPO / "params/demo.yaml")], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    bad = subprocess.run([str(exe), "validate", "/nonexistent.yaml"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2


def test_schema_table_lists_every_key_with_meaning():
    """The generated params table covers every leaf key of every section, each with a description."""
    rows = schema_table()
    keys = {r["key"] for r in rows}
    for section in ("run", "data", "llm", "magic", "model", "train", "eval", "viz", "search"):
        assert any(k.startswith(section + ".") for k in keys), section
    assert "data.synthetic.images_per_concept" in keys and "train.runs[].loss" in keys
    assert all(r["meaning"] for r in rows), [r["key"] for r in rows if not r["meaning"]]


def test_secrets_are_never_params():
    """There is no params key that could hold an API key: only the name of the environment variable."""
    keys = {r["key"] for r in schema_table()}
    assert not {k for k in keys if re.search(r"(api_key|token|secret|password)$", k)}
    with pytest.raises(ParamsError):
        parse_params({"llm": {"api_key": "sk-123"}}, REPO)


# ------------------------------------------------------------------------------------------- runner
def _notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('params_path = ""\nrun_dir = ""', metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "cglib", "display_name": "Python (cglib)", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def two_notebook_series(tmp_path):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_first.ipynb", [
        "from pathlib import Path\nfrom cglib.run import open_run\nrun = open_run(params_path, run_dir)",
        "(Path(run_dir) / 'first.txt').write_text(run.params.run.name + ' ' + params_path)"])
    _notebook(nbdir / "02_second.ipynb", [
        "from pathlib import Path\ntext = (Path(run_dir) / 'first.txt').read_text()",
        "(Path(run_dir) / 'second.txt').write_text(text.upper())"])
    params = write_yaml(tmp_path / "p.yaml", "run:\n  name: mini\n  threads: 1\n")
    return nbdir, params


@pytest.mark.slow
def test_runner_executes_series_and_writes_manifest(two_notebook_series, tmp_path):
    """Notebooks run in order with params_path and run_dir injected; run.json records status and timings."""
    nbdir, params = two_notebook_series
    out = tmp_path / "run"
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 0
    assert (out / "second.txt").read_text() == f"MINI {params.resolve()}".upper()
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "ok" and [n["name"] for n in manifest["notebooks"]] == ["01_first.ipynb",
                                                                                          "02_second.ipynb"]
    assert all(n["duration_s"] > 0 for n in manifest["notebooks"])
    assert manifest["params"]["run"]["name"] == "mini" and "torch" in manifest["versions"]
    executed = nbformat.read(out / "notebooks" / "01_first.ipynb", as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and str(out.resolve()) in injected[0].source
    # --only runs just the chosen notebook (its input from the first run still exists)
    (out / "second.txt").unlink()
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out), "--only", "02"]) == 0
    assert (out / "second.txt").exists()
    assert [n["name"] for n in json.loads((out / "run.json").read_text())["notebooks"]] == ["02_second.ipynb"]


@pytest.mark.slow
def test_runner_failing_cell_exits_nonzero_naming_it(tmp_path, capsys):
    """A raising cell stops the series: exit 1, the notebook, cell and exception named, later notebooks not run."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_ok.ipynb", ["x = 1"])
    _notebook(nbdir / "02_broken.ipynb", ["y = 2", "raise ValueError('the magic.json is stale')"])
    _notebook(nbdir / "03_never.ipynb", ["open('never_ran', 'w')"])
    params = write_yaml(tmp_path / "p.yaml", "run:\n  name: broken\n")
    out = tmp_path / "run"
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    # In [4]: the parameters cell, papermill's injected cell, `y = 2`, then the raising cell
    assert "02_broken.ipynb failed at cell In [4] [raise ValueError(" in err
    assert "ValueError: the magic.json is stale" in err
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "failed"
    assert [n["status"] for n in manifest["notebooks"]] == ["ok", "failed"]
    assert not (nbdir / "never_ran").exists()


def test_notebook_selection_by_number(tmp_path):
    """--only and --from select by number prefix; an unknown number is an error listing the valid ones."""
    for name in ("01_a.ipynb", "02_b.ipynb", "03_c.ipynb", "notes.ipynb"):
        (tmp_path / name).write_text("{}")
    nbs = discover_notebooks(tmp_path)
    assert [p.name for p in nbs] == ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb"]
    assert [p.name[:2] for p in select_notebooks(nbs, only=["3", "01"])] == ["01", "03"]
    assert [p.name[:2] for p in select_notebooks(nbs, start="02")] == ["02", "03"]
    with pytest.raises(ValueError, match="no notebook numbered '07'; available: 01, 02, 03"):
        select_notebooks(nbs, only=["07"])


# -------------------------------------------------------------------------------------- repo hygiene
def test_environment_yml_in_sync_with_pyproject():
    """environment.yml's pip section installs exactly pyproject's dependencies plus the package itself."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(p for p in pip_section if not p.startswith("-e")) == sorted(deps)
    assert "-e .[dev]" in pip_section
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.10" and py == "python=3.11"


def test_readme_commands_are_what_ci_and_make_use():
    """The README opens with `make demo` and `make test`; .ci/run runs `make test`; the Makefile defines both."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks and blocks[0].strip().splitlines() == ["make demo", "make test"]
    ci = (REPO / ".ci/run").read_text()
    assert re.search(r"^make test$", ci, flags=re.MULTILINE)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t.*cglib run params/demo.yaml", makefile, flags=re.MULTILINE)
    assert re.search(r"^test:.*\n\t.*pytest", makefile, flags=re.MULTILINE)


def test_committed_notebooks_are_clean_and_parameterised():
    """Every numbered notebook: no outputs, the cglib kernel, and a `parameters` cell with params_path, run_dir."""
    notebooks = discover_notebooks(REPO / "notebooks")
    assert notebooks and notebooks[0].name == "00_overview.ipynb"
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "cglib", path.name
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), path.name
        params_cells = [c for c in code if "parameters" in c.metadata.get("tags", [])]
        assert len(params_cells) == 1 and "params_path" in params_cells[0].source and \
            "run_dir" in params_cells[0].source, path.name


def test_outputs_is_ignored_except_readme():
    """outputs/ holds results and is git-ignored except its README."""
    ignore = (REPO / ".gitignore").read_text().splitlines()
    assert "outputs/*" in ignore and "!outputs/README.md" in ignore
    assert (REPO / "outputs/README.md").is_file()


def test_params_defaults_are_valid():
    """An empty params file is the documented defaults and is valid; only output_dir gets resolved."""
    defaults = Params().model_dump()
    parsed = parse_params({}, REPO, check_paths=False).model_dump()
    assert parsed["run"].pop("output_dir") == REPO / "outputs"
    defaults["run"].pop("output_dir")
    assert parsed == defaults


@pytest.mark.slow
def test_runner_reports_a_silent_cell_as_hung_naming_it(tmp_path, capsys):
    """A cell that sends nothing for longer than run.cell_silence_s is reported within seconds, naming the
    notebook and the cell, while run.cell_timeout_s (an hour) would still be waiting; a cell that keeps
    printing is not silent however long it runs; a kernel deaf to the interrupt is killed and reported too."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    chatty = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)"
    _notebook(nbdir / "01_chatty.ipynb", [chatty])
    _notebook(nbdir / "02_stuck.ipynb", ["x = 1", "import time\ntime.sleep(600)  # silent"])
    params = write_yaml(tmp_path / "p.yaml", "run:\n  name: stuck\n  cell_silence_s: 3\n  cell_timeout_s: 3600\n")
    out = tmp_path / "run"
    t0 = time.perf_counter()
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 1
    assert time.perf_counter() - t0 < 90
    err = capsys.readouterr().err
    assert "02_stuck.ipynb failed at cell 3 [import time]: no output for 3 s (run.cell_silence_s)" in err
    manifest = json.loads((out / "run.json").read_text())
    assert [n["status"] for n in manifest["notebooks"]] == ["ok", "failed"]
    assert "run.cell_silence_s" in manifest["notebooks"][1]["error"]
    # a kernel that ignores the interrupt (or is idle while the client waits) is killed after a grace period
    ignore = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)"
    _notebook(nbdir / "03_deaf.ipynb", [ignore])
    t0 = time.perf_counter()
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out), "--only", "03"]) == 1
    assert time.perf_counter() - t0 < 90
    assert "03_deaf.ipynb failed at cell 2 [import signal, time]: no output for 3 s" in capsys.readouterr().err


# ------------------------------------------------------------------------------- run summary, status
def test_llm_accounting_adds_up_on_a_faulty_server(tmp_path, monkeypatch):
    """Abstraction against an OpenAI-compatible server where two images' replies stay broken: the account counts
    every item where it ended (answered, failed by reason, never asked, not needed after a failed level) and
    adds up to images x levels; the requests equal the server's count; a rerun with one new image answers the
    old ones from the cache (hits and failure hits) and sends 4 items."""
    sys.path.insert(0, str(REPO / "tests"))
    from fake_openai_server import FakeOpenAIServer

    from cglib.accounts import stage_summaries, summary_lines
    from cglib.data.dataset import CaptionDataset
    from cglib.llm import run_abstraction

    def data(n: int) -> CaptionDataset:
        caps = {f"img{i}": [f"a dog number {i} on a sofa"] for i in range(n)}
        caps.update({"bad1": ["[[fault:nonjson*9]] a dog"], "bad2": ["[[fault:missing*9]] a cat"]})
        return CaptionDataset(source="test", image_ids=list(caps), captions=caps,
                              pixels=np.zeros((len(caps), 2, 2, 3), dtype=np.uint8))

    monkeypatch.setenv("CGLIB_TEST_OPENAI_KEY", "sk-test-accounting")
    with FakeOpenAIServer() as server:
        params = Params.model_validate({"llm": {
            "backend": "openai", "base_url": server.url, "api_key_env": "CGLIB_TEST_OPENAI_KEY",
            "backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 5.0, "max_bad_reply_retries": 1}})
        run_abstraction(data(3), params, tmp_path, progress=False)
        llm = stage_summaries(tmp_path)["abstraction"]["llm"]
        assert (llm["items"], llm["answered"], llm["failed"], llm["not_needed"], llm["adds_up"]) == (20, 12, 2, 6, True)
        assert llm["failed_by_reason"] == {"invalid_json": 1, "missing_fields": 1}
        assert llm["requests"]["http"] == server.total == 16  # each broken item asked twice
        stage = stage_summaries(tmp_path)["abstraction"]
        assert stage["kept"] == 3 and stage["failed"] == {"invalid_json": 1, "missing_fields": 1}
        run_abstraction(data(4), params, tmp_path, progress=False)
    llm = stage_summaries(tmp_path)["abstraction"]["llm"]
    assert (llm["cached"], llm["cached_failures"], llm["answered"], llm["failed"], llm["adds_up"]) == \
        (12, 2, 4, 0, True)
    line, account = summary_lines(stage_summaries(tmp_path))
    assert "failed 2 (invalid_json: 1, missing_fields: 1)" in line
    assert "24 items = 12 cached + 2 cached failures + 4 answered + 0 failed + 0 never asked + 6 not needed" in account


@pytest.mark.slow
def test_status_reports_running_then_interrupted_after_kill(tmp_path, capsys):
    """`cglib status`: a run whose runner is alive is running (exit 5); after SIGKILL of the runner (a real
    subprocess and its kernel) run.json still says "running", and status shows it as interrupted (exit 4)
    with the PID and host recorded; a finished run is ok (0), a failed one 1, a folder without run.json 2."""
    import os
    import signal
    import socket

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_quick.ipynb", ["x = 1"])
    _notebook(nbdir / "02_long.ipynb", ["import time\ntime.sleep(300)"])
    params = write_yaml(tmp_path / "p.yaml", "run:\n  name: killed\n")
    out = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "cglib.cli", "run", str(params), "--notebooks", str(nbdir),
                               "--out", str(out)], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            manifest = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
            if [n["name"] for n in manifest.get("notebooks", [])] == ["01_quick.ipynb"]:
                break
            time.sleep(0.5)
        assert manifest["runner"]["pid"] == runner.pid and manifest["runner"]["host"] == socket.gethostname()
        assert cli_main(["status", str(out)]) == 5
        assert "running" in capsys.readouterr().out
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the runner and the kernel it started
        runner.wait()
    assert json.loads((out / "run.json").read_text())["status"] == "running"  # what the killed runner left
    assert cli_main(["status", str(out)]) == 4
    shown = capsys.readouterr().out
    assert f"interrupted (runner PID {runner.pid} on {socket.gethostname()})" in shown
    # the exact command: the notebook it stopped in onwards, the same notebook folder
    assert (f"the runner is gone in notebook 02: resume with `cglib run {params.resolve()} --out {out} --notebooks "
            f"{nbdir} --from 02`") in shown, shown
    (tmp_path / "notebooks" / "02_long.ipynb").unlink()
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 0
    assert cli_main(["status", str(out)]) == 0
    _notebook(nbdir / "02_broken.ipynb", ["raise ValueError('no')"])
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 1
    assert cli_main(["status", str(out)]) == 1
    assert cli_main(["status", str(tmp_path / "notebooks")]) == 2


@pytest.mark.slow
def test_run_ends_with_a_stage_summary_and_strict_exits_3(tmp_path, capsys):
    """A run whose captions stage drops a duplicate caption (real COCO loader, the statistics notebook 01
    writes): the terminal's last lines give kept / skipped by reason per stage, run.json stores them, exit 0;
    with --strict the same run exits 3 and says why."""
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in (1, 2):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(images / f"{i:012d}.jpg")
    captions = {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in (1, 2)],
                "annotations": [{"id": 1, "image_id": 1, "caption": "a red square"},
                                {"id": 2, "image_id": 1, "caption": "a red square"},
                                {"id": 3, "image_id": 2, "caption": "a darker red square"}]}
    (tmp_path / "captions.json").write_text(json.dumps(captions))
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    cell = ("from cglib.data.coco import load_coco_captions\nfrom cglib.run import open_run, write_json\n"
            "from cglib.viz.data_figures import caption_statistics\nrun = open_run(params_path, run_dir)\n"
            f"ds = load_coco_captions({str(tmp_path / 'captions.json')!r}, {str(images)!r})\n"
            "write_json(run.stage('captions') / 'summary.json', {'statistics': caption_statistics(ds)})")
    _notebook(nbdir / "01_captions.ipynb", [cell])
    params = write_yaml(tmp_path / "p.yaml", "run:\n  name: lossy\n")
    out = tmp_path / "run"
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == ["Summary (kept / skipped / failed per stage):",
                            "  captions     kept 2 images; skipped 1 (duplicate caption: 1); failed 0"]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["summary"]["captions"]["skipped"] == {"duplicate caption": 1}
    assert manifest["skipped_or_failed"] == 1
    assert cli_main(["run", str(params), "--notebooks", str(nbdir), "--out", str(out), "--strict"]) == 3
    assert "STRICT: 1 items were skipped or failed" in capsys.readouterr().err


def test_open_run_rewrites_params_yaml_only_when_it_changes(tmp_path):
    """Under torchrun every rank reads the run folder's params.yaml while rank 0 opens the run: the file is left
    untouched when it already holds these params (no truncated file for a reader), and replaced whole otherwise."""
    from cglib.run import open_run

    source = tmp_path / "p.yaml"
    source.write_text("run: {name: once, threads: 1}\n")
    run = open_run(source, tmp_path / "run", check_paths=False)
    saved = run.dir / "params.yaml"
    stamp = saved.stat().st_mtime_ns
    open_run(saved, run.dir, check_paths=False)  # what rank 0 of `python -m cglib.train RUN/params.yaml` does
    assert saved.stat().st_mtime_ns == stamp
    source.write_text("run: {name: once, threads: 1, seed: 7}\n")
    open_run(source, run.dir, check_paths=False)
    assert "seed: 7" in saved.read_text() and not list(run.dir.glob("*.tmp"))
