"""The repeated-call fast path: a collective called again with the same arrays skips straight to its native plan.

A training loop calls the same collectives on the same buffers over and over. The first such call
goes the whole way (argument checks, tuner, plan, native plan); when it ran natively, it is
remembered under (collective, id(x), id(out), op or root) with its buffers' addresses. The next
call with the very same objects (same storage for tensors) only bumps the sequence number, sets the
deadline and runs the native plan: the argument check across ranks still happens, inside the
plan's first messages or its check exchange. Anything unusual (async_op, a failed communicator, a
pending async call, an output the call allocates) takes the full path.

A synchronous call on NumPy arrays also remembers its call shape (collective, dtype and shape of x,
of out or that the call allocates it or works in place, op or root): a later call on other arrays of
that shape, C-contiguous, writeable and not overlapping, runs the same native plan at their addresses
(an output the call allocates is allocated as the remembered one was), so fresh arrays skip parsing and
planning too.
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


class ShapeCall:
    """One remembered call shape: its native plan, run at the addresses of whichever arrays are passed."""

    __slots__ = ("prep", "hot", "ctx", "go", "scratch", "scratch_addr", "inplace", "alloc", "average", "meta",
                 "description")

    def __init__(self, prep: Any, hot: hotpath.Prepared, ctx: CallContext, go: Callable[..., None],
                 scratch: np.ndarray | None, scratch_addr: int | None, inplace: bool,
                 alloc: tuple[int, ...] | None, average: bool, meta: tuple, description: str) -> None:
        self.prep, self.hot, self.ctx, self.go, self.average = prep, hot, ctx, go, average
        self.scratch, self.scratch_addr = scratch, scratch_addr   # None: the plan keeps no scratch of its own
        self.inplace, self.alloc = inplace, alloc   # alloc: the shape of the output the call allocates
        self.meta, self.description = meta, description


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
    _shapes: dict[tuple, ShapeCall]   # shape_key -> the call remembered for that shape
    _fast_seen: dict[tuple, weakref.ref | None]   # keys called once -> a weak reference to the object called with
    _last_native: tuple | None = None   # (prep, hot, ctx, bases, scratch) of the latest call run natively

    def _fast_closed(self, timeout: float | None) -> bool:
        """True where no remembered path may run now: a failed or destroyed communicator, a busy collective lane,
        or a timeout the full path rejects."""
        return self._failure is not None or self._destroyed or self._lanes[LANE_COLL].busy \
            or (timeout is not None and not timeout > 0)

    def _fast_run(self, key: tuple, timeout: float | None) -> Any:
        """Run the call remembered under `key` again (within `timeout` s, default the communicator's), or MISS."""
        return MISS if self._fast_closed(timeout) else self._fast_again(key, timeout)

    def _fast_again(self, key: tuple, timeout: float | None) -> Any:
        """`_fast_run` once the communicator is known to be open."""
        f = self._fast.get(key)
        if f is None:
            return MISS
        prep = f.prep
        if prep.hot is not f.hot or (f.ptrs[0] is not None and (_ptr(f.x), _ptr(f.out)) != f.ptrs):
            del self._fast[key]
            return MISS
        return self._fast_go(prep, f.ctx, f.fn, f.description, f.meta, timeout, f.result)

    def _shape_run(self, key: tuple, fast_key: tuple | None, x: np.ndarray, out: Any, timeout: float | None) -> Any:
        """Run the call shape remembered under `key` on arrays x and out (within `timeout` s; the communicator is
        known to be open), or MISS; arrays called a second time take the full path once, which remembers them under
        `fast_key` (a shorter path)."""
        s = self._shapes.get(key)
        if s is None:
            return MISS
        if fast_key is not None:
            seen = self._fast_seen
            ref = seen.get(fast_key)
            if ref is not None and ref() is x:
                return MISS
            if len(seen) >= FAST_MAX_ENTRIES:
                seen.clear()
            seen[fast_key] = _ref(x)
        flags = x.flags
        if not (flags.c_contiguous and flags.writeable):
            return MISS
        prep = s.prep
        if prep.hot is not s.hot:
            del self._shapes[key]
            return MISS
        addr = hotpath.address
        ax = addr(x)
        if s.inplace:
            o, ao = x, ax
        else:
            if s.alloc is not None:
                o = np.empty(s.alloc, x.dtype)
            else:
                o = out
                flags = o.flags
                if not (flags.c_contiguous and flags.writeable) or np.may_share_memory(x, o):
                    return MISS
            ao = addr(o)
        bases = (ax, ao, ao if s.scratch_addr is None else s.scratch_addr)
        go, n = s.go, self.size
        if s.average:
            def fn(deadline: float) -> None:
                go(deadline, bases)
                finish_avg(o.reshape(-1), n)
        else:
            def fn(deadline: float) -> None:
                go(deadline, bases)
        return self._fast_go(prep, s.ctx, fn, s.description, s.meta, timeout, o)

    def _fast_paths(self, fast_key: tuple | None, name: str, x: Any, out: Any, arg: Any,
                    timeout: float | None) -> tuple[Any, tuple | None]:
        """A synchronous call's remembered paths: (its result or MISS, its call-shape key or None)."""
        if self._fast_closed(timeout):
            return MISS, shape_key(name, x, out, arg)
        if fast_key is not None and (r := self._fast_again(fast_key, timeout)) is not MISS:
            return r, None
        sk = shape_key(name, x, out, arg)
        if sk is None:
            return MISS, None
        return self._shape_run(sk, fast_key, x, out, timeout), sk

    def _fast_go(self, prep: Any, ctx: CallContext, fn: Callable[[float], None], description: str, meta: tuple,
                 timeout: float | None, result: Any) -> Any:
        """Run a remembered call's `fn` as the communicator's next collective, recorded like any other."""
        seq = self._op_seq
        self._op_seq = seq + 1
        ctx.op_seq = seq
        ctx.deadline = deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._last_call, self._in_call = (seq, prep.desc), True
        self.last_schedule = prep.schedule
        rec = self._rec
        if rec is None:
            self._guard(fn, deadline, LANE_COLL)
        else:
            rec.call(LANE_COLL, description, meta, self._guard, fn, deadline)
        return result

    def _fast_remember(self, key: tuple | None, x: Any, out: Any, out_flat: np.ndarray, coll: Collective,
                       opname: str | None, root: int | None, result: Any, meta: tuple,
                       shape_key: tuple | None = None) -> None:
        """After a full-path call: remember it if it ran a kept native plan, by its objects under `key` and by its
        call shape under `shape_key`."""
        last, self._last_native = self._last_native, None
        if last is None:
            return
        prep, hot, ctx, bases, scratch = last
        avg = averages_here(coll, opname, self.rank, root)
        if shape_key is not None and shape_key not in self._shapes and type(result) is np.ndarray:
            own = scratch is not out_flat
            if len(self._shapes) >= FAST_MAX_ENTRIES:
                self._shapes.clear()
            self._shapes[shape_key] = ShapeCall(
                prep, hot, ctx, hotpath.runner(hot, ctx, bases, self._transport.regions), scratch if own else None,
                bases[2] if own else None, out is x, result.shape if shape_key[3] is False else None, avg, meta,
                coll.value)
        if key is None:
            return
        seen = self._fast_seen
        if key not in seen or ((ref := seen[key]) is not None and ref() is not x):   # remembered from its second
            # call with the same object on: one-off arrays are not kept alive, and a new array that reuses a dead
            # one's id is not a repeat
            if len(seen) >= FAST_MAX_ENTRIES:
                seen.clear()
            seen[key] = _ref(x)
            return
        n = self.size
        go = hotpath.runner(hot, ctx, bases, self._transport.regions)
        fn = go
        if avg:
            def fn(deadline: float) -> None:
                go(deadline)
                finish_avg(out_flat, n)

        if len(self._fast) >= FAST_MAX_ENTRIES:
            self._fast.clear()
        self._fast[key] = FastCall(x, out, prep, hot, ctx, bases, scratch, fn, result, meta, coll.value)
