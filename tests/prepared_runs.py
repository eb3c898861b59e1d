"""Training as `python -m cglib.train` and notebook 05 call it: the runs' inputs prepared first (cglib.prepare),
then trained on what was prepared."""

from __future__ import annotations

from typing import Any

from cglib.prepare import prepare_inputs
from cglib.run import RunContext
from cglib.train import train_all, train_one


def train_one_prepared(run: RunContext, name: str, **kwargs: Any) -> dict[str, Any]:
    """train_one(run, name, ...) on the inputs prepared for run `name` under the run's training seed."""
    prepared = prepare_inputs(run, [name], [run.training_seed], progress=False, info=kwargs.get("info"))
    return train_one(run, name, prepared=prepared, **kwargs)


def train_all_prepared(run: RunContext, names: list[str] | None = None, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """train_all(run, prepared, names, ...) on the inputs prepared for `names` and the seeds it trains."""
    prepared = prepare_inputs(run, names, kwargs.get("seeds"), progress=False, info=kwargs.get("info"))
    return train_all(run, prepared, names, **kwargs)
