"""Rank side of tests/test_record_*.py: small training-like loops run under `ringflow run`.

Scenarios: `mixed` (collectives, point-to-point, async and a sub-group), `sleep` (one rank sleeps
before one all-reduce), `late` (one rank arrives --late seconds late at one all-reduce; the others give up
after their timeout and stay alive until it has arrived), `skip` (one rank skips an all-reduce), `mismatch`
(one rank all-reduces half as many elements once), `straggler` (steps of sleep-compute and an all-reduce;
each trial of --steps steps has its own slow rank, drawn from --seed).
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np

import ringflow
from ringflow.errors import RingflowError


def slow_ranks(trials: int, size: int, seed: int) -> list[int]:
    """The slow rank of each trial (the test draws the same list)."""
    rng = random.Random(seed)
    return [rng.randrange(size) for _ in range(trials)]


def mixed(comm: ringflow.Communicator, steps: int) -> None:
    x = np.ones(1024, np.float32)
    evens = comm.new_group([r for r in range(comm.size) if r % 2 == 0])
    for _ in range(steps):
        time.sleep(0.002)
        comm.all_reduce(x)
        comm.broadcast(x, root=1)
        comm.all_gather(x[:16])
        w = comm.all_reduce(np.ones(64, np.float64), op="max", async_op=True)
        w.wait()
        nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        r = comm.irecv(np.empty(32, np.int32), prv, tag=3)
        comm.send(np.arange(32, dtype=np.int32), nxt, tag=3)
        r.wait()
        if evens is not None:
            evens.all_reduce(np.ones(8, np.float32))
    comm.barrier()


def late(comm: ringflow.Communicator, steps: int, at: int, late_s: float, victim: int, x: np.ndarray) -> None:
    """The victim sleeps late_s before the all-reduce of step `at`; the others' call fails (their timeout), and
    they wait until the victim has entered it before they exit."""
    for step in range(steps):
        if step == at and comm.rank == victim:
            time.sleep(late_s)
        try:
            comm.all_reduce(x)  # site: late
        except RingflowError:
            if comm.rank != victim:
                time.sleep(late_s + 1.0)
            raise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["mixed", "sleep", "late", "skip", "mismatch", "straggler"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--slow", type=float, default=1.2, help="compute-time factor of the slow rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--at", type=int, default=3, help="the step at which the fault happens")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--late", type=float, default=6.0, help="seconds the late rank arrives late")
    a = ap.parse_args()
    comm = ringflow.init(timeout=a.timeout)
    victim = comm.size - 1
    x = np.ones(256, np.float32)
    if a.scenario == "mixed":
        mixed(comm, a.steps)
    elif a.scenario == "sleep":
        for step in range(a.steps):
            if step == a.at and comm.rank == victim:
                time.sleep(60)
            comm.all_reduce(x)  # site: sleep
    elif a.scenario == "late":
        late(comm, a.steps, a.at, a.late, victim, x)
    elif a.scenario == "mismatch":
        for step in range(a.steps):
            comm.all_reduce(x[:128] if step == a.at and comm.rank == victim else x)  # site: mismatch
    elif a.scenario == "skip":
        for step in range(a.steps):
            if not (step == a.at and comm.rank == victim):
                comm.all_reduce(x)  # site: skip
            comm.all_gather(x[:8])
    else:
        slow = slow_ranks(a.trials, comm.size, a.seed)
        for trial in range(a.trials):
            factor = a.slow if comm.rank == slow[trial] else 1.0
            for _ in range(a.steps):
                time.sleep(a.step_ms * factor / 1000)
                comm.all_reduce(x)
    comm.destroy()


if __name__ == "__main__":
    main()
