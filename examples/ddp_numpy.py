"""Data parallel on our NumPy MLP: bucketed all-reduce overlapped with backward.

    ringflow run -n 4 examples/ddp_numpy.py

Shows (1) equivalence: after k steps every rank's parameters equal
single-process training on the concatenated batch (ranks start from different
random weights; DDP's initial broadcast fixes that), and (2) the overlap
fraction: the same all-reduces run blocking after backward (comm time) and
launched per bucket during backward (exposed time).
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse

import numpy as np

import ringflow
from ringflow.parallel.data import global_batch, local_batch, make_classification
from ringflow.parallel.ddp import NumpyDDP, overlap_fraction
from ringflow.parallel.nn import mlp, train_reference
from ringflow.parallel.report import emit, print0
from ringflow.units import format_size, parse_size


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=96, help="global batch (split over ranks)")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--bucket-cap", default="64KiB")
    ap.add_argument("--first-bucket", default="8KiB")
    ap.add_argument("--overlap-width", type=int, default=512, help="hidden width of the model timed for overlap")
    ap.add_argument("--overlap-steps", type=int, default=6)
    ap.add_argument("--overlap-batch", type=int, default=960, help="global batch of the timed model")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        sizes = [data.n_features, 64, 64, data.n_classes]
        model = mlp(sizes, seed=1 if comm.rank == 0 else 100 + comm.rank)   # deliberately out of sync
        ddp = NumpyDDP(model, comm, bucket_cap_nbytes=parse_size(a.bucket_cap),
                       first_bucket_nbytes=parse_size(a.first_bucket))
        for step in range(a.steps):
            ddp.train_step(*local_batch(data.x_train, data.y_train, step, a.batch, comm.rank, comm.size), a.lr)
        ref = mlp(sizes, seed=1)
        train_reference(ref, [global_batch(data.x_train, data.y_train, s, a.batch) for s in range(a.steps)], a.lr)
        err = np.array([np.abs(model.params.flat - ref.params.flat).max()])
        comm.all_reduce(err, op="max")
        in_order = np.array([float(all(o == list(range(len(ddp.buckets))) for o in ddp.stats.launch_order))])
        comm.all_reduce(in_order, op="min")          # 1 only if every rank issued every step's buckets in plan order
        print0(comm, f"ranks={comm.size} steps={a.steps} global batch={a.batch} params={model.params.numel} float64")
        print0(comm, "buckets (reverse parameter order): " + ", ".join(
            f"#{b.index} {format_size(b.nbytes)} {[model.params.names[i] for i in b.params]}" for b in ddp.buckets))
        print0(comm, f"launch order during backward: {ddp.stats.launch_order[-1]} "
                     f"(plan order on every rank and step: {bool(in_order[0])})")
        print0(comm, f"equivalence: max |DDP - single-process| over all ranks = {err[0]:.3e} (tolerance 1e-12)")

        # overlap: a wider model so that communication takes measurable time
        wide = [data.n_features, a.overlap_width, a.overlap_width, a.overlap_width, data.n_classes]
        m2 = mlp(wide, seed=2)
        d2 = NumpyDDP(m2, comm, bucket_cap_nbytes=parse_size(a.bucket_cap) * 8,
                      first_bucket_nbytes=parse_size(a.first_bucket) * 8)
        res = {}
        for overlap in (False, True):
            d2.overlap = overlap
            d2.stats.exposed_s.clear()
            d2.stats.backward_s.clear()
            for step in range(a.overlap_steps):
                xb, yb = local_batch(data.x_train, data.y_train, step, a.overlap_batch, comm.rank, comm.size)
                d2.train_step(xb, yb, 0.01)
            t = np.array([d2.stats.mean_exposed_s(), d2.stats.mean_backward_s()])
            comm.all_reduce(t, op="avg")
            res[overlap] = t
        comm_s, exposed_s, bwd_s = res[False][0], res[True][0], res[True][1]
        frac = overlap_fraction(exposed_s, comm_s)
        print0(comm, f"overlap model: {m2.params.numel} params = {format_size(m2.params.flat.nbytes)} of gradients "
                     f"in {len(d2.buckets)} buckets")
        print0(comm, f"backward {bwd_s * 1e3:.2f} ms | all-reduce after backward (no overlap) {comm_s * 1e3:.2f} ms | "
                     f"exposed with overlap {exposed_s * 1e3:.2f} ms | overlap fraction {frac:.2f}")
        emit(comm, {"ranks": comm.size, "max_err": float(err[0]), "buckets": [list(b.params) for b in ddp.buckets],
                    "launch_orders": ddp.stats.launch_order,
                    "in_order_all_ranks": bool(in_order[0]), "comm_s": comm_s, "exposed_s": exposed_s,
                    "backward_s": bwd_s, "overlap_fraction": frac}, a.json_out)


if __name__ == "__main__":
    main()
