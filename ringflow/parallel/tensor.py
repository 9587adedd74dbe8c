"""Tensor parallelism (Megatron-LM style) for a small transformer block.

`ColumnParallelLinear` keeps a slice of the output columns; its input is
replicated, so its forward needs no communication and its backward all-reduces
the input gradient (Megatron's `f`). `RowParallelLinear` keeps the matching
slice of the input rows; its forward all-reduces the partial outputs
(Megatron's `g`) and its backward is local. Attention splits heads (fused QKV is
column-parallel, the output projection row-parallel) and the MLP splits the
hidden width (fc1 column, fc2 row): each half of the block costs exactly one
all-reduce forward and one backward.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .nn import ParamSet
from .transformer import (
    attention_bwd,
    attention_fwd,
    gelu_bwd,
    gelu_fwd,
    layernorm_bwd,
    layernorm_fwd,
    merge_heads,
    split_heads,
)

Array = np.ndarray


class _Counter:
    """Counts all-reduce calls per pass, so tests can check Megatron's one-forward-one-backward rule."""

    def __init__(self) -> None:
        self.forward = 0
        self.backward = 0


def _all_reduce(comm: Any, x: Array, counter: _Counter, phase: str) -> Array:
    if comm is not None and comm.size > 1:
        setattr(counter, phase, getattr(counter, phase) + 1)
        x = np.ascontiguousarray(x)
        comm.all_reduce(x, op="sum")
    return x


class ColumnParallelLinear:
    """y_local = x W[:, cols] + b[cols]; backward all-reduces dx (x is replicated on every rank)."""

    def __init__(self, params: ParamSet, name: str, comm: Any, counter: _Counter) -> None:
        self.params, self.name, self.comm, self.counter = params, name, comm, counter

    def forward(self, x: Array) -> tuple[Array, Array]:
        """Local slice of the output and the cache."""
        w, b = self.params.value(self.name + ".W"), self.params.value(self.name + ".b")
        x2 = x.reshape(-1, x.shape[-1])
        return (x2 @ w + b).reshape(*x.shape[:-1], w.shape[1]), x2

    def backward(self, x2: Array, dy: Array) -> Array:
        """Write dW, db; return the full input gradient (summed over ranks)."""
        w = self.params.value(self.name + ".W")
        dy2 = dy.reshape(-1, dy.shape[-1])
        self.params.gradient(self.name + ".W")[...] = x2.T @ dy2
        self.params.gradient(self.name + ".b")[...] = dy2.sum(axis=0)
        dx = _all_reduce(self.comm, dy2 @ w.T, self.counter, "backward")
        return dx.reshape(*dy.shape[:-1], w.shape[0])


class RowParallelLinear:
    """y = all_reduce(x_local W[rows, :]) + b; backward is local (b is replicated)."""

    def __init__(self, params: ParamSet, name: str, comm: Any, counter: _Counter) -> None:
        self.params, self.name, self.comm, self.counter = params, name, comm, counter

    def forward(self, x: Array) -> tuple[Array, Array]:
        """Full output (identical on all ranks) and the cache."""
        w, b = self.params.value(self.name + ".W"), self.params.value(self.name + ".b")
        x2 = x.reshape(-1, x.shape[-1])
        y = _all_reduce(self.comm, x2 @ w, self.counter, "forward") + b
        return y.reshape(*x.shape[:-1], w.shape[1]), x2

    def backward(self, x2: Array, dy: Array) -> Array:
        """Write dW, db; return the gradient of the local input slice."""
        w = self.params.value(self.name + ".W")
        dy2 = dy.reshape(-1, dy.shape[-1])
        self.params.gradient(self.name + ".W")[...] = x2.T @ dy2
        self.params.gradient(self.name + ".b")[...] = dy2.sum(axis=0)
        return (dy2 @ w.T).reshape(*dy.shape[:-1], w.shape[0])


def init_block_params(d_model: int, n_heads: int, d_ff: int, seed: int = 0) -> dict[str, Array]:
    """Full (unsplit) parameters of one pre-LayerNorm block, float64."""
    rng = np.random.default_rng(seed)
    d = d_model

    def w(n_in: int, n_out: int) -> Array:
        return rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_in, n_out))

    return {
        "ln1.g": 1.0 + 0.1 * rng.normal(size=d), "ln1.b": 0.1 * rng.normal(size=d),
        "attn.qkv.W": w(d, 3 * d), "attn.qkv.b": 0.1 * rng.normal(size=3 * d),
        "attn.proj.W": w(d, d), "attn.proj.b": 0.1 * rng.normal(size=d),
        "ln2.g": 1.0 + 0.1 * rng.normal(size=d), "ln2.b": 0.1 * rng.normal(size=d),
        "mlp.fc1.W": w(d, d_ff), "mlp.fc1.b": 0.1 * rng.normal(size=d_ff),
        "mlp.fc2.W": w(d_ff, d), "mlp.fc2.b": 0.1 * rng.normal(size=d),
    }


