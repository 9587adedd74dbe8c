"""Compile one rank's program of a Schedule into flat per-step byte ranges for one call shape.

A compiled plan is what the runtime executes and what the simulator and the host model read: per
step, the sends and receives (peer, byte range, whether a send must be snapshotted because a receive
of the same step overwrites its source) and the local copies and reductions in element ranges. It is
a function of (schedule, call shape, rank, in place) and is cached per schedule object.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import InvalidArgument
from . import check_rounds
from .layout import CallShape, buffer_elements, chunk_bounds, ref_bounds
from .schedule import Buffer, ChunkRef, Op, OpKind, Schedule, is_self_checking
from .verify_messages import missing, verifiable


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
    # leading steps that are the log-depth check's rounds (`check_rounds`: a disseminating schedule under that
    # pattern, its rounds completed by zero-byte fillers); 0 otherwise
    check_rounds: int = 0


_PLANS: dict[tuple[int, CallShape, int, bool, bool, bool], tuple[Schedule, Plan]] = {}
_PLANS_MAX = 1024


def compile_plan(schedule: Schedule, shape: CallShape, rank: int, inplace: bool) -> Plan:
    """One rank's compiled program for this call shape (cached per schedule object and shape)."""
    key = (id(schedule), shape, rank, inplace, verifiable(schedule), check_rounds.log_depth(schedule.nranks))
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


Ranges = list[tuple[Buffer, int, int]]   # (array, first element, end element)


def _ref(ref: ChunkRef | None, what: str) -> ChunkRef:
    """The chunk reference an op of this kind must carry."""
    if ref is None:
        raise InvalidArgument(f"schedule op without its {what} chunk", "every send has a src, every receive a dst")
    return ref


def _peer(op: Op) -> int:
    """The peer a transfer op must name."""
    if op.peer is None:
        raise InvalidArgument(f"schedule op {op} names no peer", "every send and receive has a peer")
    return op.peer


