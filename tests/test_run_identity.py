"""A run's identity covers its code: an edited objective or callback retrains, an unedited one is reused, code
whose source cannot be read is never reused, and a run trained by other library code says so on reuse (and trains
again with --retrain-changed)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from prepared_runs import train_one_prepared
from test_train import make_run

from cglib.code_identity import class_digest, library_digest
from cglib.run import RETRAIN_CHANGED_ENV, other_code
from cglib.train.checkpoint import FINAL, INITIAL
from cglib.train.inputs import run_entry, run_spec

REPO = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).parent / "plugins"

OBJECTIVE = '''"""A user's objective file, edited between trainings."""
import torch
import torch.nn.functional as F

from cglib.train.objectives import Objective


class Triplet(Objective):
    name, label, family = "edited_triplet", "an edited triplet", "group"
    min_groups = 2

    def forward(self, batch):
        image = F.normalize(batch.image.mean(dim=1), dim=-1)
        text = F.normalize(batch.text.mean(dim=1), dim=-1)
        similarity = image @ text.T
        others = similarity.masked_fill(torch.eye(len(similarity), dtype=torch.bool), float("-inf"))
        return {{"loss": F.softplus(({margin} - similarity.diagonal() + others.max(dim=1).values) / 0.1).mean()}}
'''


def weights_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_in_fresh_process(params_path: Path, run_dir: Path, plugin_dir: Path, *extra: str) -> str:
    """`python -m cglib.train` in a new interpreter with `plugin_dir` on the path: its stdout."""
    path = os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "cglib.train", str(params_path), "--run-dir", str(run_dir),
                           "--no-progress", *extra], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path}, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_an_edited_objective_file_retrains_and_an_unedited_one_is_reused(tmp_path):
    """Three trainings in fresh processes: the second (no edit) reuses the first's weights; after one line of the
    objective's file changes, the third trains again, to other weights."""
    plugin_dir = tmp_path / "mine"
    plugin_dir.mkdir()
    objective = plugin_dir / "edited_objectives.py"
    objective.write_text(OBJECTIVE.format(margin=0.2))
    sys.path.insert(0, str(plugin_dir))  # params validation imports the class in this process too
    try:
        run = make_run(tmp_path / "run", runs=[{"name": "mine", "loss": "edited_objectives:Triplet"}])
    finally:
        sys.path.remove(str(plugin_dir))
        sys.modules.pop("edited_objectives", None)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(run.params.model_dump(mode="json")))
    final, summary_path = run.dir / "training" / "mine" / FINAL, run.dir / "training" / "mine" / "summary.json"

    train_in_fresh_process(params_path, run.dir, plugin_dir)
    first = weights_digest(final), json.loads(summary_path.read_text())
    assert first[1]["spec"]["code"]["loss"]["sha1"] == hashlib.sha1(objective.read_bytes() + b"\0").hexdigest()

    train_in_fresh_process(params_path, run.dir, plugin_dir)
    second = weights_digest(final), json.loads(summary_path.read_text())
    assert second == first  # reused: not one byte of the weights or the summary changed

    objective.write_text(OBJECTIVE.format(margin=0.5))
    train_in_fresh_process(params_path, run.dir, plugin_dir)
    third = weights_digest(final), json.loads(summary_path.read_text())
    assert third[1]["spec_hash"] != first[1]["spec_hash"]
    assert third[0] != first[0]


def test_a_class_without_readable_source_is_never_reused_and_says_so(tmp_path, capsys):
    """A class compiled from a string (no file, no notebook cell) has no digest: every call trains it again, and a
    line says why and how to make it reusable."""
    module = types.ModuleType("sourceless_objectives")
    source = OBJECTIVE.format(margin=0.2).split('"""', 2)[2]
    exec(compile(source, "<generated>", "exec"), module.__dict__)  # noqa: S102 - the point: code without a source
    sys.modules["sourceless_objectives"] = module
    try:
        run = make_run(tmp_path, runs=[{"name": "mine", "loss": "sourceless_objectives:Triplet"}])
        steps: list[int] = []
        train_one_prepared(run, "mine", progress=False, on_step=lambda row: steps.append(row["global_step"]))
        trained_first = len(steps)
        train_one_prepared(run, "mine", progress=False, on_step=lambda row: steps.append(row["global_step"]))
    finally:
        sys.modules.pop("sourceless_objectives")
    assert trained_first > 0 and len(steps) == 2 * trained_first  # the second call trained again
    out = capsys.readouterr().out
    assert "the source of sourceless_objectives:Triplet cannot be read" in out
    assert "never reused" in out and "move Triplet into a file" in out


def test_the_library_objectives_leave_the_spec_as_it_was(tmp_path, monkeypatch):
    """No code key for a library objective without callbacks (so the demo's specs, and weights, are as before);
    a params file's callback that may stop a run enters by its file's digest, an observer does not."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    run = make_run(tmp_path, runs=[{"name": "centroid", "loss": "centroid"}])
    assert "code" not in run_spec(run.params, run_entry(run.params, "centroid"))
    stopping = make_run(tmp_path / "stopping", runs=[{"name": "centroid", "loss": "centroid"}],
                        callbacks=["my_callbacks:StopAfterSteps", "my_callbacks:QuietObserver"])
    code = run_spec(stopping.params, run_entry(stopping.params, "centroid"))["code"]
    assert list(code) == ["callbacks[0]"]
    assert code["callbacks[0]"]["sha1"] == hashlib.sha1((PLUGINS / "my_callbacks.py").read_bytes() + b"\0").hexdigest()


def test_an_observing_callback_that_asks_to_stop_is_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    run = make_run(tmp_path, callbacks=["my_callbacks:ObserverThatStops"])
    with pytest.raises(ValueError, match="declares changes_result = False"):
        train_one_prepared(run, "clip", progress=False)


def test_notebook_cells_count_the_helpers_and_constants_the_class_uses():
    """A class defined interactively is identified by its cells' source, the `__main__` helpers its methods call
    and the plain constants they read: changing a constant in another cell changes the digest."""
    namespace: dict = {"__name__": "interactive_session"}
    module = types.ModuleType("interactive_session")
    module.__dict__.update(namespace)
    sys.modules["interactive_session"] = module
    try:
        digests = []
        for margin in (0.2, 0.3):
            cells = [f"MARGIN = {margin}\n", "def helper(x):\n    return x * MARGIN\n",
                     "class Mine:\n    scale = 2\n    def forward(self, x):\n        return helper(x) * self.scale\n"]
            for number, cell in enumerate(cells):
                filename = f"<cell-{margin}-{number}>"
                import linecache

                linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)  # as IPython does
                exec(compile(cell, filename, "exec"), module.__dict__)  # noqa: S102
            digests.append(class_digest("interactive_session:Mine", module.Mine))
    finally:
        sys.modules.pop("interactive_session")
    assert all(d.how == "notebook cells" and d.digest for d in digests)
    assert digests[0].digest != digests[1].digest


def fake_other_code(path: Path) -> None:
    """Rewrite a result's recorded provenance as if another cglib commit had made it."""
    record = json.loads(path.read_text())
    record["provenance"].update(cglib_source="0" * 40, git_commit="0123456789abcdef0123456789abcdef01234567")
    path.write_text(json.dumps(record))


def test_a_run_of_other_library_code_is_reused_by_name_and_retrained_on_request(tmp_path, capsys, monkeypatch):
    """A finished run and base whose provenance names other library code: reused with a line naming the commit;
    with --retrain-changed (its variable) both train again and then record this code."""
    run = make_run(tmp_path)
    train_one_prepared(run, "clip", progress=False)
    summary_path, initial_meta = run.dir / "training" / "clip" / "summary.json", run.dir / "training" / "initial.json"
    fake_other_code(summary_path)
    fake_other_code(initial_meta)
    before = weights_digest(run.dir / "training" / "clip" / FINAL), weights_digest(run.dir / "training" / INITIAL)
    capsys.readouterr()

    steps: list[int] = []
    train_one_prepared(run, "clip", progress=False, on_step=lambda row: steps.append(1))
    out = capsys.readouterr().out
    assert steps == []
    assert "run 'clip': reused, trained by cglib 0123456789ab" in out
    assert "initial weights of training seed 0: reused, trained by cglib 0123456789ab" in out
    assert "--retrain-changed" in out

    monkeypatch.setenv(RETRAIN_CHANGED_ENV, "1")
    train_one_prepared(run, "clip", progress=False, on_step=lambda row: steps.append(1))
    out = capsys.readouterr().out
    assert steps and "training it again (--retrain-changed)" in out
    for path in (summary_path, initial_meta):
        assert other_code(json.loads(path.read_text())["provenance"]) is None
        assert json.loads(path.read_text())["provenance"]["cglib_source"] == library_digest()
    # same code, same spec, same seeds: the retrained weights equal the faked run's
    assert (weights_digest(run.dir / "training" / "clip" / FINAL),
            weights_digest(run.dir / "training" / INITIAL)) == before


def test_other_code_reads_commit_and_dirty_tree():
    assert other_code({"cglib_source": library_digest(), "git_commit": "abc"}) is None
    named = other_code({"cglib_source": "1" * 40, "git_commit": "fedcba9876543210-dirty", "created": "2026-01-01"})
    assert named == "cglib fedcba987654 with uncommitted changes (2026-01-01)"
    assert other_code({}) == "cglib of an unknown commit"


def test_a_study_refuses_trials_of_an_edited_objective_and_names_other_library_code(tmp_path, monkeypatch, capsys):
    """A search study records the code its trials ran: trials of another version of the tuned objective are
    refused (their scores would be ranked together), other library code is named and kept."""
    import optuna
    from test_search import make_search_run

    from cglib.config import load_params
    from cglib.search.study import open_study
    from cglib.search.study_code import check_study_code

    plugin_dir = tmp_path / "mine"
    plugin_dir.mkdir()
    objective = plugin_dir / "searched_objectives.py"
    objective.write_text(OBJECTIVE.format(margin=0.2))
    monkeypatch.syspath_prepend(str(plugin_dir))
    path, run_dir = make_search_run(tmp_path, run="mine")
    data = yaml.safe_load(path.read_text())
    data["train"]["runs"].append({"name": "mine", "loss": "searched_objectives:Triplet"})
    path.write_text(yaml.safe_dump(data))
    params = load_params(path, check_paths=False)
    study = open_study(params, run_dir)
    check_study_code(study, params)  # a new study: records its code
    study.add_trial(optuna.trial.create_trial(params={"lr": 1e-3},
                                              distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2)},
                                              value=0.5))
    check_study_code(open_study(params, run_dir), params)  # same code: resumes silently
    assert capsys.readouterr().out == ""

    code = dict(study.user_attrs["code"], cglib_source="0" * 40, git_commit="0123456789abcdef")
    study.set_user_attr("code", code)
    check_study_code(open_study(params, run_dir), params)
    assert "its 1 trials so far were run by cglib 0123456789ab" in capsys.readouterr().out

    objective.write_text(OBJECTIVE.format(margin=0.5))
    sys.modules.pop("searched_objectives", None)
    edited = load_params(path, check_paths=False)
    with pytest.raises(ValueError, match="trained another version of the tuned run's objective"):
        check_study_code(open_study(edited, run_dir), edited)


def test_a_rebuild_of_the_same_magic_keeps_the_trained_runs(tmp_path):
    """notebook 03 run again writes a magic.json whose timing and cache counts differ: the runs trained on it are
    reused. A DAG whose content changed retrains them."""
    from cglib.magic.files import load_magic, save_magic

    run = make_run(tmp_path)
    train_one_prepared(run, "clip", progress=False)
    path = run.dir / "magic" / "magic.json"
    magic = load_magic(path)
    rebuilt = magic.model_copy(update={"stats": {**magic.stats, "generalization": {"wall_s": 0.1, "hits": 9}},
                                       "provenance": {**magic.provenance, "created": "later"}})
    save_magic(rebuilt, path)
    steps: list[int] = []
    train_one_prepared(run, "clip", progress=False, on_step=lambda row: steps.append(1))
    assert steps == []
    first = next(iter(rebuilt.images.values()))  # one image with another caption: another DAG's content
    changed = {**rebuilt.images, first.id: first.model_copy(update={"captions": ["a different caption"]})}
    save_magic(rebuilt.model_copy(update={"images": changed}), path)
    train_one_prepared(run, "clip", progress=False, on_step=lambda row: steps.append(1))
    assert steps
