"""A schedule flattened into numpy arrays: what the simulator engines read.

One row per transfer (a send matched by a receive in the same step).  Sizes are kept as
``frac``: bytes moved per byte of the call's ``count * itemsize``, so one table serves every
message size (the analytic engine scales it; the flow engine multiplies it out).  Local work
(copy / reduce, including the reduction of a RECV_REDUCE) is kept per (rank, step) the same way.

Bytes come from `layout.chunk_bounds`, the one chunk -> element mapping of the project, at a
reference count large enough that rounding of uneven splits is below 1e-6 of any chunk.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..algorithms.layout import CallShape, chunk_bounds, ref_bounds
from ..algorithms.schedule import Buffer, Collective, OpKind, Schedule
from ..errors import InvalidArgument


@dataclass(frozen=True)
class TransferTable:
    """Transfers and local work of one schedule, as parallel numpy arrays."""

    collective: Collective
    algorithm: str
    nranks: int
    nsteps: int
    step: np.ndarray    # int64 [T] global step of the transfer
    src: np.ndarray     # int64 [T] sending rank
    dst: np.ndarray     # int64 [T] receiving rank
    chan: np.ndarray    # int64 [T] channel
    frac: np.ndarray    # float64 [T] bytes / (count * itemsize)
    nmsg: np.ndarray    # int64 [T] messages in the row (segments of one step, or coarsened steps)
    lrank: np.ndarray   # int64 [W] local work: rank
    lstep: np.ndarray   # int64 [W] local work: step
    lcopy: np.ndarray   # float64 [W] bytes copied / (count * itemsize)
    lreduce: np.ndarray  # float64 [W] bytes reduced / (count * itemsize)
    # float64 [W] the part of lreduce whose destination is also its local operand (in place); None: none known
    lreduce_inplace: np.ndarray | None = None
    # float64 [W] bytes sent fresh (`algorithms.plan.Xfer.fresh`: written earlier in the call, copied by the
    # receiver); None: none known
    lfresh: np.ndarray | None = None
    # float64 [W] the part of lfresh that a local copy of the rank wrote (an all-gather's own block); None: none
    lfresh_copied: np.ndarray | None = None
    nserial: np.ndarray | None = None  # int64 [T] dependent messages whose latencies add up (steps merged)
    coarsened: int = 1  # steps merged per macro step (1 = exact schedule)
    # int8 [T] rows a switch reduces into one stream to their receiver (1) or copies from one sender (2):
    # `sim.nvls`; None: every row is its own stream
    in_switch: np.ndarray | None = None

    def serial(self) -> np.ndarray:
        """Latencies paid in sequence per row (1 unless steps were coarsened)."""
        return self.nserial if self.nserial is not None else np.ones(self.step.size, dtype=np.int64)

    @property
    def ntransfers(self) -> int:
        """Rows of the table."""
        return int(self.step.size)

    @cached_property
    def _step_pairs(self) -> np.ndarray:
        """The distinct (step, sender, receiver) of the table, each as (step * n + sender) * n + receiver."""
        n = self.nranks
        return np.unique((self.step * n + self.src) * n + self.dst)

    @cached_property
    def _step_peers(self) -> tuple[int, int]:
        if not self.ntransfers:
            return 0, 0
        n = self.nranks
        pairs = self._step_pairs
        sends = np.unique(pairs // n, return_counts=True)[1].max()
        recvs = np.unique((pairs // (n * n)) * n + pairs % n, return_counts=True)[1].max()
        return int(sends), int(recvs)

    def step_peers(self) -> tuple[int, int]:
        """(the most distinct peers one rank sends to, the most one rank receives from) in one step."""
        return self._step_peers

    def peers_per_step(self) -> int:
        """The most distinct peers one rank sends to, or receives from, in one step."""
        return max(self.step_peers())

    @cached_property
    def in_relay_step(self) -> np.ndarray:
        """bool [T]: the transfer's step is a relay step: in it some rank sends to a peer that does not
        send back to it, and both also have another transfer in the step (the sender receives, the
        receiver sends on): a ring step, a pipelined chain, not an exchange in pairs, a fan or a lone send."""
        if not self.ntransfers or self.nranks < 3:
            return np.zeros(self.ntransfers, dtype=bool)
        n = self.nranks
        key = (self.step * n + self.src) * n + self.dst
        back = np.isin((self.step * n + self.dst) * n + self.src, key)
        src_recvs = np.isin(self.step * n + self.src, self.step * n + self.dst)
        dst_sends = np.isin(self.step * n + self.dst, self.step * n + self.src)
        relay = ~back & src_recvs & dst_sends
        return np.isin(self.step, self.step[relay])

    @cached_property
    def in_shift_step(self) -> np.ndarray:
        """bool [T]: the transfer's step is a shift: a relay step in which every rank sends to one peer and
        receives from one (a ring step, a pairwise all-to-all's shift by 1, a Bruck step), not a chain."""
        if not self.ntransfers or self.nranks < 3:
            return np.zeros(self.ntransfers, dtype=bool)
        n = self.nranks
        pairs = self._step_pairs
        step, src, dst = pairs // (n * n), pairs // n % n, pairs % n
        steps, npairs = np.unique(step, return_counts=True)

        def distinct(ranks: np.ndarray) -> np.ndarray:   # per step of `steps`: how many distinct ranks
            return np.bincount(np.searchsorted(steps, np.unique(step * n + ranks) // n), minlength=steps.size)
        full = (npairs == n) & (distinct(src) == n) & (distinct(dst) == n)
        return np.isin(self.step, steps[full]) & self.in_relay_step

    @cached_property
    def chained_step(self) -> np.ndarray:
        """bool [T]: the transfer's step directly follows a step with transfers and no local work (the
        ranks go from one message to the next without stopping)."""
        if not self.ntransfers:
            return np.zeros(0, dtype=bool)
        moved = np.zeros(self.nsteps + 1, dtype=bool)
        moved[self.step] = True
        worked = np.zeros(self.nsteps + 1, dtype=bool)
        worked[self.lstep] = True
        prev = np.maximum(self.step - 1, 0)
        return (self.step > 0) & moved[prev] & ~worked[prev]

    @cached_property
    def oneway_into_inplace_reduction(self) -> np.ndarray:
        """bool [T]: the transfer's receiver reduces into its own operand in the transfer's step (a RECV_REDUCE
        of an in-place reduce or all-reduce) and sends nothing in it (a one-way step, not an exchange or a relay)."""
        if not self.ntransfers or self.lreduce_inplace is None:
            return np.zeros(self.ntransfers, dtype=bool)
        n = self.nranks
        on = self.lreduce_inplace > 0
        reduces = np.isin(self.step * n + self.dst, self.lstep[on] * n + self.lrank[on])
        return reduces & ~np.isin(self.step * n + self.dst, self.step * n + self.src)

    def step_pattern(self) -> str:
        """'in' when some rank receives from several peers in a step and every rank sends to one
        (a direct gather), 'out' for the reverse (a direct scatter), 'all' otherwise."""
        sends, recvs = self.step_peers()
        return "in" if sends == 1 and recvs > 1 else "out" if recvs == 1 and sends > 1 else "all"

    def first_step_busy(self) -> bool:
        """Every rank both sends and receives in the first step with transfers (an exchange, a ring shift,
        an all-to-all step), as the calibration's exchange step has them right after the argument check."""
        if not self.ntransfers:
            return False
        first = self.step == self.step.min()
        ranks = np.arange(self.nranks)
        return bool(np.isin(ranks, self.src[first]).all() and np.isin(ranks, self.dst[first]).all())

    def wire_bytes(self, count_bytes: float) -> float:
        """Total bytes all transfers put on the wire for a call of `count_bytes`."""
        return float(self.frac.sum() * count_bytes)


def _reference_shape(schedule: Schedule) -> CallShape:
    if schedule.collective == Collective.ALL_TO_ALLV:
        raise InvalidArgument("all_to_allv needs its split matrix to size transfers",
                              "simulate it with from_schedule(schedule, shape=CallShape(..., splits=...))")
    nchunks = max((lay.nchunks for lay in schedule.layouts.values()), default=1)
    ref = 1
    while ref < nchunks * 10**6:
        ref *= 2
    return CallShape(schedule.collective, schedule.nranks, ref, itemsize=1)


_CACHE: dict[int, tuple[weakref.ref, TransferTable]] = {}


def from_schedule(schedule: Schedule, shape: CallShape | None = None) -> TransferTable:
    """Flatten a schedule (cached per schedule object when no explicit shape is given)."""
    if shape is None:
        hit = _CACHE.get(id(schedule))
        if hit is not None and hit[0]() is schedule:
            return hit[1]
    table = _build(schedule, shape or _reference_shape(schedule))
    if shape is None:
        _CACHE[id(schedule)] = (weakref.ref(schedule), table)
        if len(_CACHE) > 256:
            for k in [k for k, (r, _) in _CACHE.items() if r() is None]:
                del _CACHE[k]
    return table


def _build(schedule: Schedule, shape: CallShape) -> TransferTable:
    if shape.nranks != schedule.nranks or shape.collective != schedule.collective:
        raise InvalidArgument(f"shape is for {shape.collective.value} on {shape.nranks} ranks, schedule "
                              f"for {schedule.collective.value} on {schedule.nranks}",
                              "build the CallShape from the schedule's collective and nranks")
    denom = float(max(shape.count, 1) * shape.itemsize)
    if shape.collective == Collective.ALL_TO_ALLV and shape.splits is not None:
        denom = float(max(1, max(sum(r) for r in shape.splits)) * shape.itemsize)
    item = shape.itemsize
    rows = _Rows()
    send, rred, copy, red = OpKind.SEND, OpKind.RECV_REDUCE, OpKind.COPY, OpKind.REDUCE
    for r, prog in enumerate(schedule.programs):
        bounds: dict[Buffer, tuple] = {}

        def length(ref, _b=bounds, _r=r) -> int:
            bb = _b.get(ref.buffer)
            if bb is None:
                bb = _b[ref.buffer] = chunk_bounds(shape, schedule, ref.buffer, _r)
            return ref_bounds(bb, ref.index, ref.span)[1]

        for s, ops in enumerate(prog):
            for op in ops:
                k = op.kind
                if k is send:
                    rows.send(s, r, op.peer, op.channel, length(op.src) * item)
                elif k is copy:
                    rows.work(r, s, 0, length(op.dst) * item)
                elif k is rred or k is red:
                    rows.work(r, s, 1, length(op.dst) * item)
    return rows.table(schedule, denom)


def from_plans(schedule: Schedule, shape: CallShape, inplace: bool) -> TransferTable:
    """The table of what ringflow's runtime executes for one call (`algorithms.plan.compile_plan`):
    in-place aliasing, dropped self-copies and the snapshot copies of in-place sends included."""
    from ..algorithms.plan import aliased, compile_plan

    def same(b1: Buffer, o1: int, b2: Buffer, o2: int) -> bool:   # one range of one array
        return aliased(b1, inplace) == aliased(b2, inplace) and o1 == o2
    rows = _Rows()
    isz = shape.itemsize
    for r in range(schedule.nranks):
        copied: list[tuple[Buffer, int, int]] = []   # (array, first, end byte) this rank's copies wrote so far
        for s, st in enumerate(compile_plan(schedule, shape, r, inplace).steps):
            for x in st.xfers:
                if x.kind == OpKind.SEND:
                    rows.send(s, r, x.peer, int(x.key[1:]) if x.key[1:].lstrip("-").isdigit() else 0, x.nbytes)
                    if x.snapshot:
                        rows.work(r, s, 0, x.nbytes)
                    if x.fresh:
                        rows.work(r, s, 3, x.nbytes)
                        rows.work(r, s, 4, _overlap_bytes(copied, aliased(x.buf, inplace), x.off, x.nbytes))
                elif x.kind == OpKind.RECV_REDUCE:
                    rows.work(r, s, 1, x.nbytes, same(x.buf, x.off, x.src_buf, x.src_off))
            for lo in st.locals:
                red = lo.kind != OpKind.COPY
                rows.work(r, s, int(red), lo.n * isz, red and same(lo.dst, lo.dst_off, lo.src, lo.src_off))
                if not red:
                    copied.append((aliased(lo.dst, inplace), lo.dst_off * isz, (lo.dst_off + lo.n) * isz))
    return rows.table(schedule, float(max(shape.count, 1) * shape.itemsize))


def _overlap_bytes(ranges: list[tuple[Buffer, int, int]], buf: Buffer, off: int, nbytes: int) -> int:
    """Bytes of buf[off:off + nbytes] that the (array, first, end byte) ranges cover."""
    return sum(max(0, min(hi, off + nbytes) - max(lo, off)) for b, lo, hi in ranges if b == buf)


class _Rows:
    """Transfer rows and per-(rank, step) [copy, reduce, reduce in place, fresh send, fresh send a copy wrote]
    bytes, for one TransferTable."""

    def __init__(self) -> None:
        self.step: list[int] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.chan: list[int] = []
        self.nbytes: list[int] = []
        self.local: dict[tuple[int, int], list[int]] = {}

    def send(self, step: int, src: int, dst: int, chan: int, nbytes: int) -> None:
        """One message."""
        self.step.append(step)
        self.src.append(src)
        self.dst.append(dst)
        self.chan.append(chan)
        self.nbytes.append(nbytes)

    def work(self, rank: int, step: int, kind: int, nbytes: int, inplace: bool = False) -> None:
        """Local work of a rank in a step: kind 0 copy, 1 reduce (`inplace`: into its own operand), 3 bytes
        sent fresh (written earlier in the call, copied by the receiver: `algorithms.plan.Xfer.fresh`), 4 the part
        of those a local copy of the rank wrote."""
        w = self.local.setdefault((rank, step), [0, 0, 0, 0, 0])
        w[kind] += nbytes
        if inplace:
            w[2] += nbytes

    def table(self, schedule: Schedule, denom: float) -> TransferTable:
        """The TransferTable (bytes as fractions of denom = count * itemsize)."""
        return _table(schedule, self.step, self.src, self.dst, self.chan, self.nbytes, self.local, denom)


def _table(schedule: Schedule, t_step: list[int], t_src: list[int], t_dst: list[int], t_chan: list[int],
           t_bytes: list[int], work: dict[tuple[int, int], list[int]], denom: float) -> TransferTable:
    """Transfer rows and per-(rank, step) [copy, reduce, in place] bytes -> a TransferTable (fractions of denom)."""
    wk = sorted(work)
    to_i = lambda xs: np.asarray(xs, dtype=np.int64)  # noqa: E731
    step, src, dst, chan = to_i(t_step), to_i(t_src), to_i(t_dst), to_i(t_chan)
    frac = np.asarray(t_bytes, dtype=np.float64) / denom
    nmsg = np.ones(step.size, dtype=np.int64)
    if step.size:
        # several messages of one step between the same pair on the same channel (segments) travel
        # back to back on one connection: one row, bytes added, nmsg = messages
        g = np.stack([step, src, dst, chan])
        uniq, inv = np.unique(g, axis=1, return_inverse=True)
        if uniq.shape[1] < step.size:
            inv = inv.reshape(-1)
            frac = np.bincount(inv, weights=frac, minlength=uniq.shape[1])
            nmsg = np.bincount(inv, minlength=uniq.shape[1]).astype(np.int64)
            step, src, dst, chan = uniq
    return TransferTable(
        schedule.collective, schedule.algorithm, schedule.nranks, schedule.nsteps,
        step, src, dst, chan, frac, nmsg,
        to_i([k[0] for k in wk]), to_i([k[1] for k in wk]),
        np.asarray([work[k][0] for k in wk], dtype=np.float64) / denom,
        np.asarray([work[k][1] for k in wk], dtype=np.float64) / denom,
        np.asarray([work[k][2] for k in wk], dtype=np.float64) / denom,
        np.asarray([work[k][3] for k in wk], dtype=np.float64) / denom,
        np.asarray([work[k][4] for k in wk], dtype=np.float64) / denom)


def coarsen(table: TransferTable, max_transfers: int) -> TransferTable:
    """Merge runs of consecutive steps with the same (src, dst, channel) pattern.

    Each run of k identical-pattern steps is cut into groups of ``factor`` steps; a group
    becomes one macro step whose transfers carry the summed bytes and ``nmsg`` = messages
    merged (the engines charge per-message costs ``nmsg`` times).  Without contention the
    result is exact; with contention, finer-grained overlap inside a group is lost.
    """
    T = table.ntransfers
    if T <= max_transfers or table.nsteps <= 1 or table.in_switch is not None:
        return table
    factor = int(np.ceil(T / max(1, max_transfers)))
    order = np.lexsort((table.chan, table.dst, table.src, table.step))
    step, src, dst, chan = table.step[order], table.src[order], table.dst[order], table.chan[order]
    frac, nmsg = table.frac[order], table.nmsg[order]
    # signature of each step: hash of its sorted (src, dst, chan) rows
    bounds = np.searchsorted(step, np.arange(table.nsteps + 1))
    key = (src * 1_000_003 + dst) * 257 + chan
    sig = np.empty(table.nsteps, dtype=object)
    for s in range(table.nsteps):
        sig[s] = key[bounds[s]:bounds[s + 1]].tobytes()
    macro = np.empty(table.nsteps, dtype=np.int64)
    m, run_len = -1, 0
    for s in range(table.nsteps):
        if s > 0 and sig[s] == sig[s - 1] and run_len < factor and sig[s]:
            run_len += 1
        else:
            m += 1
            run_len = 1
        macro[s] = m
    new_step = macro[step]
    # group rows by (macro step, src, dst, chan)
    gkey = np.stack([new_step, src, dst, chan])
    uniq, inv = np.unique(gkey, axis=1, return_inverse=True)
    inv = inv.reshape(-1)
    nf = np.bincount(inv, weights=frac, minlength=uniq.shape[1])
    nm = np.bincount(inv, weights=nmsg, minlength=uniq.shape[1]).astype(np.int64)
    ns = np.bincount(inv, weights=table.serial()[order], minlength=uniq.shape[1]).astype(np.int64)
    # local work
    lkey = np.stack([table.lrank, macro[table.lstep]]) if table.lrank.size else np.zeros((2, 0), np.int64)
    if lkey.shape[1]:
        lu, linv = np.unique(lkey, axis=1, return_inverse=True)
        linv = linv.reshape(-1)
        lc = np.bincount(linv, weights=table.lcopy, minlength=lu.shape[1])
        lr = np.bincount(linv, weights=table.lreduce, minlength=lu.shape[1])
        li, lf, lfc = (None if w is None else np.bincount(linv, weights=w, minlength=lu.shape[1])
                       for w in (table.lreduce_inplace, table.lfresh, table.lfresh_copied))
    else:
        lu, lc, lr = lkey, table.lcopy, table.lreduce
        li, lf, lfc = table.lreduce_inplace, table.lfresh, table.lfresh_copied
    return replace(table, nsteps=int(m + 1), step=uniq[0], src=uniq[1], dst=uniq[2], chan=uniq[3],
                   frac=nf, nmsg=nm, nserial=ns, lrank=lu[0], lstep=lu[1], lcopy=lc, lreduce=lr,
                   lreduce_inplace=li, lfresh=lf, lfresh_copied=lfc, coarsened=max(table.coarsened, factor))
