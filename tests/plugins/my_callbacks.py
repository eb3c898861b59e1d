"""Training callbacks defined outside cglib, as a user would write them (tests/test_train_callbacks.py names them
in params as `train.callbacks: [my_callbacks:StopAfterSteps]` with this folder on the Python path)."""

from __future__ import annotations

from cglib.train.callbacks import Callback

SEEN: list[tuple[str, str, int, int]] = []  # (event, phase, epoch, global_step) of every call, in order


class RecordEvents(Callback):
    """Records every event it sees in SEEN (it only observes: not part of a run's spec)."""

    changes_result = False

    def _saw(self, event, state):
        SEEN.append((event, state.phase, state.epoch, state.global_step))

    def on_train_begin(self, state, control):
        self._saw("train_begin", state)

    def on_epoch_begin(self, state, control):
        self._saw("epoch_begin", state)

    def on_step_end(self, state, control):
        self._saw("step_end", state)

    def on_epoch_end(self, state, control):
        self._saw("epoch_end", state)

    def on_train_end(self, state, control):
        self._saw("train_end", state)


class StopAfterSteps(RecordEvents):
    """Records its events and asks to stop after `steps` optimizer steps (so its code is part of the run's spec)."""

    changes_result = True
    steps = 3

    def on_step_end(self, state, control):
        super().on_step_end(state, control)
        if state.global_step >= self.steps:
            control.stop(f"{self.steps} steps are enough")


class SaveAtStepTwo(Callback):
    """Asks for a checkpoint after optimizer step 2 (mid-epoch, where the built-in checkpoints write none)."""

    def on_step_end(self, state, control):
        if state.global_step == 2:
            control.save()


class WritesTheState(Callback):
    """Tries to change the run's position: the state it is given is read-only."""

    def on_step_end(self, state, control):
        state.global_step = 0


class QuietObserver(Callback):
    """Observes and changes nothing: declares it, so its code stays out of the run's spec."""

    changes_result = False


class ObserverThatStops(Callback):
    """Declares it only observes, then asks to stop: refused."""

    changes_result = False

    def on_step_end(self, state, control):
        control.stop("not mine to ask")


class NotACallback:
    """Referenced by a test to check the error for a class that does not subclass Callback."""


# The guide's example (book/architecture.md), verbatim: tests/test_train_callbacks.py keeps the two the same.
class StopWhenFlat(Callback):
    """End training once an image-text epoch improves the mean loss by less than 1%."""

    def on_epoch_end(self, state, control):
        losses = state.epoch_losses  # a tuple: the state is read-only
        if state.phase == "train" and len(losses) >= 2 and losses[-1] > 0.99 * losses[-2]:
            control.stop(f"epoch {state.epoch}: loss {losses[-1]:.4f} is flat")


class FailsAtTrainBegin(Callback):
    """Raises in its first hook: the run fails before its first step (tests/test_failed_run_account.py)."""

    def on_train_begin(self, state, control):
        raise RuntimeError("this callback refuses to start")
