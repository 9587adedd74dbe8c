"""Asynchronous data parallel (no waiting) next to synchronous DDP, with one worker slowed.

    ringflow run -n 4 examples/async_dp.py

Asynchronous: each rank applies its own gradient at once, sends it to all
peers and applies whatever peer gradients have arrived, never waiting; the
output shows how stale the applied gradients were, the wall time, the test
accuracy and that the replicas agree once all messages are drained.
Synchronous DDP on the same data with the same slow rank is run for comparison.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse
import time

import numpy as np

import ringflow
from ringflow.parallel.async_dp import train_async_dp
from ringflow.parallel.data import local_batch, make_classification
from ringflow.parallel.ddp import NumpyDDP
from ringflow.parallel.nn import accuracy, mlp
from ringflow.parallel.report import emit, print0


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=20.0)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        sizes = [data.n_features, 64, 64, data.n_classes]
        slow = comm.size - 1 if a.slow_rank < 0 else a.slow_rank
        print0(comm, f"ranks={comm.size} steps={a.steps} global batch={a.batch} slow worker=rank {slow} "
                     f"(+{a.slow_ms:g} ms/step)")
        r = train_async_dp(comm, lambda: mlp(sizes, seed=1), data, steps=a.steps, batch=a.batch, lr=a.lr,
                           slow_rank=slow, slow_s=a.slow_ms / 1e3)
        print0(comm, f"async DP : own {a.steps} steps took {r.steps_s_fastest:.3f} s on the fastest rank, "
                     f"{r.steps_s_slowest:.3f} s on the slowest (nobody waited)")
        print0(comm, f"async DP : wall {r.wall_s:.3f} s incl. final drain of in-flight gradients | "
                     f"accuracy {r.test_accuracy:.3f} | staleness of applied gradients mean {r.staleness_mean:.2f} "
                     f"max {r.staleness_max} updates | replica spread after drain {r.replica_spread:.1e}")
        model = mlp(sizes, seed=1)
        ddp = NumpyDDP(model, comm)
        comm.barrier()
        t0 = time.monotonic()
        for step in range(a.steps):
            ddp.train_step(*local_batch(data.x_train, data.y_train, step, a.batch, comm.rank, comm.size), a.lr)
            if comm.rank == slow:
                time.sleep(a.slow_ms / 1e3)
        wall = np.array([time.monotonic() - t0])
        comm.all_reduce(wall, op="max")
        acc = accuracy(model.forward(data.x_test)[0], data.y_test)
        print0(comm, f"sync DDP : wall {wall[0]:.3f} s | accuracy {acc:.3f} | "
                     f"staleness 0 (everyone waits for rank {slow})")
        emit(comm, {"ranks": comm.size, "async": {"wall_s": r.wall_s, "steps_s_fastest": r.steps_s_fastest,
                                                  "accuracy": r.test_accuracy,
                                                  "staleness_mean": r.staleness_mean, "staleness_max": r.staleness_max,
                                                  "replica_spread": r.replica_spread},
                    "sync": {"wall_s": float(wall[0]), "accuracy": acc}}, a.json_out)


if __name__ == "__main__":
    main()
