"""Parameter server training with BSP, ASP and SSP consistency (Li et al., OSDI 2014; Ho et al., NIPS 2013).

Server ranks hold contiguous shards of the flat parameter vector; workers push
gradient shards and get fresh parameter shards back. Placements:
"cpu" (rank 0 is a server only, the rest are workers: the CPU-as-server
design), "rank0" (rank 0 serves all parameters and also trains) and "sharded"
(every rank serves 1/N of the parameters and trains).

Consistency, decided per shard by `ShardServer` (pure logic, unit-tested):
- BSP: a shard applies the mean of one gradient from every worker, then
  answers all of them (equals synchronous data parallel);
- ASP: a shard applies each gradient at once (scaled 1/workers) and answers at once;
- SSP(s): like ASP, but a worker whose clock (pushes so far) is more than s
  ahead of the slowest active worker gets its answer only when the slowest
  catches up. Every answer is logged with (clock, slowest clock), so the bound
  can be checked from the record.
Training stops when the coordinator shard (server 0) has applied
`steps x workers` gradients; its answers then carry a stop flag, workers say
bye, and servers finish when every worker has.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..algorithms.layout import split_counts
from ..errors import InvalidArgument, ProtocolError, UnknownAlgorithm
from .data import Dataset, local_batch
from .mailbox import Mailbox, poll_until
from .nn import Sequential, accuracy, softmax_xent

MODES = ("bsp", "ssp", "asp")
PLACEMENTS = ("cpu", "rank0", "sharded")
PUSH_TAG, REPLY_TAG = 101, 102
KIND_GRAD, KIND_BYE = 0.0, 1.0


def roles(placement: str, size: int) -> tuple[list[int], list[int]]:
    """(server ranks, worker ranks) for a placement on `size` ranks."""
    if placement == "cpu":
        if size < 2:
            raise InvalidArgument("placement 'cpu' needs at least 2 ranks (1 server + workers)",
                                  "launch with -n 2 or more, or use placement 'rank0'")
        return [0], list(range(1, size))
    if placement == "rank0":
        return [0], list(range(size))
    if placement == "sharded":
        return list(range(size)), list(range(size))
    raise UnknownAlgorithm(f"unknown server placement {placement!r}", f"use one of {', '.join(PLACEMENTS)}")


def shard_bounds(numel: int, n_servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's shard (ringflow's one uneven-split convention)."""
    bounds, lo = [], 0
    for c in split_counts(numel, n_servers):
        bounds.append((lo, lo + c))
        lo += c
    return bounds


@dataclass(frozen=True)
class Release:
    """A reply to a worker: who, its clock, the slowest active clock at that moment, and the stop flag."""

    worker: int
    clock: int
    min_clock: float
    stop: bool


