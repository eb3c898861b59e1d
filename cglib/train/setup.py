"""What a run is set up with before its first step and keeps unchanged to its end (`RunSetup`).

The trainer builds it; the phases (phases.py) and the run summary (summary.py) read it beside the run's changing
`TrainState` (state.py) and its model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cglib.config import Params, TrainParams, TrainRunParams
from cglib.distributed import DistInfo
from cglib.run import RunContext
from cglib.train.checkpoint import RunFiles
from cglib.train.inputs import TrainInputs
from cglib.train.objectives import Objective


@dataclass(frozen=True)
class RunSetup:
    """One train.runs entry's fixed context: run (the RunContext: params, folders, seeds), entry, inputs (magic.json
    and image cache), info (the process's rank and device), spec (what determines the result; its hash names the
    run's files), files (RunFiles: where weights and checkpoints go), objective (the run's objective module, on the
    device), amp (the autocast dtype, None: fp32), progress_bars (show them)."""

    run: RunContext
    entry: TrainRunParams
    inputs: TrainInputs
    info: DistInfo
    spec: dict[str, Any]
    files: RunFiles
    objective: Objective
    amp: torch.dtype | None
    progress_bars: bool

    @property
    def params(self) -> Params:
        return self.run.params

    @property
    def t(self) -> TrainParams:
        return self.run.params.train

    @property
    def device(self) -> torch.device:
        return self.info.device
