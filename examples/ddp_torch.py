"""Data parallel for a torch module: post-accumulate-grad hooks launch bucket all-reduces during backward.

    ringflow run -n 2 examples/ddp_torch.py

Equivalence: after k SGD steps (float64) every rank equals a single-process
torch model trained on the concatenated batch. Overlap: mean exposed wait
after backward with hooks launching buckets, versus the same all-reduces
run after backward.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per rank: ranks are the parallelism (as torchrun does)

import argparse

import numpy as np

import ringflow
from ringflow.parallel.data import global_batch, local_batch, make_classification
from ringflow.parallel.ddp import TorchDDP, overlap_fraction
from ringflow.parallel.report import emit, print0
from ringflow.units import format_size, parse_size


def build(torch: object, widths: list[int], seed: int) -> object:
    """A float64 torch MLP with tanh activations."""
    torch.manual_seed(seed)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1], dtype=torch.float64))
        if i < len(widths) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def main() -> None:
    """Run the example."""
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--bucket-cap", default="64KiB")
    ap.add_argument("--first-bucket", default="8KiB")
    ap.add_argument("--overlap-width", type=int, default=512)
    ap.add_argument("--overlap-steps", type=int, default=6)
    ap.add_argument("--overlap-batch", type=int, default=960, help="global batch of the timed model")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with ringflow.init() as comm:
        data = make_classification(seed=0)
        widths = [data.n_features, 64, 64, data.n_classes]
        net = build(torch, widths, seed=1 if comm.rank == 0 else 100 + comm.rank)
        ddp = TorchDDP(net, comm, bucket_cap_nbytes=parse_size(a.bucket_cap),
                       first_bucket_nbytes=parse_size(a.first_bucket))
        opt = torch.optim.SGD(net.parameters(), lr=a.lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        for step in range(a.steps):
            x, y = local_batch(data.x_train, data.y_train, step, a.batch, comm.rank, comm.size)
            opt.zero_grad()
            loss_fn(ddp(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            opt.step()
        ref = build(torch, widths, seed=1)
        ropt = torch.optim.SGD(ref.parameters(), lr=a.lr)
        for step in range(a.steps):
            x, y = global_batch(data.x_train, data.y_train, step, a.batch)
            ropt.zero_grad()
            loss_fn(ref(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            ropt.step()
        err = np.array([max(float((p - q).detach().abs().max()) for p, q in zip(net.parameters(), ref.parameters()))])
        comm.all_reduce(err, op="max")
        in_order = np.array([float(all(o == list(range(len(ddp.buckets))) for o in ddp.stats.launch_order))])
        comm.all_reduce(in_order, op="min")          # 1 only if every rank issued every step's buckets in plan order
        print0(comm, f"torch {torch.__version__} ranks={comm.size} steps={a.steps} global batch={a.batch} float64")
        print0(comm, "buckets (param indices, reverse order): "
                     + ", ".join(f"#{b.index} {format_size(b.nbytes)} {list(b.params)}" for b in ddp.buckets))
        print0(comm, f"launch order during backward: {ddp.stats.launch_order[-1]} "
                     f"(plan order on every rank and step: {bool(in_order[0])})")
        print0(comm, f"equivalence: max |DDP - single-process torch| = {err[0]:.3e} (tolerance 1e-12)")

        wide = [data.n_features, a.overlap_width, a.overlap_width, a.overlap_width, data.n_classes]
        net2 = build(torch, wide, seed=2)
        d2 = TorchDDP(net2, comm, bucket_cap_nbytes=parse_size(a.bucket_cap) * 8,
                      first_bucket_nbytes=parse_size(a.first_bucket) * 8)
        opt2 = torch.optim.SGD(net2.parameters(), lr=0.01)
        res = {}
        for overlap in (False, True):
            d2.overlap = overlap
            d2.stats.exposed_s.clear()
            d2.stats.backward_s.clear()
            for step in range(a.overlap_steps):
                x, y = local_batch(data.x_train, data.y_train, step, a.overlap_batch, comm.rank, comm.size)
                opt2.zero_grad()
                loss_fn(d2(torch.from_numpy(x)), torch.from_numpy(y)).backward()
                opt2.step()
            t = np.array([d2.stats.mean_exposed_s(), d2.stats.mean_backward_s()])
            comm.all_reduce(t, op="avg")
            res[overlap] = t
        comm_s, exposed_s, bwd_s = res[False][0], res[True][0], res[True][1]
        frac = overlap_fraction(exposed_s, comm_s)
        nbytes = sum(p.numel() * p.element_size() for p in net2.parameters())
        print0(comm, f"overlap model: {format_size(nbytes)} of gradients in {len(d2.buckets)} buckets")
        print0(comm, f"backward {bwd_s * 1e3:.2f} ms | all-reduce after backward (no overlap) {comm_s * 1e3:.2f} ms | "
                     f"exposed with overlap {exposed_s * 1e3:.2f} ms | overlap fraction {frac:.2f}")
        emit(comm, {"ranks": comm.size, "max_err": float(err[0]), "launch_orders": ddp.stats.launch_order,
                    "in_order_all_ranks": bool(in_order[0]),
                    "buckets": [list(b.params) for b in ddp.buckets], "comm_s": comm_s, "exposed_s": exposed_s,
                    "overlap_fraction": frac}, a.json_out)


if __name__ == "__main__":
    main()
