"""Body of one measuring rank (run under `ringflow run`): time explicit schedules with the bench's timing loop.

    python -m ringflow run -n N -m ringflow.hostmodel._sweep_worker SPEC.json OUT.json

SPEC: {"tasks": [{"collective", "algorithm", "nsegs", "nchannels", "size_bytes"}, ...], "dtype",
"warmup", "iters", "passes", "quick"}. Every task's samples are split over `passes` sweeps of all tasks, so
tasks listed side by side (e.g. two schedules of one call) are timed interleaved and meet the same host
noise. Rank 0 writes one row per task: the task, the schedule that ran, `time_us` (median over samples).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..runtime.bench import _fill, call_samples_s, rank_job_main
from .sweep import INPLACE, schedule_for


def _buffers(comm: Any, cache: dict, coll: str, nelem: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    key = (coll, nelem)
    if key not in cache:
        if len(cache) > 4:
            cache.clear()
        cache[key] = _fill(comm, coll, nelem, dtype, False)
    return cache[key]


def measure(comm: Any, spec: dict) -> list[dict]:
    """Time every task of `spec` on this communicator; rank 0's rows (others: an empty list)."""
    n = comm.size
    dtype = np.dtype(spec.get("dtype", "float32"))
    passes = max(1, int(spec.get("passes") or 1))
    timer = np.zeros(1, np.float64)
    tasks = spec["tasks"]
    scheds = [schedule_for(t, n) for t in tasks]
    samples: list[list[float]] = [[] for _ in tasks]
    per_pass: list[list[float]] = [[] for _ in tasks]
    cache: dict = {}

    def slowest(seconds: float) -> float:
        timer[0] = seconds
        comm.all_reduce(timer, "max")
        return float(timer[0])

    for _ in range(passes):
        for i, (t, s) in enumerate(zip(tasks, scheds, strict=True)):
            coll = t["collective"]
            nelem = int(t["size_bytes"]) // dtype.itemsize
            if Collective.parse(coll).per_rank_sized:
                nelem -= nelem % n
            if nelem == 0:
                continue
            x, out = _buffers(comm, cache, coll, nelem, dtype)
            target = None if coll in INPLACE else out

            def call(s: object = s, x: object = x, target: object = target) -> None:
                comm.execute(s, x, target, "sum")
            with np.errstate(all="ignore"):
                got = call_samples_s(call, comm.barrier, slowest, warmup=int(spec.get("warmup", 3)),
                                     iters=int(spec.get("iters") or 0), quick=bool(spec.get("quick")), share=passes)
            samples[i].extend(got)
            per_pass[i].append(1e6 * float(np.median(got)))
    rows = []
    if comm.rank == 0:
        for t, s, got, pp in zip(tasks, scheds, samples, per_pass, strict=True):
            if not got:
                continue
            size = (int(t["size_bytes"]) // dtype.itemsize)
            if Collective.parse(t["collective"]).per_rank_sized:
                size -= size % n
            rows.append({**t, "nranks": n, "size_bytes": size * dtype.itemsize, "itemsize": dtype.itemsize,
                         "schedule": {"algorithm": s.algorithm, "nchannels": s.nchannels},
                         "inplace": t["collective"] in INPLACE, "time_us": 1e6 * float(np.median(got)),
                         "samples": len(got), "pass_us": pp})
    return rows


if __name__ == "__main__":
    rank_job_main(measure, sys.argv[1:])
