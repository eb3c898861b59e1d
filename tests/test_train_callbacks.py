"""Training callbacks: the events a callback sees, its read-only view of the training state, what it asks of the
trainer through `control` (stop, save), and your own callbacks named in params (`train.callbacks`)."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest
import torch
from prepared_runs import train_one_prepared
from pydantic import ValidationError
from test_light_params import fresh_python
from test_train import _final_and_log, make_run

from cglib.config import TrainParams
from cglib.train.callbacks import StateView
from cglib.train.checkpoint import load_checkpoint
from cglib.train.state import Progress, TrainState

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def plugins(monkeypatch):
    """tests/plugins on the Python path; my_callbacks.SEEN empty."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    import my_callbacks

    my_callbacks.SEEN.clear()
    return my_callbacks


def test_a_watching_callback_sees_every_event_in_order_and_changes_nothing(tmp_path, plugins):
    """A callback named in params sees train begin, each epoch's begin, steps and end, and train end, with the
    position at each; a run with it ends with exactly the weights and log of a run without it."""
    plain = make_run(tmp_path / "plain")
    train_one_prepared(plain, "clip", progress=False)
    watched = make_run(tmp_path / "watched", callbacks=["my_callbacks:RecordEvents"])
    summary = train_one_prepared(watched, "clip", progress=False)
    per_epoch, epochs = summary["steps_per_epoch"], summary["epochs"]
    expected = [("train_begin", "train", 0, 0)]
    for epoch in range(epochs):
        expected.append(("epoch_begin", "train", epoch, epoch * per_epoch))
        expected += [("step_end", "train", epoch, epoch * per_epoch + k) for k in range(1, per_epoch + 1)]
        expected.append(("epoch_end", "train", epoch + 1, (epoch + 1) * per_epoch))
    expected.append(("train_end", "train", epochs, epochs * per_epoch))
    assert plugins.SEEN == expected
    assert summary["stopped"] is None
    (want, want_log), (got, got_log) = _final_and_log(plain, "clip"), _final_and_log(watched, "clip")
    assert all(torch.equal(want[k], got[k]) for k in want) and got_log == want_log


def test_a_callback_named_in_params_stops_the_run_after_n_steps(tmp_path, plugins):
    """control.stop() ends training after the event: the run's final weights are those after step 3, its log has
    3 rows, and summary.json says who stopped it where; the callback still sees train end."""
    run = make_run(tmp_path, callbacks=["my_callbacks:StopAfterSteps"])
    summary = train_one_prepared(run, "clip", progress=False)
    assert summary["steps_per_epoch"] > 3  # stopped mid-epoch
    assert summary["steps"] == 3 and summary["epoch_loss"] == []
    assert summary["stopped"] == {"reason": "3 steps are enough", "phase": "train", "epoch": 0, "global_step": 3}
    out = run.dir / "training" / "clip"
    assert len(list(csv.DictReader((out / "log.csv").open()))) == 3
    assert (out / "final.safetensors").is_file() and not (out / "checkpoints" / "last.pt").exists()
    assert [event for event, *_ in plugins.SEEN] == ["train_begin", "epoch_begin", "step_end", "step_end",
                                                     "step_end", "train_end"]
    assert json.loads((out / "summary.json").read_text())["stopped"]["global_step"] == 3


def test_a_callback_asks_for_a_checkpoint_mid_epoch(tmp_path, plugins):
    """control.save() writes last.pt of the step just completed (the built-in callback writes one only at an
    epoch's end)."""
    run = make_run(tmp_path, callbacks=["my_callbacks:SaveAtStepTwo"])
    saved = []

    def look(row):
        if row["global_step"] == 3:
            last = run.dir / "training" / "clip" / "checkpoints" / "last.pt"
            saved.append(load_checkpoint(last)["progress"]["global_step"] if last.is_file() else None)

    train_one_prepared(run, "clip", progress=False, on_step=look)
    assert saved == [2]


