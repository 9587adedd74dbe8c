"""Data parallel with bucketed, backward-overlapped gradient all-reduce (NumPy models and torch modules).

Both wrappers do what PyTorch DDP does: broadcast rank 0's parameters once,
then in every backward pass launch each bucket's asynchronous all-reduce as
soon as all its gradients exist (buckets strictly in plan order, the same on
every rank), wait for the rest when backward ends, and divide by the world
size; the optimizer step follows. `overlap=False` instead runs the same
all-reduces blocking after backward, which measures the communication time
that overlap tries to hide:

    overlap_fraction = 1 - exposed_s(overlap) / comm_s(no overlap)

where exposed_s is the wait between the end of backward and the last bucket's
completion.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidUsage
from .buckets import DEFAULT_BUCKET_CAP_NBYTES, DEFAULT_FIRST_BUCKET_NBYTES, Bucket, plan_buckets
from .nn import Sequential, sgd_step, softmax_xent

Array = np.ndarray


@dataclass
class SyncStats:
    """Per-step timings of gradient synchronisation (seconds), appended once per backward."""

    backward_s: list[float] = field(default_factory=list)
    exposed_s: list[float] = field(default_factory=list)
    launch_order: list[list[int]] = field(default_factory=list)

    def mean_exposed_s(self, skip: int = 1) -> float:
        """Mean exposed communication, skipping warm-up steps."""
        v = self.exposed_s[skip:] or self.exposed_s
        return float(np.mean(v)) if v else 0.0

    def mean_backward_s(self, skip: int = 1) -> float:
        """Mean backward time, skipping warm-up steps."""
        v = self.backward_s[skip:] or self.backward_s
        return float(np.mean(v)) if v else 0.0


def overlap_fraction(exposed_s: float, comm_s: float) -> float:
    """Share of the communication time hidden behind backward, clipped to [0, 1]."""
    if comm_s <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - exposed_s / comm_s)))


class _BucketLauncher:
    """Tracks readiness and launches buckets strictly in plan order (shared by both wrappers)."""

    def __init__(self, buckets: list[Bucket], overlap: bool, launch: Any) -> None:
        self.buckets, self.overlap, self.launch = buckets, overlap, launch
        self.owner = {p: b.index for b in buckets for p in b.params}
        self.reset()

    def reset(self) -> None:
        """Start a new backward pass."""
        self.missing = [len(b.params) for b in self.buckets]
        self.next = 0
        self.order: list[int] = []

    def param_ready(self, i: int) -> None:
        """Parameter i's gradient is final; launch every bucket that is now complete and next in order."""
        self.missing[self.owner[i]] -= 1
        if self.overlap:
            self._drain()

    def _drain(self) -> None:
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            self.order.append(self.next)
            self.launch(self.buckets[self.next])
            self.next += 1

    def finish(self) -> None:
        """Launch what is left (all of it when overlap is off); every bucket must be complete now."""
        if any(self.missing):
            raise InvalidUsage("backward ended but some parameters got no gradient",
                               "every parameter must take part in the loss (or leave it out of the model)")
        self._drain()


class _OverlapSwitch:
    """The `overlap` switch shared by the DDP wrappers (both hold a `_launcher`)."""

    _launcher: _BucketLauncher

    @property
    def overlap(self) -> bool:
        """Whether buckets are launched during backward."""
        return self._launcher.overlap

    @overlap.setter
    def overlap(self, value: bool) -> None:
        self._launcher.overlap = bool(value)


