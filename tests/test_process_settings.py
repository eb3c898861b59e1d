"""The suite's own hygiene: what one test sets in the pytest process does not reach the next test or its kernels."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import THREAD_VARIABLES_AT_START, TORCH_THREADS, process_settings_restored

from cglib.run import set_threads


def test_settings_changed_inside_are_given_back():
    """set_threads(1), as start_run does for run.threads: 1, sets OMP_NUM_THREADS (for the processes a run starts)
    and torch's thread count; on leaving both are as at the session's start, and any other variable set inside is
    gone."""
    with process_settings_restored():
        set_threads(1)
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == (THREAD_VARIABLES_AT_START["OMP_NUM_THREADS"] or "1")
        os.environ["CGLIB_SOMETHING_A_TEST_SET"] = "1"
    assert torch.get_num_threads() == TORCH_THREADS
    assert os.environ.get("OMP_NUM_THREADS") == THREAD_VARIABLES_AT_START["OMP_NUM_THREADS"]
    assert "CGLIB_SOMETHING_A_TEST_SET" not in os.environ


@pytest.fixture(scope="module")
def single_thread_module_run() -> None:
    """What a module fixture that trains in this process does (run.threads: 1): set up before a test's own
    fixtures, so a test's snapshot of the environment already holds its setting."""
    set_threads(1)


def test_a_module_fixture_and_a_test_start_single_thread_runs_here(single_thread_module_run):
    set_threads(1)
    assert torch.get_num_threads() == 1 and os.environ.get("OMP_NUM_THREADS")


def test_the_next_test_starts_with_the_sessions_threads():
    """Runs after the test above (pytest keeps a file's order): its settings and its module fixture's are given
    back, so this test, and any kernel it would start, has the session's threads."""
    assert torch.get_num_threads() == TORCH_THREADS
    assert os.environ.get("OMP_NUM_THREADS") == THREAD_VARIABLES_AT_START["OMP_NUM_THREADS"]
