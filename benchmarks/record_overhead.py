"""What the call recorder costs: per call (a one-rank communicator, so the call itself is a few microseconds)
and on the step time of a 4-rank NumPy DDP training loop, with the flight recorder off (the default), on
(RINGFLOW_DUMP_DIR set) and with RINGFLOW_RECORD. Modes alternate over `--rounds` so drifting machine load
hits each alike.

    python benchmarks/record_overhead.py [--rounds 3] [--steps 40]
    python benchmarks/record_overhead.py --ab [--nranks 1,2] [--pairs 9]
    python benchmarks/record_overhead.py --parts

`--ab` times in one process per rank (RINGFLOW_RECORD set), on the same communicator and the same array, the
repeated call with the recorder off, with the Python recorder, with the C one (runtime/record_native.py) and with
the C one under gc.disable(), alternating within each of `--pairs` rounds, so load from other programs hits
each alike (each mode's time in a round: the fastest of 5 runs of `--calls`, at most 4000); it prints per mode
the added microseconds per call (min and median over the rounds, slowest rank). `--parts` splits each
recorder's cost per call into its parts (one rank, in process).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = {"off": {"RINGFLOW_FLIGHT_RECORDER": "0"}, "flight": {"RINGFLOW_DUMP_DIR": "<tmp>"},
         "record": {"RINGFLOW_RECORD": "<tmp>"}}


def per_call_us(calls: int) -> float:
    """Median microseconds per all_reduce of 4 floats on a one-rank communicator (this process's knobs)."""
    import numpy as np

    import ringflow
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    x = np.ones(4, np.float32)
    for _ in range(2000):
        comm.all_reduce(x)
    reps = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            comm.all_reduce(x)
        reps.append((time.perf_counter() - t) / calls * 1e6)
    comm.destroy()
    return statistics.median(reps)


def ddp_rank(steps: int) -> None:
    """Rank side: median step time of NumpyDDP on a 3-layer MLP (printed by rank 0 as JSON)."""
    import numpy as np

    import ringflow
    from ringflow.parallel.data import local_batch, make_classification
    from ringflow.parallel.ddp import NumpyDDP
    from ringflow.parallel.nn import mlp
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        model = mlp([data.n_features, 256, 256, data.n_classes], seed=1)
        ddp = NumpyDDP(model, comm, bucket_cap_nbytes=64 << 10, first_bucket_nbytes=8 << 10)
        times = []
        for step in range(steps):
            xb, yb = local_batch(data.x_train, data.y_train, step, 384, comm.rank, comm.size)
            t = time.perf_counter()
            ddp.train_step(xb, yb, 0.01)
            times.append(time.perf_counter() - t)
        med = np.array([statistics.median(times[steps // 4:])])
        comm.all_reduce(med, op="max")
        if comm.rank == 0:
            print(json.dumps({"step_s": float(med[0])}))


AB_MODES = ("off", "python", "native", "native_nogc")


def ab_rank(pairs: int, calls: int, out: str) -> None:
    """Rank side of --ab: per round, the us per call of each mode (rank 0 writes them as JSON)."""
    import gc

    import numpy as np

    import ringflow
    from ringflow.runtime.recording.record import Recorder
    from ringflow.runtime.recording.record_native import NativeRecorder, recorder_class
    if os.environ.get("RINGFLOW_WORLD_SIZE"):
        comm = ringflow.init()
    else:
        comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    rec = comm._rec
    native = recorder_class() is NativeRecorder
    x, buf = np.ones(2, np.float32), np.zeros(1)

    def timed(mode: str) -> float:
        comm._rec = None if mode == "off" else rec
        rec.__class__ = Recorder if mode == "python" else NativeRecorder
        gc.disable() if mode == "native_nogc" else gc.enable()
        comm.barrier()
        reps = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(x, op="max")
            reps.append((time.perf_counter() - t) / calls * 1e6)
        gc.enable()
        comm._rec = None
        buf[0] = min(reps)   # the run least disturbed by other programs on the machine
        comm.all_reduce(buf, op="max")
        return float(buf[0])

    modes = AB_MODES if native else AB_MODES[:2]
    for mode in modes:   # warm up every path (and the repeated-call table)
        timed(mode)
    res: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(pairs):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            res[mode].append(timed(mode))
    comm._rec = rec
    if comm.rank == 0:
        Path(out).write_text(json.dumps(res))
    comm.destroy()


def parts(calls: int, rounds: int = 5) -> None:
    """Per-part ns per call of each recorder on one rank (RINGFLOW_RECORD set): the recorder called as the
    runtime calls it, two ringflow frames below the user's line, with a guard that does nothing; the fastest
    of `rounds` x 9 runs."""
    import gc

    import numpy as np

    import ringflow
    from ringflow.runtime.recording import record
    from ringflow.runtime.recording.record_native import NativeRecorder, recorder_class
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    rec = comm._rec
    meta, guard = ("all_reduce", np.dtype("float32"), 2, None, "max"), comm._guard

    def fn(deadline: float) -> None:
        pass

    def inner(r: Any, g: Any) -> Any:   # ringflow's _run
        return r.call(0, "all_reduce", meta, g, fn, 1e18) if r is not None else guard(fn, 1e18, 0)

    def outer(r: Any, g: Any) -> Any:   # ringflow's comm.all_reduce
        return inner(r, g)
    for f in (inner, outer):   # skipped by the call-site search, as ringflow's own frames are
        record._internal[f.__code__] = True

    def best(r: Any, g: Any) -> float:
        out = []
        for _ in range(9):
            t = time.perf_counter_ns()
            for _ in range(calls):
                outer(r, g)
            out.append((time.perf_counter_ns() - t) / calls)
        return min(out)
    res: dict[tuple[str, str], list[float]] = {}
    classes = [record.Recorder] + ([NativeRecorder] if recorder_class() is NativeRecorder else [])
    for _ in range(rounds):
        for cls in classes:
            rec.__class__, k = cls, cls.__name__
            res.setdefault((k, "off (the guard alone)"), []).append(best(None, guard))
            rec.pending = None
            res.setdefault((k, "entry only: site, seq, entry, ring"), []).append(best(rec, None))
            res.setdefault((k, "+ timing the guarded call"), []).append(best(rec, guard))
            rec.pending = []
            res.setdefault((k, "+ pending list and writes"), []).append(best(rec, guard))
            gc.disable()
            res.setdefault((k, "  the same with gc.disable()"), []).append(best(rec, guard))
            gc.enable()
    rec.__class__ = classes[-1]
    comm.destroy()
    for (k, what), v in res.items():
        print(f"{k:<16}{what:<38}{min(v):8.0f} ns per call")


def ab(nranks: list[int], pairs: int, calls: int) -> None:
    """In-process A/B of the recorder modes at each rank count; prints added us per call (min, median)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_RECORD", "RINGFLOW_FLIGHT"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    report = {}
    for n in nranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ab.json")
            role = [*me, "--role", "ab", "--pairs", str(pairs), "--calls", str(calls), "--out", out]
            cmd = role if n == 1 else [sys.executable, "-m", "ringflow", "run", "-n", str(n), "--", *role]
            subprocess.run(cmd, env={**env, "RINGFLOW_RECORD": os.path.join(tmp, "rec")}, check=True, timeout=600)
            res = json.loads(Path(out).read_text())
        off = res.pop("off")
        rows = {"off_us": {"min": min(off), "median": statistics.median(off)}}
        for mode, v in res.items():
            d = [a - b for a, b in zip(v, off, strict=True)]
            rows[f"{mode}_added_us"] = {"min": min(d), "median": statistics.median(d)}
        report[f"{n} rank(s)"] = rows
        print(f"== {n} rank(s), {pairs} pairs of {calls} calls: off {statistics.median(off):.2f} us per call")
        for k, r in rows.items():
            print(f"  {k:<24} min {r['min']:6.2f}  median {r['median']:6.2f}")
    print(json.dumps(report, indent=1))


def run_mode(mode: str, what: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_RECORD", "RINGFLOW_FLIGHT"))}
    with tempfile.TemporaryDirectory() as tmp:
        env.update({k: (tmp if v == "<tmp>" else v) for k, v in MODES[mode].items()})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run(what, env=env, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["value"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--ab", action="store_true", help="in-process A/B of recorder off / Python / C")
    ap.add_argument("--nranks", default="1,2", help="--ab: rank counts")
    ap.add_argument("--pairs", type=int, default=9, help="--ab: rounds of the modes")
    ap.add_argument("--parts", action="store_true", help="per-part cost of each recorder, one rank, in process")
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "ab":
        ab_rank(a.pairs, a.calls, a.out)
        return
    if a.parts:
        os.environ.setdefault("RINGFLOW_RECORD", tempfile.mkdtemp(prefix="rf-rec-"))
        parts(min(a.calls, 4000))
        return
    if a.ab:
        ab([int(v) for v in a.nranks.split(",")], a.pairs, min(a.calls, 4000))
        return
    if a.role == "call":
        print(json.dumps({"value": per_call_us(a.calls)}))
        return
    if a.role == "ddp":
        ddp_rank(a.steps)
        return
    me = [sys.executable, str(Path(__file__).resolve())]
    res: dict[str, dict[str, list[float]]] = {"per_call_us": {m: [] for m in MODES}, "ddp_step_ms": {m: []
                                                                                                 for m in MODES}}
    for _ in range(a.rounds):
        for mode in MODES:
            res["per_call_us"][mode].append(run_mode(mode, [*me, "--role", "call", "--calls", str(a.calls)]))
            launch = [sys.executable, "-m", "ringflow", "run", "-n", "4", "--", *me, "--role", "ddp", "--steps",
                      str(a.steps)]
            env_out = run_ddp(mode, launch)
            res["ddp_step_ms"][mode].append(env_out * 1e3)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
    print(json.dumps({"rounds": res, "median": med}, indent=1))
    for mode in ("flight", "record"):
        print(f"{mode}: +{med['per_call_us'][mode] - med['per_call_us']['off']:.2f} us per call, DDP step "
              f"{(med['ddp_step_ms'][mode] / med['ddp_step_ms']['off'] - 1) * 100:+.1f} %")


def run_ddp(mode: str, launch: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_RECORD", "RINGFLOW_FLIGHT"))}
    with tempfile.TemporaryDirectory() as tmp:
        env.update({k: (tmp if v == "<tmp>" else v) for k, v in MODES[mode].items()})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run(launch, env=env, capture_output=True, text=True, check=True).stdout
    line = [ln for ln in out.splitlines() if '"step_s"' in ln][-1]
    return float(json.loads(line[line.index("{"):])["step_s"])


if __name__ == "__main__":
    main()
