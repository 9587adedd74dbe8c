#!/usr/bin/env python3
"""The per-step and per-message cost of small collectives: every algorithm timed, a line fitted through them.

    .venv/bin/python benchmarks/small_message_cost.py --nranks 2,4,8,16 --json small.json

Per rank count, a job times the 8-byte all-reduce (float32, in place) and broadcast of every algorithm the tuner
may run for them (each in its own group made with RINGFLOW_ALGO naming it; the repeated call with the same
array, as `ringflow bench` times it: the median over samples of the slowest rank's time per call). Each call's
features are its steps and its messages as the cost model counts them (`algorithms.selection.call_messages`:
the sum over steps of the most messages any rank sends + receives, the argument check's included). A
least-squares line through every point with at least 3 ranks (with 2 ranks every step is one message each
way, so steps and messages cannot be told apart),

    time = call + alpha x steps + o x messages,

(points far off the line, such as a call whose every step slept on its doorbell, left out and named)
gives the figures of the single-host default (`algorithms.cost.DEFAULT_ALPHA_US`, `DEFAULT_MSG_US`); the
call term is the per-call work outside the steps (entry, door, identity check), which every candidate pays
alike. `--no-check` runs the jobs again with the argument check off (RINGFLOW_CHECKS_DISABLE=1,
RINGFLOW_RECEIVER_CHECK=0): the difference is what the check costs. Ranks beyond the machine's cores are
oversubscribed: fit only rank counts the cores hold (`--fit-max-ranks`, default: the core count).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = {"all_reduce": "allreduce", "broadcast": "broadcast"}
OUTLIER_FACTOR = 10.0   # a point this many times its rank count's median is off the line


def worker(out: str) -> None:
    """One rank: every algorithm of every collective in its own group, timed; rank 0 writes the rows."""
    import ringflow
    from ringflow import config
    from ringflow.algorithms import registry, selection
    from ringflow.algorithms.schedule import Collective
    from ringflow.runtime.bench import call_samples_s
    comm = ringflow.init()
    buf = np.zeros(1)
    rows = []
    for coll in SPEC:
        c = Collective.parse(coll)
        root = 0 if c.has_root else None
        for algo in registry.algorithms_for(c):
            if algo == "hierarchical":
                continue
            with config.override(ALGO=f"{SPEC[coll]}:{algo}"):
                g = comm.split(0)
            assert g is not None
            x = np.ones(2, np.float32)

            def call(g=g, x=x, coll=coll) -> None:
                if coll == "all_reduce":
                    g.all_reduce(x, op="max")
                else:
                    g.broadcast(x, 0)

            def slowest(v: float) -> float:
                buf[0] = v
                comm.all_reduce(buf, op="max")
                return float(buf[0])

            for _ in range(20):
                call()
            samples = call_samples_s(call, comm.barrier, slowest, iters=25)
            sched = g._schedule(c, x.nbytes, root, 4, True)
            steps, msgs = selection.call_messages(sched, selection.call_shape(c, comm.size, x.nbytes, 4))
            rows.append({"collective": coll, "algorithm": sched.algorithm, "nranks": comm.size,
                         "time_us": float(np.median(samples)) * 1e6, "steps": steps, "messages": msgs})
            g.destroy()
    if comm.rank == 0:
        Path(out).write_text(json.dumps(rows))
    comm.destroy()


def run_job(n: int, check: bool) -> list[dict]:
    """One job of n ranks; rank 0's rows."""
    with tempfile.TemporaryDirectory(prefix="rf-small-") as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, RINGFLOW_FLIGHT_RECORDER="0")
        if not check:
            env.update(RINGFLOW_CHECKS_DISABLE="1", RINGFLOW_RECEIVER_CHECK="0")
        cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), sys.executable, __file__, "--worker", out]
        subprocess.run(cmd, env=env, check=True, timeout=600)
        return [dict(r, check=check) for r in json.loads(Path(out).read_text())]


def _nnls(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Least squares with no negative term (an active-set solve; 3 terms)."""
    keep = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep], t, rcond=None)[0]
        neg = [k for k in keep if coef[k] < 0]
        if not neg:
            return coef
        keep.remove(min(neg, key=lambda k: coef[k]))


def fit(rows: list[dict]) -> dict[str, object]:
    """call_us, alpha_us (per step) and msg_us (per message) through `rows`, none negative. A point slower than
    OUTLIER_FACTOR times the median of its rank count's points (a call that slept on its doorbell every step) is
    left out and named."""
    med = {n: float(np.median([r["time_us"] for r in rows if r["nranks"] == n])) for n in {r["nranks"] for r in rows}}
    pts = [r for r in rows if r["time_us"] <= OUTLIER_FACTOR * med[r["nranks"]]]
    dropped = [f"{r['collective']} {r['algorithm']} {r['nranks']} ranks ({r['time_us']:.1f} us)"
               for r in rows if r not in pts]
    a = np.array([[1.0, r["steps"], r["messages"]] for r in pts])
    t = np.array([r["time_us"] for r in pts])
    coef = _nnls(a, t)
    return {"call_us": float(coef[0]), "alpha_us": float(coef[1]), "msg_us": float(coef[2]),
            "rms_error_us": float(np.sqrt(np.mean((t - a @ coef) ** 2))), "points": len(pts), "dropped": dropped}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", default="2,3,4")
    ap.add_argument("--no-check", action="store_true", help="also time every call with the argument check off")
    ap.add_argument("--fit-max-ranks", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    rows: list[dict] = []
    for n in (int(v) for v in a.nranks.split(",")):
        for check in (True, False) if a.no_check else (True,):
            rows += run_job(n, check)
    result: dict[str, object] = {"rows": rows}
    for check in (True, False) if a.no_check else (True,):
        pts = [r for r in rows if r["check"] == check and 3 <= r["nranks"] <= a.fit_max_ranks]
        if len(pts) >= 3:
            result[f"fit (check {'on' if check else 'off'})"] = f = fit(pts)
            print(f"fit, check {'on' if check else 'off'}, {f['points']} points of 3-{a.fit_max_ranks} ranks: "
                  f"call {f['call_us']:.2f} us + {f['alpha_us']:.3f} us per step + {f['msg_us']:.3f} us per message"
                  f" (rms error {f['rms_error_us']:.2f} us)"
                  + (f"; off the line, left out: {', '.join(f['dropped'])}" if f["dropped"] else ""))
    print(f"{'collective':<11}{'algorithm':<20}{'ranks':>6}{'check':>6}{'steps':>6}{'msgs':>6}{'us':>9}")
    for r in rows:
        print(f"{r['collective']:<11}{r['algorithm']:<20}{r['nranks']:>6}{'on' if r['check'] else 'off':>6}"
              f"{r['steps']:>6}{r['messages']:>6}{r['time_us']:>9.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