def shard_block_params(full: dict[str, Array], rank: int, size: int) -> dict[str, Array]:
    """Rank `rank`'s slices: q/k/v columns and proj rows of its heads, fc1 columns and fc2 rows of its share."""
    d = full["ln1.g"].shape[0]
    d_ff = full["mlp.fc1.b"].shape[0]
    if d % size or d_ff % size:
        raise InvalidArgument(f"d_model={d} and d_ff={d_ff} must be divisible by tp size {size}",
                              "choose widths that are multiples of the number of ranks")
    dl, fl = d // size, d_ff // size
    cols = np.concatenate([np.arange(sec * d + rank * dl, sec * d + (rank + 1) * dl) for sec in range(3)])
    out = {k: v.copy() for k, v in full.items() if k.startswith("ln") or k in ("attn.proj.b", "mlp.fc2.b")}
    out["attn.qkv.W"] = full["attn.qkv.W"][:, cols].copy()
    out["attn.qkv.b"] = full["attn.qkv.b"][cols].copy()
    out["attn.proj.W"] = full["attn.proj.W"][rank * dl:(rank + 1) * dl].copy()
    out["mlp.fc1.W"] = full["mlp.fc1.W"][:, rank * fl:(rank + 1) * fl].copy()
    out["mlp.fc1.b"] = full["mlp.fc1.b"][rank * fl:(rank + 1) * fl].copy()
    out["mlp.fc2.W"] = full["mlp.fc2.W"][rank * fl:(rank + 1) * fl].copy()
    return out


class TransformerBlock:
    """x + Attn(LN1 x), then + MLP(LN2 .), with heads and MLP width split over `comm` (None: unsplit)."""

    ORDER = ["ln1.g", "ln1.b", "attn.qkv.W", "attn.qkv.b", "attn.proj.W", "attn.proj.b",
             "ln2.g", "ln2.b", "mlp.fc1.W", "mlp.fc1.b", "mlp.fc2.W", "mlp.fc2.b"]

    def __init__(self, d_model: int, n_heads: int, d_ff: int, comm: Any = None, seed: int = 0) -> None:
        size = comm.size if comm is not None else 1
        rank = comm.rank if comm is not None else 0
        if d_model % n_heads or n_heads % size:
            raise InvalidArgument(f"need d_model % n_heads == 0 and n_heads % tp == 0 "
                                  f"(d_model={d_model}, n_heads={n_heads}, tp={size})",
                                  "pick n_heads divisible by the number of ranks")
        self.comm, self.heads_local = comm, n_heads // size
        local = shard_block_params(init_block_params(d_model, n_heads, d_ff, seed), rank, size)
        self.params = ParamSet([(k, local[k].shape) for k in self.ORDER])
        for k in self.ORDER:
            self.params.value(k)[...] = local[k]
        self.counter = _Counter()
        self.qkv = ColumnParallelLinear(self.params, "attn.qkv", comm, self.counter)
        self.proj = RowParallelLinear(self.params, "attn.proj", comm, self.counter)
        self.fc1 = ColumnParallelLinear(self.params, "mlp.fc1", comm, self.counter)
        self.fc2 = RowParallelLinear(self.params, "mlp.fc2", comm, self.counter)

    def forward(self, x: Array) -> tuple[Array, tuple]:
        """Block output (identical on every rank) and the cache; x is (batch, seq, d_model)."""
        p = self.params.value
        a, c_ln1 = layernorm_fwd(x, p("ln1.g"), p("ln1.b"))
        qkv, c_qkv = self.qkv.forward(a)
        q, k, v = (split_heads(t, self.heads_local) for t in np.split(qkv, 3, axis=-1))
        o, c_att = attention_fwd(q, k, v)
        o = merge_heads(o)
        y_att, c_proj = self.proj.forward(o)
        h = x + y_att
        a2, c_ln2 = layernorm_fwd(h, p("ln2.g"), p("ln2.b"))
        u, c_fc1 = self.fc1.forward(a2)
        gl, c_gelu = gelu_fwd(u)
        y_mlp, c_fc2 = self.fc2.forward(gl)
        return h + y_mlp, (c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc1, c_gelu, c_fc2)

    def backward(self, cache: tuple, dy: Array) -> Array:
        """Write all local parameter gradients into `params.grad`; return dx."""
        c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc1, c_gelu, c_fc2 = cache
        g = self.params.gradient
        dgl = self.fc2.backward(c_fc2, dy)
        da2 = self.fc1.backward(c_fc1, gelu_bwd(dgl, c_gelu))
        dh_ln, g("ln2.g")[...], g("ln2.b")[...] = layernorm_bwd(da2, c_ln2)
        dh = dy + dh_ln
        do = split_heads(self.proj.backward(c_proj, dh), self.heads_local)
        dq, dk, dv = (merge_heads(t) for t in attention_bwd(do, c_att))
        da = self.qkv.backward(c_qkv, np.concatenate([dq, dk, dv], axis=-1))
        dx_ln, g("ln1.g")[...], g("ln1.b")[...] = layernorm_bwd(da, c_ln1)
        return dh + dx_ln
