"""A tiny NumPy network with hand-written backward passes, the model every strategy trains.

Parameters live in one flat vector (`ParamSet.flat`) with named views into it,
and gradients in a second flat vector of the same layout; that makes buckets,
shards and pipeline stages plain slices. Forward order of parameters is the
order of `ParamSet.names`; backward produces them in reverse.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..errors import InvalidArgument

Array = np.ndarray


class ParamSet:
    """Named parameters stored contiguously in `flat`, their gradients in `grad` (same layout)."""

    def __init__(self, shapes: Sequence[tuple[str, tuple[int, ...]]], dtype: type = np.float64) -> None:
        self.names = [n for n, _ in shapes]
        if len(set(self.names)) != len(self.names):
            raise InvalidArgument("duplicate parameter names", "give every parameter a unique name")
        self.shapes = {n: tuple(s) for n, s in shapes}
        self.offsets: dict[str, tuple[int, int]] = {}
        lo = 0
        for n, s in shapes:
            size = int(np.prod(s, dtype=np.int64))
            self.offsets[n] = (lo, lo + size)
            lo += size
        self.flat: Array = np.zeros(lo, dtype=dtype)
        self.grad: Array = np.zeros(lo, dtype=dtype)

    @property
    def numel(self) -> int:
        """Total number of parameter elements."""
        return int(self.flat.size)

    def value(self, name: str) -> Array:
        """A writable view of parameter `name` inside `flat`."""
        lo, hi = self.offsets[name]
        return self.flat[lo:hi].reshape(self.shapes[name])

    def gradient(self, name: str) -> Array:
        """A writable view of the gradient of `name` inside `grad`."""
        lo, hi = self.offsets[name]
        return self.grad[lo:hi].reshape(self.shapes[name])

    def nbytes(self, name: str) -> int:
        """Bytes of parameter `name`."""
        lo, hi = self.offsets[name]
        return (hi - lo) * self.flat.itemsize


class Layer:
    """A layer: `param_shapes`, `init`, `forward` (returns output and cache) and `backward`."""

    param_shapes: dict[str, tuple[int, ...]] = {}

    def init(self, rng: np.random.Generator) -> dict[str, Array]:
        """Initial parameter values."""
        return {}

    def forward(self, p: dict[str, Array], x: Array) -> tuple[Array, object]:
        """Output and whatever backward needs."""
        raise NotImplementedError

    def backward(self, p: dict[str, Array], g: dict[str, Array], cache: object, dy: Array) -> Array:
        """Write parameter gradients into `g` (overwriting) and return the input gradient."""
        raise NotImplementedError


class Linear(Layer):
    """y = x W + b with W of shape (n_in, n_out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        self.param_shapes = {"W": (n_in, n_out), "b": (n_out,)}

    def init(self, rng: np.random.Generator) -> dict[str, Array]:
        n_in, n_out = self.param_shapes["W"]
        return {"W": rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_in, n_out)), "b": rng.normal(0.0, 0.1, n_out)}

    def forward(self, p: dict[str, Array], x: Array) -> tuple[Array, object]:
        return x @ p["W"] + p["b"], x

    def backward(self, p: dict[str, Array], g: dict[str, Array], cache: object, dy: Array) -> Array:
        x = cast(Array, cache)
        g["W"][...] = x.T @ dy
        g["b"][...] = dy.sum(axis=0)
        return dy @ p["W"].T


class Tanh(Layer):
    """Elementwise tanh (smooth, so finite-difference gradient checks are exact to ~1e-9)."""

    def forward(self, p: dict[str, Array], x: Array) -> tuple[Array, object]:
        y = np.tanh(x)
        return y, y

    def backward(self, p: dict[str, Array], g: dict[str, Array], cache: object, dy: Array) -> Array:
        y = cast(Array, cache)
        return dy * (1.0 - y * y)


