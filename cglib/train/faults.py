"""Fault handling of a training run, in one place: interruptions, non-finite steps, resuming elsewhere.

- Ctrl-C (SIGINT) and SIGTERM (a scheduler's or `kill`'s stop) both end a run with a checkpoint of the last
  completed optimizer step: SIGTERM is turned into `Terminated`, a KeyboardInterrupt, for the length of a run,
  and both signals are held back during a parameter update so a checkpoint never sees half-updated weights.
- A step whose gradients are not finite is skipped, not taken and not fatal: under fp16 GradScaler skips it
  itself (and lowers its scale); under bf16 or fp32 the stepper skips it the same way. Skipped steps are
  counted in the log (`skipped`) and in the summary (`skipped_steps`).
- A checkpoint stores the resolved device type and AMP dtype; resuming it under another one is an error naming
  both (the optimizer and scaler states, and the bit-exact resume, only hold on the same kind of device).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during training: handled like Ctrl-C (checkpoint, then stop)."""


def _raise_for(signum: int) -> None:
    raise Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt


@contextmanager
def checkpoint_on_signals() -> Iterator[None]:
    """During a run, SIGTERM raises `Terminated` (as Ctrl-C raises KeyboardInterrupt), so both checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _raise_for(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def defer_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during a parameter update; the first one caught is raised after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        _raise_for(caught[0])


def finite(value: torch.Tensor | float) -> bool:
    """True when a gradient norm (or loss) is a finite number."""
    return bool(torch.isfinite(torch.as_tensor(value)).all())


def resolved_precision(device: torch.device, amp: torch.dtype | None) -> dict[str, str]:
    """What a checkpoint records about where it was trained: device type and AMP dtype ('off' for fp32)."""
    return {"device": device.type, "amp": str(amp).replace("torch.", "") if amp is not None else "off"}


def check_resume_precision(path: Any, saved: dict[str, str] | None, now: dict[str, str]) -> None:
    """Refuse to resume a checkpoint under another device type or AMP dtype, naming both."""
    if saved is None or saved == now:
        return
    raise ValueError(f"{path} was trained on device {saved['device']} with amp {saved['amp']}, but this run resolves "
                     f"to device {now['device']} with amp {now['amp']}; resume it with the same run.device and "
                     "train.amp, or set train.resume: false to start over")
