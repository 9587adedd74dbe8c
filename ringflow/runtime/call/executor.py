"""Runs a Schedule between real processes: compile once per call shape, then drive transfers.

`algorithms.plan.compile_plan` turns one rank's program into flat per-step lists of byte ranges
(using the one chunk->element mapping, `layout.chunk_bounds`), cached per (schedule, shape, dtype,
rank, in-place). `run_plan` executes it: per step, start every send and receive, progress them without
blocking until all are done (waiting with `Waiter` when nothing moves), then run the local copies
and reductions in listed order. Semantics follow `algorithms.schedule`: sends read values as of the
start of the step (a send whose source a receive of the same step overwrites is snapshotted first).

Cross-rank argument checks: every message carries the call signature, which its receiver compares
with its own before it uses a byte of the payload. A plan whose step 0 moves exactly one message each
way between every pair of ranks checks itself: the one-shot all-reduce, 2-rank exchanges, and plans the
compiler completes with zero-byte verify messages (algorithms.verify_messages: a 2-rank broadcast's
receiver answers its root in the same step). Other plans open with a CHECK exchange of the call
description. Either way every rank hears from every peer before data reaches the user's arrays, so
disagreeing ranks all raise InvalidArgument, and every message posted is consumed: the communicator
stays usable. Under the log-depth pattern (`algorithms.check_rounds`, `checkrounds`) the same holds after
ceil(log2 n) rounds of one message each way, which a disseminating plan's own first steps carry.
"""
from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from ...algorithms.check_rounds import round_peers
from ...algorithms.plan import Plan
from ...algorithms.schedule import Buffer, OpKind
from ...errors import InvalidArgument, RemoteError, RingflowError, Timeout
from .. import native
from ..logs import trace_step, tracing
from ..native import copy_into
from ..transport import doorbell
from ..transport.base import Mismatch, Sink, XferOp
from ..transport.frames import Kind
from . import checkrounds
from .calltext import hint

if TYPE_CHECKING:
    from ..transport.manager import Transport



STRIPE_MIN_BYTES = 4 * 2**20  # TCP transfers at least this big are striped over several streams


def stripes(nbytes: int, isz: int, streams: int) -> list[tuple[int, int]]:
    """(offset, nbytes) of each stream's part of a transfer (element aligned); one part when small."""
    if streams <= 1 or nbytes < STRIPE_MIN_BYTES:
        return [(0, nbytes)]
    n = nbytes // isz
    q, r = divmod(n, streams)
    out, off = [], 0
    for j in range(streams):
        k = (q + (1 if j < r else 0)) * isz
        out.append((off, k))
        off += k
    return out


def stream_key(key: str, j: int) -> str:
    """Connection key of stream j of a channel (stream 0 is the channel's own connection)."""
    return key if j == 0 else f"{key}.s{j}"


GOODBYE_GRACE_S = 0.25  # a departed peer's last data may trail its goodbye on another socket by this much
# Small messages on shared memory with a core per rank spin this long without yielding before they sleep, as long
# as bulk waits (the doorbell's spin budget): a peer bound to another core that is not there yet was preempted for a
# moment by another process, and a sleeper pays a wake-up (tens of us on a VM) after that moment ends
HOT_SPIN_S = 1e-3
SOCKET_HOT_S = 50e-6  # a socket-only wait polls this long before each further poll yields the core
# Socket-only waits with a core per rank poll this long before sleeping: a peer that finished its call first
# (a gather's or reduce's, while the root still copies or reduces) waits in the next call's check, and
# asleep it pays a wake-up that grows with how long it slept. 2 TCP ranks, checked - unchecked at 512 KiB /
# 1 MiB / 2 MiB: gathers 31 / 62 / 82 us polling 50 us, 37 / 40 / 43 with 500 us, broadcasts 29-31
# either way
SOCKET_SPIN_S = 500e-6


