"""What the call recorder costs: per call (a one-rank communicator, so the call itself is a few microseconds)
and on the step time of a 4-rank NumPy DDP training loop, with the flight recorder off (the default), on
(RINGFLOW_DUMP_DIR set) and with RINGFLOW_RECORD. Modes alternate over `--rounds` so drifting machine load
hits each alike.

    python benchmarks/record_overhead.py [--rounds 3] [--steps 40]
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
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    a = ap.parse_args()
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
