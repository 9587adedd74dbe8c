"""Compile one rank's program of a Schedule into flat per-step byte ranges for one call shape.

A compiled plan is what the runtime executes and what the simulator and the host model read: per
step, the sends and receives (peer, byte range, whether a send must be snapshotted because a receive
of the same step overwrites its source) and the local copies and reductions in element ranges. It is
a function of (schedule, call shape, rank, in place) and is cached per schedule object.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import InvalidArgument
from .layout import CallShape, buffer_elements, chunk_bounds, ref_bounds
from .schedule import Buffer, OpKind, Schedule, is_self_checking


@dataclass(frozen=True)
class Xfer:
    """One send or receive of a compiled step (offsets and sizes in bytes; src_* for RECV_REDUCE)."""

    kind: OpKind
    peer: int
    key: str
    buf: Buffer
    off: int
    nbytes: int
    src_buf: Buffer | None = None
    src_off: int = 0
    snapshot: bool = False
    lone: bool = False  # a send that is this rank's only transfer of the step: the rank has nothing else to do
    # a send whose receiver copies it (not reduces) from a source this rank has not written in this call
    # (a freshly written source is dirty in this core's cache: a kernel copy from it crosses cores slowly)
    cold_copy: bool = False
    # a send whose receiver copies it from a source this rank wrote earlier in this call: below the
    # single-copy size for such sources it goes through the slots (the simulator prices the difference)
    fresh: bool = False


@dataclass(frozen=True)
class Local:
    """One local COPY or REDUCE (offsets and sizes in elements)."""

    kind: OpKind
    dst: Buffer
    dst_off: int
    n: int
    src: Buffer
    src_off: int


@dataclass(frozen=True)
class StepPlan:
    xfers: tuple[Xfer, ...]
    locals: tuple[Local, ...]


@dataclass(frozen=True)
class Plan:
    """One rank's compiled program for one call shape."""

    steps: tuple[StepPlan, ...]
    scratch_elems: int
    self_checking: bool
    peers: tuple[int, ...] = field(default=())
    max_xfer_bytes: int = 0


_PLANS: dict[tuple, tuple[Schedule, "Plan"]] = {}
_PLANS_MAX = 1024


def compile_plan(schedule: Schedule, shape: CallShape, rank: int, inplace: bool) -> Plan:
    """One rank's compiled program for this call shape (cached per schedule object and shape)."""
    key = (id(schedule), shape, rank, inplace)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is schedule:
        return hit[1]
    plan = _compile(schedule, shape, rank, inplace)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = (schedule, plan)
    return plan


def aliased(b: Buffer, inplace: bool) -> Buffer:
    """The array a schedule buffer names in a call: in place, IN is OUT."""
    return Buffer.OUT if (inplace and b == Buffer.IN) else b


def _compile(schedule: Schedule, shape: CallShape, rank: int, inplace: bool) -> Plan:
    """Flatten one rank's program into byte ranges for this call shape."""
    isz = shape.itemsize
    bounds = {b: chunk_bounds(shape, schedule, b, rank) for b in schedule.layouts}

    def alias(b: Buffer) -> Buffer:
        return aliased(b, inplace)

    steps = []
    peers = set()
    written: list[tuple[Buffer, int, int]] = []   # (array, first, end element) this rank wrote so far

    def overlaps(ranges: list[tuple[Buffer, int, int]], b: Buffer, o: int, n: int) -> bool:
        return any(alias(b) == rb and o < hi and lo < o + n for rb, lo, hi in ranges)

    for si, step in enumerate(schedule.steps(rank)):
        xf, loc = [], []
        recv_ranges = []
        for op in step:
            if op.kind.is_recv:
                o, n = ref_bounds(bounds[op.dst.buffer], op.dst.index, op.dst.span)
                recv_ranges.append((alias(op.dst.buffer), o, o + n))
        for op in step:
            if op.kind == OpKind.SEND:
                o, n = ref_bounds(bounds[op.src.buffer], op.src.index, op.src.span)
                b = op.src.buffer
                snap = overlaps(recv_ranges, b, o, n)
                reduces = any(q.kind == OpKind.RECV_REDUCE and q.peer == rank and q.channel == op.channel
                              for q in schedule.steps(op.peer)[si])
                fresh = overlaps(written, b, o, n)
                xf.append(Xfer(OpKind.SEND, op.peer, f"c{op.channel}", b, o * isz, n * isz, snapshot=snap,
                               cold_copy=not reduces and not fresh, fresh=fresh and not reduces))
                peers.add(op.peer)
            elif op.kind == OpKind.RECV:
                o, n = ref_bounds(bounds[op.dst.buffer], op.dst.index, op.dst.span)
                xf.append(Xfer(OpKind.RECV, op.peer, f"c{op.channel}", op.dst.buffer, o * isz, n * isz))
                peers.add(op.peer)
            elif op.kind == OpKind.RECV_REDUCE:
                o, n = ref_bounds(bounds[op.dst.buffer], op.dst.index, op.dst.span)
                so, sn = ref_bounds(bounds[op.src.buffer], op.src.index, op.src.span)
                if sn != n:
                    raise InvalidArgument(f"schedule {schedule.algorithm}: recv_reduce sizes differ ({sn} vs {n})")
                xf.append(Xfer(OpKind.RECV_REDUCE, op.peer, f"c{op.channel}", op.dst.buffer, o * isz, n * isz,
                               op.src.buffer, so * isz))
                peers.add(op.peer)
            else:
                o, n = ref_bounds(bounds[op.dst.buffer], op.dst.index, op.dst.span)
                so, sn = ref_bounds(bounds[op.src.buffer], op.src.index, op.src.span)
                if sn != n:
                    raise InvalidArgument(f"schedule {schedule.algorithm}: local op sizes differ ({sn} vs {n})")
                if op.kind == OpKind.COPY and alias(op.dst.buffer) == alias(op.src.buffer) and o == so:
                    continue   # in place, a copy onto itself (e.g. the root's IN -> OUT of a broadcast)
                loc.append(Local(op.kind, op.dst.buffer, o, n, op.src.buffer, so))
        written += recv_ranges + [(alias(lo.dst), lo.dst_off, lo.dst_off + lo.n) for lo in loc]
        if len(xf) == 1 and xf[0].kind == OpKind.SEND:
            xf[0] = replace(xf[0], lone=True)
        steps.append(StepPlan(tuple(xf), tuple(loc)))
    scratch = buffer_elements(shape, schedule, Buffer.SCRATCH, rank) if Buffer.SCRATCH in schedule.layouts else 0
    biggest = max((x.nbytes for st in steps for x in st.xfers), default=0)
    return Plan(tuple(steps), scratch, is_self_checking(schedule), tuple(sorted(peers)), biggest)
