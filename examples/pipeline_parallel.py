"""Pipeline parallel: an MLP cut into one stage per rank, trained with GPipe and with 1F1B.

    ringflow run -n 4 examples/pipeline_parallel.py

For each schedule: the parameters after k steps versus single-process
training, the measured bubble (1 - compute time / (stages x step wall time))
next to (p-1)/(m+p-1) and to the bubble of the ideal timeline of the same
action lists, and the most micro-batches whose activations a stage held.
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
from ringflow.parallel.pipeline import PipelineStage
from ringflow.parallel.pp_schedule import SCHEDULES, render, schedule, simulate
from ringflow.parallel.report import emit, print0


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        p, m = comm.size, a.micro_batches
        sizes = [data.n_features] + [a.width] * (p + 1) + [data.n_classes]   # p big layers: balanced stages
        batches = [global_batch(data.x_train, data.y_train, s, a.batch) for s in range(a.steps)]
        ref = mlp(sizes, seed=1)
        train_reference(ref, batches, a.lr)
        out = {"ranks": p, "micro_batches": m}
        print0(comm, f"stages={p} micro-batches={m} batch={a.batch} widths={sizes} float64")
        for name in SCHEDULES:
            stage = PipelineStage(comm, sizes, seed=1, schedule_name=name, micro_batches=m)
            stats = [stage.train_step(x, y, a.lr) for x, y in batches]
            err = np.array([max(np.abs(stage.model.params.value(n) - ref.params.value(n)).max()
                                for n in stage.model.params.names)])
            peak = np.zeros(p)
            peak[comm.rank] = stats[-1].peak_inflight
            comm.all_reduce(err, op="max")
            comm.all_reduce(peak, op="sum")
            measured = float(np.mean([s.bubble for s in stats[1:] or stats]))
            ideal = simulate(schedule(name, p, m), t_f=1.0, t_b=2.0).bubble
            print0(comm, f"\n[{name}]\n{render(schedule(name, p, min(m, 8)))}")
            print0(comm, f"equivalence: max |pipeline - single-process| = {err[0]:.3e} (tolerance 1e-12)")
            print0(comm, f"bubble: measured {measured:.3f} | (p-1)/(m+p-1) = {stats[0].theory_bubble:.3f} | "
                         f"ideal timeline of these action lists {ideal:.3f} | "
                         f"step wall {stats[-1].wall_s * 1e3:.1f} ms")
            print0(comm, f"peak micro-batches in flight per stage: {[int(v) for v in peak]}")
            out[name] = {"max_err": float(err[0]), "bubble": measured, "theory": stats[0].theory_bubble,
                         "ideal": ideal, "peak_inflight": [int(v) for v in peak],
                         "loss": [s.loss for s in stats]}
        emit(comm, out, a.json_out)


if __name__ == "__main__":
    main()
