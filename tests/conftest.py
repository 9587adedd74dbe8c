"""Shared test set-up: the resilience tests' rank-side programs and their shared-memory leak check."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/resilience_ranks.py: the rank side of the fault tests


@pytest.fixture
def no_leaked_shared_memory():
    """The test's ringflow jobs leave no /dev/shm names behind."""
    from resilience_ranks import Job, take_leaked_names

    since = len(Job.all_ids)
    yield
    leaked = take_leaked_names(since)
    assert not leaked, f"shared-memory names left behind: {leaked}"
