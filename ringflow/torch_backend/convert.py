"""Tensors and reduce ops from torch to ringflow: contiguous staging, dtype views and op names."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidArgument

#: dtypes ringflow moves and reduces as they are
NATIVE = {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64}
#: the NumPy dtype of each dtype ringflow takes as a NumPy view (bfloat16 has none: it goes as the tensor)
NUMPY_OF = {t: torch.empty(0, dtype=t).numpy().dtype for t in NATIVE - {torch.bfloat16}}
#: bitwise ops (integer and bool tensors only)
BITWISE = frozenset({"band", "bor", "bxor"})
_OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "BAND": "band",
        "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}


def op_of(op: Any, dtype: torch.dtype) -> tuple[str, Any]:
    """(ringflow op name, PREMUL_SUM factor or None) for a torch ReduceOp on this dtype."""
    kind = getattr(op, "op", op)
    name = _OPS.get(getattr(kind, "name", str(kind)).rsplit(".", 1)[-1])
    if name is None:
        raise InvalidArgument(f"reduce op {op!r} is not supported", f"use one of {', '.join(_OPS)}")
    if dtype == torch.bool:
        return {"sum": "max", "max": "max", "bor": "max", "prod": "min", "min": "min", "band": "min"}.get(
            name, name), None
    if name in BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise InvalidArgument(f"{name.upper()} on {dtype}", "bitwise ops need an integer or bool tensor")
    if dtype.is_complex and name not in ("sum", "avg", "premul_sum"):
        raise InvalidArgument(f"{name.upper()} on complex {dtype}", "complex tensors reduce with SUM or AVG only")
    if name == "premul_sum":
        return "sum", op.factor
    return name, None


def work_view(t: torch.Tensor) -> torch.Tensor:
    """t as a tensor of a dtype ringflow moves (complex as real pairs, bool as uint8), same memory."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    if t.dtype not in NATIVE:
        raise InvalidArgument(f"dtype {t.dtype} is not supported by the ringflow backend",
                              "use an integer, float16, bfloat16, float32/64, complex or bool tensor")
    if t.device.type != "cpu":
        raise InvalidArgument(f"tensor on {t.device}", "the ringflow backend moves CPU tensors; use .cpu()")
    return t


class Staged:
    """A flat contiguous working tensor for a user tensor; `finish()` copies results back when it was a copy.

    `arg` is what to hand ringflow: the user's tensor itself when ringflow can use it as it is (a contiguous
    CPU tensor of a native dtype without the negative bit), so ringflow's per-call binding cache recognises it
    call after call.
    """

    __slots__ = ("user", "flat", "copied", "arg")

    def __init__(self, t: torch.Tensor, writeback: bool = True) -> None:
        if t.requires_grad:
            t = t.detach()
        if t.dtype in NATIVE and t.is_contiguous() and t.is_cpu and not t.is_neg():
            self.user = self.arg = t
            self.copied = False
            self.flat = t.view(-1) if t.dim() != 1 else t
            return
        v = work_view(t.detach())
        self.user = v
        # a negative view's memory holds the negated values: its working copy holds them as they read
        self.copied = not v.is_contiguous() or v.is_neg()
        self.flat = self.arg = (v.resolve_neg().contiguous() if self.copied else v).view(-1)
        if not writeback:
            self.copied = False

    def finish(self) -> None:
        """Copy the working tensor back into the user's (non-contiguous) tensor."""
        if self.copied:
            self.user.copy_(self.flat.view(self.user.shape))


def flat_buffer(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """A fresh flat buffer with room for every tensor's elements, in `dtype`."""
    return torch.empty(sum(t.numel() for t in tensors), dtype=dtype)


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors' working views into one flat tensor."""
    views = [work_view(t.detach()).reshape(-1) for t in tensors]
    if not views:
        raise InvalidArgument("empty tensor list", "pass at least one tensor")
    return torch.cat(views) if len(views) > 1 else views[0].clone()


def unpack(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of flat into tensors (their working views)."""
    off = 0
    for t in tensors:
        v = work_view(t.detach())
        n = v.numel()
        v.copy_(flat[off:off + n].view(v.shape))
        off += n


def same_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    """The common dtype of tensors; a typed error if they differ."""
    dts = {t.dtype for t in tensors}
    if len(dts) != 1:
        raise InvalidArgument(f"{what}: tensors have dtypes {sorted(map(str, dts))}", "use one dtype for all")
    return next(iter(dts))
