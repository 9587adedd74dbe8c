"""NumPy building blocks of a transformer layer with hand-written backward passes.

LayerNorm, tanh-GELU and causal multi-head attention; `tensor.py` assembles
them into a block whose linear layers may be split across ranks.
"""
from __future__ import annotations

import numpy as np

Array = np.ndarray


def layernorm_fwd(x: Array, gamma: Array, beta: Array, eps: float = 1e-5) -> tuple[Array, tuple]:
    """LayerNorm over the last axis."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * gamma + beta, (xhat, rstd, gamma)


def layernorm_bwd(dy: Array, cache: tuple) -> tuple[Array, Array, Array]:
    """Gradients (dx, dgamma, dbeta) of LayerNorm."""
    xhat, rstd, gamma = cache
    axes = tuple(range(dy.ndim - 1))
    dgamma = (dy * xhat).sum(axis=axes)
    dbeta = dy.sum(axis=axes)
    dxhat = dy * gamma
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


_C = np.sqrt(2.0 / np.pi)


def gelu_fwd(x: Array) -> tuple[Array, Array]:
    """tanh-approximated GELU."""
    t = np.tanh(_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), x


def gelu_bwd(dy: Array, x: Array) -> Array:
    """Input gradient of tanh-GELU."""
    t = np.tanh(_C * (x + 0.044715 * x ** 3))
    dt = (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * dt)


def attention_fwd(q: Array, k: Array, v: Array) -> tuple[Array, tuple]:
    """Causal scaled dot-product attention; q, k, v have shape (batch, heads, seq, head_dim)."""
    dh = q.shape[-1]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(dh)
    t = s.shape[-1]
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v, (q, k, v, p)


def attention_bwd(do: Array, cache: tuple) -> tuple[Array, Array, Array]:
    """Gradients (dq, dk, dv) of causal attention."""
    q, k, v, p = cache
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def split_heads(x: Array, heads: int) -> Array:
    """(batch, seq, heads*dh) -> (batch, heads, seq, dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)


def merge_heads(x: Array) -> Array:
    """(batch, heads, seq, dh) -> (batch, seq, heads*dh)."""
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)
