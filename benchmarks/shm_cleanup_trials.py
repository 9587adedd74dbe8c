#!/usr/bin/env python3
"""SIGKILL to `ringflow run` at random moments: does any /dev/shm name of the job outlive it?

    .venv/bin/python benchmarks/shm_cleanup_trials.py --trials 100 --nranks 2 4 --json shm_cleanup.json

Each trial starts `ringflow run -n N` on a job that keeps making shared-memory names (collectives of
several sizes, `comm.alloc` regions, point-to-point on new tags, split communicators) and SIGKILLs the
launcher after a random delay: half the trials while the ranks initialise (a delay drawn over the
launch), half while they run collectives (a delay after every rank reported ready). The ranks die with
the launcher (PR_SET_PDEATHSIG); the trial waits until every process of the job (ranks and their
reapers, found by an environment marker) has exited, then lists `/dev/shm/ringflow-<job>-*`.
Prints one row per (ranks, phase) and writes every trial to --json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

JOB = '''
import os, sys
import numpy as np
import ringflow
out = sys.argv[1]
with ringflow.init() as comm:
    open(f"{out}/ready{comm.rank}", "w").close()
    peer = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    bufs = []
    i = 0
    while True:
        for n in (2, 70_000, 1 << 20):
            x = np.full(n, comm.rank + 1.0)
            comm.all_reduce(x)
        if i % 4 == 0 and len(bufs) < 8:
            bufs.append(comm.alloc(1 << 16, np.float32))   # a named region, mapped by peers on demand
        if bufs:
            comm.all_reduce(bufs[-1])
        if comm.size > 1:                                  # a new point-to-point connection every few rounds
            tag = i % 6
            y = np.zeros(1 << 12, dtype=np.float32)
            if comm.rank % 2 == 0:
                comm.send(y + 1, peer, tag)
                comm.recv(y, left, tag)
            else:
                comm.recv(y, left, tag)
                comm.send(y + 1, peer, tag)
        if i % 5 == 2:                                     # a new communicator: new segments, then destroyed
            sub = comm.split(comm.rank % 2, comm.rank)
            if sub is not None:
                z = np.ones(1 << 15)
                sub.all_reduce(z)
                sub.destroy()
        i += 1
'''


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries the trial's marker."""
    pids = []
    needle = f"RINGFLOW_TRIAL={marker}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        pids.append(int(d))
    return pids


def run_trial(nranks: int, phase: str, rng: random.Random, *, init_s: float = 6.0, run_s: float = 1.0,
              gone_timeout_s: float = 20.0) -> dict:
    """One trial: launch, SIGKILL the launcher after a random delay in `phase` ('init': up to init_s after the
    launcher made the job, while ranks start and connect; 'collectives': up to run_s after every rank is ready),
    wait for every process of the job to exit; the names the job left."""
    work = Path(tempfile.mkdtemp(prefix="ringflow-trial-"))
    (work / "job.py").write_text(JOB)
    marker = uuid.uuid4().hex
    env = {**os.environ, "RINGFLOW_TRIAL": marker, "TMPDIR": str(work)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ringflow", "run", "-n", str(nranks), "--timeout", "120",
                             str(work / "job.py"), str(work)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ready_s = None
    end = t0 + 60
    if phase == "init":
        while not (work / "ringflow-runs").exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, init_s))
    else:
        while not all((work / f"ready{r}").exists() for r in range(nranks)) and time.monotonic() < end \
                and proc.poll() is None:
            time.sleep(0.01)
        ready_s = time.monotonic() - t0
        time.sleep(rng.uniform(0.0, run_s))
    killed_s = time.monotonic() - t0
    ready_at_kill = sum((work / f"ready{r}").exists() for r in range(nranks))
    exited_early = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    jobs = [p.name for p in (work / "ringflow-runs").glob("j*")] if (work / "ringflow-runs").exists() else []
    end = time.monotonic() + gone_timeout_s
    while _marked(marker) and time.monotonic() < end:
        time.sleep(0.02)
    survivors = _marked(marker)
    left = sorted(n for j in jobs for n in glob.glob(f"/dev/shm/ringflow-{j}-*"))
    for name in left:  # leave the machine clean for the next trial
        try:
            os.unlink(name)
        except OSError:
            pass
    for pid in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return {"nranks": nranks, "phase": phase, "killed_after_s": round(killed_s, 3),
            "ready_after_s": None if ready_s is None else round(ready_s, 3), "ranks_ready_at_kill": ready_at_kill,
            "exited_before_kill": exited_early, "job": jobs[0] if jobs else None, "left": left,
            "processes_left": len(survivors), "gone_s": round(time.monotonic() - t0 - killed_s, 3)}


def main() -> None:
    """Run the trials, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="trials per rank count (half per phase)")
    ap.add_argument("--nranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="shm_cleanup.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows: list[dict] = []
    for n in args.nranks:
        for k in range(args.trials):
            rows.append(run_trial(n, "init" if k % 2 == 0 else "collectives", rng))
            Path(args.json).write_text(json.dumps({"trials": rows}, indent=1) + "\n")  # kept as it grows
    print(f"{'ranks':>5} {'phase':>12} {'trials':>6} {'leaked':>6} {'names left':>10} {'procs left':>10} "
          f"{'ready at kill':>13}")
    for n in args.nranks:
        for phase in ("init", "collectives"):
            sel = [r for r in rows if r["nranks"] == n and r["phase"] == phase]
            print(f"{n:>5} {phase:>12} {len(sel):>6} {sum(bool(r['left']) for r in sel):>6} "
                  f"{sum(len(r['left']) for r in sel):>10} {sum(r['processes_left'] for r in sel):>10} "
                  f"{sum(r['ranks_ready_at_kill'] == n for r in sel):>13}")
    Path(args.json).write_text(json.dumps({"trials": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
