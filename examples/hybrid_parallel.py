"""Hybrid data x tensor parallel: the transformer block split over TP groups, replicated over DP groups.

    ringflow run -n 4 examples/hybrid_parallel.py --tp 2

`comm.split` builds the groups: ranks {0..tp-1} form the first TP group, and
ranks with the same TP index form a DP group. Each DP replica takes 1/dp of the
batch, runs the Megatron-split block with its TP group, then all-reduces its
gradient shard over its DP group (average). After k SGD steps every rank's
shard equals the unsplit block trained on the whole batch.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse

import numpy as np

import ringflow
from ringflow.errors import InvalidArgument
from ringflow.parallel.report import emit, print0
from ringflow.parallel.tensor import TransformerBlock, shard_block_params


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel group size (must divide the ranks)")
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="global batch (split over DP replicas)")
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        if comm.size % a.tp or a.batch % (comm.size // a.tp):
            raise InvalidArgument(f"--tp {a.tp} must divide {comm.size} ranks and the DP degree the batch {a.batch}",
                                  "e.g. -n 4 --tp 2 --batch 8")
        dp = comm.size // a.tp
        tp_comm = comm.split(comm.rank // a.tp, key=comm.rank)
        dp_comm = comm.split(comm.rank % a.tp, key=comm.rank)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(a.batch, a.seq, a.d_model))
        target = rng.normal(size=x.shape)
        per = a.batch // dp
        xs, ts = x[dp_comm.rank * per:(dp_comm.rank + 1) * per], target[dp_comm.rank * per:(dp_comm.rank + 1) * per]
        full = TransformerBlock(a.d_model, a.heads, a.d_ff, None, seed=3)
        blk = TransformerBlock(a.d_model, a.heads, a.d_ff, tp_comm, seed=3)
        for _ in range(a.steps):
            y, c = full.forward(x)
            full.backward(c, (y - target) / y.size)
            full.params.flat -= a.lr * full.params.grad
            y, c = blk.forward(xs)
            blk.backward(c, (y - ts) / y.size)       # mean over the local shard
            dp_comm.all_reduce(blk.params.grad, op="avg")
            blk.params.flat -= a.lr * blk.params.grad
        ref = shard_block_params({k: full.params.value(k) for k in full.ORDER}, tp_comm.rank, tp_comm.size)
        err = np.array([max(np.abs(blk.params.value(k) - ref[k]).max() for k in ref)])
        comm.all_reduce(err, op="max")
        groups = np.zeros(2 * comm.size)
        groups[2 * comm.rank:2 * comm.rank + 2] = (tp_comm.rank, dp_comm.rank)
        comm.all_reduce(groups, op="sum")
        print0(comm, f"ranks={comm.size} = tp {a.tp} x dp {dp}; (tp rank, dp rank) per global rank: "
                     f"{[(int(groups[2 * r]), int(groups[2 * r + 1])) for r in range(comm.size)]}")
        print0(comm, f"per step: {blk.counter.forward // a.steps} TP all-reduces forward, "
                     f"{blk.counter.backward // a.steps} backward (in the TP group), 1 gradient all-reduce "
                     f"of {blk.params.grad.nbytes} bytes in the DP group")
        print0(comm, f"equivalence: max |hybrid - unsplit block on the whole batch| after {a.steps} steps = "
                     f"{err[0]:.3e} (tolerance 1e-12)")
        emit(comm, {"ranks": comm.size, "tp": a.tp, "dp": dp, "param_err": float(err[0])}, a.json_out)
        tp_comm.destroy()
        dp_comm.destroy()


if __name__ == "__main__":
    main()
