"""A run that failed is on record: `training/<name>/failed.json` (or `training/seed<k>/<name>/`), written when
training the run raised, removed when the run is trained. The run accounts (`cglib.accounts`) name the failed run
with its reason, instead of counting only the models that happen to be in the folder."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from cglib.run import write_json

FAILED = "failed.json"


def record_failure(out: Path, name: str, training_seed: int, exc: BaseException) -> Path:
    """Write `out/failed.json`: the run, its training seed, when it failed and why (the exception, one line)."""
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return write_json(Path(out) / FAILED, {"name": name, "training_seed": training_seed, "error": reason,
                                           "failed": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def clear_failure(out: Path) -> None:
    """The run is trained: an earlier failure of it is no longer its state."""
    (Path(out) / FAILED).unlink(missing_ok=True)
