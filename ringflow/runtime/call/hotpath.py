"""Runs a compiled plan on the native executor (native/_hotpath.c) when every peer is on shared memory.

`build` turns a compiled plan (algorithms.plan: per step the transfers and local ops, as byte
ranges of the call's IN / OUT / SCRATCH buffers) and its connections into a native plan, once per
call shape: a call passes only its buffers' addresses. `run` executes it with the GIL released,
resuming after each bounded sleep to check what only Python knows (abort, failure, peers that left,
the deadline), and turns the native return codes into ringflow's typed errors. A plan the native
executor cannot take (a TCP peer, an unsupported dtype, RINGFLOW_NATIVE=0) runs in Python; so does
a call whose connections a peer has not created yet (the next call tries again).
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...algorithms.check_rounds import round_peers
from ...algorithms.plan import Plan, StepPlan
from ...algorithms.schedule import Buffer, OpKind
from ...errors import InvalidArgument, ProtocolError
from .. import native
from ..transport import cma
from ..transport.base import Mismatch
from ..transport.frames import Kind
from ..transport.protocol import CMA_COPY_MIN_BYTES, CMA_MIN_BYTES, W_PID
from ..transport.shm import ShmIn, ShmOut
from .executor import GOODBYE_GRACE_S, CallContext, after_mismatch, departed, needs_check, step_mismatch, timed_out
from .ops import BFLOAT16

T_SEND, T_RECV, T_RECV_REDUCE, T_COPY, T_REDUCE = range(5)
RC_DONE, RC_STALLED, RC_MISMATCH, RC_PROTOCOL, RC_CMA, RC_REGION = range(6)
NCOLS = 18

_DTYPES = {np.dtype(n): i for i, n in enumerate(
    ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16"))}
if BFLOAT16 is not None:
    _DTYPES[BFLOAT16] = 10
_DTYPES.update({np.dtype("float32"): 11, np.dtype("float64"): 12})
OPS = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
UNSUITED = False  # a binding the native executor can never take (build() caches this instead of a plan)

if native._hotpath is not None:
    native._hotpath.set_array_type(np.ndarray)
    address = native._hotpath.address   # an array's data address, without ndarray.ctypes' per-call object
else:
    def address(a: np.ndarray) -> int:
        """An array's data address."""
        return int(a.ctypes.data)


BUF_INDEX = {Buffer.IN: 0, Buffer.OUT: 1, Buffer.SCRATCH: 2}
OWN = 3   # the plan's own payload (the argument check's description)