def test_the_state_a_callback_sees_is_read_only(tmp_path, plugins):
    """Assigning to the state fails naming what to do instead; lists come as tuples, dicts as read-only copies."""
    state = TrainState(Progress(phase="train", epoch_losses=[1.0]), described={"sampler": {"kind": "groups"}})
    view = StateView(state)
    assert view.phase == "train" and view.epoch_losses == (1.0,) and view.described["sampler"]["kind"] == "groups"
    with pytest.raises(AttributeError, match=r"read-only in a callback \(tried to set 'step'\).*control.stop"):
        view.step = 3
    with pytest.raises(TypeError):
        view.described["sampler"] = {}
    view.described["sampler"]["kind"] = "changed"  # a copy: the trainer's state keeps its own
    assert state.described["sampler"]["kind"] == "groups"
    with pytest.raises(AttributeError, match="not readable in a callback"):
        view.progress  # noqa: B018
    with pytest.raises(AttributeError, match="read-only in a callback"):
        train_one_prepared(make_run(tmp_path, callbacks=["my_callbacks:WritesTheState"]), "clip", progress=False)


@pytest.mark.parametrize(("path", "message"), [
    ("my_callbacks", "write it as 'package.module:ClassName'"),
    ("no_such_package.module:Thing", "cannot import module 'no_such_package.module'"),
    ("my_callbacks:Missing", "module 'my_callbacks' has no 'Missing'; check the class name"),
    ("my_callbacks:NotACallback", "NotACallback is not a subclass of cglib.train.callbacks.Callback"),
])
def test_a_bad_callback_is_a_params_error_naming_the_fix(plugins, path, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        TrainParams(callbacks=[path])


def test_validating_a_callback_imports_neither_torch_nor_open_clip():
    """`train.callbacks` entries are imported and checked when params are validated, still without torch."""
    out = fresh_python("import sys; from cglib.config import TrainParams; "
                       "TrainParams(callbacks=['my_callbacks:StopAfterSteps']); "
                       "print([m for m in ('torch', 'open_clip') if m in sys.modules])", extra_path=PLUGINS)
    assert out.strip() == "[]"


def _imports_of(path: Path) -> set[str]:
    """Every cglib module a file imports, at the top, inside functions or under TYPE_CHECKING."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cglib"):
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("cglib")}
    return found


def test_the_training_package_has_no_import_cycle():
    """The trainer, its phases, the run summary and the callbacks read the state from a module below them: no
    module of cglib.train reaches itself again through its imports, counting those inside functions and under
    TYPE_CHECKING (which the layers contract leaves out)."""
    package = Path(__file__).resolve().parent.parent / "cglib" / "train"
    modules = {f"cglib.train.{p.relative_to(package).with_suffix('').as_posix().replace('/', '.')}"
               .removesuffix(".__init__"): p for p in package.rglob("*.py")}
    graph = {name: {m for m in _imports_of(path) if m in modules and m != name} for name, path in modules.items()}

    def reaches(start: str) -> bool:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module == start:
                return True
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
        return False

    assert {"cglib.train.trainer", "cglib.train.state", "cglib.train.callbacks"} <= set(graph)
    assert [m for m in sorted(graph) if reaches(m)] == []


def test_the_guides_example_callback_stops_on_a_flat_epoch(plugins):
    """book/architecture.md's StopWhenFlat, as written there: a 1% fall goes on, a 0.5% fall stops with its reason."""
    import my_callbacks

    source = (Path(__file__).parent.parent / "book" / "architecture.md").read_text(encoding="utf-8")
    example = source.split("class StopWhenFlat(Callback):", 1)[1].split("```", 1)[0].strip()
    plugin = Path(my_callbacks.__file__).read_text(encoding="utf-8")
    assert all(line.strip() in plugin for line in example.splitlines()), "the guide's example and the plugin differ"
    from cglib.train.callbacks import TrainControl

    for losses, stops in (([2.0, 1.9], False), ([2.0, 1.99], True), ([2.0], False)):
        control = TrainControl()
        view = StateView(TrainState(Progress(phase="train", epoch=len(losses) - 1, epoch_losses=losses)))
        my_callbacks.StopWhenFlat().on_epoch_end(view, control)
        assert control.should_training_stop is stops
    assert control.stop_reason == "" and "is flat" not in control.stop_reason
    control = TrainControl()
    my_callbacks.StopWhenFlat().on_epoch_end(StateView(TrainState(Progress(phase="train", epoch=1,
                                                                            epoch_losses=[2.0, 1.99]))), control)
    assert control.stop_reason == "epoch 1: loss 1.9900 is flat"
