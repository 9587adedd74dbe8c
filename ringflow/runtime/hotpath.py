"""Runs a bound plan on the native executor (native/_hotpath.c) when every peer is on shared memory.

`build` turns a binding (executor.bind: per step the connections, views and sinks) into a native
plan once; `run` executes it with the GIL released, resuming after each bounded sleep to check
what only Python knows (abort, failure, peers that left, the deadline), and turns the native return
codes into ringflow's typed errors. A plan the native executor cannot take (a TCP peer, a
connection its peer has not created yet, pending Python sends on a connection) runs in Python.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ProtocolError, RemoteError, Timeout
from . import native
from .ops import BFLOAT16
from .transport import cma
from .transport.base import Mismatch
from .transport.frames import Kind
from .transport.shm import CMA_COPY_MIN_BYTES, CMA_MIN_BYTES, W_PID, ZERO_COPY_MIN_BYTES, ShmIn, ShmOut

T_SEND, T_RECV, T_RECV_REDUCE, T_COPY, T_REDUCE = range(5)
RC_DONE, RC_STALLED, RC_MISMATCH, RC_PROTOCOL, RC_CMA, RC_REGION = range(6)
NCOLS = 16

_DTYPES = {np.dtype(n): i for i, n in enumerate(
    ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16"))}
if BFLOAT16 is not None:
    _DTYPES[BFLOAT16] = 10
_DTYPES.update({np.dtype("float32"): 11, np.dtype("float64"): 12})
OPS = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
UNSUITED = False  # a binding the native executor can never take (build() caches this instead of a plan)


class _Rows:
    """The rows of a native plan as it is assembled (one int64 row of NCOLS per op)."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.starts: list[int] = [0]
        self.bells: list[bytes] = []
        self.keep: list[Any] = []
        self.last: dict[int, int] = {}   # connection control address -> its latest op in this step

    def bell(self, address: bytes) -> int:
        if address not in self.bells:
            self.bells.append(address)
        return self.bells.index(address)

    def add(self, typ: int, *, kind: int = int(Kind.DATA), peer: int = -1, ctl: int = 0, nslots: int = 0,
            slot_bytes: int = 0, data: int = 0, src: int = 0, nbytes: int = 0, want: int = 0, cma_min: int = 0,
            pipelined: bool = False, bell: int = -1, snapshot: bool = False, ref: int = 0) -> None:
        prev = self.last.get(ctl, -1) if ctl else -1
        if ctl:
            self.last[ctl] = len(self.rows)
        self.rows.append([typ, kind, peer, prev, ctl, nslots, slot_bytes, data, src, nbytes, want, cma_min,
                          int(pipelined), bell, int(snapshot), ref])

    def end_step(self) -> None:
        self.starts.append(len(self.rows))
        self.last.clear()

    def plan(self, dtype: np.dtype, opname: str | None, conns: list[Any]) -> Any:
        rows = np.asarray(self.rows, dtype=np.int64).reshape(-1, NCOLS)
        starts = np.asarray(self.starts, dtype=np.int32)
        hp = native._hotpath.plan(rows.tobytes(), starts.tobytes(), self.bells, _DTYPES[dtype],
                                  OPS.get(opname or "sum", 0), dtype.itemsize, (self.keep, conns))
        return NativePlan(hp, conns)


class NativePlan:
    """A native plan and the connections it runs on (to name a peer's pid or map its region on request)."""

    __slots__ = ("hp", "conns")

    def __init__(self, hp: Any, conns: list[Any]) -> None:
        self.hp, self.conns = hp, conns


def _addr(a: np.ndarray) -> int:
    return int(a.ctypes.data) if a.size else 0


def _conn_ok(c: Any) -> bool:
    return isinstance(c, (ShmOut, ShmIn)) and c.m is not None and not c.queue


def _send(r: _Rows, c: ShmOut, view: np.ndarray, snap: bool, lone: bool, cold: bool, kind: int = int(Kind.DATA)) \
        -> None:
    """One send row: by reference when it lies in a comm.alloc region, else by slots or single copy."""
    ref = 0
    n = int(view.shape[0])
    if n >= ZERO_COPY_MIN_BYTES and c.regions is not None and not snap:
        found = c.regions.find(view)
        if found is not None:
            ref = ((found[0] + 1) << 48) | found[1]
    r.keep.append(view)
    r.add(T_SEND, kind=kind, peer=c.peer, ctl=c.m.addr, nslots=c.m.nslots, slot_bytes=c.m.slot_bytes,
          data=_addr(view), nbytes=n, cma_min=CMA_COPY_MIN_BYTES if cold else CMA_MIN_BYTES,
          pipelined=lone and c.spare_core, bell=r.bell(c.peer_bell), snapshot=snap, ref=ref)


