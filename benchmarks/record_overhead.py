"""What the call recorder costs: per call (a one-rank communicator, so the call itself is a few microseconds)
and on the step time of a 4-rank NumPy DDP training loop, with the flight recorder off (the default), on
(RINGFLOW_DUMP_DIR set) and with RINGFLOW_RECORD. Modes alternate over `--rounds` so drifting machine load
hits each alike.

    python benchmarks/record_overhead.py [--rounds 3] [--steps 40]
    python benchmarks/record_overhead.py --ab [--nranks 1,2] [--pairs 9] [--python]
    python benchmarks/record_overhead.py --parts

`--ab` times in one process per rank, with the flight ring on as `ringflow run` has it (RINGFLOW_DUMP_DIR set),
on the same communicator and the same 8-byte array, the repeated all-reduce with the recorder off, with the C
recorder (runtime/record_native.py), off again (the noise floor: what "added" reads with nothing added) and, with
`--python`, with the Python one, alternating within each of `--pairs` rounds, so load from other programs hits
each alike (each mode's time in a round: the fastest of 5 runs of `--calls`, at most
4000); it prints per mode the added microseconds per call (min and median over the rounds, slowest rank).
`--parts` times each recorder alone, in process: what it adds per call to a collective of one of two ranks, as
`run` records a NumPy call the remembered-call path runs natively and as `call` records one run through the
communicator's guard.
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


AB_MODES = ("off", "ring", "off_again", "ring_python")   # off_again: the recorder off again, the noise floor


def ab_rank(pairs: int, calls: int, out: str, python: bool) -> None:
    """Rank side of --ab: per round, the us per call of each mode (rank 0 writes them as JSON)."""
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
        comm._rec = None if mode.startswith("off") else rec
        rec.__class__ = Recorder if mode == "ring_python" else NativeRecorder if native else Recorder
        comm.barrier()
        reps = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(x, op="max")
            reps.append((time.perf_counter() - t) / calls * 1e6)
        comm._rec = None
        buf[0] = min(reps)   # the run least disturbed by other programs on the machine
        comm.all_reduce(buf, op="max")
        return float(buf[0])

    modes = [m for m in AB_MODES if (native or m != "ring_python") and (python or m != "ring_python")]
    for mode in modes:   # warm up every path (and the repeated-call table)
        timed(mode)
    res: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(pairs):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            res[mode].append(timed(mode))
    rec.__class__ = NativeRecorder if native else Recorder
    comm._rec = rec
    if comm.rank == 0:
        Path(out).write_text(json.dumps(res))
    comm.destroy()


class _TwoRanks:
    """What a recorder reads of its communicator, for one of two ranks (--parts times the recorder alone)."""

    ns, rank, size, last_schedule = "parts", 0, 2, None


def _nothing(deadline: float) -> None:
    pass


def _native(a: tuple) -> tuple:   # stands for the remembered call's one native call (fastcall._fast_native)
    return a


_MISS = object()


# the remembered-call path's frames between the user's line and the recorder (ringflow's own: skipped for the site);
# a[2]: "run" (a NumPy call the remembered path runs natively, recorded by `run`) or "call" (one run through the
# communicator's guard, recorded by `call`)
def _fast_go(r: Any, a: tuple) -> Any:
    if a[2] == "run":
        return r.run("all_reduce", a[0], _MISS, _native, a) if r is not None else _native(a)
    return r.call(0, "all_reduce", a[0], a[1], _nothing, 1e18) if r is not None else a[1](_nothing, 1e18, 0)


def _fast_again(r: Any, a: tuple) -> Any:
    return _fast_go(r, a)


def _fast_paths(r: Any, a: tuple) -> Any:
    return _fast_again(r, a)


def _all_reduce(r: Any, a: tuple) -> Any:
    return _fast_paths(r, a)


def _best(r: Any, a: tuple, calls: int) -> float:
    """The fastest of 9 runs of `calls` calls, ns per call."""
    out = []
    for _ in range(9):
        if r is not None and r.pending:
            r.pending = []   # as a flush leaves it
        t = time.perf_counter_ns()
        for _ in range(calls):
            _all_reduce(r, a)
        out.append((time.perf_counter_ns() - t) / calls)
    return min(out)


def parts(calls: int, rounds: int = 5) -> None:
    """ns per call each recorder adds to a repeated collective, one rank, in process: the recorder called as the
    remembered-call path calls it (four ringflow frames below the user's line) for one of two ranks, around a
    call that does nothing (`run`: as a NumPy call's one native call; `call`: through the communicator's guard);
    the fastest of `rounds` x 9 runs, against the same call unrecorded."""
    import gc

    import numpy as np

    import ringflow
    from ringflow.runtime.recording import record
    from ringflow.runtime.recording.record_native import NativeRecorder, recorder_class
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    meta = ("all_reduce", np.dtype("float32"), 2, None, "max")
    tmp = Path(tempfile.mkdtemp(prefix="rf-parts-"))
    for f in (_fast_go, _fast_again, _fast_paths, _all_reduce):
        record._internal[f.__code__] = True
    kinds: dict[str, tuple[type, bool]] = {"Python recorder, ring": (record.Recorder, False)}
    if recorder_class() is NativeRecorder:
        kinds.update({"C recorder, ring (ringflow run)": (NativeRecorder, False),
                      "C recorder, ring + every call kept": (NativeRecorder, True)})
    recs, who = {}, _TwoRanks()   # held: a recorder refers to its communicator weakly
    for k, (cls, recording) in kinds.items():
        recs[k] = r = cls(who, 256, "")
        r.open_ring(tmp, 256)
        r.pending = [] if recording else None
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for how in ("run", "call"):
            a = (meta, comm._guard, how)
            res.setdefault(("off", how), []).append(_best(None, a, calls))
            for k, r in recs.items():
                res.setdefault((k, how), []).append(_best(r, a, calls))
        gc.collect()
    for r in recs.values():
        r.end_ring(2)
    comm.destroy()
    for how in ("run", "call"):
        off = min(res.pop(("off", how)))
        print(f"{how}: {'off (the call alone)':<36}{off:8.0f} ns per call")
        for (k, h), v in res.items():
            if h == how:
                print(f"{how}: {k:<36}{min(v) - off:+8.0f} ns per call")


def ab(nranks: list[int], pairs: int, calls: int, python: bool) -> None:
    """In-process A/B of the recorder modes at each rank count, the flight ring on as `ringflow run` puts it;
    prints added us per call (min, median)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_RECORD", "RINGFLOW_FLIGHT",
                                                                     "RINGFLOW_DUMP"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    report = {}
    for n in nranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ab.json")
            role = [*me, "--role", "ab", "--pairs", str(pairs), "--calls", str(calls), "--out", out] + \
                (["--python"] if python else [])
            cmd = role if n == 1 else [sys.executable, "-m", "ringflow", "run", "-n", str(n), "--", *role]
            subprocess.run(cmd, env={**env, "RINGFLOW_DUMP_DIR": os.path.join(tmp, "job")}, check=True,
                           timeout=600)
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
    ap.add_argument("--ab", action="store_true", help="in-process A/B of the recorder off / C (/ Python)")
    ap.add_argument("--nranks", default="1,2", help="--ab: rank counts")
    ap.add_argument("--pairs", type=int, default=9, help="--ab: rounds of the modes")
    ap.add_argument("--python", action="store_true", help="--ab: the Python recorder too")
    ap.add_argument("--parts", action="store_true", help="per-part cost of each recorder, one rank, in process")
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "ab":
        ab_rank(a.pairs, a.calls, a.out, a.python)
        return
    if a.parts:
        parts(min(a.calls, 4000))
        return
    if a.ab:
        ab([int(v) for v in a.nranks.split(",")], a.pairs, min(a.calls, 4000), a.python)
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
