#!/usr/bin/env python3
"""Where the time of a small collective goes: the native loop alone, the Python around it, the full path.

    .venv/bin/python benchmarks/call_overhead.py --nranks 2 --json overhead.json
    .venv/bin/python benchmarks/call_overhead.py --nranks 2 --parts --collectives all_reduce,broadcast

Per rank count and collective (``--collectives``: all_reduce, broadcast), two jobs (native executor on, and
RINGFLOW_NATIVE=0), each timing an 8-byte call (float32; all_reduce with op="max", broadcast from rank 0) with
ringflow.runtime.bench.call_samples_s (rows: the median over samples of the slowest rank's time per call) in
these ways:

* ``native loop``: the compiled native plan run directly (HotPlan.run): the floor of a call.
* ``hotpath.execute``: plus the Python that starts it and reads its result.
* ``same array``: the call with the same x each time (the repeated-call fast path).
* ``new array``: the call on a fresh array each time (the remembered call shape run at
  the new array's address), minus the time to make the array (measured alone).

Each row is a separate measurement; the differences between rows are the per-call overhead of each layer.

``--parts`` adds, for the native job, the breakdown of the repeated call (same array) into its layers, and the
waits' counters of the native module (`_hotpath.stats`, this thread's) over the rows that exchange:

* ``Python entry and the door's checks`` (CPU time, local): the collective's own Python up to its door and
  every check the door makes in C before it runs the plan (failed or destroyed communicator, recorder, queued
  asynchronous call, owning thread, op, timeout, plan, both arrays' state), timed with ``Door.checks`` in place
  of ``Door.call`` (the bookkeeping it skips is a few dictionary stores).
* ``C call and identity check`` (CPU time, local): ``Runner.go`` on another array, which returns before reading
  any state (the array-state re-check adds one memcmp of about 40 bytes).
* ``native loop``: ``Runner.repeat`` (the plan run n times in C, no Python between calls; its best sample),
  split into ``waiting for the peer's flag`` (time inside the native waits, this rank's median per call: the
  peer's message crossing cores plus the ranks' skew) and ``own work`` (the rest: slot copy, header words,
  reduction, bookkeeping).
* ``flight recorder``: the same call timed with the communicator's recorder and with it set aside, in turns (best
  samples): what recording each call costs (on by default under ``ringflow run``; ``RINGFLOW_FLIGHT_RECORDER=0``
  turns it off, and the row reads about 0).
* ``rest``: the full call (its best sample) minus the entry, the recorder and the native loop (the GIL's release and
  return, skew and scheduling between two Python processes, measurement noise).
* per call: native waits, sleeps on the doorbell (syscalls, each a wake-up), doorbells rung for a sleeping peer,
  counted in separate passes (reading the counters around each call costs microseconds, kept out of every time).
CPU-time rows are robust to other load on the machine; the wall-time rows are not (compare within one run).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


ARGS = {"all_reduce": "max", "broadcast": 0}   # each collective's op or root, as its door takes it


def collective_call(comm: object, coll: str) -> Callable[[np.ndarray], object]:
    """The timed call of `coll` on an array (all_reduce with op="max", broadcast from rank 0)."""
    if coll == "all_reduce":
        return lambda a: comm.all_reduce(a, op="max")   # type: ignore[attr-defined]
    return lambda a: comm.broadcast(a, root=0)   # type: ignore[attr-defined]


def worker(out: str, parts: bool, coll: str) -> None:
    """One rank: time each layer of `coll`, write rank 0's rows."""
    import ringflow
    from ringflow.runtime import native
    from ringflow.runtime.bench import call_samples_s
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

    best: dict[str, float] = {}   # the best sample of each row (--parts: robust to other load on the machine)

    def timed(name: str, call: object, per: int = 1) -> None:
        samples = call_samples_s(call, comm.barrier, slowest, iters=30)  # type: ignore[arg-type]
        rows[name] = float(np.median(samples)) * 1e6 / per
        best[name] = min(samples) * 1e6 / per

    def counted(name: str, call: object, per: int = 1) -> dict[str, float]:
        """`timed`, then the native module's wait counters per call in a second pass (reading them around each call
        costs microseconds, kept out of the time), counted inside the calls only (not in the barriers and
        slowest-rank reductions between samples)."""
        keys = ("runs", "waits", "wait_ns", "sleeps", "rings")
        sums = dict.fromkeys(keys, 0)
        wait_ns: list[float] = []   # per timed call, per native run in it: the median is robust to preemption

        def call_counted() -> None:
            before = native._hotpath.stats()
            call()   # type: ignore[operator]
            after = native._hotpath.stats()
            for k in keys:
                sums[k] += after[k] - before[k]
            wait_ns.append((after["wait_ns"] - before["wait_ns"]) / max(1, after["runs"] - before["runs"]))
        timed(name, call, per)
        call_samples_s(call_counted, comm.barrier, slowest, iters=10)
        runs = max(1, sums["runs"])
        return {"wait_ns": float(np.median(wait_ns)), **{k: sums[k] / runs for k in ("waits", "sleeps", "rings")}}

    call = collective_call(comm, coll)
    for _ in range(20):
        call(x)
    full = counted("same array: call(x)", lambda: call(x))
    if parts:
        _recorder_rows(comm, lambda: call(x), slowest, rows, best)
    # the remembered call, taken before the new arrays below crowd the repeated-call table
    fast = next((f for k, f in comm._mem.by_object.items() if k[0] == coll and k[1] == id(x)), None)
    timed("making the array alone", lambda: np.ones(2, np.float32))
    timed("new array: call(np.ones(2))", lambda: call(np.ones(2, np.float32)))
    rows["new array: call(np.ones(2))"] -= rows["making the array alone"]
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
        if parts and fast.runner is not None:
            _parts(rows, best, full, fast, x, regions, comm, counted, coll)
    if comm.rank == 0:
        Path(out).write_text(json.dumps(rows))
    comm.destroy()


