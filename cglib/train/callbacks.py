"""Callbacks: code that runs at fixed points of training, sees its state and may ask the trainer to stop or save.

The trainer (trainer.py) calls every callback's method of an event, in order:

    on_train_begin   before the first step of this attempt (a resumed run: at its checkpoint's position)
    on_epoch_begin   before an epoch of a phase (pretrain, re, train) starts or resumes
    on_step_end      after every optimizer step, once it is counted and logged
    on_epoch_end     after an epoch's mean loss is recorded
    on_evaluate      after the trainer scored the model at an image-text epoch's end (only when the caller gave it
                     a scorer, e.g. the hyper-parameter search: `metrics` is what the scorer returned)
    on_train_end     after the last step (also when a callback stopped the run), before the final weights

Each method receives `state`, a read-only `StateView` of the run's `TrainState` (state.py: phase, epoch, step,
global_step, epoch_losses, last_step, ...; assigning to it raises), and `control`, a `TrainControl` with which it
asks the trainer for something: `control.stop(reason)` ends training after this event (the run's final weights are
the current ones and summary.json says who stopped it where), `control.save()` writes the checkpoint of the last
completed step (last.pt) after this event. A callback never sees the trainer or the model.

A params file names its own callbacks as `train.callbacks: [package.module:ClassName]`: subclasses of `Callback`
built with no arguments, one per run, called after the built-in ones (`Checkpoints`). Such a callback may stop a run,
so its code is part of the run's identity (`Callback.changes_result`).

Plain Python (no torch): params validation imports this module to check `train.callbacks`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cglib.plugins import load_plugin
from cglib.train.state import TrainState


class StateView:
    """Read-only view of a run's `TrainState`: its fields, then those of its `progress` (so `state.global_step`
    reads `progress.global_step`); lists come back as tuples and dicts as read-only mappings."""

    __slots__ = ("_state",)

    def __init__(self, state: TrainState) -> None:
        object.__setattr__(self, "_state", state)

    def __getattr__(self, name: str) -> Any:
        state = object.__getattribute__(self, "_state")
        if name.startswith("_") or name == "progress":  # its fields are read through the view itself
            raise AttributeError(f"the training state's {name!r} is not readable in a callback; read its fields "
                                 "directly (state.global_step, state.epoch_losses, ...)")
        if hasattr(state, name):
            value = getattr(state, name)
        elif hasattr(state.progress, name):
            value = getattr(state.progress, name)
        else:
            raise AttributeError(f"the training state has no {name!r}; see cglib.train.state.TrainState and "
                                 "Progress for what it holds")
        if isinstance(value, list):
            return tuple(value)
        if isinstance(value, Mapping):  # a copy: a nested dict of the view must not reach the trainer's
            return MappingProxyType(copy.deepcopy(dict(value)))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the training state is read-only in a callback (tried to set {name!r}); ask the "
                             "trainer through `control` instead: control.stop(reason) ends training, control.save() "
                             "writes a checkpoint")

    __delattr__ = __setattr__  # type: ignore[assignment]

    def __repr__(self) -> str:
        p = object.__getattribute__(self, "_state").progress
        return f"StateView(phase={p.phase!r}, epoch={p.epoch}, step={p.step}, global_step={p.global_step})"


class TrainControl:
    """What callbacks ask of the trainer; the trainer reads it after each event and resets `should_save`."""

    def __init__(self) -> None:
        self.should_training_stop = False
        self.stop_reason = ""
        self.should_save = False

    def stop(self, reason: str) -> None:
        """End training after this event; `reason` goes into summary.json (`stopped`)."""
        if not self.should_training_stop:  # the first reason given is the one recorded
            self.should_training_stop, self.stop_reason = True, reason

    def save(self) -> None:
        """Write the checkpoint of the last completed optimizer step (last.pt) after this event."""
        self.should_save = True


class Callback:
    """Base class: override the events you need (all do nothing here).

    `changes_result`: whether the callback may change the run's weights (by `control.stop`). A params file's
    callbacks that may enter the run's spec by their code's digest (cglib.train.inputs.code_digests), so an edited
    callback retrains the runs it shaped. One that only observes (logs, plots) sets it False: it then leaves the
    spec, and asking to stop raises."""

    changes_result = True

    def on_train_begin(self, state: StateView, control: TrainControl) -> None:
        """Before the first step of this attempt."""

    def on_epoch_begin(self, state: StateView, control: TrainControl) -> None:
        """Before epoch `state.epoch` of phase `state.phase` starts (or resumes at batch `state.batch`)."""

    def on_step_end(self, state: StateView, control: TrainControl) -> None:
        """After optimizer step `state.global_step` (its log row: `state.last_step`)."""

    def on_epoch_end(self, state: StateView, control: TrainControl) -> None:
        """After an epoch of `state.phase` (`state.epoch` epochs of it done)."""

    def on_evaluate(self, state: StateView, control: TrainControl, metrics: Mapping[str, Any]) -> None:
        """After the caller's scorer scored the model at an image-text epoch's end."""

    def on_train_end(self, state: StateView, control: TrainControl) -> None:
        """After the last step (or the step a callback stopped at), before the final weights are written."""


class Checkpoints(Callback):
    """last.pt at every epoch end (the trainer then also keeps the epoch's weights with train.keep_epoch_weights,
    in the phases whose epochs are the run's: RE and image-text)."""

    changes_result = False

    def on_epoch_end(self, state: StateView, control: TrainControl) -> None:
        control.save()


def load_callback(path: str) -> type[Callback]:
    """The callback class a params file names (`train.callbacks`); a ValueError naming the fix otherwise."""
    return load_plugin(path, Callback, "train.callbacks entry",
                       "subclass cglib.train.callbacks.Callback and override its on_* methods")