@dataclass
class Sequential:
    """Layers applied in order; `first_index` names/seeds layers so a stage equals a slice of the full model."""

    layers: list[Layer]
    first_index: int = 0
    dtype: type = np.float64
    params: ParamSet = field(init=False)

    def __post_init__(self) -> None:
        shapes = [(f"{self.first_index + i}.{k}", s) for i, layer in enumerate(self.layers)
                  for k, s in layer.param_shapes.items()]
        self.params = ParamSet(shapes, self.dtype)
        self._p = [{k: self.params.value(f"{self.first_index + i}.{k}") for k in layer.param_shapes}
                   for i, layer in enumerate(self.layers)]
        self._g = [{k: self.params.gradient(f"{self.first_index + i}.{k}") for k in layer.param_shapes}
                   for i, layer in enumerate(self.layers)]

    def init(self, seed: int) -> Sequential:
        """Deterministic init: layer i draws from rng([seed, i]), independent of how the model is cut."""
        for i, layer in enumerate(self.layers):
            rng = np.random.default_rng([seed, self.first_index + i])
            for k, v in layer.init(rng).items():
                self._p[i][k][...] = v
        return self

    def layer_param_names(self, i: int) -> list[str]:
        """Parameter names of local layer i."""
        return [f"{self.first_index + i}.{k}" for k in self.layers[i].param_shapes]

    def forward(self, x: Array) -> tuple[Array, list[object]]:
        """Output and the per-layer caches."""
        caches = []
        for layer, p in zip(self.layers, self._p, strict=True):
            x, c = layer.forward(p, x)
            caches.append(c)
        return x, caches

    def backward(self, caches: list[object], dy: Array, *, accumulate: bool = False,
                 on_layer_ready: Callable[[int], None] | None = None) -> Array:
        """Backward through all layers; grads overwrite (or add to) `params.grad`; calls on_layer_ready(i)."""
        for i in range(len(self.layers) - 1, -1, -1):
            layer, p, g = self.layers[i], self._p[i], self._g[i]
            if accumulate and g:
                tmp = {k: np.empty_like(v) for k, v in g.items()}
                dy = layer.backward(p, tmp, caches[i], dy)
                for k in g:
                    g[k] += tmp[k]
            else:
                dy = layer.backward(p, g, caches[i], dy)
            if on_layer_ready is not None:
                on_layer_ready(i)
        return dy


def mlp_layers(sizes: Sequence[int]) -> list[Layer]:
    """Linear/Tanh layers for the given widths (no activation after the last Linear)."""
    if len(sizes) < 2:
        raise InvalidArgument(f"an MLP needs at least 2 widths, got {list(sizes)}", "pass e.g. [16, 32, 4]")
    layers: list[Layer] = []
    for i in range(len(sizes) - 1):
        layers.append(Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(Tanh())
    return layers


def mlp(sizes: Sequence[int], seed: int = 0, dtype: type = np.float64) -> Sequential:
    """An initialised MLP classifier with the given widths."""
    return Sequential(mlp_layers(sizes), dtype=dtype).init(seed)


def softmax_xent(logits: Array, labels: Array, scale: float = 1.0) -> tuple[float, Array]:
    """Mean cross-entropy over the batch and its gradient w.r.t. logits (times `scale`)."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(-np.log(prob[np.arange(n), labels] + 1e-300).mean())
    d = prob
    d[np.arange(n), labels] -= 1.0
    return loss, d * (scale / n)


def accuracy(logits: Array, labels: Array) -> float:
    """Fraction of rows whose arg-max equals the label."""
    return float((logits.argmax(axis=1) == labels).mean())


def sgd_step(params: ParamSet, lr: float) -> None:
    """Plain SGD on the flat vector: w -= lr * g."""
    params.flat -= lr * params.grad


def train_reference(model: Sequential, batches: Sequence[tuple[Array, Array]], lr: float) -> list[float]:
    """Single-process training, one SGD step per (x, y) batch; returns the losses (the equivalence oracle)."""
    losses = []
    for x, y in batches:
        out, caches = model.forward(x)
        loss, dy = softmax_xent(out, y)
        model.backward(caches, dy)
        sgd_step(model.params, lr)
        losses.append(loss)
    return losses