class ShardServer:
    """Consistency logic of one parameter shard (no communication: feed it pushes, it says whom to answer)."""

    def __init__(self, init: np.ndarray, workers: list[int], mode: str, lr: float, staleness: int = 0,
                 target_updates: int | None = None) -> None:
        if mode not in MODES:
            raise UnknownAlgorithm(f"unknown consistency mode {mode!r}", f"use one of {', '.join(MODES)}")
        if staleness < 0:
            raise InvalidArgument(f"staleness bound {staleness} is negative", "use s >= 0 (s = 0 behaves like BSP)")
        self.params = np.array(init, dtype=np.float64, copy=True)
        self.mode, self.lr, self.s, self.target = mode, lr, staleness, target_updates
        self.n_workers = len(workers)
        self.clocks = {w: 0 for w in workers}
        self.active = set(workers)
        self.read_version = {w: 0 for w in workers}
        self.deferred: list[int] = []
        self.version = self.applied = 0
        self._acc = np.zeros_like(self.params)
        self._acc_n = 0
        self.staleness: list[int] = []
        self.releases: list[Release] = []

    @property
    def done(self) -> bool:
        """Every worker said bye and nobody waits for an answer."""
        return not self.active and not self.deferred

    def min_clock(self) -> float:
        """Clock of the slowest active worker (inf when none is left)."""
        return min((self.clocks[w] for w in self.active), default=float("inf"))

    def push(self, worker: int, clock: int, grad: np.ndarray) -> list[Release]:
        """A gradient computed on the parameters last sent to `worker`; returns the answers now due."""
        if worker not in self.active:
            raise ProtocolError(f"push from worker {worker}, which is not active on this shard",
                                "a worker must not push after saying bye")
        if clock != self.clocks[worker] + 1 or worker in self.deferred:
            raise ProtocolError(f"worker {worker} pushed clock {clock} (expected {self.clocks[worker] + 1}, "
                                "one push per answer)", "wait for the answer before pushing again")
        self.clocks[worker] = clock
        self.deferred.append(worker)
        self.staleness.append(self.version - self.read_version[worker])
        if self.mode == "bsp":
            self._acc += grad
            self._acc_n += 1
            self._maybe_apply_round()
        else:
            self.params -= (self.lr / self.n_workers) * grad
            self.version += 1
            self.applied += 1
        return self._release()

    def bye(self, worker: int) -> list[Release]:
        """`worker` stops; it no longer holds the slowest clock back."""
        self.active.discard(worker)
        if self.mode == "bsp":
            self._maybe_apply_round()
        return self._release()

    def _maybe_apply_round(self) -> None:
        if self._acc_n and self._acc_n == len(self.active):
            self.params -= self.lr * (self._acc / self._acc_n)
            self.version += 1
            self.applied += self._acc_n
            self._acc[...] = 0.0
            self._acc_n = 0

    def _release(self) -> list[Release]:
        stop = self.target is not None and self.applied >= self.target
        low = self.min_clock()
        out = []
        for w in list(self.deferred):
            if self.mode == "bsp":
                ok = self._acc_n == 0
            elif self.mode == "asp":
                ok = True
            else:
                ok = stop or self.clocks[w] - low <= self.s
            if ok:
                self.deferred.remove(w)
                self.read_version[w] = self.version
                rel = Release(w, self.clocks[w], low, stop)
                self.releases.append(rel)
                out.append(rel)
        return out

    def max_clock_gap(self) -> float:
        """Largest (own clock - slowest clock) among answers that let a worker compute again."""
        gaps = [r.clock - r.min_clock for r in self.releases if not r.stop and r.min_clock != float("inf")]
        return max(gaps, default=0)


@dataclass
class PSResult:
    """Outcome of one parameter-server run (identical on every rank)."""

    mode: str
    placement: str
    params: np.ndarray
    wall_s: float
    worker_steps: list[int]
    updates_applied: int
    max_clock_gap: float
    staleness_mean: float
    staleness_max: int
    test_accuracy: float = 0.0
    extra: dict = field(default_factory=dict)


class _Worker:
    """One worker's loop as a state machine: compute (maybe slowed), push, wait for all shards."""

    def __init__(self, box: Mailbox, model: Sequential, data: Dataset, index: int, n_workers: int,
                 servers: list[int], bounds: list[tuple[int, int]], batch: int, slow_s: float) -> None:
        self.box, self.model, self.data, self.index, self.n_workers = box, model, data, index, n_workers
        self.servers, self.bounds, self.batch, self.slow_s = servers, bounds, batch, slow_s
        self.clock = 0
        self.state = "compute"
        self.busy_until: float | None = None
        self.replies: dict[int, np.ndarray] = {}
        self.done = False

    def step(self) -> bool:
        """Advance the state machine; True if anything happened."""
        if self.done:
            return False
        if self.state == "compute":
            if self.busy_until is None:
                x, y = local_batch(self.data.x_train, self.data.y_train, self.clock, self.batch,
                                   self.index, self.n_workers)
                out, caches = self.model.forward(x)
                _, dy = softmax_xent(out, y)
                self.model.backward(caches, dy)
                self.busy_until = time.monotonic() + self.slow_s
            if time.monotonic() < self.busy_until:
                return False
            self.busy_until = None
            self.clock += 1
            g = self.model.params.grad
            for srv, (lo, hi) in zip(self.servers, self.bounds, strict=True):
                self.box.send(srv, PUSH_TAG, np.concatenate(([KIND_GRAD, self.clock], g[lo:hi])))
            self.state, self.replies = "wait", {}
            return True
        progressed = False
        for srv, (lo, hi) in zip(self.servers, self.bounds, strict=True):
            if srv not in self.replies:
                msg = self.box.try_recv(srv, REPLY_TAG, 2 + hi - lo)
                if msg is not None:
                    self.replies[srv] = msg
                    progressed = True
        if len(self.replies) == len(self.servers):
            for srv, (lo, hi) in zip(self.servers, self.bounds, strict=True):
                self.model.params.flat[lo:hi] = self.replies[srv][2:]
            if self.replies[self.servers[0]][0] != 0.0:
                for srv, (lo, hi) in zip(self.servers, self.bounds, strict=True):
                    self.box.send(srv, PUSH_TAG, np.concatenate(([KIND_BYE, self.clock], np.zeros(hi - lo))))
                self.done = True
            else:
                self.state = "compute"
        return progressed


