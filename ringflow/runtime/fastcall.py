"""The repeated-call fast path: a collective called again with the same arrays skips straight to its native plan.

A training loop calls the same collectives on the same buffers over and over. The first such call
goes the whole way (argument checks, tuner, plan, native plan); when it ran natively, it is
remembered under (collective, id(x), id(out), op or root) with its buffers' addresses. The next
call with the very same objects (same storage for tensors) only bumps the sequence number, sets the
deadline and runs the native plan: the argument check across ranks still happens, inside the
plan's first messages or its check exchange. Anything unusual (async_op, a failed communicator, a
pending async call, an output the call allocates) takes the full path.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..algorithms.schedule import Collective
from . import hotpath
from .executor import CallContext
from .ops import averages_here, finish_avg
from .transport.manager import LANE_COLL

MISS = object()        # the fast path does not apply: take the full path
FAST_MAX_ENTRIES = 256


def _ptr(obj: Any) -> int | None:
    """A tensor's storage address (it can be swapped under the same object); None for a NumPy array."""
    f = getattr(obj, "data_ptr", None)
    return f() if f is not None else None


def _ref(obj: Any) -> weakref.ref | None:
    """A weak reference to obj; None if it takes none (its id alone then stands for it)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


class FastCall:
    """One remembered call: the objects it was made with and everything needed to run it again."""

    __slots__ = ("x", "out", "ptrs", "prep", "hot", "ctx", "bases", "scratch", "fn", "result", "meta", "description")

    def __init__(self, x: Any, out: Any, prep: Any, hot: hotpath.Prepared, ctx: CallContext,
                 bases: tuple[int, int, int], scratch: np.ndarray, fn: Callable[[float], None], result: Any,
                 meta: tuple, description: str) -> None:
        self.x, self.out, self.prep, self.hot, self.ctx, self.fn = x, out, prep, hot, ctx, fn
        self.bases, self.scratch = bases, scratch  # the scratch array the addresses point into lives on
        self.ptrs = (_ptr(x), _ptr(out))
        self.result, self.meta, self.description = result, meta, description


class FastCalls:
    """The fast path of `Communicator` (a mixin: the communicator provides the state declared below)."""

    if TYPE_CHECKING:
        rank: int
        size: int
        timeout: float
        _op_seq: int
        _last_call: tuple[int, str]
        _in_call: bool
        _failure: Any
        _destroyed: bool
        _lanes: list[Any]
        _rec: Any
        _transport: Any
        _guard: Callable[..., None]
        last_schedule: Any

    _fast: dict[tuple, FastCall]
    _fast_seen: dict[tuple, weakref.ref | None]   # keys called once -> a weak reference to the object called with
    _last_native: tuple | None = None   # (prep, hot, ctx, bases, scratch) of the latest call run natively

    def _fast_run(self, key: tuple, timeout: float | None) -> Any:
        """Run the call remembered under `key` again (within `timeout` s, default the communicator's), or MISS."""
        f = self._fast.get(key)
        if f is None or self._failure is not None or self._destroyed or self._lanes[LANE_COLL].busy \
                or (timeout is not None and not timeout > 0):
            return MISS
        prep = f.prep
        if prep.hot is not f.hot or (f.ptrs[0] is not None and (_ptr(f.x), _ptr(f.out)) != f.ptrs):
            del self._fast[key]
            return MISS
        ctx = f.ctx
        seq = self._op_seq
        self._op_seq = seq + 1
        ctx.op_seq = seq
        ctx.deadline = deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._last_call, self._in_call = (seq, prep.desc), True
        self.last_schedule = prep.schedule
        rec = self._rec
        if rec is None:
            self._guard(f.fn, deadline, LANE_COLL)
        else:
            rec.call(LANE_COLL, f.description, f.meta, self._guard, f.fn, deadline)
        return f.result

    def _fast_remember(self, key: tuple | None, x: Any, out: Any, out_flat: np.ndarray, coll: Collective,
                       opname: str | None, root: int | None, result: Any, meta: tuple) -> None:
        """After a full-path call: remember it if it ran a kept native plan."""
        last, self._last_native = self._last_native, None
        if key is None or last is None:
            return
        seen = self._fast_seen
        if key not in seen or ((ref := seen[key]) is not None and ref() is not x):   # remembered from its second
            # call with the same object on: one-off arrays are not kept alive, and a new array that reuses a dead
            # one's id is not a repeat
            if len(seen) >= FAST_MAX_ENTRIES:
                seen.clear()
            seen[key] = _ref(x)
            return
        prep, hot, ctx, bases, scratch = last
        n = self.size
        go = hotpath.runner(hot, ctx, bases, self._transport.regions)
        fn = go
        if averages_here(coll, opname, self.rank, root):
            def fn(deadline: float) -> None:
                go(deadline)
                finish_avg(out_flat, n)

        if len(self._fast) >= FAST_MAX_ENTRIES:
            self._fast.clear()
        self._fast[key] = FastCall(x, out, prep, hot, ctx, bases, scratch, fn, result, meta, coll.value)
