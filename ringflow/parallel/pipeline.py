"""Pipeline parallelism: an MLP cut into stages across ranks, run by GPipe or 1F1B action lists.

Rank s holds stage s. Activations go forward and their gradients backward by
point-to-point messages (send via `isend`, so no schedule can deadlock on a
blocking send; receive via `recv` with a timeout). Micro-batch losses are
scaled by 1/m, so one step equals one full-batch SGD step of the unsplit
model. The measured bubble is 1 - sum(stage compute time) / (p x step wall time).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .nn import Layer, Linear, Sequential, mlp_layers, sgd_step, softmax_xent
from .pp_schedule import schedule, theoretical_bubble

Array = np.ndarray


def stage_bounds(layers: Sequence[Layer], stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) layer ranges, one per stage, minimising the largest stage's weight count.

    Weight count (n_in x n_out per Linear) is the proxy for a stage's FLOPs; an
    activation layer stays with the Linear before it; every stage gets >= 1 Linear.
    """
    starts = [i for i, layer in enumerate(layers) if isinstance(layer, Linear)]
    n = len(starts)
    if not 1 <= stages <= n:
        raise InvalidArgument(f"{stages} stages but {n} linear layers",
                              "use between 1 and as many ranks as the model has linear layers")
    cost = [int(np.prod(layers[i].param_shapes["W"])) for i in starts]
    prefix = np.concatenate(([0], np.cumsum(cost)))
    inf = float("inf")
    # best[k][j]: smallest possible max-stage cost putting the first j units on k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], prefix[j] - prefix[i])
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    ends, j = [], n
    for k in range(stages, 0, -1):
        ends.append(j)
        j = cut[k][j]
    ends.reverse()
    bounds, lo_unit = [], 0
    for e in ends:
        lo = starts[lo_unit]
        hi = starts[e] if e < n else len(layers)
        bounds.append((lo, hi))
        lo_unit = e
    return bounds


@dataclass
class StepStats:
    """What one pipeline step measured (identical on all ranks after the exchange)."""

    loss: float
    wall_s: float
    busy_s: list[float]
    bubble: float
    theory_bubble: float
    peak_inflight: int


class PipelineStage:
    """This rank's stage of an MLP with widths `sizes`, trained with schedule 'gpipe' or '1f1b'."""

    def __init__(self, comm: Any, sizes: Sequence[int], *, seed: int = 0, schedule_name: str = "1f1b",
                 micro_batches: int = 4, timeout: float | None = None) -> None:
        self.comm, self.p, self.s = comm, comm.size, comm.rank
        layers = mlp_layers(sizes)
        lo, hi = stage_bounds(layers, self.p)[self.s]
        self.model = Sequential(layers[lo:hi], first_index=lo).init(seed)
        self.in_width = layers[lo].param_shapes["W"][0]
        self.out_width = [lay for lay in layers[lo:hi] if isinstance(lay, Linear)][-1].param_shapes["W"][1]
        self.m, self.timeout = micro_batches, timeout
        self.actions = schedule(schedule_name, self.p, micro_batches)[self.s]

    @property
    def is_first(self) -> bool:
        """Stage 0 reads the inputs."""
        return self.s == 0

    @property
    def is_last(self) -> bool:
        """The last stage computes the loss."""
        return self.s == self.p - 1

    def train_step(self, x: Array | None, y: Array | None, lr: float) -> StepStats:
        """One SGD step on a global batch (x needed on stage 0, y on the last stage)."""
        comm, m, s = self.comm, self.m, self.s
        n = (x if self.is_first else y if self.is_last else None)
        batch = int(n.shape[0]) if n is not None else -1
        sizes = np.array([batch], dtype=np.int64)
        comm.all_reduce(sizes, op="max", timeout=self.timeout)
        batch = int(sizes[0])
        if batch % m:
            raise InvalidArgument(f"batch {batch} is not divisible by {m} micro-batches",
                                  "choose a batch that is a multiple of micro_batches")
        mb = batch // m
        self.model.params.grad[...] = 0.0
        caches: dict[int, Any] = {}
        pending: list[Any] = []
        busy = loss = 0.0
        live = peak = 0
        comm.barrier(timeout=self.timeout)
        t_start = time.time()
        for a in self.actions:
            j = a.mb
            if a.kind == "F":
                if self.is_first:
                    assert x is not None
                    inp = np.ascontiguousarray(x[j * mb:(j + 1) * mb])
                else:
                    inp = np.empty((mb, self.in_width), dtype=self.model.params.flat.dtype)
                    comm.recv(inp, s - 1, tag=2 * j, timeout=self.timeout)
                t0 = time.perf_counter()
                out, cache = self.model.forward(inp)
                if self.is_last:
                    assert y is not None
                    lj, dy = softmax_xent(out, y[j * mb:(j + 1) * mb], scale=1.0 / m)
                    loss += lj / m
                    caches[j] = (cache, dy)
                else:
                    caches[j] = (cache, None)
                busy += time.perf_counter() - t0
                if not self.is_last:
                    pending.append(comm.isend(np.ascontiguousarray(out), s + 1, tag=2 * j, timeout=self.timeout))
                live += 1
                peak = max(peak, live)
            else:
                cache, dy = caches.pop(j)
                if not self.is_last:
                    dy = np.empty((mb, self.out_width), dtype=self.model.params.flat.dtype)
                    comm.recv(dy, s + 1, tag=2 * j + 1, timeout=self.timeout)
                t0 = time.perf_counter()
                dx = self.model.backward(cache, dy, accumulate=True)
                busy += time.perf_counter() - t0
                if not self.is_first:
                    pending.append(comm.isend(np.ascontiguousarray(dx), s - 1, tag=2 * j + 1, timeout=self.timeout))
                live -= 1
        for w in pending:
            w.wait(timeout=self.timeout)
        t_end = time.time()
        sgd_step(self.model.params, lr)
        mine = np.array([t_start, t_end, busy, loss], dtype=np.float64)
        allv = np.empty(4 * self.p, dtype=np.float64)
        comm.all_gather(mine, out=allv, timeout=self.timeout)
        allv = allv.reshape(self.p, 4)
        wall = float(allv[:, 1].max() - allv[:, 0].min())
        busy_all = [float(b) for b in allv[:, 2]]
        return StepStats(loss=float(allv[-1, 3]), wall_s=wall, busy_s=busy_all,
                         bubble=1.0 - sum(busy_all) / (self.p * wall), theory_bubble=theoretical_bubble(self.p, m),
                         peak_inflight=peak)