class _Server:
    """Serves one shard over the mailbox."""

    def __init__(self, box: Mailbox, shard: ShardServer, workers: list[int], nelem: int) -> None:
        self.box, self.shard, self.workers, self.nelem = box, shard, workers, nelem

    def step(self) -> bool:
        """Handle every push that has arrived; True if any did."""
        progressed = False
        for w in self.workers:
            if w not in self.shard.active:
                continue
            msg = self.box.try_recv(w, PUSH_TAG, 2 + self.nelem)
            if msg is None:
                continue
            progressed = True
            if msg[0] == KIND_BYE:
                rels = self.shard.bye(w)
            else:
                rels = self.shard.push(w, int(msg[1]), msg[2:])
            for r in rels:
                self.box.send(r.worker, REPLY_TAG,
                              np.concatenate(([1.0 if r.stop else 0.0, self.shard.version], self.shard.params)))
        return progressed


def train_param_server(comm: Any, make_model: Callable[[], Sequential], data: Dataset, *, mode: str = "bsp",
                       staleness: int = 2, placement: str = "sharded", steps: int = 20, batch: int = 64,
                       lr: float = 0.1, slow_rank: int | None = None, slow_s: float = 0.0,
                       timeout: float | None = None) -> PSResult:
    """Train `make_model()` with a parameter server; steps = gradient pushes per worker on average."""
    if mode not in MODES:
        raise UnknownAlgorithm(f"unknown consistency mode {mode!r}", f"use one of {', '.join(MODES)}")
    servers, workers = roles(placement, comm.size)
    model = make_model()
    numel = model.params.numel
    bounds = shard_bounds(numel, len(servers))
    box = Mailbox(comm, (PUSH_TAG, REPLY_TAG), timeout)
    server = worker = None
    if comm.rank in servers:
        k = servers.index(comm.rank)
        lo, hi = bounds[k]
        shard = ShardServer(model.params.flat[lo:hi], workers, mode, lr, staleness,
                            target_updates=steps * len(workers) if k == 0 else None)
        server = _Server(box, shard, workers, hi - lo)
    if comm.rank in workers:
        worker = _Worker(box, model, data, workers.index(comm.rank), len(workers), servers, bounds, batch,
                         slow_s if comm.rank == slow_rank else 0.0)
    comm.barrier(timeout=box.timeout)
    t0 = time.monotonic()

    def step() -> bool:
        a = server.step() if server is not None else False
        b = worker.step() if worker is not None else False
        return a or b

    poll_until(lambda: (server is None or server.shard.done) and (worker is None or worker.done), step,
               box.timeout, f"parameter server ({mode}, rank {comm.rank})")
    elapsed = np.array([time.monotonic() - t0])
    box.close()
    comm.all_reduce(elapsed, op="max", timeout=box.timeout)
    final = np.zeros(numel)
    steps_done = np.zeros(comm.size)
    stats = np.zeros(3)  # staleness sum, staleness count, updates applied on the coordinator
    gap = np.zeros(1)
    if server is not None:
        final[lo:hi] = server.shard.params
        st = server.shard.staleness
        stats[:] = (sum(st), len(st), server.shard.applied if k == 0 else 0)
        gap[0] = server.shard.max_clock_gap()
        smax = np.array([max(st, default=0)], dtype=np.float64)
    else:
        smax = np.zeros(1)
    if worker is not None:
        steps_done[comm.rank] = worker.clock
    for arr, op in ((final, "sum"), (steps_done, "sum"), (stats, "sum"), (gap, "max"), (smax, "max")):
        comm.all_reduce(arr, op=op, timeout=box.timeout)
    model.params.flat[...] = final
    out, _ = model.forward(data.x_test)
    return PSResult(mode=mode, placement=placement, params=final, wall_s=float(elapsed[0]),
                    worker_steps=[int(steps_done[w]) for w in workers], updates_applied=int(stats[2]),
                    max_clock_gap=float(gap[0]), staleness_mean=float(stats[0] / max(stats[1], 1)),
                    staleness_max=int(smax[0]), test_accuracy=accuracy(out, data.y_test))
