"""The remembered-call paths: a collective called again skips straight to its native plan.

A training loop calls the same collectives on the same buffers over and over. The first such call
goes the whole way (argument checks, tuner, plan, native plan); when it ran natively, the call's
shape is remembered, and from the second call with the same objects on, so are the objects
(`callmemory.IdentityEntry`: weak references and the state that determines the plan). A remembered
call only re-reads that state, bumps the sequence number, sets the deadline and runs the native
plan: the argument check across ranks still happens, inside the plan's first messages or its check
exchange. On NumPy arrays, with the flight recorder off, the re-read of both arrays, the deadline
and the plan's first native pass are one C call (`hotpath.call_runner`). Anything unusual (async_op,
a failed communicator, a pending async call, a changed dtype, shape, stride, address or
writeability) takes the full path, whose rules are the only rules.

all_reduce, broadcast, all_gather, reduce_scatter and all_to_all (even parts) go first to their door
(`_hotpath.Door`, one per collective per communicator), which holds the identity entries they ran last (a few per
collective): one C call makes every check of the remembered path (open communicator, no queued async call, the
owning thread, op or root, timeout, plan, both arrays' state), the communicator's bookkeeping (sequence number,
last call, last schedule) and the plan's first native pass, inside the recorder's `run` where the communicator has
one. Any miss returns MISS having changed nothing (its record taken back), and the paths below decide.

A synchronous call on NumPy arrays also finds its call shape (collective, dtype and shape of x, of out
or that the call allocates it or works in place, op or root): a later call on other arrays of that
shape, C-contiguous, writeable and not overlapping, runs the same native plan at their addresses. The door holds
the call shapes last run for its collective too (`Door.set_shape`, up to 8): a call on fresh arrays then costs one
C call, as a repeated one does, which matches x's (and out's) exact type, dtype object, shape, C-contiguity,
alignment and writeability, that x and out do not overlap, and makes every check of the identity path. Shapes
whose call allocates its output or averages, and arrays the door does not take, go through `_shape_run` in Python
(same rules, and it gives the door the shape again where the door forgot it for newer ones).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np

from ...algorithms.schedule import Collective
from .. import native
from ..transport.manager import LANE_COLL
from . import hotpath
from .callmemory import MAX_ENTRIES, CallMemory, IdentityEntry, ShapeEntry, shape_key
from .executor import CallContext
from .ops import as_numpy, averages_here, finish_avg

MISS = object()        # the remembered paths do not apply: take the full path
# the collectives with a Door: the calls remembered last for each, run in C (arg: the op, the root, or None)
DOORS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")


class _NoDoor:
    """The door where the native executor is not built: every call takes the Python paths."""

    @staticmethod
    def call(x: Any, out: Any, arg: Any, async_op: Any, timeout: Any) -> Any:
        """Always MISS."""
        return MISS

    def clear(self) -> None:
        """Nothing to forget."""


class FastCalls:
    """The remembered-call paths of `Communicator` (a mixin: the communicator provides the state declared below)."""

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
        _own_thread: Callable[[str], None]
        _owner_id: int | None
        last_schedule: Any

    _mem: CallMemory
    _last_native: tuple | None = None   # (prep, hot, ctx, bases, own scratch or None) of the latest native call

    def _fast_doors(self) -> None:
        """Give each collective in DOORS its door (`_door_<name>`): the identity entry it remembered last, whose
        repeat the door checks and runs in one C call (`_hotpath.Door.call`), every check of `_fast_native` included."""
        make = None if native._hotpath is None else native._hotpath.door
        for name in DOORS:
            door = _NoDoor() if make is None else make(self.__dict__, self._lanes[LANE_COLL], MISS)
            self._mem.doors[name] = door
            setattr(self, "_door_" + name, door)

    def _fast_open_door(self, name: str, f: IdentityEntry, arg: Any) -> None:
        """Let the door of collective `name` run identity entry f (called with `arg`, its op or root) from now on."""
        door = self._mem.doors.get(name)
        if door is None or f.runner is None or f.average or isinstance(door, _NoDoor):
            return
        hot, ctx = f.hot, f.ctx
        door.set(f.runner, arg, f.prep, hot, f.prep.desc, f.prep.schedule, self._transport.regions,
                 lambda seq, rc, *at: self._fast_finish(hot, ctx, seq, rc, at), f.description, f.meta)

    def _shape_open_door(self, name: str, s: ShapeEntry, x: np.ndarray, out: Any, arg: Any) -> None:
        """Let the door of collective `name` run call shape s (called with `arg`, its op or root) on any arrays of
        x's (and out's) dtype and shape: out is None, x, or another array (a shape whose call allocates its output,
        or averages, stays with `_shape_run`)."""
        door = self._mem.doors.get(name)
        if door is None or isinstance(door, _NoDoor) or s.average or (s.alloc is not None and not s.inplace):
            return
        if s.runner is None:
            s.runner = hotpath.call_runner(s.hot, s.ctx, (0, 0, 0), x, out)
            if s.runner is None:
                return
        hot, ctx = s.hot, s.ctx
        door.set_shape(s.runner, arg, s.prep, hot, s.prep.desc, s.prep.schedule, self._transport.regions,
                       lambda seq, rc, *at: self._fast_finish(hot, ctx, seq, rc, at), s.description, s.meta,
                       x, out, s.scratch)

    def _fast_finish(self, hot: hotpath.Prepared, ctx: CallContext, seq: int, rc: int,
                     at: tuple[int, int, int, float]) -> None:
        """Finish call number `seq` of a remembered call whose first native pass (its runner's, or its door's) at
        the addresses and deadline `at` (IN, OUT, SCRATCH, deadline) returned `rc`, unfinished."""
        bases = (at[0], at[1], at[2])
        ctx.op_seq, ctx.deadline = seq, at[3]
        spans = self._transport.regions.packed
        self._guard(lambda _: hotpath.resume_call(hot, ctx, bases, spans, rc), ctx.deadline, LANE_COLL)

    def _fast_closed(self, timeout: float | None) -> bool:
        """True where no remembered path may run now: a failed or destroyed communicator, a busy collective lane,
        or a timeout the full path rejects."""
        return self._failure is not None or self._destroyed or self._lanes[LANE_COLL].busy \
            or (timeout is not None and not timeout > 0)

    def _fast_run(self, key: tuple, x: Any, out: Any, timeout: float | None) -> Any:
        """Run the call remembered under `key` for these objects again (within `timeout` s), or MISS."""
        return MISS if self._fast_closed(timeout) else self._fast_again(key, x, out, timeout)

    def _fast_again(self, key: tuple, x: Any, out: Any, timeout: float | None) -> Any:
        """`_fast_run` once the communicator is known to be open."""
        by_object = self._mem.by_object
        f = by_object.get(key)
        if f is None:
            return MISS
        if f.prep.hot is not f.hot:
            by_object.pop(key, None)
            return MISS
        if f.runner is not None:
            rec = self._rec
            if rec is None:
                return self._fast_native(f, key, x, out, timeout)
            return rec.run(f.description, f.meta, MISS, self._fast_native, f, key, x, out, timeout)
        if not f.matches(x, out):
            by_object.pop(key, None)
            return MISS
        result = x if out is None else out
        go = f.go
        if f.average:
            n = self.size

            def avg(deadline: float) -> None:
                go(deadline)
                finish_avg(as_numpy(result).reshape(-1), n)
            return self._fast_go(f.prep, f.ctx, avg, f.description, f.meta, timeout, result)
        return self._fast_go(f.prep, f.ctx, go, f.description, f.meta, timeout, result)

    def _fast_native(self, f: IdentityEntry, key: tuple, x: Any, out: Any, timeout: float | None) -> Any:
        """`_fast_again` for NumPy arrays (the recorder's `run` records it): the re-check of x and out, the deadline
        and the plan's first native pass are one C call (`IdentityEntry.runner`); only a call that pass leaves
        unfinished goes on in Python."""
        if get_ident() != self._owner_id:
            self._own_thread(f.description)
        prep = f.prep
        seq, last = self._op_seq, self._last_call
        self._op_seq = seq + 1
        self._last_call, self._in_call = (seq, prep.desc), True
        self.last_schedule = prep.schedule
        spans = self._transport.regions.packed
        try:
            rc = f.runner.go(x, out, seq, self.timeout if timeout is None else timeout, spans)
        except BaseException:   # go() raises only on its arguments, before anything ran or was sent
            self._op_seq, self._last_call, self._in_call = seq, last, False
            raise
        if rc < 0:   # x or out is not what was remembered: nothing ran, the full path decides
            self._op_seq, self._last_call, self._in_call = seq, last, False
            self._mem.by_object.pop(key, None)
            return MISS
        self._fast_open_door(key[0], f, key[-1])
        if rc:
            self._fast_finish(f.hot, f.ctx, seq, rc, (*f.bases, f.runner.deadline))
        else:
            self._in_call = False
        result = x if out is None else out
        if f.average:
            finish_avg(as_numpy(result).reshape(-1), self.size)
        return result

    def _shape_run(self, key: tuple, fast_key: tuple | None, x: np.ndarray, out: Any, timeout: float | None) -> Any:
        """Run the call shape remembered under `key` on arrays x and out (within `timeout` s; the communicator is
        known to be open), or MISS; arrays called a second time take the full path once, which remembers them under
        `fast_key` (a shorter path)."""
        mem = self._mem
        s = mem.by_shape.get(key)
        if s is None:
            return MISS
        if fast_key is not None and mem.second_call(fast_key, x):
            return MISS
        flags = x.flags
        if not (flags.c_contiguous and flags.writeable):
            return MISS
        prep = s.prep
        if prep.hot is not s.hot:
            mem.by_shape.pop(key, None)
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
        if s.alloc is None or s.inplace:   # the door forgot it for newer shapes: it takes the next call again
            self._shape_open_door(key[0], s, x, out, key[-1])
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
        if fast_key is not None and (r := self._fast_again(fast_key, x, out, timeout)) is not MISS:
            return r, None
        sk = shape_key(name, x, out, arg)
        if sk is None:
            return MISS, None
        return self._shape_run(sk, fast_key, x, out, timeout), sk

    def _fast_go(self, prep: Any, ctx: CallContext, fn: Callable[[float], None], description: str, meta: tuple,
                 timeout: float | None, result: Any) -> Any:
        """Run a remembered call's `fn` as the communicator's next collective, recorded like any other."""
        if get_ident() != self._owner_id:
            self._own_thread(description)
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

    def _fast_remember(self, key: tuple | None, x: Any, out: Any, coll: Collective, opname: str | None,
                       root: int | None, meta: tuple, result: Any, shape_key: tuple | None = None) -> None:
        """After a full-path call on x with the caller's `out` (None where not given) that returned `result`: remember
        it if it ran a kept native plan, by its call shape under `shape_key` and by those objects under `key` (where
        it has a call shape, or from its second call with the same objects)."""
        last, self._last_native = self._last_native, None
        if last is None:
            return
        prep, hot, ctx, bases, scratch = last
        mem = self._mem
        avg = averages_here(coll, opname, self.rank, root)
        if shape_key is not None and shape_key not in mem.by_shape and type(result) is np.ndarray:
            if len(mem.by_shape) >= MAX_ENTRIES:
                mem.by_shape.clear()
            s = mem.by_shape[shape_key] = ShapeEntry(
                prep, hot, ctx, hotpath.runner(hot, ctx, bases, self._transport.regions), scratch,
                None if scratch is None else bases[2], result is x, result.shape if shape_key[3] is False else None,
                avg, meta, coll.value)
            self._shape_open_door(shape_key[0], s, x, out, shape_key[-1])
        # from the second call with these objects on; or now, where the call found its shape (the door takes this
        # shape's later calls in C, so these objects would not come back to be counted)
        if key is None or not (shape_key is not None or mem.second_call(key, x)):
            return
        if len(mem.by_object) >= MAX_ENTRIES:
            mem.by_object.clear()
        f = mem.by_object[key] = IdentityEntry(x, out, prep, hot, ctx, bases, scratch,
                                               hotpath.runner(hot, ctx, bases, self._transport.regions), avg, meta,
                                               coll.value)
        self._fast_open_door(key[0], f, key[-1])
