"""ZeRO data parallelism for the NumPy models of `parallel.nn`, on a ringflow Communicator.

Stage 0 is plain data parallelism (all-reduce of gradients, every rank keeps everything). Stage 1 shards the
optimizer state (Adam's m and v): each rank updates its 1/n of the parameters and the parameters are
all-gathered. Stage 2 also shards gradients: each layer's gradients are reduce-scattered as soon as backward
produced them, and a rank keeps only its 1/n. Stage 3 also shards parameters: a rank keeps only its 1/n and
all-gathers a layer's parameters right before the layer's forward.

The sharding unit is one layer's parameters (a contiguous slice of `ParamSet.flat`), padded to a multiple of
n; rank r owns the r-th 1/n of every unit. In stages 2 and 3 the model's own full-size gradient (and, in 3,
parameter) vectors serve as backward / gather workspace; `state_bytes()` reports what persists between steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .nn import Array, Sequential, softmax_xent


@dataclass(frozen=True)
class Unit:
    """One layer's slice [lo, hi) of the flat parameters; `chunk` elements per rank at `off` in the shard."""

    layer: int
    lo: int
    hi: int
    chunk: int
    off: int

    def owned(self, rank: int) -> tuple[int, int]:
        """This rank's part [a, b) of the unit in the flat vector (may be empty)."""
        a = min(self.hi, self.lo + rank * self.chunk)
        return a, min(self.hi, a + self.chunk)


@dataclass
class Adam:
    """Adam (Kingma and Ba) over a flat vector of `n` elements: its state is m and v."""

    n: int
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    dtype: Any = np.float64

    def __post_init__(self) -> None:
        self.m = np.zeros(self.n, dtype=self.dtype)
        self.v = np.zeros(self.n, dtype=self.dtype)
        self.t = 0

    def begin_step(self) -> None:
        """Advance the step counter (once per optimizer step, before `update`s)."""
        self.t += 1

    def update(self, w: Array, g: Array, off: int = 0) -> None:
        """w -= lr * m_hat / (sqrt(v_hat) + eps) for w, g against state slice [off, off + len(w))."""
        m, v = self.m[off:off + w.size], self.v[off:off + w.size]
        m *= self.beta1
        m += (1.0 - self.beta1) * g
        v *= self.beta2
        v += (1.0 - self.beta2) * g * g
        mhat = m / (1.0 - self.beta1 ** self.t)
        vhat = v / (1.0 - self.beta2 ** self.t)
        w -= self.lr * mhat / (np.sqrt(vhat) + self.eps)

    @property
    def nbytes(self) -> int:
        """Bytes of optimizer state."""
        return int(self.m.nbytes + self.v.nbytes)