class _Compiler:
    """Flattens one rank's program into byte ranges for one call shape (`compile_plan` caches the result)."""

    def __init__(self, schedule: Schedule, shape: CallShape, rank: int, inplace: bool) -> None:
        self.schedule, self.shape, self.rank, self.inplace = schedule, shape, rank, inplace
        self.bounds = {b: chunk_bounds(shape, schedule, b, rank) for b in schedule.layouts}
        self.peers: set[int] = set()
        self.written: Ranges = []   # ranges this rank wrote so far in the call

    def alias(self, b: Buffer) -> Buffer:
        return aliased(b, self.inplace)

    def elems(self, ref: ChunkRef) -> tuple[int, int]:
        """(offset, count) in elements of a chunk reference of this rank."""
        return ref_bounds(self.bounds[ref.buffer], ref.index, ref.span)

    def overlaps(self, ranges: Ranges, b: Buffer, o: int, n: int) -> bool:
        return any(self.alias(b) == rb and o < hi and lo < o + n for rb, lo, hi in ranges)

    def send(self, op: Op, si: int, recv_ranges: Ranges) -> Xfer:
        src, peer, isz = _ref(op.src, "src"), _peer(op), self.shape.itemsize
        o, n = self.elems(src)
        reduces = any(q.kind == OpKind.RECV_REDUCE and q.peer == self.rank and q.channel == op.channel
                      for q in self.schedule.steps(peer)[si])
        fresh = self.overlaps(self.written, src.buffer, o, n)
        return Xfer(OpKind.SEND, peer, f"c{op.channel}", src.buffer, o * isz, n * isz,
                    snapshot=self.overlaps(recv_ranges, src.buffer, o, n), cold_copy=not reduces and not fresh,
                    fresh=fresh and not reduces)

    def receive(self, op: Op) -> Xfer:
        dst, peer, isz = _ref(op.dst, "dst"), _peer(op), self.shape.itemsize
        o, n = self.elems(dst)
        if op.kind == OpKind.RECV:
            return Xfer(OpKind.RECV, peer, f"c{op.channel}", dst.buffer, o * isz, n * isz)
        src = _ref(op.src, "src")
        so, sn = self.elems(src)
        if sn != n:
            raise InvalidArgument(f"schedule {self.schedule.algorithm}: recv_reduce sizes differ ({sn} vs {n})")
        return Xfer(OpKind.RECV_REDUCE, peer, f"c{op.channel}", dst.buffer, o * isz, n * isz, src.buffer, so * isz)

    def local(self, op: Op) -> Local | None:
        dst, src = _ref(op.dst, "dst"), _ref(op.src, "src")
        (o, n), (so, sn) = self.elems(dst), self.elems(src)
        if sn != n:
            raise InvalidArgument(f"schedule {self.schedule.algorithm}: local op sizes differ ({sn} vs {n})")
        if op.kind == OpKind.COPY and self.alias(dst.buffer) == self.alias(src.buffer) and o == so:
            return None   # in place, a copy onto itself (e.g. the root's IN -> OUT of a broadcast)
        return Local(op.kind, dst.buffer, o, n, src.buffer, so)

    def step(self, si: int, ops: list[Op]) -> StepPlan:
        recv_ranges: Ranges = []
        for op in ops:
            if op.kind.is_recv:
                o, n = self.elems(_ref(op.dst, "dst"))
                recv_ranges.append((self.alias(_ref(op.dst, "dst").buffer), o, o + n))
        xf: list[Xfer] = []
        loc: list[Local] = []
        for op in ops:
            if op.kind == OpKind.SEND:
                xf.append(self.send(op, si, recv_ranges))
            elif op.kind in (OpKind.RECV, OpKind.RECV_REDUCE):
                xf.append(self.receive(op))
            else:
                lo = self.local(op)
                if lo is not None:
                    loc.append(lo)
        self.peers.update(x.peer for x in xf)
        self.written += recv_ranges + [(self.alias(lo.dst), lo.dst_off, lo.dst_off + lo.n) for lo in loc]
        if len(xf) == 1 and xf[0].kind == OpKind.SEND:
            xf[0] = replace(xf[0], lone=True)
        return StepPlan(tuple(xf), tuple(loc))

    def zero_byte(self, step: StepPlan, to: list[int], frm: list[int]) -> StepPlan:
        """`step` with zero-byte channel-0 messages added: one sent to each of `to`, one received from each of
        `frm` (verify messages, the log-depth rounds' fillers)."""
        self.peers.update(to + frm)
        extra = [Xfer(OpKind.SEND, p, "c0", Buffer.IN, 0, 0) for p in to]
        extra += [Xfer(OpKind.RECV, p, "c0", Buffer.OUT, 0, 0) for p in frm]
        return StepPlan(step.xfers + tuple(extra), step.locals)

    def fill_rounds(self, steps: list[StepPlan]) -> None:
        """The zero-byte fillers that complete this rank's log-depth check rounds (`check_rounds.fillers`)."""
        to, frm = check_rounds.fillers(self.schedule, self.rank)
        for k in range(check_rounds.rounds(self.schedule.nranks)):
            steps[k] = self.zero_byte(steps[k], [p for j, p in to if j == k], [p for j, p in frm if j == k])

    def plan(self) -> Plan:
        steps = [self.step(si, list(ops)) for si, ops in enumerate(self.schedule.steps(self.rank))]
        sch = self.schedule
        verified = verifiable(sch)
        if verified:
            steps[0] = self.zero_byte(steps[0], *missing(sch, self.rank))
        log = check_rounds.log_depth(sch.nranks)
        rounds = 0
        if log and check_rounds.disseminates(sch):
            self.fill_rounds(steps)
            rounds = check_rounds.rounds(sch.nranks)
        scratch = buffer_elements(self.shape, sch, Buffer.SCRATCH, self.rank) if Buffer.SCRATCH in sch.layouts else 0
        biggest = max((x.nbytes for st in steps for x in st.xfers), default=0)
        checks = rounds > 0 or (verified or is_self_checking(sch)) and not log
        return Plan(tuple(steps), scratch, checks, tuple(sorted(self.peers)), biggest, rounds)


def _compile(schedule: Schedule, shape: CallShape, rank: int, inplace: bool) -> Plan:
    """Flatten one rank's program into byte ranges for this call shape."""
    return _Compiler(schedule, shape, rank, inplace).plan()
