#!/usr/bin/env python3
"""Where the time of a small collective goes: the native loop alone, the Python around it, the full path.

    .venv/bin/python benchmarks/call_overhead.py --nranks 2 --json overhead.json

Per rank count, two jobs (native executor on, and RINGFLOW_NATIVE=0), each timing an 8-byte
all-reduce (float32) with ringflow.runtime.bench.median_call_s (the slowest rank's median time per
call) in these ways:

* ``native loop``: the compiled native plan run directly (HotPlan.run): the floor of a call.
* ``hotpath.execute``: plus the Python that starts it and reads its result.
* ``same array``: ``comm.all_reduce(x, op="max")`` with the same x each time (the repeated-call fast path).
* ``new array``: ``comm.all_reduce(x, op="max")`` on a fresh array each time (the remembered call shape run at
  the new array's address), minus the time to make the array (measured alone).

Each row is a separate measurement; the differences between rows are the per-call overhead of each layer.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(out: str) -> None:
    """One rank: time each layer, write rank 0's rows."""
    import ringflow
    from ringflow.runtime.bench import median_call_s
    from ringflow.runtime.call import hotpath
    from ringflow.runtime.transport.manager import LANE_COLL
    comm = ringflow.init()
    x = np.ones(2, np.float32)
    buf = np.zeros(1)

    def slowest(v: float) -> float:
        buf[0] = v
        comm.all_reduce(buf, op="max")
        return float(buf[0])

    rows: dict[str, float] = {}

    def timed(name: str, call: object) -> None:
        rows[name] = median_call_s(call, comm.barrier, slowest, iters=30)[0] * 1e6  # type: ignore[arg-type]

    for _ in range(20):
        comm.all_reduce(x, op="max")
    timed("same array: comm.all_reduce(x)", lambda: comm.all_reduce(x, op="max"))
    # the remembered call, taken before the new arrays below crowd the repeated-call table
    fast = next((f for k, f in comm._mem.by_object.items() if k[0] == "all_reduce" and k[1] == id(x)), None)
    timed("making the array alone", lambda: np.ones(2, np.float32))
    timed("new array: comm.all_reduce(np.ones(2))", lambda: comm.all_reduce(np.ones(2, np.float32), op="max"))
    rows["new array: comm.all_reduce(np.ones(2))"] -= rows["making the array alone"]
    if fast is not None:
        ctx, hot, regions, bases = fast.ctx, fast.hot, comm._transport.regions, fast.bases
        hp, w = hot.steps.hp, comm._waiters[LANE_COLL]

        def loop() -> None:
            hp.reset()
            while (rc := hp.run(ctx.sig, 0, time.monotonic() + 60, w.bell.fd, w.hot_s, w.spin_s, *bases, b"")) \
                    == hotpath.RC_STALLED:   # a peer was descheduled: resume, as hotpath.run does
                pass
            if rc != hotpath.RC_DONE:
                raise RuntimeError(f"native loop ended with code {rc}")

        def execute_plain() -> None:
            ctx.deadline = time.monotonic() + 60
            hotpath.execute(hot, ctx, bases, regions.packed)

        timed("hotpath.execute", execute_plain)
        timed("native loop (HotPlan.run)", loop)
    if comm.rank == 0:
        Path(out).write_text(json.dumps(rows))
    comm.destroy()


def run_job(n: int, native: bool) -> dict[str, float]:
    """One job of n ranks; rank 0's rows."""
    with tempfile.TemporaryDirectory(prefix="rf-ovh-") as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, RINGFLOW_NATIVE="1" if native else "0")
        cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), sys.executable, __file__, "--worker", out]
        subprocess.run(cmd, env=env, check=True, timeout=600)
        return json.loads(Path(out).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", default="2,4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    result = {}
    for n in (int(v) for v in a.nranks.split(",")):
        for native in (True, False):
            rows = run_job(n, native)
            label = f"{n} ranks, native {'on' if native else 'off'}"
            result[label] = rows
            print(f"== {label}: 8-byte all_reduce, us per call (slowest rank's median)")
            for k, v in rows.items():
                print(f"  {k:<42}{v:>8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
