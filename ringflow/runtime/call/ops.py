"""Reduction ops and dtypes: names to NumPy ufuncs, arrays and tensors to flat NumPy views."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...algorithms.schedule import Collective
from ...errors import InvalidArgument

try:  # bfloat16 lives in ml_dtypes (a dependency); keep the import soft for odd installs
    import ml_dtypes
    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BFLOAT16 = None

UFUNCS: dict[str, Callable] = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                               "avg": np.add, "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
BITWISE_OPS = frozenset({"band", "bor", "bxor"})  # integer and bool dtypes only
OP_ALIASES = {"add": "sum", "mul": "prod", "product": "prod", "minimum": "min", "maximum": "max",
              "mean": "avg", "average": "avg", "band": None}
SUPPORTED_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                    "float16", "bfloat16", "float32", "float64")


def parse_op(op: Any) -> str:
    """Normalise an op name ('sum', 'SUM', ReduceOp.SUM from torch) to one of UFUNCS."""
    if isinstance(op, str) and op in UFUNCS:
        return op
    name = getattr(op, "name", None) or str(op)
    name = name.lower().rsplit(".", 1)[-1]
    name = OP_ALIASES.get(name, name) or name
    if name not in UFUNCS:
        raise InvalidArgument(f"unknown reduction op {op!r}", f"use one of {', '.join(UFUNCS)}")
    return name


_SUPPORTED = ({np.dtype(n) for n in SUPPORTED_DTYPES if n != "bfloat16"}
              | ({BFLOAT16} if BFLOAT16 is not None else set()))
_OPS_CACHE: dict = {}


def check_dtype(dtype: np.dtype) -> np.dtype:
    """Accept the numeric dtypes ringflow reduces; a typed error for the rest."""
    if dtype not in _SUPPORTED:
        raise InvalidArgument(f"dtype {dtype} is not supported", f"use one of {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def check_op(opname: str | None, dtype: np.dtype) -> None:
    """A typed error for an op the dtype cannot take (bitwise on floats, avg on bool)."""
    if opname in BITWISE_OPS and dtype.kind not in "biu":
        raise InvalidArgument(f"{opname} on {dtype}", "bitwise ops need an integer or bool array")
    if opname == "avg" and dtype.kind == "b":
        raise InvalidArgument("avg on bool", "use sum or max (any) or min or prod (all) on bool")


def averages_here(coll: Collective, opname: str | None, rank: int, root: int | None) -> bool:
    """True if this rank turns its result's sum into an average ("avg": every rank, except off the root of a
    reduce, whose buffer is scratch there)."""
    return opname == "avg" and (coll != Collective.REDUCE or rank == root)


def finish_avg(out: np.ndarray, nranks: int) -> None:
    """Turn a sum into an average in place (integers: floor division)."""
    if nranks == 1:
        return
    if out.dtype.kind in "iu":
        np.floor_divide(out, out.dtype.type(nranks), out=out)
    else:
        np.divide(out, out.dtype.type(nranks), out=out)


class Buf:
    """A user buffer seen as a flat, C-contiguous NumPy array (torch tensors share memory)."""

    __slots__ = ("orig", "arr", "flat", "shape")

    def __init__(self, obj: Any, what: str = "buffer") -> None:
        self.orig = obj
        arr = as_numpy(obj, what)
        flags = arr.flags
        if not flags.c_contiguous:
            raise InvalidArgument(f"{what} is not contiguous", "pass a contiguous array (np.ascontiguousarray "
                                  "or tensor.contiguous())")
        if not flags.writeable:
            raise InvalidArgument(f"{what} is read-only", "pass a writeable array")
        check_dtype(arr.dtype)
        self.arr, self.shape = arr, arr.shape
        self.flat = arr.reshape(-1)


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True if two flat arrays are the same memory exactly (same start and size): a call on them works in place."""
    return a is b or (a.size > 0 and a.nbytes == b.nbytes and np.may_share_memory(a, b)
                      and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def unaliased(x: Buf, out: Buf) -> Buf:
    """x itself, or a private copy of it where it overlaps `out` other than exactly (`same_memory`: in place): a
    collective's output may then be written while its input is still read, so the input is copied first and
    every rank gets the exact result. The copy's `orig` is None (it is never remembered)."""
    xf, of = x.flat, out.flat
    if not xf.size or not of.size or same_memory(xf, of) or not np.may_share_memory(xf, of):
        return x
    c = Buf.__new__(Buf)
    c.orig, c.arr = None, x.arr.copy()
    c.shape, c.flat = x.shape, c.arr.reshape(-1)
    return c


def empty_like_input(x: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A new output for a collective on x: a torch tensor of x's dtype when x is one, else a NumPy array."""
    if type(x).__module__.startswith("torch"):
        import torch  # lazy: only when a tensor is passed
        return torch.empty(shape, dtype=x.dtype)
    return np.empty(shape, dtype=dtype)


def tensor_view(obj: Any) -> np.ndarray | None:
    """A C-contiguous NumPy view of a plain CPU torch tensor NumPy can alias as it is (no grad, conjugate or negative
    bits, not bfloat16), or None. The collectives run such a tensor as this view, so a tensor made fresh for each call
    takes the remembered call-shape path a fresh array takes (`fastcall`), and the tensor holds the result."""
    if type(obj).__name__ != "Tensor" or type(obj).__module__ != "torch":
        return None
    try:
        a = obj.numpy()   # refuses another device, grad, conjugate or negative bits, and dtypes NumPy lacks
    except (RuntimeError, TypeError):
        return None
    return a if a.flags.c_contiguous else None


def tensor_views(x: Any, out: Any, need_out: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(view of x, view of out or None) when x, and out where given, are tensors `tensor_view` takes, else None;
    `need_out`: the call allocates its output when out is None (it must then run on the tensor itself, so that the
    output is a tensor too)."""
    v = tensor_view(x)
    if v is None:
        return None
    if out is None:
        return None if need_out else (v, None)
    w = tensor_view(out)
    return None if w is None else (v, w)


def as_numpy(obj: Any, what: str = "buffer") -> np.ndarray:
    """A NumPy view of an ndarray or a CPU torch tensor (bfloat16 through an int16 view)."""
    if isinstance(obj, np.ndarray):
        return obj
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch  # lazy: only when a tensor is passed
        t = obj
        if t.device.type != "cpu":
            raise InvalidArgument(f"{what} is on {t.device}", "ringflow moves CPU tensors; call .cpu() first")
        if t.requires_grad:
            t = t.detach()
        if t.dtype == torch.bfloat16:
            if BFLOAT16 is None:  # pragma: no cover
                raise InvalidArgument("bfloat16 needs ml_dtypes", "pip install ml_dtypes")
            return t.view(torch.int16).numpy().view(BFLOAT16)
        return t.numpy()
    raise InvalidArgument(f"{what} must be a numpy array or a CPU torch tensor, got {type(obj).__name__}",
                          "convert it with np.asarray(...)")
