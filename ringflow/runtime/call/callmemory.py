"""What a communicator remembers about its calls, in one object that resets as a unit.

A communicator remembers, per call shape, the tuner's schedule and the compiled plans (Python and
native); per pair of objects called twice, an identity entry that runs the native plan again; per
call shape on NumPy arrays, an entry that runs it at the addresses of fresh arrays; and the cost
model the tuner picks with. `CallMemory.reset` drops all of it at once (`tune_with`, abort), so no
entry can outlive the choice it was made under; a new communicator (split, shrink) starts empty.

An identity entry holds its arrays by weak reference (an array only the cache holds is freed) and
the state that determines its plan: dtype, shape, strides, data address and writeability of x and of
out (for a torch tensor: dtype, sizes, strides and storage address). Every hit re-reads that state
and takes the full path on any difference.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import native
from . import hotpath
from .executor import CallContext

MAX_ENTRIES = 256      # identity and call-shape entries each (emptied when full)
MAX_SCHEDULES = 1024   # tuner choices
MAX_PREPARED = 4096    # compiled plans

_address = hotpath.address
_array_state = None if native._hotpath is None else native._hotpath.array_state


def reader_of(obj: Any) -> Callable[[Any], Any]:
    """The fastest function that reads `state_of(obj)` for objects of obj's type (the C reader for an ndarray)."""
    return _array_state if type(obj) is np.ndarray and _array_state is not None else state_of


def state_of(obj: Any) -> Any:
    """What determines a call's plan about one buffer: dtype, shape, strides, data address and, for a NumPy
    array, contiguity and writeability (one C call for an ndarray: the holder keeps its dtype alive, whose address
    the state names); None for an object that is neither an ndarray nor a tensor (never remembered)."""
    if type(obj) is np.ndarray:
        if _array_state is not None:
            return _array_state(obj)
        return (obj.dtype, obj.shape, obj.strides, _address(obj), obj.flags.writeable)
    ptr = getattr(obj, "data_ptr", None)
    if ptr is not None:   # a torch tensor: its storage can be swapped, resized or re-viewed under the same object
        return (obj.dtype, obj.shape, obj.stride(), ptr())
    if isinstance(obj, np.ndarray):
        return (obj.dtype, obj.shape, obj.strides, int(obj.ctypes.data), obj.flags.writeable)
    return None


