"""Body of one wake-up measuring rank (run under `ringflow run -n 2`): one rank enters an 8-byte all-reduce
`delay` after the other, so the early rank spins past its window and sleeps on its doorbell.

    python -m ringflow run -n 2 -m ringflow.hostmodel._wake_worker SPEC.json OUT.json

SPEC: {"delays_us": [...], "reps": R}. Per trial both ranks leave a barrier, the late rank (alternating) busy-waits
`delay_us` (compute, not sleep), and each rank notes its call's start and end (CLOCK_MONOTONIC, shared by the
host's processes). Rank 0 writes one row per trial: delay_us, late rank, each rank's start_ns and end_ns.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from ..runtime.bench import rank_job_main


def _busy_wait(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def measure(comm: Any, spec: dict) -> list[dict]:
    """The trials of `spec` on this communicator; rank 0's rows (others: an empty list)."""
    n, rank = comm.size, comm.rank
    x = np.ones(1, np.float64)
    stamps = np.zeros(2 * n, np.float64)
    rows = []
    delays = [float(d) for d in spec["delays_us"]]
    for _ in range(3):   # warm the plan and the connections
        comm.all_reduce(x, "sum")
    trials = [(d, i % n) for i in range(int(spec["reps"])) for d in delays]
    for d_us, late in trials:
        comm.barrier()
        if rank == late:
            _busy_wait(d_us / 1e6)
        t0 = time.monotonic_ns()
        comm.all_reduce(x, "sum")
        t1 = time.monotonic_ns()
        stamps[:] = 0.0
        stamps[2 * rank], stamps[2 * rank + 1] = t0, t1
        comm.all_reduce(stamps, "sum")
        if rank == 0:
            rows.append({"delay_us": d_us, "late": late, "start_ns": [int(stamps[2 * r]) for r in range(n)],
                         "end_ns": [int(stamps[2 * r + 1]) for r in range(n)]})
    return rows


if __name__ == "__main__":
    rank_job_main(measure, sys.argv[1:])
