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

    def mismatch(self, reference: TransferTable, rel: float = 1e-6) -> str | None:
        """Where this table (written directly, in (step, src, dst, channel) order: `sim.nvls_tree`,
        `sim.nccl_tree`) differs from `reference` (the schedule's): the first field that differs, or None. Byte
        fractions and local reductions compare within `rel` (the schedule rounds at its reference count)."""
        if (self.nranks, self.nsteps, self.ntransfers) != (reference.nranks, reference.nsteps, reference.ntransfers):
            return "shape (nranks, nsteps, rows)"
        o = np.lexsort((reference.chan, reference.dst, reference.src, reference.step))
        for f in ("step", "src", "dst", "chan", "nmsg"):
            if not np.array_equal(getattr(reference, f)[o], getattr(self, f)):
                return f
        for f in ("lrank", "lstep"):
            if not np.array_equal(getattr(reference, f), getattr(self, f)):
                return f
        if not np.allclose(self.frac, reference.frac[o], rtol=rel, atol=0):
            return "frac"
        if not np.allclose(self.lreduce, reference.lreduce, rtol=rel, atol=0) or \
                not np.allclose(self.lcopy, reference.lcopy, rtol=rel, atol=0):
            return "local work"
        return None

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
                    assert op.peer is not None   # a SEND names its receiver
                    rows.send(s, r, op.peer, op.channel, length(op.src) * item)
                elif k is copy:
                    rows.work(r, s, 0, length(op.dst) * item)
                elif k is rred or k is red:
                    rows.work(r, s, 1, length(op.dst) * item)
    return rows.table(schedule, denom)


class _Rows:
    """Transfer rows and per-(rank, step) [copy, reduce] bytes, for one TransferTable."""

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

    def work(self, rank: int, step: int, kind: int, nbytes: int) -> None:
        """Local work of a rank in a step: kind 0 copy, 1 reduce."""
        w = self.local.setdefault((rank, step), [0, 0])
        w[kind] += nbytes

    def table(self, schedule: Schedule, denom: float) -> TransferTable:
        """The TransferTable (bytes as fractions of denom = count * itemsize)."""
        return _table(schedule, self.step, self.src, self.dst, self.chan, self.nbytes, self.local, denom)


def _table(schedule: Schedule, t_step: list[int], t_src: list[int], t_dst: list[int], t_chan: list[int],
           t_bytes: list[int], work: dict[tuple[int, int], list[int]], denom: float) -> TransferTable:
    """Transfer rows and per-(rank, step) [copy, reduce] bytes -> a TransferTable (fractions of denom)."""
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
            frac = np.bincount(inv, weights=frac, minlength=uniq.shape[1]).astype(np.float64)
            nmsg = np.bincount(inv, minlength=uniq.shape[1]).astype(np.int64)
            step, src, dst, chan = uniq
    return TransferTable(
        schedule.collective, schedule.algorithm, schedule.nranks, schedule.nsteps,
        step, src, dst, chan, frac, nmsg,
        to_i([k[0] for k in wk]), to_i([k[1] for k in wk]),
        np.asarray([work[k][0] for k in wk], dtype=np.float64) / denom,
        np.asarray([work[k][1] for k in wk], dtype=np.float64) / denom)


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
    else:
        lu, lc, lr = lkey, table.lcopy, table.lreduce
    return replace(table, nsteps=int(m + 1), step=uniq[0], src=uniq[1], dst=uniq[2], chan=uniq[3],
                   frac=nf, nmsg=nm, nserial=ns, lrank=lu[0], lstep=lu[1], lcopy=lc, lreduce=lr,
                   coarsened=max(table.coarsened, factor))


def pipelined(table: TransferTable) -> TransferTable:
    """`table` with every step run at once: for schedules whose relays forward each chunk as it lands (NCCL's
    PXN all-to-all: the NVLink hop to the rail's GPU and that GPU's NIC send overlap, chunk by chunk), so a link
    carries the bytes of every step together and each row pays the hop latencies of all steps in sequence."""
    if table.nsteps <= 1:
        return table
    import dataclasses
    zeros = np.zeros(table.ntransfers, dtype=np.int64)
    return dataclasses.replace(table, nsteps=1, step=zeros, nserial=table.serial() * table.nsteps,
                               lstep=np.zeros(table.lstep.size, dtype=np.int64))