class Waiter:
    """Waits for progress on one lane: spin a little, then sleep on the lane's doorbell."""

    def __init__(self, bell: doorbell.Doorbell, local_ranks: int, failure: Callable[[], None],
                 departed: Mapping[int, float] | None = None) -> None:
        self.bell = bell
        self.departed = departed  # peer -> when it said goodbye (the watchdog's live view)
        self.spin_s = doorbell.spin_budget_s(local_ranks)
        crowded = doorbell.oversubscribed(local_ranks)
        self.hot_s = 0.0 if crowded else HOT_SPIN_S
        self.socket_s = 0.0 if crowded else SOCKET_SPIN_S
        self.yields = crowded  # bulk spins hand the core over (to a peer rank waiting for it)
        if crowded and native._hotpath is not None:
            native._hotpath.set_spin_yield(True)  # process-wide: oversubscription is the host's
        self.failure = failure  # raises if the communicator failed or was aborted

    def wait(self, pending: list[XferOp], deadline: float, what: str, hot: bool = True) -> None:
        """Return when some op may progress; raise on failure, abort or timeout.

        `hot` (messages below RINGFLOW_LL_THRESHOLD): spin HOT_SPIN_S without yielding, then sleep: with a
        core per rank a peer that is not there yet was preempted for a moment on its own core, and a sleeper
        would pay a wake-up after that moment; sched_yield, which on a busy host hands the core to anybody for
        a timeslice, would only delay this rank. Where ranks outnumber cores there is no hot spin (hot_s is
        0): the wait is a bulk one. Bulk transfers spin up to the spin budget: the peer is busy copying the
        next slice and will be back within tens of microseconds. They yield the core while spinning only where
        the host's ranks outnumber its cores (the peer may be waiting for this core); with a core per rank a
        yield hands the core to whatever else runs on the host for a whole timeslice, so on a busy host a bulk
        call would wait milliseconds for a peer that was back within microseconds. Socket-only waits poll
        their sockets for SOCKET_SPIN_S before sleeping, unless the host is oversubscribed: a rank asleep in
        poll() when the data lands pays a wake-up (30-80 us on a VM, more the longer it slept), and a pair of
        ranks can lock into paying it on every call.
        """
        shm = [op for op in pending if op.is_shm]
        if self._ready_despite_failure(pending, shm):
            return
        if shm:
            hot_spin = hot and self.hot_s > 0
            end = time.monotonic() + (self.hot_s if hot_spin else self.spin_s)
            while True:
                for op in shm:
                    if op.ready():
                        return
                if time.monotonic() > end:
                    break
                if not hot_spin and self.yields:
                    os.sched_yield()
        elif self.socket_s > 0 and _sockets_ready(pending, self.socket_s):
            return
        for op in shm:
            op.set_waiting(1)
        try:
            for op in shm:
                if op.ready():
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                raise timed_out(what, sorted({op.peer for op in pending}))
            fds = [fd for op in pending for fd in op.fds]
            self.bell.sleep(min(left, doorbell.SLEEP_CAP_S if shm else 0.5), fds)
        finally:
            for op in shm:
                op.set_waiting(0)
        if self._ready_despite_failure(pending, shm):
            return
        self._check_departed(pending, shm, what)

    def _ready_despite_failure(self, pending: list[XferOp], shm: list[XferOp]) -> bool:
        """Raise the communicator's failure (a peer that failed or aborted, or this rank's abort) unless a pending
        op can progress: what a peer sent before it failed is still taken, so a call that completed on the peer
        (its last message sent) completes here too. True when an op is ready (the caller returns to progress)."""
        try:
            self.failure()
        except BaseException:
            if any(op.ready() for op in shm) or _sockets_ready(pending, 0.0):
                return True
            raise
        return False

    def _check_departed(self, pending: list[XferOp], shm: list[XferOp], what: str) -> None:
        """Raise once a peer this call still waits on said goodbye GOODBYE_GRACE_S ago and nothing more can come:
        what it sent before leaving has been consumed (its data socket may trail its goodbye by a moment)."""
        if not self.departed:
            return
        now = time.monotonic()
        gone = sorted({op.peer for op in pending if now - self.departed.get(op.peer, now) >= GOODBYE_GRACE_S})
        if not gone or any(op.ready() for op in shm) or _sockets_ready(pending, 0.0):
            return
        raise departed(what, gone[0])