class NumpyDDP(_OverlapSwitch):
    """Data-parallel training of a `Sequential` model: bucketed async all-reduce during backward."""

    def __init__(self, model: Sequential, comm: Any, *, bucket_cap_nbytes: int = DEFAULT_BUCKET_CAP_NBYTES,
                 first_bucket_nbytes: int = DEFAULT_FIRST_BUCKET_NBYTES, overlap: bool = True,
                 timeout: float | None = None) -> None:
        self.model, self.comm, self.timeout = model, comm, timeout
        ps = model.params
        comm.broadcast(ps.flat, 0, timeout=timeout)
        self._index = {n: i for i, n in enumerate(ps.names)}
        self.buckets = plan_buckets([ps.nbytes(n) for n in ps.names], bucket_cap_nbytes, first_bucket_nbytes)
        self._ranges = []
        for b in self.buckets:
            los, his = zip(*(ps.offsets[ps.names[i]] for i in b.params), strict=True)
            self._ranges.append((min(los), max(his)))
        self._launcher = _BucketLauncher(self.buckets, overlap, self._launch)
        self._works: list[Any] = []
        self.stats = SyncStats()

    def _launch(self, b: Bucket) -> None:
        lo, hi = self._ranges[b.index]
        view = self.model.params.grad[lo:hi]
        if self._launcher.overlap:
            self._works.append(self.comm.all_reduce(view, op="sum", async_op=True, timeout=self.timeout))
        else:
            self.comm.all_reduce(view, op="sum", timeout=self.timeout)

    def _layer_ready(self, layer: int) -> None:
        for name in self.model.layer_param_names(layer):
            self._launcher.param_ready(self._index[name])

    def forward_backward(self, x: Array, y: Array) -> float:
        """Local loss on this rank's batch; on return `model.params.grad` holds the rank-averaged gradient."""
        self._launcher.reset()
        self._works = []
        out, caches = self.model.forward(x)
        loss, dy = softmax_xent(out, y)
        t0 = time.perf_counter()
        self.model.backward(caches, dy, on_layer_ready=self._layer_ready)
        t1 = time.perf_counter()
        self._launcher.finish()
        for w in self._works:
            w.wait(timeout=self.timeout)
        t2 = time.perf_counter()
        self.model.params.grad /= self.comm.size
        self.stats.backward_s.append(t1 - t0)
        self.stats.exposed_s.append(t2 - t1)
        self.stats.launch_order.append(list(self._launcher.order))
        return loss

    def train_step(self, x: Array, y: Array, lr: float) -> float:
        """forward_backward then SGD."""
        loss = self.forward_backward(x, y)
        sgd_step(self.model.params, lr)
        return loss


class TorchDDP(_OverlapSwitch):
    """DDP for a torch.nn.Module on CPU: post-accumulate-grad hooks launch each bucket's async all-reduce.

    After `loss.backward()` returns, every `p.grad` holds the rank average (the
    wait runs in a callback queued at the end of the autograd pass); then call
    the optimizer as usual.
    """

    def __init__(self, module: Any, comm: Any, *, bucket_cap_nbytes: int = DEFAULT_BUCKET_CAP_NBYTES,
                 first_bucket_nbytes: int = DEFAULT_FIRST_BUCKET_NBYTES, overlap: bool = True,
                 timeout: float | None = None) -> None:
        import torch  # optional dependency, loaded only here

        self._torch = torch
        self.module, self.comm, self.timeout = module, comm, timeout
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for p in self.params:
                buf = p.detach().clone().contiguous()
                comm.broadcast(buf, 0, timeout=timeout)
                p.copy_(buf)
        self.buckets = plan_buckets([p.numel() * p.element_size() for p in self.params],
                                    bucket_cap_nbytes, first_bucket_nbytes)
        self._launcher = _BucketLauncher(self.buckets, overlap, self._launch)
        self._flat: dict[int, Any] = {}
        self._works: list[tuple[Bucket, Any]] = []
        self._queued = False
        self._t_bwd_end = 0.0
        self._t_bwd_start = 0.0
        self.stats = SyncStats()
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._make_hook(i))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module's forward."""
        return self.module(*args, **kwargs)

    def _make_hook(self, i: int) -> Any:
        def hook(p: Any) -> None:
            if not self._queued:
                self._queued = True
                self._t_bwd_start = time.perf_counter()
                self._launcher.reset()
                self._works = []
                self._torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._launcher.param_ready(i)
        return hook

    def _launch(self, b: Bucket) -> None:
        torch = self._torch
        flat = torch.cat([self.params[i].grad.reshape(-1) for i in b.params])
        self._flat[b.index] = flat
        if self._launcher.overlap:
            self._works.append((b, self.comm.all_reduce(flat, op="sum", async_op=True, timeout=self.timeout)))
        else:
            self.comm.all_reduce(flat, op="sum", timeout=self.timeout)
            self._works.append((b, None))

    def _finish(self) -> None:
        t1 = time.perf_counter()
        self._queued = False
        self._launcher.finish()
        size = self.comm.size
        for b, w in self._works:
            if w is not None:
                w.wait(timeout=self.timeout)
            flat = self._flat.pop(b.index)
            flat /= size
            off = 0
            for i in b.params:
                g = self.params[i].grad
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        t2 = time.perf_counter()
        self.stats.backward_s.append(t1 - self._t_bwd_start)
        self.stats.exposed_s.append(t2 - t1)
        self.stats.launch_order.append(list(self._launcher.order))