class _Rows:
    """The rows of a native plan as it is assembled (one int64 row of NCOLS per op)."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.starts: list[int] = [0]
        self.bells: list[bytes] = []
        self.last: dict[int, int] = {}   # connection control address -> its latest op in this step

    def bell(self, address: bytes) -> int:
        if address not in self.bells:
            self.bells.append(address)
        return self.bells.index(address)

    def add(self, typ: int, *, kind: int = int(Kind.DATA), peer: int = -1, conn: Any = None, dst: tuple[int, int] =
            (0, 0), src: tuple[int, int] = (0, 0), nbytes: int = 0, want: int = 0, cma_min: int = 0,
            pipelined: bool = False, snapshot: bool = False, early: bool = False) -> None:
        ctl = nslots = slot_bytes = 0
        bell = prev = -1
        if conn is not None:
            ctl, nslots, slot_bytes, bell = conn.m.addr, conn.m.nslots, conn.m.slot_bytes, self.bell(conn.peer_bell)
            prev = self.last.get(ctl, -1)
            self.last[ctl] = len(self.rows)
        self.rows.append([typ, kind, peer, prev, ctl, nslots, slot_bytes, dst[0], dst[1], src[0], src[1], nbytes, want,
                          cma_min, int(pipelined), bell, int(snapshot), int(early)])

    def end_step(self) -> None:
        self.starts.append(len(self.rows))
        self.last.clear()

    def plan(self, dtype: np.dtype, opname: str | None, conns: list[Any], own: np.ndarray | None = None) -> NativePlan:
        rows = np.asarray(self.rows, dtype=np.int64).reshape(-1, NCOLS)
        starts = np.asarray(self.starts, dtype=np.int32)
        try:
            hp = native._hotpath.plan(rows.tobytes(), starts.tobytes(), self.bells, _DTYPES[dtype],
                                      OPS.get(opname or "sum", 0), dtype.itemsize,
                                      int(own.ctypes.data) if own is not None else 0, (own, conns))
        except ValueError as exc:  # make_plan checks every index it would follow
            raise ProtocolError(f"the native executor refused a compiled plan: {exc}",
                                "a ringflow bug: RINGFLOW_NATIVE=0 runs the call in Python; please report it") from None
        return NativePlan(hp, conns)


class NativePlan:
    """A native plan and the connections it runs on (to name a peer's pid or map its region on request)."""

    __slots__ = ("hp", "conns")

    def __init__(self, hp: Any, conns: list[Any]) -> None:
        self.hp, self.conns = hp, conns


def _drivable(conns: list[Any]) -> bool | None:
    """True if the native executor can drive these connections now (shared memory, mapped, no Python op queued);
    UNSUITED if one is not shared memory, None if one is not ready yet."""
    if not all(isinstance(c, (ShmOut, ShmIn)) for c in conns):
        return UNSUITED
    return True if all(c.m is not None and not c.queue for c in conns) else None


Range = tuple[int, int, int]   # (buffer index, first byte, end byte)


def _hits(r: Range, others: list[Range]) -> bool:
    return any(r[0] == o[0] and r[1] < o[2] and o[1] < r[2] for o in others)


def early_locals(step: StepPlan, isz: int, inplace: bool) -> list[bool]:
    """Which local ops of a step may run as soon as its receives passed their checks, overlapping the rest of
    the step's data movement: those that touch no byte a transfer of the step reads or writes, nor one an earlier
    local op left for the end touches (so listed order holds wherever it matters)."""
    def rng(b: Buffer, off: int, n: int) -> Range:
        i = BUF_INDEX[b]
        return (BUF_INDEX[Buffer.OUT] if inplace and i == BUF_INDEX[Buffer.IN] else i, off, off + n)
    written = [rng(x.buf, x.off, x.nbytes) for x in step.xfers if x.kind != OpKind.SEND]
    read = [rng(x.buf, x.off, x.nbytes) for x in step.xfers if x.kind == OpKind.SEND]
    read += [rng(x.src_buf, x.src_off, x.nbytes) for x in step.xfers
             if x.kind == OpKind.RECV_REDUCE and x.src_buf is not None]
    late_dst: list[Range] = []
    late_src: list[Range] = []
    out = []
    for lo in step.locals:
        d = rng(lo.dst, lo.dst_off * isz, lo.n * isz)
        src = rng(lo.src, lo.src_off * isz, lo.n * isz)
        ok = not _hits(d, written + read + late_dst + late_src) and not _hits(src, written + late_dst)
        if not ok:
            late_dst.append(d)
            late_src.append(src)
        out.append(ok)
    return out


def build(plan: Plan, transport: Any, deadline: float, dtype: np.dtype, opname: str | None,
          inplace: bool = True) -> NativePlan | bool | None:
    """The native plan of a compiled plan (any arrays: their addresses are given per call); UNSUITED if it can never
    run natively, None if not yet (a peer has not created its side of a connection): this call then runs in Python."""
    if not native.hot_available() or dtype not in _DTYPES:
        return UNSUITED
    if any(transport.kind(p) != "shm" for p in plan.peers):
        return UNSUITED
    r, conns, isz = _Rows(), [], dtype.itemsize
    for step in plan.steps:
        sends = [(x, transport.out(x.peer, x.key, deadline)) for x in step.xfers if x.kind == OpKind.SEND]
        recvs = [(x, transport.inn(x.peer, x.key)) for x in step.xfers if x.kind != OpKind.SEND]
        step_conns = [c for _, c in sends + recvs]
        ready = _drivable(step_conns)
        if ready is not True:
            return ready
        conns += step_conns
        for x, c in sends:
            r.add(T_SEND, peer=x.peer, conn=c, dst=(BUF_INDEX[x.buf], x.off), nbytes=x.nbytes,
                  cma_min=CMA_COPY_MIN_BYTES if x.cold_copy else CMA_MIN_BYTES, pipelined=x.lone and c.spare_core,
                  snapshot=x.snapshot)
        for x, c in recvs:
            red = x.kind == OpKind.RECV_REDUCE
            src = (BUF_INDEX[x.src_buf], x.src_off) if red and x.src_buf is not None else (0, 0)
            r.add(T_RECV_REDUCE if red else T_RECV, peer=x.peer, conn=c, dst=(BUF_INDEX[x.buf], x.off), src=src,
                  nbytes=x.nbytes, want=x.nbytes)
        for lo, early in zip(step.locals, early_locals(step, isz, inplace), strict=True):
            r.add(T_COPY if lo.kind == OpKind.COPY else T_REDUCE, dst=(BUF_INDEX[lo.dst], lo.dst_off * isz),
                  src=(BUF_INDEX[lo.src], lo.src_off * isz), nbytes=lo.n * isz, early=early)
        r.end_step()
    return r.plan(dtype, opname, conns)


def build_check(transport: Any, steps: list[tuple[list[int], list[int]]], description: str,
                deadline: float) -> NativePlan | bool | None:
    """The argument check as a native plan: per step (the peers to send to, the peers to receive from: every peer
    in one step, or one each way per log-depth round) this call's description sent, theirs compared."""
    if not native.hot_available():
        return UNSUITED
    r = _Rows()
    conns: list[Any] = []
    payload = np.frombuffer(description.encode(), dtype=np.uint8).copy()
    for to, frm in steps:
        outs = [transport.out(p, "c0", deadline) for p in to]
        ins = [transport.inn(p, "c0") for p in frm]
        ready = _drivable(outs + ins)
        if ready is not True:
            return ready
        conns += outs + ins
        for c in outs:
            r.add(T_SEND, kind=int(Kind.CHECK), peer=c.peer, conn=c, dst=(OWN, 0), nbytes=payload.size,
                  cma_min=CMA_MIN_BYTES)
        for c in ins:
            r.add(T_RECV, kind=int(Kind.CHECK), peer=c.peer, conn=c, want=-1)
        r.end_step()
    return r.plan(np.dtype(np.uint8), None, conns, own=payload)


class Prepared:
    """The native plans of one call shape: the steps, and the argument check where the steps do not check;
    `rounds`: the steps' leading log-depth check rounds (`Plan.check_rounds`)."""

    __slots__ = ("steps", "check", "rounds")

    def __init__(self, steps: NativePlan, check: NativePlan | None, rounds: int = 0) -> None:
        self.steps, self.check, self.rounds = steps, check, rounds


def prepare(plan: Plan, ctx: CallContext, dtype: np.dtype, opname: str | None,
            inplace: bool) -> Prepared | bool | None:
    """Both native plans of a call shape; UNSUITED or None (not yet) as `build`."""
    steps = build(plan, ctx.transport, ctx.deadline, dtype, opname, inplace)
    if not isinstance(steps, NativePlan):
        return steps
    check = None
    if needs_check(plan, ctx):
        peers = [p for p in range(ctx.nranks) if p != ctx.rank]
        rounds = [([to], [frm]) for to, frm in (round_peers(ctx.nranks, ctx.rank, k) for k in range(ctx.check_rounds))]
        c = build_check(ctx.transport, rounds or [(peers, peers)], ctx.description, ctx.deadline)
        if not isinstance(c, NativePlan):
            return c
        check = c
    return Prepared(steps, check, plan.check_rounds)


def check_failed(ctx: CallContext, bad: list[tuple[int, Mismatch]]) -> InvalidArgument:
    """The error of an argument check that found a message of another call (in its round `bad[0][0]` under the
    log-depth pattern, whose later rounds relay it first)."""
    si, mismatch = bad[0]
    return after_mismatch(ctx, si, mismatch) if ctx.check_rounds else mismatch.error(ctx.description)


def execute(prep: Prepared, ctx: CallContext, bases: tuple[int, int, int], spans: bytes) -> None:
    """One call on the native executor: the argument check (if the plan does not check itself), then the steps."""
    if prep.check is not None:
        bad = run(prep.check, ctx, bases, spans)
        if bad:
            raise check_failed(ctx, bad)
    prep.steps.hp.reset()
    resume(prep, ctx, bases, spans, None)


def resume(prep: Prepared, ctx: CallContext, bases: tuple[int, int, int], spans: bytes, rc: int | None) -> None:
    """The call's steps from where they stand to the end (`rc`: what their last native pass returned; None: run
    one); a message of another call raises."""
    bad = _drive(prep.steps, ctx, bases, spans, rc)
    if bad:
        si, mismatch = bad[0]
        if si < prep.rounds:
            raise after_mismatch(ctx, si, mismatch)
        raise step_mismatch(mismatch, ctx, si, prep.check is not None)


def run(plan: NativePlan, ctx: Any, bases: tuple[int, int, int], spans: bytes = b"") -> list[tuple[int, Mismatch]]:
    """Run a native plan on this call's (IN, OUT, SCRATCH) addresses; [(step, mismatch)] if a step received a
    message of another call."""
    plan.hp.reset()
    return _drive(plan, ctx, bases, spans, None)


def _drive(plan: NativePlan, ctx: Any, bases: tuple[int, int, int], spans: bytes,
           rc: int | None) -> list[tuple[int, Mismatch]]:
    """Run the plan on from where it stands until it is done; `rc`: what its last run returned (None: run it)."""
    hp = plan.hp
    w = ctx.waiter
    hot_s = w.hot_s if ctx.ll else 0.0
    fd = w.bell.fd
    while True:
        if rc is None:
            rc = hp.run(ctx.sig, ctx.op_seq, ctx.deadline, fd, hot_s, w.spin_s, bases[0], bases[1], bases[2], spans)
        if rc == RC_DONE:
            return []
        if rc == RC_MISMATCH:
            return [(hp.at() - 1, Mismatch(peer, got, want, sig, ctx.sig & 0xFFFFFFFF, detail))
                    for peer, got, want, sig, detail in hp.mismatches()]
        if rc == RC_STALLED:
            w.failure()
            _check_stalled(hp, w.departed, ctx.deadline, ctx.description)
        elif rc == RC_REGION:
            op, peer, _, rid = hp.error()
            conn = _conn_of(plan, peer, ShmIn)
            reg = conn.region(rid - 1)
            hp.set_region(op, rid, reg.ctypes.data, reg.shape[0])
        else:
            _raise(plan, rc)
        rc = None


CHECK_RC = 16   # Runner.go's code for a call whose check exchange did not finish: CHECK_RC + the exchange's rc


def resume_call(prep: Prepared, ctx: CallContext, bases: tuple[int, int, int], spans: bytes, rc: int) -> None:
    """Finish a call whose first native pass (Runner.go) returned `rc`, as `execute` would have."""
    steps_rc: int | None = rc
    if rc >= CHECK_RC:
        assert prep.check is not None   # only a runner with a check exchange returns these
        bad = _drive(prep.check, ctx, bases, spans, rc - CHECK_RC)
        if bad:
            raise check_failed(ctx, bad)
        prep.steps.hp.reset()
        steps_rc = None
    resume(prep, ctx, bases, spans, steps_rc)


def runner(prep: Prepared, ctx: CallContext, bases: tuple[int, int, int], regions: Any) -> Any:
    """`execute` for one remembered call (the repeated-call path), as one function of the deadline (and of other
    addresses than `bases`, for a remembered call shape): a plan that checks itself runs its first native pass
    inline, and only what that pass leaves goes through `resume`."""
    if prep.check is not None:
        return lambda deadline, b=bases: execute(prep, ctx, b, regions.packed)
    hp, w = prep.steps.hp, ctx.waiter

    def go(deadline: float, b: tuple[int, int, int] = bases) -> None:
        hp.reset()
        spans = regions.packed
        rc = hp.run(ctx.sig, ctx.op_seq, ctx.deadline, w.bell.fd, w.hot_s if ctx.ll else 0.0, w.spin_s, b[0], b[1],
                    b[2], spans)
        if rc != RC_DONE:
            resume(prep, ctx, b, spans, rc)
    return go


def call_runner(prep: Prepared, ctx: CallContext, bases: tuple[int, int, int], x: Any, out: Any) -> Any:
    """A remembered call on NumPy arrays x (and out) as one C object (`_hotpath.Runner`): its `go(x, out, op_seq,
    timeout_s, spans)` re-checks that x and out are the arrays remembered in the state remembered (else returns -1,
    having done nothing) and runs the call's first native pass (the check exchange where the plan needs one, then
    the plan), returning what `resume_call` takes; None where an array is not exactly an ndarray (`runner` serves
    those)."""
    if native._hotpath is None or type(x) is not np.ndarray or (out is not None and type(out) is not np.ndarray):
        return None
    w, st = ctx.waiter, native._hotpath.array_state
    check = None if prep.check is None else prep.check.hp
    oref, ostate = (None, None) if out is None else (weakref.ref(out), st(out))
    return native._hotpath.runner(prep.steps.hp, check, weakref.ref(x), st(x), oref, ostate, ctx.sig, w.bell.fd,
                                  w.hot_s if ctx.ll else 0.0, w.spin_s, *bases)


def _conn_of(plan: NativePlan, peer: int, kind: type) -> Any:
    return next(c for c in plan.conns if c.peer == peer and isinstance(c, kind))


def _check_stalled(hp: Any, departed_at: Mapping[int, float] | None, deadline: float, what: str) -> None:
    """After a sleep without progress: a peer that left, or the deadline passed, ends the call."""
    peers = sorted(set(hp.pending()))
    now = time.monotonic()
    if departed_at:
        gone = [p for p in peers if now - departed_at.get(p, now) >= GOODBYE_GRACE_S]
        if gone:
            raise departed(what, gone[0])
    if now >= deadline:
        raise timed_out(what, peers)


def _raise(plan: NativePlan, rc: int) -> None:
    op, peer, code, _ = plan.hp.error()
    if rc == RC_CMA:
        conn = _conn_of(plan, peer, ShmIn)
        assert conn.m is not None  # a native plan only holds mapped connections
        raise cma._fail(int(conn.m.ctl[W_PID]), peer, -code)
    raise ProtocolError(f"shared-memory message from rank {peer} is out of order or malformed (native executor, "
                        f"op {op}, code {code})", "a peer process is corrupt or from another ringflow version")