def timed_out(what: str, peers: list[int]) -> Timeout:
    """The error of a call whose deadline passed while it waited on `peers` (both executors)."""
    return Timeout(f"{what} timed out waiting for {'rank' if len(peers) == 1 else 'ranks'} "
                   f"{', '.join(map(str, peers))}", hint("timeout"),
                   detail={"reason": "timeout", "waiting_on": list(peers)})


def departed(what: str, peer: int) -> RemoteError:
    """The error of a call still waiting on a peer that said goodbye (both executors)."""
    return RemoteError(f"{what}: rank {peer} left the communicator (destroy() or the end of its `with` block) "
                       f"while this call waited on it", rank=peer, hint=hint("departed"))


def _sockets_ready(pending: list[XferOp], budget_s: float) -> bool:
    """Poll the pending ops' sockets without sleeping for up to budget_s; True once one is ready. Past
    SOCKET_HOT_S each poll yields the core: ranks of emulated hosts (network namespaces) each count a core
    per rank while sharing this machine's (2 namespaces x 2 ranks on 2 cores, flat ring all-reduce of
    256 KiB: 2,989 us with a 50 us poll, 4,937 with 500 us of plain polling)."""
    fds = [fd for op in pending for fd in op.fds]
    if not fds:
        return False
    poller = select.poll()
    for fd, ev in fds:
        poller.register(fd, ev)
    start = time.monotonic()
    hot_end, end = start + min(SOCKET_HOT_S, budget_s), start + budget_s
    while True:
        if poller.poll(0):
            return True
        now = time.monotonic()
        if now >= end:
            return False
        if now >= hot_end:
            os.sched_yield()


def drive(ops: list[XferOp], waiter: Waiter, deadline: float, what: str, hot: bool = True) -> None:
    """Progress every op to completion (`hot`: latency mode, spin before yielding)."""
    pending = ops
    try:
        while pending:
            moved = False
            for op in pending:
                if op.progress():
                    moved = True
            pending = [op for op in pending if not op.done]
            if pending and not moved:
                waiter.wait(pending, deadline, what, hot)
    except BaseException:
        for op in pending:
            op.cancel()
        raise


class CallContext:
    """What a run needs besides the plan."""

    __slots__ = ("transport", "waiter", "sig", "op_seq", "description", "deadline", "nranks", "rank", "checks",
                 "streams", "ll", "check_rounds")

    def __init__(self, transport: Transport, waiter: Waiter, sig: int, op_seq: int, description: str, deadline: float,
                 nranks: int, rank: int, checks: bool, streams: int = 1, check_rounds: int = 0) -> None:
        self.transport, self.waiter, self.sig, self.op_seq = transport, waiter, sig, op_seq
        self.description, self.deadline, self.nranks, self.rank, self.checks = \
            description, deadline, nranks, rank, checks
        self.streams = streams
        self.ll = True  # latency mode (set per call from RINGFLOW_LL_THRESHOLD)
        self.check_rounds = check_rounds  # K under the log-depth check pattern (`algorithms.check_rounds`), else 0


def check_exchange(ctx: CallContext, peers: range | list[int]) -> None:
    """Send this call's description to every peer and compare theirs (CHECK frames on channel 0); under the log-depth
    pattern, to one peer a round (`checkrounds`)."""
    if ctx.check_rounds:
        check_rounds_from(ctx, 0, None)
        return
    t = ctx.transport
    payload = np.frombuffer(ctx.description.encode(), dtype=np.uint8)
    ops: list[XferOp] = []
    for p in peers:
        ops.append(t.out(p, "c0", ctx.deadline).send(payload, Kind.CHECK, ctx.sig, ctx.op_seq, 0))
    recvs: list[XferOp] = [t.inn(p, "c0").recv(None, -1, ctx.sig, check=True, op_seq=ctx.op_seq, tag=0)
                           for p in peers]
    drive(ops + recvs, ctx.waiter, ctx.deadline, "argument check", ctx.ll)
    _raise_mismatch(recvs, ctx)


