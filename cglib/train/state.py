"""The one record of a run while it trains: where it is, what it counted, what its phases described.

`TrainState` is built and changed by the trainer alone (trainer.py). The phases (phases.py) write what the run
summary should say about them into `described` and `warmup_used`; the run summary (summary.py) reads it at the end;
callbacks (callbacks.py) see it through a read-only view. `Progress` is the part a checkpoint saves and a resumed
run restores; the rest belongs to this attempt.

Plain Python (no torch): params validation imports the callbacks' base class, which reads this module.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """Position and counters of a run (all saved in the checkpoint)."""

    phase: str = "pretrain"
    epoch: int = 0
    batch: int = 0  # next batch index within the epoch
    step: int = 0  # optimizer steps done in this phase
    global_step: int = 0  # optimizer steps over both phases
    pretrain_steps: int = 0
    wall_s: float = 0.0
    images: int = 0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    fallback_batches: int = 0
    repeated_images: int = 0
    skipped_steps: int = 0  # optimizer steps skipped for non-finite gradients (faults.py)
    empty_steps: int = 0  # steps of the authors' epoch whose loader item was empty: skipped, no update (epochs.py)
    epoch_losses: list[float] = field(default_factory=list)
    epoch_sum: float = 0.0
    epoch_count: int = 0
    pretrain_losses: list[float] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def count(self, result: dict[str, float]) -> None:
        """Count one completed optimizer step; a skipped step's (non-finite) loss and an empty step's (none) stay
        out of the epoch mean."""
        self.step, self.global_step = self.step + 1, self.global_step + 1
        if result.get("empty"):
            self.empty_steps += 1
        elif result.get("skipped"):
            self.skipped_steps += 1
        elif math.isfinite(result["loss"]):
            self.epoch_sum, self.epoch_count = self.epoch_sum + result["loss"], self.epoch_count + 1


def _steps_and_epochs() -> dict[str, int]:
    return {"steps": 0, "epochs": 0}


@dataclass
class TrainState:
    """Everything a run knows about itself while it trains.

    progress: position and counters (checkpointed). run: the train.runs entry's name. is_main: this process is
    rank 0 (the one that writes files; every rank trains and sees every event). started: the
    `time.perf_counter()` origin of the run's wall clock (a resumed run's origin lies before this attempt, by the
    checkpoint's wall time). resumed_from: the optimizer step a checkpoint resumed at (None: from the start).
    kept / trained_now: optimizer steps and epochs the checkpoint kept and this attempt trained; repeated_steps:
    steps an earlier, killed attempt did past its checkpoint (done again now). warmup_used: each phase's warmup.
    described: what the phases tell the run summary (sampler, pretraining, re_training, precomputed_texts).
    weights_source: trained here, or the authors' released weights. last_step: the latest optimizer step's
    log.csv row. stopped: why and where a callback stopped the run (None: it ran to its end).
    """

    progress: Progress
    run: str = ""
    is_main: bool = True
    started: float = 0.0
    resumed_from: int | None = None
    kept: dict[str, int] = field(default_factory=_steps_and_epochs)
    trained_now: dict[str, int] = field(default_factory=_steps_and_epochs)
    repeated_steps: int = 0
    warmup_used: dict[str, int] = field(default_factory=dict)
    described: dict[str, Any] = field(default_factory=dict)
    weights_source: dict[str, Any] = field(default_factory=dict)
    last_step: dict[str, Any] = field(default_factory=dict)
    stopped: dict[str, Any] | None = None

    def elapsed_s(self) -> float:
        """Wall time of the run so far (over all its attempts)."""
        return time.perf_counter() - self.started

    def epochs_done(self) -> int:
        """Epochs of every phase completed so far."""
        return len(self.progress.epoch_losses) + len(self.progress.pretrain_losses)
