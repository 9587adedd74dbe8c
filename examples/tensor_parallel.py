"""Tensor parallel (Megatron split) transformer block: forward and backward equal the unsplit block.

    ringflow run -n 2 examples/tensor_parallel.py

Attention heads and MLP width are split over the ranks (QKV and fc1
column-parallel, proj and fc2 row-parallel). Every rank also runs the unsplit
block locally and compares output, input gradient and its parameter-gradient
slices, then both train k SGD steps and compare parameters.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse

import numpy as np

import ringflow
from ringflow.parallel.report import emit, print0
from ringflow.parallel.tensor import TransformerBlock, shard_block_params


def main() -> None:
    """Run the example."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    with ringflow.init() as comm:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(a.batch, a.seq, a.d_model))
        target = rng.normal(size=x.shape)
        full = TransformerBlock(a.d_model, a.heads, a.d_ff, None, seed=3)
        tp = TransformerBlock(a.d_model, a.heads, a.d_ff, comm, seed=3)

        def grads(blk: TransformerBlock) -> dict[str, np.ndarray]:
            return {k: blk.params.gradient(k).copy() for k in blk.ORDER}

        errs = np.zeros(4)
        for step in range(a.steps):
            y_f, c_f = full.forward(x)
            dy = (y_f - target) / y_f.size              # MSE gradient, identical on all ranks
            dx_f = full.backward(c_f, dy)
            y_t, c_t = tp.forward(x)
            dx_t = tp.backward(c_t, (y_t - target) / y_t.size)
            g_ref = shard_block_params(grads(full), comm.rank, comm.size)
            g_tp = grads(tp)
            if step == 0:
                errs[0] = np.abs(y_t - y_f).max()
                errs[1] = np.abs(dx_t - dx_f).max()
                errs[2] = max(np.abs(g_tp[k] - g_ref[k]).max() for k in g_ref)
                calls = dict(vars(tp.counter))
            full.params.flat -= a.lr * full.params.grad
            tp.params.flat -= a.lr * tp.params.grad
        p_ref = shard_block_params({k: full.params.value(k) for k in full.ORDER}, comm.rank, comm.size)
        errs[3] = max(np.abs(tp.params.value(k) - p_ref[k]).max() for k in p_ref)
        comm.all_reduce(errs, op="max")
        print0(comm, f"tp={comm.size} d_model={a.d_model} heads={a.heads} ({a.heads // comm.size} per rank) "
                     f"d_ff={a.d_ff} ({a.d_ff // comm.size} per rank) x=({a.batch},{a.seq},{a.d_model}) float64")
        print0(comm, f"all-reduces in one forward: {calls['forward']}, in one backward: {calls['backward']} "
                     "(one per attention and one per MLP, each way)")
        print0(comm, f"max |TP - unsplit|: output {errs[0]:.3e}, dx {errs[1]:.3e}, parameter grads {errs[2]:.3e}, "
                     f"parameters after {a.steps} SGD steps {errs[3]:.3e} (tolerance 1e-12)")
        emit(comm, {"ranks": comm.size, "out_err": errs[0], "dx_err": errs[1], "grad_err": errs[2],
                    "param_err": errs[3], "calls": calls}, a.json_out)


if __name__ == "__main__":
    main()