def check_rounds_from(ctx: CallContext, start: int, finding: checkrounds.Finding | None) -> None:
    """Rounds `start` .. K-1 of the log-depth check on the Python transport (`checkrounds`): this call's
    description to (r+2^k)%n, or RELAY frames once a round found a mismatch (`finding`), the message from
    (r-2^k)%n compared; the finding's error, on every rank, after the last round."""
    t = ctx.transport
    desc = np.frombuffer(ctx.description.encode(), dtype=np.uint8)
    for k in range(start, ctx.check_rounds):
        to, frm = round_peers(ctx.nranks, ctx.rank, k)
        out = t.out(to, "c0", ctx.deadline)
        send = out.send(desc, Kind.CHECK, ctx.sig, ctx.op_seq, 0) if finding is None else \
            out.send(finding.payload(), Kind.RELAY, ctx.sig, ctx.op_seq, 0)
        recv = t.inn(frm, "c0").recv(None, -1, ctx.sig, check=True, op_seq=ctx.op_seq, tag=0)
        drive([send, recv], ctx.waiter, ctx.deadline, "argument check", ctx.ll)
        if recv.mismatch is not None and finding is None:
            finding = checkrounds.finding_of(recv.mismatch, ctx)
    if finding is not None:
        raise finding.error(ctx)


def after_mismatch(ctx: CallContext, step: int, mismatch: Mismatch) -> InvalidArgument:
    """The error of a call whose log-depth check round `step` received `mismatch`: the later rounds relay the
    finding first (`check_rounds_from`), so every rank raises it."""
    try:
        check_rounds_from(ctx, step + 1, checkrounds.finding_of(mismatch, ctx))
    except InvalidArgument as exc:
        return exc
    raise AssertionError("check_rounds_from returns only without a finding")   # pragma: no cover


def _raise_mismatch(recvs: list[XferOp], ctx: CallContext) -> None:
    bad = [op.mismatch for op in recvs if op.mismatch is not None]
    if bad:
        raise bad[0].error(ctx.description)


class Bound:
    """A plan bound to concrete arrays: per step the connections, views and sinks, ready to run.

    Binding costs slicing and object creation; a communicator keeps the binding of a small,
    repeated call (same arrays) so the next call only posts the messages.
    """

    __slots__ = ("plan", "steps", "refs")

    def __init__(self, plan: Plan, steps: list, refs: tuple) -> None:
        self.plan, self.steps, self.refs = plan, steps, refs


def bind(plan: Plan, ctx: CallContext, arrays: dict[Buffer, np.ndarray], ufunc: Callable,
         refs: tuple = ()) -> Bound:
    """Resolve every transfer and local op of `plan` to connections and views of `arrays`."""
    t = ctx.transport
    u8 = {b: a.view(np.uint8) for b, a in arrays.items()}
    dtype = arrays[Buffer.OUT].dtype if Buffer.OUT in arrays else arrays[Buffer.IN].dtype
    isz = dtype.itemsize
    steps = []
    for si, step in enumerate(plan.steps):
        sends, recvs, locs = [], [], []
        for x in step.xfers:
            # a check round's message is one frame: its receiver checks the header before any byte lands
            tcp = t.kind(x.peer) == "tcp" and si >= plan.check_rounds
            parts = stripes(x.nbytes, isz, ctx.streams) if tcp else ((0, x.nbytes),)
            for j, (po, pn) in enumerate(parts):
                key = x.key if j == 0 else stream_key(x.key, j)
                if x.kind == OpKind.SEND:
                    sends.append((t.out(x.peer, key, ctx.deadline), u8[x.buf][x.off + po:x.off + po + pn],
                                  x.snapshot, x.lone, x.cold_copy))
                    continue
                o = x.off + po
                if x.kind == OpKind.RECV:
                    sink = Sink(u8[x.buf][o:o + pn])
                else:
                    a, b = o // isz, (o + pn) // isz
                    sa = (x.src_off + po) // isz
                    assert x.src_buf is not None  # a RECV_REDUCE names its source
                    sink = Sink(u8[x.buf][o:o + pn], ufunc=ufunc, src_t=arrays[x.src_buf][sa:sa + (b - a)],
                                dst_t=arrays[x.buf][a:b], dtype=dtype)
                recvs.append((t.inn(x.peer, key), sink, pn))
        for lo in step.locals:
            locs.append((lo.kind == OpKind.COPY, arrays[lo.dst][lo.dst_off:lo.dst_off + lo.n],
                         arrays[lo.src][lo.src_off:lo.src_off + lo.n]))
        steps.append((sends, recvs, locs))
    return Bound(plan, steps, refs)


