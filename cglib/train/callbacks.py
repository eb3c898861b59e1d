"""What the training loop does after every epoch of a phase, as callbacks (`Trainer.callbacks`).

The loop (`Trainer.run_phase`) calls `epoch_end(trainer, phase)` of each callback in order once an epoch's mean
loss is recorded and the position marked; what happens after every optimizer step belongs to the phase's
objective (`Objective.after_step`, e.g. a memory's commit), inside the step's interrupt-proof section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cglib.train.phases import Phase
    from cglib.train.trainer import Trainer


class Callback:
    """Base class: override `epoch_end`."""

    def epoch_end(self, trainer: Trainer, phase: Phase) -> None:
        """After an epoch of `phase` (trainer.state.epoch epochs done)."""


class Checkpoints(Callback):
    """last.pt at every epoch end (and, with train.keep_epoch_weights, the epoch's weights of the phases whose
    epochs are the run's: RE and image-text)."""

    def epoch_end(self, trainer: Trainer, phase: Phase) -> None:
        trainer.save_boundary()
        if phase.keep_epoch_weights:
            trainer.files.save_epoch_weights(trainer.bundle, trainer.state.epoch)


class EpochHook(Callback):
    """`hook(epochs_done, bundle)` after each image-text epoch's checkpoint (the hyper-parameter search scores the
    validation split there, and may stop the run by raising optuna.TrialPruned)."""

    def __init__(self, hook: Callable[[int, Any], None]) -> None:
        self.hook = hook

    def epoch_end(self, trainer: Trainer, phase: Phase) -> None:
        if phase.image_text:
            self.hook(trainer.state.epoch, trainer.bundle)
