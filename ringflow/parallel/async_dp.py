"""Asynchronous data parallel ("no waiting" DP), without a parameter server.

Every rank keeps a full replica. Each step it computes a gradient on its own
batch, applies it (scaled 1/workers) at once, sends it to every peer with
`isend`, and applies whatever peer gradients have arrived so far -- it never
waits for anyone. A replica is therefore always "the latest global weights
this worker has heard of", and stale: a peer gradient was computed on weights
that lacked some updates the receiver already has. Each message carries the
sender's vector clock (how many updates of each worker it had applied), so
staleness is counted exactly: updates present on the receiver but missing
from the weights the gradient was computed on. SGD updates add up, so after a
final drain every replica holds the same sum of updates: the replicas agree to
rounding even though no step was synchronous (reported as `replica_spread`).
The parameter-server ASP mode (`param_server.py`) is the centralised variant.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import Dataset, local_batch
from .mailbox import Mailbox, poll_until
from .nn import Sequential, accuracy, softmax_xent

GRAD_TAG = 201


@dataclass
class AsyncDPResult:
    """Outcome of an asynchronous DP run (identical on every rank)."""

    wall_s: float
    drain_s: float
    steps_s_fastest: float
    steps_s_slowest: float
    staleness_mean: float
    staleness_max: int
    replica_spread: float
    test_accuracy: float
    params: np.ndarray


def train_async_dp(comm: Any, make_model: Callable[[], Sequential], data: Dataset, *, steps: int = 20,
                   batch: int = 64, lr: float = 0.1, slow_rank: int | None = None, slow_s: float = 0.0,
                   timeout: float | None = None) -> AsyncDPResult:
    """Train `steps` asynchronous steps per rank; `batch` is the global batch (split over ranks)."""
    model = make_model()
    comm.broadcast(model.params.flat, 0, timeout=timeout)
    n, me = comm.size, comm.rank
    numel = model.params.numel
    box = Mailbox(comm, (GRAD_TAG,), timeout)
    peers = [r for r in range(n) if r != me]
    applied = np.zeros(n)            # vector clock: updates of each worker in this replica
    got = {r: 0 for r in peers}
    stale: list[int] = []
    scale = lr / n

    def drain() -> bool:
        progressed = False
        for r in peers:
            while got[r] < steps:
                msg = box.try_recv(r, GRAD_TAG, n + numel)
                if msg is None:
                    break
                seen = msg[:n]
                stale.append(int(np.maximum(applied - seen, 0).sum()))
                model.params.flat -= scale * msg[n:]
                applied[r] += 1
                got[r] += 1
                progressed = True
        return progressed

    comm.barrier(timeout=box.timeout)
    t0 = time.monotonic()
    for c in range(steps):
        seen = applied.copy()
        x, y = local_batch(data.x_train, data.y_train, c, batch, me, n)
        out, caches = model.forward(x)
        _, dy = softmax_xent(out, y)
        model.backward(caches, dy)
        grad = model.params.grad.copy()
        busy_until = time.monotonic() + (slow_s if me == slow_rank else 0.0)
        while time.monotonic() < busy_until:   # a straggler: slow compute, but it still takes in messages
            if not drain():
                time.sleep(1e-4)
        stale.append(int(np.maximum(applied - seen, 0).sum()))   # peer updates that arrived during compute
        model.params.flat -= scale * grad
        applied[me] += 1
        msg = np.concatenate((seen, grad))
        for r in peers:
            box.send(r, GRAD_TAG, msg)
        drain()
    t_train = time.monotonic()
    poll_until(lambda: all(v == steps for v in got.values()), drain, box.timeout,
               f"async DP drain (rank {me})")
    t_end = time.monotonic()
    box.close()
    times = np.array([t_end - t0, t_end - t_train, t_train - t0])
    fastest = times[2:3].copy()
    comm.all_reduce(times, op="max", timeout=box.timeout)
    comm.all_reduce(fastest, op="min", timeout=box.timeout)
    hi, lo = model.params.flat.copy(), model.params.flat.copy()
    comm.all_reduce(hi, op="max", timeout=box.timeout)
    comm.all_reduce(lo, op="min", timeout=box.timeout)
    st = np.array([sum(stale), len(stale), max(stale, default=0)], dtype=np.float64)
    smax = st[2:3].copy()
    comm.all_reduce(st, op="sum", timeout=box.timeout)
    comm.all_reduce(smax, op="max", timeout=box.timeout)
    out, _ = model.forward(data.x_test)
    return AsyncDPResult(wall_s=float(times[0]), drain_s=float(times[1]), steps_s_fastest=float(fastest[0]),
                         steps_s_slowest=float(times[2]), staleness_mean=float(st[0] / max(st[1], 1)),
                         staleness_max=int(smax[0]), replica_spread=float((hi - lo).max()),
                         test_accuracy=accuracy(out, data.y_test), params=model.params.flat.copy())
