"""The suite's own hygiene: what one test sets in the pytest process does not reach the next test or its kernels."""

from __future__ import annotations

import os

import torch
from conftest import OMP_NUM_THREADS_AT_START, TORCH_THREADS, process_settings_restored

from cglib.run import set_threads


def test_settings_changed_inside_are_given_back():
    """set_threads(1), as start_run does for run.threads: 1, sets OMP_NUM_THREADS (for the processes a run starts)
    and torch's thread count; on leaving both are as before, and so is any other variable set inside."""
    before = os.environ.get("OMP_NUM_THREADS")
    with process_settings_restored():
        set_threads(1)
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == (before or "1")
        os.environ["CGLIB_SOMETHING_A_TEST_SET"] = "1"
    assert torch.get_num_threads() == TORCH_THREADS
    assert os.environ.get("OMP_NUM_THREADS") == before
    assert "CGLIB_SOMETHING_A_TEST_SET" not in os.environ


def test_a_test_that_starts_a_single_thread_run_here():
    """What the suite's in-process training tests do (run.threads: 1); nothing gives it back in this test."""
    set_threads(1)
    assert torch.get_num_threads() == 1


def test_the_next_test_starts_with_the_sessions_threads():
    """Runs after the test above (pytest keeps a file's order): the autouse fixture gave its settings back, so
    this test, and any kernel it would start, has the session's threads."""
    assert torch.get_num_threads() == TORCH_THREADS
    assert os.environ.get("OMP_NUM_THREADS") == OMP_NUM_THREADS_AT_START