REPEAT = 50   # calls per Runner.repeat


def _recorder_rows(comm: Any, call: Callable[[], object], slowest: Callable[[float], float], rows: dict[str, float],
                   best: dict[str, float]) -> None:
    """The same call timed with the communicator's flight recorder and with it set aside, in turns (load on the
    machine hits both alike)."""
    from ringflow.runtime.bench import call_samples_s
    rec, with_rec, without = comm._rec, [], []
    for _ in range(3):
        with_rec += call_samples_s(call, comm.barrier, slowest, iters=10)
        comm._rec = None
        try:
            without += call_samples_s(call, comm.barrier, slowest, iters=10)
        finally:
            comm._rec = rec
    for name, samples in (("same array, recorder on", with_rec), ("same array, recorder set aside", without)):
        rows[name] = float(np.median(samples)) * 1e6
        best[name] = min(samples) * 1e6


class _Checks:
    """A stand-in for a communicator's door whose call only checks (times the Python and C around the
    native plan: every check of `Door.call`, no bookkeeping, nothing sent)."""

    def __init__(self, door: object) -> None:
        self.call = door.checks   # type: ignore[attr-defined]


def cpu_us(fn: object, n: int = 20000) -> float:
    """This thread's CPU time per call of a local function (best of 5 runs of n calls): no peer, no waiting, and
    time the scheduler gave to other processes not counted."""
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(n):
            fn()   # type: ignore[operator]
        best = min(best, (time.thread_time() - t0) / n)
    return best * 1e6