def build(steps: list, dtype: np.dtype, opname: str | None) -> NativePlan | bool | None:
    """A native plan of a binding's steps; UNSUITED if it can never run natively, None if not yet (a peer's
    connection not created yet, Python sends pending): then this call runs in Python."""
    if not native.hot_available() or dtype not in _DTYPES:
        return UNSUITED
    r, conns = _Rows(), []
    for sends, recvs, locs in steps:
        for c, *_ in sends + recvs:
            if not isinstance(c, (ShmOut, ShmIn)):
                return UNSUITED
            if not _conn_ok(c):
                return None
            conns.append(c)
        for c, view, snap, lone, cold in sends:
            _send(r, c, view, snap, lone, cold)
        for c, sink, nb in recvs:
            reduce = sink.ufunc is not None
            r.keep.append(sink)
            r.add(T_RECV_REDUCE if reduce else T_RECV, peer=c.peer, ctl=c.m.addr, nslots=c.m.nslots,
                  slot_bytes=c.m.slot_bytes, data=_addr(sink.dst_u8), src=_addr(sink.src_t) if reduce else 0,
                  nbytes=nb, want=nb, bell=r.bell(c.peer_bell))
        for is_copy, dst, src in locs:
            r.keep += [dst, src]
            r.add(T_COPY if is_copy else T_REDUCE, data=_addr(dst), src=_addr(src), nbytes=int(dst.nbytes))
        r.end_step()
    return r.plan(dtype, opname, conns)


def build_check(transport: Any, peers: list[int], description: str, deadline: float) -> NativePlan | bool | None:
    """The argument check as a native plan: this call's description to every peer, theirs compared."""
    if not native.hot_available():
        return UNSUITED
    outs = [transport.out(p, "c0", deadline) for p in peers]
    ins = [transport.inn(p, "c0") for p in peers]
    if not all(isinstance(c, (ShmOut, ShmIn)) for c in outs + ins):
        return UNSUITED
    if not all(_conn_ok(c) for c in outs + ins):
        return None
    r = _Rows()
    payload = np.frombuffer(description.encode(), dtype=np.uint8).copy()
    for c in outs:
        _send(r, c, payload, False, False, False, kind=int(Kind.CHECK))
    for c in ins:
        r.add(T_RECV, kind=int(Kind.CHECK), peer=c.peer, ctl=c.m.addr, nslots=c.m.nslots, slot_bytes=c.m.slot_bytes,
              want=-1, bell=r.bell(c.peer_bell))
    r.end_step()
    return r.plan(np.dtype(np.uint8), None, outs + ins)


def run(plan: NativePlan, ctx: Any, what: str) -> list[tuple[int, Mismatch]]:
    """Run a native plan to its end; [(step, mismatch)] if a step received a message of another call."""
    hp = plan.hp
    hp.reset()
    w = ctx.waiter
    hot_s = w.hot_s if ctx.ll else 0.0
    fd = w.bell.fd
    while True:
        rc = hp.run(ctx.sig, ctx.op_seq, ctx.deadline, fd, hot_s, w.spin_s)
        if rc == RC_DONE:
            return []
        if rc == RC_MISMATCH:
            return [(hp.at() - 1, Mismatch(peer, got, want, sig, ctx.sig & 0xFFFFFFFF, detail))
                    for peer, got, want, sig, detail in hp.mismatches()]
        if rc == RC_STALLED:
            w.failure()
            _check_stalled(hp, w.departed, ctx.deadline, what)
        elif rc == RC_REGION:
            op, peer, _, rid = hp.error()
            conn = _conn_of(plan, peer, ShmIn)
            reg = conn.region(rid - 1)
            hp.set_region(op, rid, reg.ctypes.data, reg.shape[0])
        else:
            _raise(plan, rc)


def _conn_of(plan: NativePlan, peer: int, kind: type) -> Any:
    return next(c for c in plan.conns if c.peer == peer and isinstance(c, kind))


def _check_stalled(hp: Any, departed: Mapping[int, float] | None, deadline: float, what: str) -> None:
    """After a sleep without progress: a peer that left, or the deadline passed, ends the call."""
    from .executor import GOODBYE_GRACE_S
    peers = sorted(set(hp.pending()))
    now = time.monotonic()
    if departed:
        gone = [p for p in peers if now - departed.get(p, now) >= GOODBYE_GRACE_S]
        if gone:
            raise RemoteError(f"{what}: rank {gone[0]} left the communicator (destroy() or the end of its `with` "
                              f"block) while this call waited on it", rank=gone[0],
                              hint="every rank must make the same collective calls before destroying; this "
                                   "communicator cannot complete them: shrink() it or create a new one")
    if now >= deadline:
        raise Timeout(f"{what} timed out waiting for ranks {peers}",
                      "a peer is slow, stuck or called a different collective; raise timeout= or "
                      "RINGFLOW_TIMEOUT, or check every rank calls the same sequence")


def _raise(plan: NativePlan, rc: int) -> None:
    op, peer, code, _ = plan.hp.error()
    if rc == RC_CMA:
        conn = _conn_of(plan, peer, ShmIn)
        assert conn.m is not None  # a native plan only holds mapped connections
        raise cma._fail(int(conn.m.ctl[W_PID]), peer, -code)
    raise ProtocolError(f"shared-memory message from rank {peer} is out of order or malformed (native executor, "
                        f"op {op}, code {code})", "a peer process is corrupt or from another ringflow version")