class ZeroDP:
    """Train a `Sequential` with ZeRO stage 0-3 and Adam; `train_step(x, y)` on this rank's batch."""

    def __init__(self, model: Sequential, comm: Any, stage: int, *, lr: float = 1e-3, timeout: float | None = None
                 ) -> None:
        if stage not in (0, 1, 2, 3):
            raise InvalidArgument(f"ZeRO stage {stage}", "use stage 0, 1, 2 or 3")
        self.model, self.comm, self.stage, self.timeout = model, comm, stage, timeout
        self.n, self.rank = int(comm.size), int(comm.rank)
        ps = model.params
        comm.broadcast(ps.flat, 0, timeout=timeout)
        self.units: dict[int, Unit] = {}
        off = 0
        for i in range(len(model.layers)):
            names = model.layer_param_names(i)
            if not names:
                continue
            lo, hi = min(ps.offsets[k][0] for k in names), max(ps.offsets[k][1] for k in names)
            chunk = -(-(hi - lo) // self.n)
            self.units[i] = Unit(i, lo, hi, chunk, off)
            off += chunk
        self.shard_numel = off
        dt = ps.flat.dtype
        self.opt = Adam(ps.numel if stage == 0 else off, lr=lr, dtype=dt)
        self.grad_shard = np.zeros(off, dtype=dt) if stage >= 2 else None
        self.param_shard: Array | None = None
        if stage == 3:
            self.param_shard = np.zeros(off, dtype=dt)
            for u in self.units.values():
                a, b = u.owned(self.rank)
                self.param_shard[u.off:u.off + b - a] = ps.flat[a:b]

    # ---------------------------------------------------------------- collectives per unit
    def _gather(self, u: Unit, shard: Array) -> None:
        """All-gather the unit from every rank's `shard` chunk into the model's flat parameters."""
        full = self.comm.all_gather(np.ascontiguousarray(shard), timeout=self.timeout)
        self.model.params.flat[u.lo:u.hi] = full[:u.hi - u.lo]

    def _own_params(self, u: Unit) -> Array:
        a, b = u.owned(self.rank)
        buf = np.zeros(u.chunk, dtype=self.model.params.flat.dtype)
        buf[:b - a] = self.model.params.flat[a:b]
        return buf

    def _grad_ready(self, layer: int) -> None:
        """Stages 2 and 3: reduce-scatter this layer's gradients into the gradient shard (averaged)."""
        u = self.units.get(layer)
        if u is None or self.grad_shard is None:
            return
        padded = np.zeros(self.n * u.chunk, dtype=self.grad_shard.dtype)
        padded[:u.hi - u.lo] = self.model.params.grad[u.lo:u.hi]
        out = self.grad_shard[u.off:u.off + u.chunk]
        self.comm.reduce_scatter(padded, "sum", out=out, timeout=self.timeout)
        out /= self.n

    # ---------------------------------------------------------------- a step
    def _layer_params(self, i: int) -> dict[str, Array]:
        m = self.model
        return {k: m.params.value(f"{m.first_index + i}.{k}") for k in m.layers[i].param_shapes}

    def forward_backward(self, x: Array, y: Array) -> float:
        """Local loss; afterwards the averaged gradient is in `model.params.grad` (0, 1) or `grad_shard` (2, 3)."""
        m = self.model
        if self.stage == 3:
            m.params.flat[:] = np.nan   # the workspace: only what was gathered for a layer may be used
        h, caches = x, []
        for i, layer in enumerate(m.layers):
            if self.stage == 3 and i in self.units:
                assert self.param_shard is not None
                u = self.units[i]
                self._gather(u, self.param_shard[u.off:u.off + u.chunk])
            h, c = layer.forward(self._layer_params(i), h)
            caches.append(c)
        loss, dy = softmax_xent(h, y)
        m.backward(caches, dy, on_layer_ready=self._grad_ready if self.stage >= 2 else None)
        if self.stage < 2:
            self.comm.all_reduce(m.params.grad, "sum", timeout=self.timeout)
            m.params.grad /= self.n
        return loss

    def step(self) -> None:
        """The optimizer step on what this rank owns, then (stages 1, 2) the all-gather of the parameters."""
        ps, opt = self.model.params, self.opt
        opt.begin_step()
        if self.stage == 0:
            opt.update(ps.flat, ps.grad)
            return
        for u in self.units.values():
            a, b = u.owned(self.rank)
            k = b - a
            if self.stage == 3:
                assert self.param_shard is not None and self.grad_shard is not None
                opt.update(self.param_shard[u.off:u.off + k], self.grad_shard[u.off:u.off + k], u.off)
                continue
            g = ps.grad[a:b] if self.stage == 1 else self.grad_shard[u.off:u.off + k]  # type: ignore[index]
            opt.update(ps.flat[a:b], g, u.off)
            self._gather(u, self._own_params(u))

    def train_step(self, x: Array, y: Array) -> float:
        """forward_backward then step."""
        loss = self.forward_backward(x, y)
        self.step()
        return loss

    def full_params(self) -> Array:
        """Every parameter, assembled (stage 3 all-gathers its shards; a collective on every rank)."""
        if self.stage == 3:
            assert self.param_shard is not None
            for u in self.units.values():
                self._gather(u, self.param_shard[u.off:u.off + u.chunk])
        return self.model.params.flat.copy()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps: parameters, gradients, optimizer state."""
        ps = self.model.params
        return {"params": int(self.param_shard.nbytes if self.param_shard is not None else ps.flat.nbytes),
                "grads": int(self.grad_shard.nbytes if self.grad_shard is not None else ps.grad.nbytes),
                "optimizer": self.opt.nbytes}


def predicted_fractions(stage: int, n: int) -> dict[str, float]:
    """The fraction of the full parameters / gradients / optimizer state a rank holds at this ZeRO stage, as
    `workload.memory.model_state_bytes_per_param` counts them (solved from its per-parameter bytes)."""
    from ..workload import memory
    w, o = memory.WEIGHT_BYTES, memory.OPTIMIZER_BYTES
    g = 4
    total = memory.model_state_bytes_per_param(stage, n, grad_bytes=g)
    grads = (total - memory.model_state_bytes_per_param(stage, n, grad_bytes=0)) / g
    rest = memory.model_state_bytes_per_param(stage, n, grad_bytes=0)
    for fw in (1.0, 1.0 / n):
        fo = (rest - w * fw) / o
        if min(abs(fo - 1.0), abs(fo - 1.0 / n)) < 1e-12:
            return {"params": fw, "grads": grads, "optimizer": fo}
    raise InvalidArgument(f"memory.model_state_bytes_per_param({stage}, {n}) does not split into weights, "
                          "gradients and optimizer fractions", "check ringflow.workload.memory")