def _parts(rows: dict[str, float], best: dict[str, float], full: dict[str, float], fast: object, x: np.ndarray,
           regions: object, comm: object, counted: object, coll: str) -> None:
    """The breakdown rows of --parts (see the module docstring)."""
    from ringflow.runtime.call import hotpath
    r, ctx, bases = fast.runner, fast.ctx, fast.bases   # type: ignore[attr-defined]
    seq = [comm._op_seq]   # type: ignore[attr-defined]  # every rank makes the same calls, so the same numbers

    def go() -> None:
        spans = regions.packed   # type: ignore[attr-defined]
        rc = r.go(x, None, seq[0], 60.0, spans)
        if rc != hotpath.RC_DONE:   # a peer was descheduled: finish as the communicator does
            ctx.op_seq, ctx.deadline = seq[0], r.deadline
            hotpath.resume_call(fast.hot, ctx, bases, spans, rc)   # type: ignore[attr-defined]
        seq[0] += 1

    def repeat() -> None:
        rc = r.repeat(x, None, seq[0], REPEAT, 60.0, regions.packed)   # type: ignore[attr-defined]
        seq[0] += REPEAT
        if rc != hotpath.RC_DONE:
            raise RuntimeError(f"Runner.repeat ended with code {rc}")

    counted("one C call (Runner.go)", go)   # type: ignore[operator]
    native_c = counted("native loop in C (Runner.repeat)", repeat, REPEAT)   # type: ignore[operator]
    comm._op_seq = seq[0]   # type: ignore[attr-defined]
    # local, CPU time: the collective's Python and the door's checks (Door.checks in place of Door.call), and the C
    # call's entry and identity check (another array: it returns -1 before any state is read or anything is sent)
    name, other, call = f"_door_{coll}", np.ones(2, np.float32), collective_call(comm, coll)
    door, rec = getattr(comm, name), comm._rec   # type: ignore[attr-defined]
    comm._rec = None   # type: ignore[attr-defined]  # Door.checks takes the path without the recorder
    try:
        if door.checks(x, None, ARGS[coll], False, None) is not True:
            raise RuntimeError(f"the repeated {coll} does not take its door")
        setattr(comm, name, _Checks(door))
        entry = cpu_us(lambda: call(x))
    finally:
        setattr(comm, name, door)
        comm._rec = rec   # type: ignore[attr-defined]
    c_entry = cpu_us(lambda: r.go(other, None, 0, 60.0, b""))
    total, loop = best["same array: call(x)"], best["native loop in C (Runner.repeat)"]
    recorder = best["same array, recorder on"] - best["same array, recorder set aside"]
    wait_us = native_c["wait_ns"] / 1e3
    rows.update({
        "parts (CPU): Python entry and the door's checks": entry,
        "parts (CPU): C call and identity check": c_entry,
        "parts (best sample): native loop": loop,
        "parts:   waiting for the peer's flag": wait_us,
        "parts:   own work": loop - wait_us,
        "parts (best sample): full call": total,
        "parts: flight recorder (on - set aside)": recorder,
        "parts: rest (full - entry - recorder - loop)": total - entry - recorder - loop,
        "per call (native loop): waits": native_c["waits"],
        "per call (native loop): sleeps": native_c["sleeps"],
        "per call (native loop): doorbells rung": native_c["rings"],
        "per call (full call): sleeps": full["sleeps"],
        "per call (full call): doorbells rung": full["rings"],
    })


def run_job(n: int, native: bool, parts: bool = False, coll: str = "all_reduce") -> dict[str, float]:
    """One job of n ranks timing `coll`; rank 0's rows."""
    with tempfile.TemporaryDirectory(prefix="rf-ovh-") as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, RINGFLOW_NATIVE="1" if native else "0")
        cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), sys.executable, __file__, "--worker", out,
               "--collectives", coll]
        if parts:
            cmd.append("--parts")
        subprocess.run(cmd, env=env, check=True, timeout=600)
        return json.loads(Path(out).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", default="2,4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--parts", action="store_true", help="the repeated call's breakdown (native job)")
    ap.add_argument("--collectives", default="all_reduce", help="comma list: all_reduce, broadcast")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    colls = a.collectives.split(",")
    if any(c not in ARGS for c in colls):
        ap.error(f"--collectives takes {', '.join(ARGS)}")
    if a.worker:
        worker(a.worker, a.parts, colls[0])
        return 0
    result = {}
    for n, coll, native in ((int(v), c, nat) for v in a.nranks.split(",") for c in colls for nat in (True, False)):
        rows = run_job(n, native, a.parts and native, coll)
        label = f"{n} ranks, {coll}, native {'on' if native else 'off'}"
        result[label] = rows
        print(f"== {label}: 8-byte call, us per call (slowest rank's median)")
        for k, v in rows.items():
            print(f"  {k:<52}{v:>8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