def needs_check(plan: Plan, ctx: CallContext) -> bool:
    """True if the call opens with the CHECK exchange: its plan's first step does not check every pair of ranks,
    or may stripe a transfer over several TCP streams (safe only once every rank agreed on the sizes). A plan
    whose first steps are the log-depth check's rounds never opens with it (nothing in them is striped, and
    every rank, whatever its peers' transports, must run the same rounds)."""
    if not ctx.checks or ctx.nranks < 2:
        return False
    if plan.check_rounds:
        return False
    if not plan.self_checking:
        return True
    return plan.max_xfer_bytes >= STRIPE_MIN_BYTES and ctx.streams > 1 and \
        any(ctx.transport.kind(p) == "tcp" for p in plan.peers)


def run_plan(plan: Plan, ctx: CallContext, arrays: dict[Buffer, np.ndarray], ufunc: Callable) -> None:
    """Execute a compiled plan on flat typed arrays (IN/OUT/SCRATCH)."""
    run_bound(bind(plan, ctx, arrays, ufunc), ctx, ufunc)


def run_bound(bound: Bound, ctx: CallContext, ufunc: Callable) -> None:
    """Execute a bound plan: per step post every message, drive them, then the local ops."""
    plan = bound.plan
    n = ctx.nranks
    check = needs_check(plan, ctx)
    if check:
        check_exchange(ctx, [p for p in range(n) if p != ctx.rank])
    sig, seq = ctx.sig, ctx.op_seq
    for si, (sends, recvs, locs) in enumerate(bound.steps):
        if tracing[0]:
            step = plan.steps[si]
            trace_step(ctx.op_seq, ctx.description, si, step.xfers, step.locals)
        if sends or recvs:
            ops: list[XferOp] = [c.send(v.copy() if snap else v, Kind.DATA, sig, seq, 0, lone=lone, copied=cp)
                                 for c, v, snap, lone, cp in sends]
            rops = [c.recv(sink, nb, sig, check=True, op_seq=seq, tag=0) for c, sink, nb in recvs]
            drive(ops + rops if ops else rops, ctx.waiter, ctx.deadline, "collective step", ctx.ll)
            for op in rops:
                if op.mismatch is not None:
                    if si < plan.check_rounds:
                        raise after_mismatch(ctx, si, op.mismatch)
                    raise step_mismatch(op.mismatch, ctx, si, check)
        for is_copy, dst, src in locs:
            if is_copy:
                copy_into(dst, src)
            else:
                ufunc(dst, src, out=dst)


def step_mismatch(mismatch: Mismatch, ctx: CallContext, step: int, checked: bool) -> RingflowError:
    """The error for a message of another call found in `step`: in the first step of a plan that checks itself
    no data has moved yet (InvalidArgument, the communicator stays usable); otherwise the channels are out of
    step (`_Broken`). `checked`: the call opened with the CHECK exchange."""
    if ctx.checks and step == 0 and not checked and ctx.nranks > 1:
        return mismatch.error(ctx.description)
    return _Broken(mismatch)


class _Broken(RingflowError):
    """A mismatch found after data moved: the communicator's channels are out of step."""

    def __init__(self, mismatch: Mismatch) -> None:
        self.mismatch = mismatch
        super().__init__(f"rank {mismatch.peer} sent {mismatch.got_nbytes} bytes where "
                         f"{mismatch.want_nbytes} were expected")


def describe(collective: str, count: int, dtype: np.dtype, op: str | None, root: int | None, algorithm: str) -> str:
    """The human-readable call description exchanged by the argument check."""
    return json.dumps({"collective": collective, "count": count, "dtype": str(dtype), "op": op, "root": root,
                       "algorithm": algorithm})