def weak(obj: Any) -> weakref.ref | None:
    """A weak reference to obj, or None where it takes none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


class IdentityEntry:
    """A call remembered for the very objects it was made with: their weak references and states, and the native
    runner of its plan (`go(deadline)`; for NumPy arrays also `runner`, the whole call in C)."""

    __slots__ = ("xref", "outref", "xstate", "outstate", "read", "dtypes", "prep", "hot", "ctx", "bases", "scratch",
                 "go", "runner", "average", "meta", "description")

    def __init__(self, x: Any, out: Any, prep: Any, hot: hotpath.Prepared, ctx: CallContext,
                 bases: tuple[int, int, int], scratch: np.ndarray | None, go: Callable[[float], None], average: bool,
                 meta: tuple, description: str) -> None:
        self.xref, self.outref = weakref.ref(x), (None if out is None else weakref.ref(out))
        self.xstate, self.outstate = state_of(x), (None if out is None else state_of(out))
        self.read = reader_of(x)   # x's type is part of its identity: the same reader serves every hit
        self.dtypes = (x.dtype, getattr(out, "dtype", None))   # alive while the states name their addresses
        self.prep, self.hot, self.ctx, self.go, self.bases = prep, hot, ctx, go, bases   # bases: IN, OUT, SCRATCH
        self.scratch = scratch   # the communicator's scratch array the plan's addresses point into (None: none)
        self.average, self.meta, self.description = average, meta, description
        # the whole repeated call in C, re-checking both arrays (None: x or out is not an ndarray, or the plan has
        # its own check exchange; `go` serves those)
        self.runner = hotpath.call_runner(hot, ctx, bases, x, out)

    def matches(self, x: Any, out: Any) -> bool:
        """True if x and out are the objects remembered, in the state remembered."""
        if self.xref() is not x or self.read(x) != self.xstate:
            return False
        if out is None:
            return self.outref is None
        ref = self.outref
        return ref is not None and ref() is out and state_of(out) == self.outstate


def shape_key(name: str, x: Any, out: Any, arg: Any) -> tuple | None:
    """The call-shape key of a call on NumPy arrays (None: not such a call): `out` is None (the collective
    allocates it or works in place), x itself, or another array; `arg`: the op or root."""
    if type(x) is not np.ndarray:
        return None
    if out is None or out is x:
        return (name, x.dtype, x.shape, out is x, arg)
    if type(out) is not np.ndarray:
        return None
    return (name, x.dtype, x.shape, out.dtype, out.shape, arg)


class ShapeEntry:
    """A remembered call shape: its native plan, run at the addresses of whichever arrays of that shape are
    passed (C-contiguous, writeable, not overlapping: re-checked per call)."""

    __slots__ = ("prep", "hot", "ctx", "go", "scratch", "scratch_addr", "inplace", "alloc", "average", "meta",
                 "description", "runner")

    def __init__(self, prep: Any, hot: hotpath.Prepared, ctx: CallContext, go: Callable[..., None],
                 scratch: np.ndarray | None, scratch_addr: int | None, inplace: bool,
                 alloc: tuple[int, ...] | None, average: bool, meta: tuple, description: str) -> None:
        self.prep, self.hot, self.ctx, self.go, self.average = prep, hot, ctx, go, average
        self.scratch, self.scratch_addr = scratch, scratch_addr   # None: the plan keeps no scratch of its own
        self.inplace, self.alloc = inplace, alloc   # alloc: the shape of the output the call allocates
        self.meta, self.description = meta, description
        self.runner: Any = None   # its plan as a `_hotpath.Runner` for its collective's door (made on first use)


class CallMemory:
    """Everything one communicator remembers about calls: the tuner's cost model and choices, compiled plans,
    identity entries, call-shape entries, and the objects called once (weakly)."""

    __slots__ = ("model", "pattern", "rounds", "schedules", "prepared", "by_object", "by_shape", "seen", "doors")

    def __init__(self, model: Any = None) -> None:
        self.model = model
        # the argument check's pattern and its rounds (`check_rounds`); None: not priced yet (on first use)
        self.pattern: str | None = None
        self.rounds = 0
        self.schedules: dict[tuple, Any] = {}
        self.prepared: dict[tuple, Any] = {}
        self.by_object: dict[tuple, IdentityEntry] = {}
        self.by_shape: dict[tuple, ShapeEntry] = {}
        self.seen: dict[tuple, weakref.ref | None] = {}
        self.doors: dict[str, Any] = {}   # collective name -> its Door (fastcall.py): the call remembered last for it

    def reset(self, model: Any = None, pattern: str | None = None, rounds: int = 0) -> None:
        """Forget every remembered choice, plan and entry; pick with `model` and check arguments in `pattern`
        (`rounds` log-depth rounds, 0 for pairs; None: priced on first use) from now on."""
        self.model, self.pattern, self.rounds = model, pattern, rounds
        for d in (self.schedules, self.prepared, self.by_object, self.by_shape, self.seen):
            d.clear()
        for door in self.doors.values():
            door.clear()

    def entries(self) -> int:
        """How many identity and call-shape entries are held."""
        return len(self.by_object) + len(self.by_shape)

    def second_call(self, key: tuple, x: Any) -> bool:
        """True if `key` was called before with this very object x (then it earns an identity entry); notes it
        otherwise, weakly (a new array that reuses a dead one's id is not a repeat)."""
        seen = self.seen
        ref = seen.get(key)
        if ref is not None and ref() is x:
            return True
        if len(seen) >= MAX_ENTRIES:
            seen.clear()
        seen[key] = weak(x)
        return False
