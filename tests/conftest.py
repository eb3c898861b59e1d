"""Shared fixtures: the real data beside the repo (skipped with a reason when absent), offline HF settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("CGLIB_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real data folder (HierarCaps 1K, COCO captions); skips the test when it is absent."""
    if not (SHARED_DATA / "hierarcaps" / "hierarcaps_test.csv").is_file():
        pytest.skip(f"real data not found at {SHARED_DATA} (set CGLIB_SHARED_DATA to the shared/data folder)")
    return SHARED_DATA
