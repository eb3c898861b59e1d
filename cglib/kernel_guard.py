"""A notebook kernel that stops at once when the `cglib run` that started it dies.

papermill starts each kernel in a session of its own, so a kill of the runner's process group (a scheduler's
SIGKILL, `kill -- -PID`) does not reach it, and ipykernel notices a dead parent only by polling: a kernel left
behind went on sending paid LLM requests for about 15 s. The runner exports its PID (`RUNNER_PID_ENV`) and starts
its kernels with this module as an IPython extension (`KERNEL_ARGUMENTS`), which runs before the first cell:

- on Linux, the kernel asks the operating system to SIGKILL it when its parent dies (prctl PR_SET_PDEATHSIG): at
  once, whatever the kernel is doing (a C call holding the GIL included);
- elsewhere, or when the kernel's parent is not the runner, a daemon thread checks the runner's PID every 0.1 s.

A kernel started another way (Jupyter, VS Code) has no runner PID and is left alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

RUNNER_PID_ENV = "CGLIB_RUNNER_PID"
KERNEL_ARGUMENTS = ["--IPKernelApp.extensions=cglib.kernel_guard"]
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.1


def load_ipython_extension(ipython: object) -> None:
    """IPython's hook for `--IPKernelApp.extensions=cglib.kernel_guard`: guard this kernel when a runner started it."""
    runner = os.environ.get(RUNNER_PID_ENV)
    if runner:
        stop_with_runner(int(runner))


def stop_with_runner(runner_pid: int) -> None:
    """Make this process die as soon as process `runner_pid` does."""
    if sys.platform.startswith("linux") and os.getppid() == runner_pid:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != runner_pid:  # the runner died before the request took effect
                os.kill(os.getpid(), signal.SIGKILL)
            return
    threading.Thread(target=_watch, args=(runner_pid,), name="cglib-runner-watch", daemon=True).start()


def _watch(runner_pid: int) -> None:
    while True:
        try:
            os.kill(runner_pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (another user's process has taken its PID)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(POLL_S)
