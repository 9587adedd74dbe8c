"""Parameter server with BSP, SSP and ASP consistency, one worker artificially slowed.

    ringflow run -n 4 examples/param_server.py [--placement sharded|rank0|cpu]

Prints per mode: wall time, gradients applied per second, steps each worker
did, test accuracy, parameter staleness and the largest clock gap any worker
was allowed to compute at (SSP keeps it <= s), plus BSP's distance from
synchronous data parallel (single-process training on the same global batches).
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse

import numpy as np

import ringflow
from ringflow.parallel.data import global_batch, make_classification
from ringflow.parallel.nn import mlp, train_reference
from ringflow.parallel.param_server import MODES, PLACEMENTS, roles, train_param_server
from ringflow.parallel.report import emit, print0


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placement", choices=PLACEMENTS, default="sharded")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--staleness", type=int, default=2, help="SSP bound s")
    ap.add_argument("--steps", type=int, default=30, help="gradient pushes per worker (on average)")
    ap.add_argument("--batch", type=int, default=96, help="global batch per round (split over workers)")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--slow-rank", type=int, default=-1, help="rank whose compute is slowed (-1: the last)")
    ap.add_argument("--slow-ms", type=float, default=20.0, help="extra compute time per step of the slow worker")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        sizes = [data.n_features, 64, 64, data.n_classes]
        servers, workers = roles(a.placement, comm.size)
        slow = comm.size - 1 if a.slow_rank < 0 else a.slow_rank
        print0(comm, f"ranks={comm.size} placement={a.placement} servers={servers} workers={workers} "
                     f"slow worker=rank {slow} (+{a.slow_ms:g} ms/step) steps={a.steps} s={a.staleness}")
        ref = mlp(sizes, seed=1)
        train_reference(ref, [global_batch(data.x_train, data.y_train, s, a.batch) for s in range(a.steps)], a.lr)
        rows, out = [], {"ranks": comm.size, "placement": a.placement, "staleness": a.staleness}
        print0(comm, f"{'mode':<6}{'wall s':>8}{'grads/s':>9}{'acc':>7}  {'steps per worker':<22}"
                     f"{'stale mean':>11}{'stale max':>10}{'max gap':>8}{'|w-DP|':>11}")
        for mode in a.modes.split(","):
            r = train_param_server(comm, lambda: mlp(sizes, seed=1), data, mode=mode, staleness=a.staleness,
                                   placement=a.placement, steps=a.steps, batch=a.batch, lr=a.lr, slow_rank=slow,
                                   slow_s=a.slow_ms / 1e3)
            dist = float(np.abs(r.params - ref.params.flat).max())
            print0(comm, f"{mode:<6}{r.wall_s:>8.3f}{r.updates_applied / r.wall_s:>9.0f}{r.test_accuracy:>7.3f}  "
                         f"{str(r.worker_steps):<22}{r.staleness_mean:>11.2f}{r.staleness_max:>10d}"
                         f"{r.max_clock_gap:>8.0f}{dist:>11.2e}")
            rows.append(mode)
            out[mode] = {"wall_s": r.wall_s, "updates": r.updates_applied, "accuracy": r.test_accuracy,
                         "worker_steps": r.worker_steps, "staleness_mean": r.staleness_mean,
                         "staleness_max": r.staleness_max, "max_clock_gap": r.max_clock_gap, "dist_dp": dist}
        print0(comm, "max gap = largest (own clock - slowest clock) at which a worker was allowed to compute; "
                     "|w-DP| = max distance from synchronous DP (BSP: equal within 1e-12)")
        emit(comm, out, a.json_out)


if __name__ == "__main__":
    main()
