"""The per-step record of a run: `log.csv` (LOG_COLUMNS) and TensorBoard scalars."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

LOG_COLUMNS = ["phase", "epoch", "step", "global_step", "loss", "inner", "outer", "lr", "grad_norm",
               "images_per_s", "data_wait_s", "step_s", "fallback_groups", "repeated_images", "skipped", "wall_s",
               # train.epoch: pairs_as_published only: 1 when the authors' loader item was empty (no update)
               "empty",
               # loss: re runs only (cglib.train.re_run): the RE loss's parts, exterior angles in radians
               "re_mean", "re_minimax", "re_reg", "re_angle_pos", "re_angle_neg"]


class RunLog:
    """Per-step CSV rows and TensorBoard scalars; on resume, rows after the checkpoint are dropped."""

    def __init__(self, out: Path, enabled: bool, resume_global_step: int | None, log_every: int) -> None:
        self.enabled, self.log_every = enabled, log_every
        self.path = out / "log.csv"
        self.window: dict[str, list[float]] = {}
        self.writer = None
        if not enabled:
            return
        keep: list[dict[str, str]] = []
        if resume_global_step is not None and self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as f:
                keep = [r for r in csv.DictReader(f) if int(r["global_step"]) <= resume_global_step]
        with self.path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, LOG_COLUMNS)
            w.writeheader()
            w.writerows(keep)
        self.file = self.path.open("a", newline="", encoding="utf-8")
        self.csv = csv.DictWriter(self.file, LOG_COLUMNS)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=(resume_global_step or 0) + 1)

    def row(self, row: dict[str, Any]) -> None:
        """Append one step's row; every `log_every` steps write window means to TensorBoard."""
        if not self.enabled:
            return
        self.csv.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
        self.file.flush()  # a killed attempt's log then holds every step it did: a resume counts what it repeats
        for key in ("loss", "inner", "outer", "lr", "grad_norm", "images_per_s", "data_wait_s", "re_mean",
                    "re_minimax", "re_reg", "re_angle_pos", "re_angle_neg"):
            if isinstance(row.get(key), float) and math.isfinite(row[key]):
                self.window.setdefault(key, []).append(row[key])
        if row["global_step"] % self.log_every == 0:
            for key, values in self.window.items():
                self.writer.add_scalar(f"{row['phase']}/{key}", float(np.mean(values)), row["global_step"])
            self.window = {}

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.writer.close()


def logged_steps(path: Path, after: int = 0) -> int:
    """Optimizer steps a log.csv records after global step `after` (0 when there is no log)."""
    if not path.is_file():
        return 0
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        return sum(1 for r in csv.DictReader(f) if (r.get("global_step") or "").isdigit()
                   and int(r["global_step"]) > after)
