#!/usr/bin/env python3
"""What a shift step costs against a pair exchange, and what a pairwise all-to-all is made of.

    RINGFLOW_SHM_DISABLE=1 RINGFLOW_CHECKS_DISABLE=1 .venv/bin/ringflow run -n 4 benchmarks/shift_steps.py --json shift.json

Every rank of the job runs the same hand-built steps (`comm.execute`, one message per rank per step, no
argument check) and the all-to-all and all-gather calls, interleaved over `--rounds` rounds so all of them
see the same drift, timed as nccl-tests times them (`runtime.bench.median_call_s`). Rows: message size,
then the median over rounds of: one exchange in pairs (r <-> r + n/2), one shift by 1 (r -> r + 1), one
shift by n - 1, the pairwise all-to-all's own steps (shifts by 1 .. n - 1), the same shift by 1 n - 1
times (a ring), the exchange n - 1 times, and the all-to-all and all-gather calls on n such messages.
The simulator prices shift steps from the calibration's shift over its exchange (docs/simulator.md,
twenty-ninth session); this shows the ratio on the host at hand.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ringflow  # noqa: E402
from ringflow.algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder  # noqa: E402
from ringflow.runtime.bench import median_call_s  # noqa: E402
from ringflow.units import format_size, parse_size  # noqa: E402


def _steps(n: int, name: str, shifts: list[int]):
    """A schedule of one step per shift distance: rank r sends its buffer to r + k, receives from r - k."""
    lay = {Buffer.IN: BufferLayout(1), Buffer.OUT: BufferLayout(1)}
    b = ScheduleBuilder("all_reduce", n, name, layouts=lay)
    for step, k in enumerate(shifts):
        for r in range(n):
            b.transfer(step, r, (r + k) % n, ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0))
    return b.build()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64KiB,128KiB,256KiB,1MiB", help="message sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (their median counts)")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args()
    comm = ringflow.init()
    n = comm.size
    if n < 3 or n % 2:
        raise SystemExit("run on an even number of ranks, 4 or more: `ringflow run -n 4 ...`")
    sched = {"exchange": _steps(n, "exchange", [n // 2]), "shift_1": _steps(n, "shift1", [1]),
             f"shift_{n - 1}": _steps(n, "shiftm1", [n - 1]),
             "pairwise_steps": _steps(n, "pairwise", list(range(1, n))),
             "ring_steps": _steps(n, "ring", [1] * (n - 1)), "exchange_steps": _steps(n, "exch", [n // 2] * (n - 1))}
    timer = np.zeros(1)

    def slowest(s: float) -> float:
        timer[0] = s
        comm.all_reduce(timer, "max")
        return float(timer[0])

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    got: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for nb in sizes:
            x, y = np.ones(nb // 4, np.float32), np.zeros(nb // 4, np.float32)
            a, o = np.ones(n * nb // 4, np.float32), np.zeros(n * nb // 4, np.float32)
            calls = {k: (lambda s=s: comm.execute(s, x, y)) for k, s in sched.items()}
            calls["all_to_all"] = lambda: comm.all_to_all(a, o)
            calls["all_gather"] = lambda: comm.all_gather(x, o)
            for k, call in calls.items():
                got.setdefault((nb, k), []).append(1e6 * median_call_s(call, comm.barrier, slowest, iters=6)[0])
    if comm.rank == 0:
        keys = list(sched) + ["all_to_all", "all_gather"]
        rows = [{"message_bytes": nb, **{f"{k}_us": float(np.median(got[(nb, k)])) for k in keys}} for nb in sizes]
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"{n} ranks, medians of {args.rounds} rounds (us)")
        for col in ["message"] + keys + ["shift_1 / exchange"]:
            t.add_column(col.replace("_", " "), justify="right")
        for r in rows:
            ratio = r["shift_1_us"] / r["exchange_us"]
            t.add_row(format_size(r["message_bytes"]), *[f"{r[f'{k}_us']:.0f}" for k in keys], f"{ratio:.2f}")
        Console(width=200).print(t)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"nranks": n, "rounds": args.rounds, "rows": rows}, fh, indent=1)
    comm.destroy()


if __name__ == "__main__":
    main()
