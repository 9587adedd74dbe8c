"""The collective calls of a Communicator: argument checks, output allocation, and dispatch to a schedule.

Every collective takes a NumPy array or a CPU torch tensor, works in place where torch.distributed
does (all_reduce, broadcast, reduce), takes `out=` by keyword, and returns the result array, or a
`Work` with `async_op=True`. Ranks are group-local. Collectives that allocate their output (out=None)
allocate a torch tensor of x's dtype when x is a tensor, else a NumPy array.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np

from ...algorithms.schedule import Collective
from ...errors import InvalidArgument
from ..native import copy_into
from ..transport.frames import call_signature
from ..transport.manager import LANE_COLL, Transport
from .executor import CallContext, Waiter, check_exchange, describe
from .fastcall import MISS, FastCalls
from .ops import Buf, averages_here, check_op, empty_like_input, finish_avg, parse_op, tensor_views, unaliased
from .work import Work

if TYPE_CHECKING:
    from numpy.typing import NDArray  # annotations only: numpy.typing costs milliseconds to import

ArrayT = TypeVar("ArrayT")   # a NumPy array or a CPU torch.Tensor
OpLike = Any                 # "sum", "avg", "prod", "min", "max", "band", "bor", "bxor", or a torch ReduceOp


class CollectiveCalls(FastCalls):
    """The collectives of `Communicator` (a mixin: the communicator provides the state declared below)."""

    if TYPE_CHECKING:
        rank: int
        size: int
        _op_seq: int
        _last_call: tuple[int, str]
        _in_call: bool
        _transport: Transport
        _waiters: list[Waiter]
        _run: Callable[..., Any]
        _execute: Callable[..., None]
        _door_all_reduce: Any
        _door_broadcast: Any
        _door_all_gather: Any
        _door_reduce_scatter: Any
        _door_all_to_all: Any
        _pattern: Callable[[], tuple[str, int]]

    def _coll(self, coll: Collective, x: Buf, out: Buf, count: int, opname: str | None, root: int | None,
              async_op: bool, timeout: float | None, result: Any,
              splits: tuple[tuple[int, ...], ...] | None = None, fast_key: tuple | None = None,
              shape_key: tuple | None = None, user_out: Any = None) -> Any:
        if opname is not None:
            check_op(opname, out.flat.dtype)
        meta = (coll, x.flat.dtype, x.flat.size, root, opname)
        x = unaliased(x, out)
        remember = (fast_key is not None or shape_key is not None) and not async_op and x.orig is not None
        if remember:
            self._last_native = None
        r = self._run(LANE_COLL, self._coll_fn(coll, x, out, count, opname, root, splits), async_op, timeout,
                      coll.value, result, meta=meta)
        if remember:
            self._fast_remember(fast_key, x.orig, user_out, coll, opname, root, meta, result, shape_key)
        return r

    def _coll_fn(self, coll: Collective, x: Buf, out: Buf, count: int, opname: str | None, root: int | None,
                 splits: tuple[tuple[int, ...], ...] | None) -> Callable[[float], None]:
        """The body of one collective call, run on the collective lane."""

        def fn(deadline: float) -> None:
            if self.size == 1:
                if out.flat is not x.flat and out.flat.size:
                    copy_into(out.flat, x.flat[:out.flat.size] if x.flat.size >= out.flat.size else x.flat)
                return
            self._execute(None, Collective.ALL_TO_ALLV if splits is not None else coll, count, x.flat, out.flat,
                          opname, root, deadline, splits, (x.orig, out.orig))
            if averages_here(coll, opname, self.rank, root):
                finish_avg(out.flat, self.size)
        return fn

    def _root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.size:
            raise InvalidArgument(f"root={root!r} is not a rank of this communicator (size {self.size})",
                                  "ranks are group-local: 0 .. size-1")
        return int(root)

    @staticmethod
    def _same_type(a: Buf, b: Buf, what: str) -> None:
        if a.flat.dtype != b.flat.dtype:
            raise InvalidArgument(f"{what}: input dtype {a.flat.dtype} differs from output dtype {b.flat.dtype}",
                                  "use the same dtype for both")

    # typed call shapes: a NumPy array or CPU tensor in; the result array (sync) or a Work (async_op=True)
    @staticmethod
    def _on_views(call: Callable[..., Any], x: Any, out: Any, need_out: bool, *args: Any,
                  timeout: float | None) -> Any:
        """MISS, or `call` run on NumPy views of tensors x and out (`ops.tensor_views`), returning x or out: a
        synchronous call on plain CPU tensors then takes the paths a call on arrays takes."""
        if type(x) is np.ndarray or (tv := tensor_views(x, out, need_out)) is None:
            return MISS
        if tv[1] is None:
            call(tv[0], *args, timeout=timeout)
            return x
        call(tv[0], *args, out=tv[1], timeout=timeout)
        return out

    @overload
    def all_reduce(self, x: ArrayT, op: OpLike = ..., *, out: None = ..., async_op: Literal[False] = ...,
                   timeout: float | None = ...) -> ArrayT: ...
    @overload
    def all_reduce(self, x: Any, op: OpLike = ..., *, out: ArrayT, async_op: Literal[False] = ...,
                   timeout: float | None = ...) -> ArrayT: ...
    @overload
    def all_reduce(self, x: Any, op: OpLike = ..., *, out: Any = ..., async_op: Literal[True],
                   timeout: float | None = ...) -> Work: ...
    def all_reduce(self, x: Any, op: Any = "sum", *, out: Any = None, async_op: bool = False,
                   timeout: float | None = None) -> Any:
        """Reduce x across ranks; the result lands in x (or `out`) on every rank."""
        if type(x) is not np.ndarray and not async_op and \
                (r := self._on_views(self.all_reduce, x, out, False, op, timeout=timeout)) is not MISS:
            return r
        if (r := self._door_all_reduce.call(x, out, op, async_op, timeout)) is not MISS:
            return r
        fk = ("all_reduce", id(x), id(out), op) if type(op) is str and not async_op else None
        r, sk = self._fast_paths(fk, "all_reduce", x, out, op, timeout) if fk is not None else (MISS, None)
        if r is not MISS:
            return r
        xb = Buf(x, "x")
        ob = Buf(out, "out") if out is not None else xb
        self._same_type(xb, ob, "all_reduce")
        if ob.flat.size != xb.flat.size:
            raise InvalidArgument(f"all_reduce: out has {ob.flat.size} elements, x has {xb.flat.size}",
                                  "out must be the size of x")
        return self._coll(Collective.ALL_REDUCE, xb, ob, xb.flat.size, parse_op(op), None, async_op, timeout,
                          out if out is not None else x, fast_key=fk, shape_key=sk, user_out=out)

    @overload
    def broadcast(self, x: ArrayT, root: int, *, async_op: Literal[False] = ...,
                  timeout: float | None = ...) -> ArrayT: ...
    @overload
    def broadcast(self, x: Any, root: int, *, async_op: Literal[True], timeout: float | None = ...) -> Work: ...
    def broadcast(self, x: Any, root: int, *, async_op: bool = False, timeout: float | None = None) -> Any:
        """Copy root's x into x on every rank."""
        if type(x) is not np.ndarray and not async_op and \
                (r := self._on_views(self.broadcast, x, None, False, root, timeout=timeout)) is not MISS:
            return r
        if (r := self._door_broadcast.call(x, None, root, async_op, timeout)) is not MISS:
            return r
        fk = ("broadcast", id(x), root) if type(root) is int and not async_op else None
        r, sk = self._fast_paths(fk, "broadcast", x, None, root, timeout) if fk is not None else (MISS, None)
        if r is not MISS:
            return r
        xb = Buf(x, "x")
        return self._coll(Collective.BROADCAST, xb, xb, xb.flat.size, None, self._root(root), async_op, timeout, x,
                          fast_key=fk, shape_key=sk)

    @overload
    def reduce(self, x: ArrayT, root: int, op: OpLike = ..., *, out: None = ..., async_op: Literal[False] = ...,
               timeout: float | None = ...) -> ArrayT: ...
    @overload
    def reduce(self, x: Any, root: int, op: OpLike = ..., *, out: ArrayT, async_op: Literal[False] = ...,
               timeout: float | None = ...) -> ArrayT: ...
    @overload
    def reduce(self, x: Any, root: int, op: OpLike = ..., *, out: Any = ..., async_op: Literal[True],
               timeout: float | None = ...) -> Work: ...
    def reduce(self, x: Any, root: int, op: Any = "sum", *, out: Any = None, async_op: bool = False,
               timeout: float | None = None) -> Any:
        """Reduce x across ranks into root's x (or `out`); other ranks' buffers are scratch."""
        fk = ("reduce", id(x), id(out), op, root) \
            if type(op) is str and type(root) is int and not async_op else None
        if fk is not None and (r := self._fast_run(fk, x, out, timeout)) is not MISS:
            return r
        xb = Buf(x, "x")
        ob = Buf(out, "out") if out is not None else xb
        self._same_type(xb, ob, "reduce")
        if ob.flat.size != xb.flat.size:
            raise InvalidArgument(f"reduce: out has {ob.flat.size} elements, x has {xb.flat.size}")
        return self._coll(Collective.REDUCE, xb, ob, xb.flat.size, parse_op(op), self._root(root), async_op,
                          timeout, out if out is not None else x, fast_key=fk, user_out=out)

    def _gather_out(self, xb: Buf, out: Any, what: str) -> tuple[Buf, Any]:
        if out is None:
            shape = (self.size * xb.shape[0], *xb.shape[1:]) if xb.shape else (self.size,)
            out = empty_like_input(xb.orig, shape, xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, what)
        if ob.flat.size != self.size * xb.flat.size:
            raise InvalidArgument(f"{what}: out has {ob.flat.size} elements, needs {self.size} x {xb.flat.size}",
                                  "out must be n times the size of x (concatenation on axis 0)")
        return ob, out

    @overload
    def all_gather(self, x: Any, *, out: None = ..., async_op: Literal[False] = ...,
              timeout: float | None = ...) -> NDArray[Any]: ...
    @overload
    def all_gather(self, x: Any, *, out: ArrayT, async_op: Literal[False] = ...,
              timeout: float | None = ...) -> ArrayT: ...
    @overload
    def all_gather(self, x: Any, *, out: Any = ..., async_op: Literal[True],
              timeout: float | None = ...) -> Work: ...
    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False, timeout: float | None = None) -> Any:
        """Concatenate every rank's x on axis 0, on every rank."""
        if type(x) is not np.ndarray and not async_op and \
                (r := self._on_views(self.all_gather, x, out, True, timeout=timeout)) is not MISS:
            return r
        if (r := self._door_all_gather.call(x, out, None, async_op, timeout)) is not MISS:
            return r
        fk = ("all_gather", id(x), id(out), None) if out is not None and not async_op else None
        r, sk = self._fast_paths(fk, "all_gather", x, out, None, timeout) if not async_op else (MISS, None)
        if r is not MISS:
            return r
        xb = Buf(x, "x")
        given = out
        ob, out = self._gather_out(xb, out, "all_gather")
        return self._coll(Collective.ALL_GATHER, xb, ob, xb.flat.size, None, None, async_op, timeout, out,
                          fast_key=fk, shape_key=sk, user_out=given)

    @overload
    def gather(self, x: Any, root: int, *, out: None = ..., async_op: Literal[False] = ...,
              timeout: float | None = ...) -> NDArray[Any]: ...
    @overload
    def gather(self, x: Any, root: int, *, out: ArrayT, async_op: Literal[False] = ...,
              timeout: float | None = ...) -> ArrayT: ...
    @overload
    def gather(self, x: Any, root: int, *, out: Any = ..., async_op: Literal[True],
              timeout: float | None = ...) -> Work: ...
    def gather(self, x: Any, root: int, *, out: Any = None, async_op: bool = False,
               timeout: float | None = None) -> Any:
        """Concatenate every rank's x on axis 0, at root (other ranks may pass out=None)."""
        xb = Buf(x, "x")
        root = self._root(root)
        ob, out = self._gather_out(xb, out, "gather")
        return self._coll(Collective.GATHER, xb, ob, xb.flat.size, None, root, async_op, timeout, out)

    def _split_out(self, xb: Buf, out: Any, what: str) -> tuple[Buf, Any, int]:
        if xb.shape and xb.shape[0] % self.size:
            raise InvalidArgument(f"{what}: x.shape[0]={xb.shape[0]} is not divisible by {self.size} ranks",
                                  "pad x so its first dimension is a multiple of the communicator size")
        count = xb.flat.size // self.size
        if out is None:
            shape = (xb.shape[0] // self.size, *xb.shape[1:]) if xb.shape else (count,)
            out = empty_like_input(xb.orig, shape, xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, what)
        if ob.flat.size != count:
            raise InvalidArgument(f"{what}: out has {ob.flat.size} elements, needs {count}",
                                  "out holds x.shape[0] // n rows")
        return ob, out, count

    @overload
    def reduce_scatter(self, x: Any, op: OpLike = ..., *, out: None = ..., async_op: Literal[False] = ...,
              timeout: float | None = ...) -> NDArray[Any]: ...
    @overload
    def reduce_scatter(self, x: Any, op: OpLike = ..., *, out: ArrayT, async_op: Literal[False] = ...,
              timeout: float | None = ...) -> ArrayT: ...
    @overload
    def reduce_scatter(self, x: Any, op: OpLike = ..., *, out: Any = ..., async_op: Literal[True],
              timeout: float | None = ...) -> Work: ...
    def reduce_scatter(self, x: Any, op: Any = "sum", *, out: Any = None, async_op: bool = False,
                       timeout: float | None = None) -> Any:
        """Reduce x across ranks and give rank r the r-th 1/n of the result (rows of axis 0)."""
        if type(x) is not np.ndarray and not async_op and \
                (r := self._on_views(self.reduce_scatter, x, out, True, op, timeout=timeout)) is not MISS:
            return r
        if (r := self._door_reduce_scatter.call(x, out, op, async_op, timeout)) is not MISS:
            return r
        fk = ("reduce_scatter", id(x), id(out), op) \
            if out is not None and type(op) is str and not async_op else None
        r, sk = self._fast_paths(fk, "reduce_scatter", x, out, op, timeout) \
            if type(op) is str and not async_op else (MISS, None)
        if r is not MISS:
            return r
        xb = Buf(x, "x")
        given = out
        ob, out, count = self._split_out(xb, out, "reduce_scatter")
        return self._coll(Collective.REDUCE_SCATTER, xb, ob, count, parse_op(op), None, async_op, timeout, out,
                          fast_key=fk, shape_key=sk, user_out=given)

    @overload
    def scatter(self, x: Any, root: int, *, out: None = ..., async_op: Literal[False] = ...,
              timeout: float | None = ...) -> NDArray[Any]: ...
    @overload
    def scatter(self, x: Any, root: int, *, out: ArrayT, async_op: Literal[False] = ...,
              timeout: float | None = ...) -> ArrayT: ...
    @overload
    def scatter(self, x: Any, root: int, *, out: Any = ..., async_op: Literal[True],
              timeout: float | None = ...) -> Work: ...
    def scatter(self, x: Any, root: int, *, out: Any = None, async_op: bool = False,
                timeout: float | None = None) -> Any:
        """Give rank r the r-th 1/n of root's x (other ranks pass an x of the same shape)."""
        xb = Buf(x, "x")
        root = self._root(root)
        ob, out, count = self._split_out(xb, out, "scatter")
        return self._coll(Collective.SCATTER, xb, ob, count, None, root, async_op, timeout, out)

    @overload
    def all_to_all(self, x: Any, *, out: None = ..., send_counts: Sequence[int] | None = ...,
                   recv_counts: Sequence[int] | None = ..., async_op: Literal[False] = ...,
                   timeout: float | None = ...) -> NDArray[Any]: ...
    @overload
    def all_to_all(self, x: Any, *, out: ArrayT, send_counts: Sequence[int] | None = ...,
                   recv_counts: Sequence[int] | None = ..., async_op: Literal[False] = ...,
                   timeout: float | None = ...) -> ArrayT: ...
    @overload
    def all_to_all(self, x: Any, *, out: Any = ..., send_counts: Sequence[int] | None = ...,
                   recv_counts: Sequence[int] | None = ..., async_op: Literal[True],
                   timeout: float | None = ...) -> Work: ...
    def all_to_all(self, x: Any, *, out: Any = None, send_counts: Sequence[int] | None = None,
                   recv_counts: Sequence[int] | None = None, async_op: bool = False,
                   timeout: float | None = None) -> Any:
        """Rank r sends its j-th part of x to rank j; equal parts, or counts (rows of axis 0) per rank."""
        even = send_counts is None and recv_counts is None and not async_op
        if even and ((r := self._on_views(self.all_to_all, x, out, True, timeout=timeout)) is not MISS
                     or (r := self._door_all_to_all.call(x, out, None, async_op, timeout)) is not MISS):
            return r
        fk = ("all_to_all", id(x), id(out), None) if out is not None and even else None
        r, sk = self._fast_paths(fk, "all_to_all", x, out, None, timeout) if even else (MISS, None)
        if r is not MISS:
            return r
        xb = Buf(x, "x")
        n = self.size
        if send_counts is None and recv_counts is None:
            if xb.shape and xb.shape[0] % n:
                raise InvalidArgument(f"all_to_all: x.shape[0]={xb.shape[0]} is not divisible by {n}",
                                      "pass send_counts/recv_counts for uneven splits")
            given = out
            if out is None:
                out = empty_like_input(xb.orig, xb.shape, xb.flat.dtype)
            ob = Buf(out, "out")
            self._same_type(xb, ob, "all_to_all")
            if ob.flat.size != xb.flat.size:
                raise InvalidArgument("all_to_all: out must have the size of x")
            return self._coll(Collective.ALL_TO_ALL, xb, ob, xb.flat.size // n, None, None, async_op, timeout, out,
                              fast_key=fk, shape_key=sk, user_out=given)
        row = int(np.prod(xb.shape[1:])) if len(xb.shape) > 1 else 1
        sc = self._counts(send_counts, "send_counts")
        if sum(sc) * row != xb.flat.size:
            raise InvalidArgument(f"send_counts sum to {sum(sc)} rows but x has {xb.shape[0] if xb.shape else 0}",
                                  "send_counts[j] = rows of x for rank j")
        if recv_counts is None:
            counts = np.asarray(sc, dtype=np.int64)
            got = np.empty(n, dtype=np.int64)
            self.all_to_all(counts, out=got, timeout=timeout)
            rc = [int(v) for v in got]
        else:
            rc = self._counts(recv_counts, "recv_counts")
        if out is None:
            out = empty_like_input(xb.orig, (sum(rc), *xb.shape[1:]), xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, "all_to_all")
        if ob.flat.size != sum(rc) * row:
            raise InvalidArgument(f"all_to_all: out has {ob.flat.size} elements, recv_counts need {sum(rc) * row}")
        splits = [[0] * n for _ in range(n)]
        for j in range(n):
            splits[self.rank][j] = sc[j] * row
            splits[j][self.rank] = rc[j] * row
        if n > 1:
            splits[self.rank][self.rank] = sc[self.rank] * row
            if sc[self.rank] != rc[self.rank]:
                raise InvalidArgument(f"send_counts[{self.rank}]={sc[self.rank]} but recv_counts[{self.rank}]="
                                      f"{rc[self.rank]}", "what a rank sends itself must equal what it receives")
        tsplits = tuple(tuple(r) for r in splits)
        if n == 1:
            return self._coll(Collective.ALL_TO_ALL, xb, ob, xb.flat.size, None, None, async_op, timeout, out)
        return self._coll(Collective.ALL_TO_ALLV, xb, ob, 0, None, None, async_op, timeout, out, splits=tsplits)

    def _counts(self, counts: Sequence[int] | None, what: str) -> list[int]:
        if counts is None or len(counts) != self.size or any(int(c) < 0 for c in counts):
            raise InvalidArgument(f"{what} must list {self.size} non-negative counts", f"got {counts!r}")
        return [int(c) for c in counts]

    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank of the communicator has reached the barrier."""
        def fn(deadline: float) -> None:
            if self.size == 1:
                return
            seq = self._op_seq
            self._op_seq += 1
            self._last_call, self._in_call = (seq, "barrier"), True
            ctx = CallContext(self._transport, self._waiters[LANE_COLL], call_signature("barrier"), seq,
                              describe("barrier", 0, np.dtype("uint8"), None, None, "check"), deadline, self.size,
                              self.rank, True, check_rounds=self._pattern()[1])
            check_exchange(ctx, [p for p in range(self.size) if p != self.rank])
        self._run(LANE_COLL, fn, False, timeout, "barrier", None, meta=("barrier", None, 0, None, None))
