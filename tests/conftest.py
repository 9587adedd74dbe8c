"""Shared test set-up: the resilience tests' rank-side programs and their shared-memory leak check,
busy-looping processes for the host-load tests, and collecting the output of rank processes."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
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


@pytest.fixture
def busy_loops() -> Iterator[Callable[[int], None]]:
    """`busy_loops(n)` starts n processes that spin on a core each until the test ends (other work the
    host-load meter must see); they are killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(n: int) -> None:
        procs.extend(subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n))

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def outputs_of(procs: list[subprocess.Popen], timeout_s: float,
               ok: Callable[[subprocess.Popen, str], bool] = lambda p, err: p.returncode == 0) -> list[str]:
    """The stdout of every rank process (text mode) once it ended `ok`; a rank that failed fails the test with its
    output; processes still running when the test stops are killed."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout_s)
            assert ok(p, err), f"rank failed (rc {p.returncode}):\n{out}\n{err[-4000:]}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs
