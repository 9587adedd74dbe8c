"""Symbolic verification of schedules (MSCCLang-style provenance), raising VerificationError.

Every chunk value is a *provenance*: ``(position, ranks, expr)`` where ``position`` is the
IN chunk index the data comes from, ``ranks`` the bitmask of ranks whose contribution it
holds, and ``expr`` an interned id of the reduction tree (commutative: ``a+b == b+a``,
not associative), so that two ranks holding different trees would not be bitwise equal.

Checks, in order, for every step: sends and receives match per (sender, receiver, channel)
in order with equal spans (and equal element counts when a CallShape is given) -- in the
lock-step model this is exactly deadlock freedom; nothing reads an undefined chunk; no
chunk is written twice in a step; IN is never written; a reduction never mixes positions
nor counts a contribution twice. At the end, every rank's OUT holds exactly what the
collective promises; for barrier every rank has heard, transitively, from every other.
Collectives that may run in place (all_reduce, reduce, broadcast) are run a second time
with IN and OUT aliased.

Switch participants (``Schedule.nswitches``: NVLS / SHARP in-network reduction) take part in
matching and provenance like ranks, but hold only scratch (no IN, no OUT, no contribution of
their own), so a switch can only forward or reduce what ranks sent it, and it never counts as
a rank in the final checks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..errors import VerificationError
from .layout import CallShape, chunk_bounds, ref_bounds
from .schedule import Buffer, ChunkRef, Collective, Op, OpKind, Schedule

IN_PLACE = (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST)

Value = tuple[int, int, int]  # (position, rank bitmask, expr id)


@dataclass(frozen=True)
class VerifyReport:
    """What a successful verification saw."""

    collective: str
    algorithm: str
    nranks: int
    nsteps: int
    transfers: int
    in_place_checked: bool
    shapes_checked: int


def _ranks(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _fmt(v: Value | None) -> str:
    if v is None:
        return "undefined"
    return f"position {v[0]} from ranks {_ranks(v[1])}"


def _errn(name: str, msg: str, rank: int | None, step: int | None, chunk: object,
          hint: str | None = None) -> VerificationError:
    return _err(msg, rank, step, chunk, hint, name)


class _Exprs:
    """Interned reduction trees, commutative at each node."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, int] | tuple[str, int, int], int] = {}

    def leaf(self, rank: int) -> int:
        return self.ids.setdefault(("leaf", rank), len(self.ids))

    def add(self, a: int, b: int) -> int:
        key = ("+", min(a, b), max(a, b))
        return self.ids.setdefault(key, len(self.ids))


def _name(s: Schedule) -> str:
    return f"{s.collective.value}/{s.algorithm} n={s.nranks}"


def _err(msg: str, rank: int | None, step: int | None, chunk: object, hint: str | None = None,
         name: str = "") -> VerificationError:
    where = []
    if rank is not None:
        where.append(f"rank {rank}")
    if step is not None:
        where.append(f"step {step}")
    if chunk is not None:
        where.append(f"chunk {chunk}")
    return VerificationError(f"{name}: {', '.join(where)}: {msg}", rank=rank, step=step, chunk=chunk, hint=hint)


def check_layouts(s: Schedule) -> None:
    """IN/OUT/SCRATCH layouts fit the collective (parts per rank, equal segments)."""
    c, n = s.collective, s.nranks
    lin, lout = s.layouts.get(Buffer.IN), s.layouts.get(Buffer.OUT)
    if lin is None or lout is None:
        raise VerificationError(f"{s.algorithm}: schedule has no IN or OUT layout", hint="declare both")
    if lin.nsegs != lout.nsegs:
        raise VerificationError(f"{s.algorithm}: IN and OUT have different nsegs ({lin.nsegs} vs {lout.nsegs})")
    ok = True
    if c in (Collective.ALL_GATHER, Collective.GATHER):
        ok = lout.nblocks == n * lin.nblocks
    elif c in (Collective.REDUCE_SCATTER, Collective.SCATTER):
        ok = lin.nblocks == n * lout.nblocks
    elif c in (Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV):
        ok = lin.nblocks == lout.nblocks and lin.nblocks % n == 0
    elif c in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.SENDRECV):
        ok = lin.nblocks == lout.nblocks
    if not ok:
        raise VerificationError(f"{s.algorithm}: layouts IN {lin.nblocks} blocks / OUT {lout.nblocks} blocks "
                                f"do not fit {c.value} on {n} ranks")
    scr = s.layouts.get(Buffer.SCRATCH)
    if s.nswitches and scr is not None and scr.own_block:
        raise VerificationError(f"{s.algorithm}: a switch has no block of its own, so SCRATCH cannot be own_block "
                                "in a schedule with switches", hint="give scratch whole copies (own_block=False)")
    if len(s.programs) != s.nparticipants:
        raise VerificationError(f"{s.algorithm}: {len(s.programs)} programs for {n} ranks + {s.nswitches} switches",
                                hint="build it with ScheduleBuilder(nswitches=...)")


def check_matching(s: Schedule, shape: CallShape | None = None) -> int:
    """Every send has its receive in the same step (per sender, receiver, channel, in order)."""
    count, name = 0, _name(s)
    bounds = _bounds_fn(s, shape)
    if shape is not None:
        _check_local_lengths(s, shape, name, bounds)
    for step in range(s.nsteps):
        sends, recvs = _step_messages(s, step, name)
        for key in sorted(set(sends) | set(recvs)):
            count += _match_channel(name, step, key, sends.get(key, []), recvs.get(key, []), shape, bounds)
    return count


_Channel = tuple[int, int, int]  # (sender, receiver, channel)


def _step_messages(s: Schedule, step: int, name: str) -> tuple[dict[_Channel, list[Op]], dict[_Channel, list[Op]]]:
    """The sends and the receives of one step, in program order, per (sender, receiver, channel)."""
    sends: dict[_Channel, list[Op]] = {}
    recvs: dict[_Channel, list[Op]] = {}
    for r in range(s.nparticipants):
        prog = s.programs[r]
        for op in (prog[step] if step < len(prog) else ()):
            if op.kind == OpKind.SEND:
                if op.peer == r:
                    raise _errn(name, "sends to itself", r, step, op.src, "use a local copy")
                assert op.peer is not None
                sends.setdefault((r, op.peer, op.channel), []).append(op)
            elif op.kind.is_recv:
                if op.peer == r:
                    raise _errn(name, "receives from itself", r, step, op.dst, "use a local copy")
                assert op.peer is not None
                recvs.setdefault((op.peer, r, op.channel), []).append(op)
    return sends, recvs


def _match_channel(name: str, step: int, key: _Channel, ss: list[Op], rr: list[Op], shape: CallShape | None,
                   bounds: Callable[[Buffer, int], tuple[tuple[int, int], ...]]) -> int:
    """Pair the sends `ss` and receives `rr` of one (sender, receiver, channel); the number of pairs."""
    a, b, ch = key
    if len(ss) != len(rr):
        if len(ss) < len(rr):
            missing = rr[len(ss)]
            raise _errn(name, f"expects {len(rr)} receive(s) from rank {a} on channel {ch} but rank {a} sends "
                       f"{len(ss)} (a dropped send?)", b, step, missing.dst,
                       "every receive needs a send in the same step")
        extra = ss[len(rr)]
        raise _errn(name, f"sends {len(ss)} message(s) to rank {b} on channel {ch} but rank {b} receives "
                   f"{len(rr)} (would deadlock)", a, step, extra.src,
                   "every send needs a receive in the same step")
    for so, ro in zip(ss, rr, strict=True):
        assert so.src is not None and ro.dst is not None
        if so.src.span != ro.dst.span:
            raise _errn(name, f"receives {ro.dst.span} chunk(s) from rank {a} which sends {so.src} "
                       f"({so.src.span} chunks)", b, step, ro.dst)
        if shape is not None:
            la = ref_bounds(bounds(so.src.buffer, a), so.src.index, so.src.span)[1]
            lb = ref_bounds(bounds(ro.dst.buffer, b), ro.dst.index, ro.dst.span)[1]
            if la != lb:
                raise _errn(name, f"receives {lb} elements into {ro.dst} but rank {a} sends {la} from {so.src} "
                           f"(count={shape.count})", b, step, ro.dst)
    return len(ss)


def _bounds_fn(s: Schedule, shape: CallShape | None) -> Callable[[Buffer, int], tuple[tuple[int, int], ...]]:
    """chunk_bounds of (buffer, rank) for `shape`, memoised for one pass."""
    memo: dict[tuple[Buffer, int], tuple[tuple[int, int], ...]] = {}

    def get(buf: Buffer, rank: int) -> tuple[tuple[int, int], ...]:
        key = (buf, rank)
        if key not in memo:
            assert shape is not None
            memo[key] = chunk_bounds(shape, s, buf, rank)
        return memo[key]
    return get


def _check_local_lengths(s: Schedule, shape: CallShape, name: str,
                         bounds: Callable[[Buffer, int], tuple[tuple[int, int], ...]]) -> None:
    """Copies and reductions join chunk ranges of equal element counts."""
    for r, step, op in s.ops():
        if op.kind in (OpKind.COPY, OpKind.REDUCE, OpKind.RECV_REDUCE):
            assert op.src is not None and op.dst is not None
            la = ref_bounds(bounds(op.src.buffer, r), op.src.index, op.src.span)[1]
            lb = ref_bounds(bounds(op.dst.buffer, r), op.dst.index, op.dst.span)[1]
            if la != lb:
                raise _errn(name, f"{op.kind.value} between {op.src} ({la} elements) and {op.dst} ({lb} elements) "
                            f"(count={shape.count})", r, step, op.dst)


class _Machine:
    """Symbolic state of all ranks' buffers."""

    def __init__(self, s: Schedule, aliased: bool, shape: CallShape | None) -> None:
        self.s, self.aliased, self.shape = s, aliased, shape
        self.ex = _Exprs()
        self.name = _name(s)
        n = s.nranks
        c = s.collective
        self.bufs: list[dict[Buffer, list[Value | None]]] = []
        for r in range(n):
            d: dict[Buffer, list[Value | None]] = {}
            lin = s.layouts[Buffer.IN]
            defined = True
            if c in (Collective.BROADCAST, Collective.SCATTER, Collective.SENDRECV) and r != s.root:
                defined = False
            leaf = self.ex.leaf(r)
            d[Buffer.IN] = [(i, 1 << r, leaf) if defined else None for i in range(lin.nchunks)]
            d[Buffer.OUT] = d[Buffer.IN] if aliased else [None] * s.layouts[Buffer.OUT].nchunks
            if Buffer.SCRATCH in s.layouts:
                d[Buffer.SCRATCH] = [None] * s.layouts[Buffer.SCRATCH].nchunks
            self.bufs.append(d)
        for _ in range(s.nswitches):   # a switch holds scratch only: no input, no output, no contribution
            sw: dict[Buffer, list[Value | None]] = {}
            if Buffer.SCRATCH in s.layouts:
                sw[Buffer.SCRATCH] = [None] * s.layouts[Buffer.SCRATCH].nchunks
            self.bufs.append(sw)
        self.know = [1 << r for r in range(n)] + [0] * s.nswitches

    def _check_ref(self, r: int, step: int, ref: ChunkRef) -> list[Value | None]:
        buf = self.bufs[r].get(ref.buffer)
        if buf is None and self.s.is_switch(r):
            raise _errn(self.name, f"switch uses buffer {ref.buffer.value}, but a switch holds only scratch "
                        "(it has no input or output of its own)", r, step, ref,
                        "stage what the switch reduces or multicasts in SCRATCH")
        if buf is None:
            raise _errn(self.name, f"uses buffer {ref.buffer.value} which has no layout", r, step, ref)
        if ref.span < 1 or ref.index < 0 or ref.index + ref.span > len(buf):
            raise _errn(self.name, f"chunk range outside the {ref.buffer.value} buffer of {len(buf)} chunks",
                        r, step, ref)
        return buf

    def read(self, r: int, step: int, ref: ChunkRef) -> list[Value]:
        buf = self._check_ref(r, step, ref)
        vals = buf[ref.index:ref.index + ref.span]
        for i, v in enumerate(vals):
            if v is None:
                raise _errn(self.name, "reads an undefined chunk (never written)", r, step,
                           ChunkRef(ref.buffer, ref.index + i), "initialise it first (copy from IN or receive)")
        return cast(list[Value], vals)  # every entry checked above

    def combine(self, r: int, step: int, ref: ChunkRef, a: Value, b: Value) -> Value:
        if not self.s.collective.is_reduction:
            raise _errn(self.name, f"reduces data in a {self.s.collective.value}, which has no reduction", r, step, ref)
        if a[0] != b[0]:
            raise _errn(self.name, f"reduces position {b[0]} into position {a[0]} (wrong index)", r, step, ref)
        if a[1] & b[1]:
            raise _errn(self.name, f"contribution of rank(s) {_ranks(a[1] & b[1])} reduced twice "
                       f"({_fmt(a)} + {_fmt(b)})", r, step, ref, "each contribution must enter a sum once")
        return (a[0], a[1] | b[1], self.ex.add(a[2], b[2]))

    def lengths_equal(self, r: int, step: int, a: ChunkRef, b: ChunkRef) -> None:
        if a.span != b.span:
            raise _errn(self.name, f"local op between {a} and {b} of different spans", r, step, b)
        if self.shape is not None:
            la = ref_bounds(chunk_bounds(self.shape, self.s, a.buffer, r), a.index, a.span)[1]
            lb = ref_bounds(chunk_bounds(self.shape, self.s, b.buffer, r), b.index, b.span)[1]
            if la != lb:
                raise _errn(self.name, f"local op between {a} ({la} elements) and {b} ({lb} elements)", r, step, b)

    def write_target(self, r: int, step: int, ref: ChunkRef) -> list[Value | None]:
        if ref.buffer == Buffer.IN:
            raise _errn(self.name, "writes the IN buffer (the caller's input is read-only)", r, step, ref,
                       "write OUT or SCRATCH")
        return self._check_ref(r, step, ref)

    def run_step(self, step: int) -> None:
        s, n = self.s, self.s.nparticipants
        outbox: dict[tuple[int, int, int], list[tuple[list[Value], int]]] = {}
        for r in range(n):
            prog = s.programs[r]
            for op in (prog[step] if step < len(prog) else ()):
                if op.kind == OpKind.SEND:
                    assert op.src is not None and op.peer is not None
                    outbox.setdefault((r, op.peer, op.channel), []).append((self.read(r, step, op.src), self.know[r]))
        new_know = list(self.know)
        writes: list[tuple[int, ChunkRef, list[Value]]] = []
        for r in range(n):
            prog = s.programs[r]
            seen: set[tuple[Buffer, int]] = set()
            ops = prog[step] if step < len(prog) else ()
            self._check_recv_sources(r, step, ops)
            for op in ops:
                if not op.kind.is_recv:
                    continue
                assert op.dst is not None and op.peer is not None
                vals, know = outbox[(op.peer, r, op.channel)].pop(0)
                new_know[r] |= know
                self.write_target(r, step, op.dst)
                for i in op.dst.indices():
                    key = (Buffer.OUT if self.aliased and op.dst.buffer == Buffer.IN else op.dst.buffer, i)
                    if key in seen:
                        raise _errn(self.name, "written by two receives in one step", r, step,
                                    ChunkRef(op.dst.buffer, i), "receive into distinct chunks or use separate steps")
                    seen.add(key)
                if op.kind == OpKind.RECV_REDUCE:
                    assert op.src is not None
                    local = self.read(r, step, op.src)
                    self.lengths_equal(r, step, op.src, op.dst)
                    vals = [self.combine(r, step, ChunkRef(op.dst.buffer, op.dst.index + i), a, b)
                            for i, (a, b) in enumerate(zip(local, vals, strict=True))]
                writes.append((r, op.dst, vals))
        for r, ref, vals in writes:
            buf = self.bufs[r][ref.buffer]
            buf[ref.index:ref.index + ref.span] = vals
        self.know = new_know
        for r in range(n):
            prog = s.programs[r]
            for op in (prog[step] if step < len(prog) else ()):
                if op.kind == OpKind.COPY:
                    assert op.src is not None and op.dst is not None
                    vals = self.read(r, step, op.src)
                    self.lengths_equal(r, step, op.src, op.dst)
                    self.write_target(r, step, op.dst)[op.dst.index:op.dst.index + op.dst.span] = list(vals)
                elif op.kind == OpKind.REDUCE:
                    assert op.src is not None and op.dst is not None
                    vals = self.read(r, step, op.src)
                    cur = self.read(r, step, op.dst)
                    self.lengths_equal(r, step, op.src, op.dst)
                    out = [self.combine(r, step, ChunkRef(op.dst.buffer, op.dst.index + i), a, b)
                           for i, (a, b) in enumerate(zip(cur, vals, strict=True))]
                    self.write_target(r, step, op.dst)[op.dst.index:op.dst.index + op.dst.span] = out

    def _key(self, buf: Buffer, i: int) -> tuple[Buffer, int]:
        return (Buffer.OUT if self.aliased and buf == Buffer.IN else buf, i)

    def _check_recv_sources(self, r: int, step: int, ops: Sequence[Op]) -> None:
        """A RECV_REDUCE must not read a chunk that another receive of the same step writes (order ambiguous)."""
        written = {self._key(op.dst.buffer, i) for op in ops if op.kind.is_recv and op.dst is not None
                   for i in op.dst.indices()}
        for op in ops:
            if op.kind != OpKind.RECV_REDUCE or op.src is None or op.dst is None:
                continue
            own = {self._key(op.dst.buffer, i) for i in op.dst.indices()}
            for i in op.src.indices():
                k = self._key(op.src.buffer, i)
                if k in written and k not in own:
                    raise _errn(self.name, "a receive-reduce reads a chunk that another receive of the same step "
                                "writes (ambiguous order)", r, step, ChunkRef(op.src.buffer, i),
                                "reduce from a chunk no receive of this step writes")

    def expect(self, r: int, i: int, pos: int, mask: int) -> Value:
        """Rank r's OUT chunk i holds position `pos` reduced over the ranks of `mask`; that value."""
        found = self.bufs[r][Buffer.OUT][i]
        if found is None or found[0] != pos or found[1] != mask:
            raise _errn(self.name, f"OUT ends with {_fmt(found)}, expected {_fmt((pos, mask, 0))}", r, None,
                       ChunkRef(Buffer.OUT, i))
        return found

    def final_check(self) -> None:
        """Every rank's OUT holds what the collective promises (barrier: every rank heard from every other)."""
        check = self._FINAL_CHECKS.get(self.s.collective)
        if check is not None:
            check(self)

    def _root(self) -> int:
        root = self.s.root
        assert root is not None, "rooted collectives have a root"
        return root

    def _final_all_reduce(self) -> None:
        n, nchunks = self.s.nranks, self.s.layouts[Buffer.OUT].nchunks
        full = (1 << n) - 1
        for r in range(n):
            for i in range(nchunks):
                expr = self.expect(r, i, i, full)[2]
                first = self.bufs[0][Buffer.OUT][i]  # rank 0's chunk i, checked before any other rank's
                if first is None or expr != first[2]:
                    raise _errn(self.name,
                                "reduction order differs from rank 0: results would not be bitwise identical",
                                r, None, ChunkRef(Buffer.OUT, i),
                                "reduce each chunk once and copy it, or reduce in the same order everywhere")

    def _final_reduce(self) -> None:
        full = (1 << self.s.nranks) - 1
        for i in range(self.s.layouts[Buffer.OUT].nchunks):
            self.expect(self._root(), i, i, full)

    def _final_broadcast(self) -> None:
        root = self._root()
        for r in range(self.s.nranks):
            for i in range(self.s.layouts[Buffer.OUT].nchunks):
                self.expect(r, i, i, 1 << root)

    def _final_reduce_scatter(self) -> None:
        n, k = self.s.nranks, self.s.layouts[Buffer.OUT].nchunks
        full = (1 << n) - 1
        for r in range(n):
            for j in range(k):
                self.expect(r, j, r * k + j, full)

    def _final_gather(self) -> None:
        n, k = self.s.nranks, self.s.layouts[Buffer.IN].nchunks
        for r in (range(n) if self.s.collective == Collective.ALL_GATHER else [self._root()]):
            for q in range(n):
                for j in range(k):
                    self.expect(r, q * k + j, j, 1 << q)

    def _final_scatter(self) -> None:
        root, k = self._root(), self.s.layouts[Buffer.OUT].nchunks
        for r in range(self.s.nranks):
            for j in range(k):
                self.expect(r, j, r * k + j, 1 << root)

    def _final_all_to_all(self) -> None:
        n = self.s.nranks
        k = self.s.layouts[Buffer.IN].nchunks // n
        for p in range(n):
            for q in range(n):
                for j in range(k):
                    self.expect(p, q * k + j, p * k + j, 1 << q)

    def _final_sendrecv(self) -> None:
        n = self.s.nranks
        if n > 1:
            root = self._root()
            dst = int(self.s.params.get("peer", (root + 1) % n))
            for j in range(self.s.layouts[Buffer.OUT].nchunks):
                self.expect(dst, j, j, 1 << root)

    def _final_barrier(self) -> None:
        full = (1 << self.s.nranks) - 1
        for r in range(self.s.nranks):
            if self.know[r] != full:
                missing = _ranks(full & ~self.know[r])
                raise _errn(self.name, f"leaves the barrier without hearing from rank(s) {missing}", r, None, None,
                           "every rank must hear (transitively) from every other")

    _FINAL_CHECKS: dict[Collective, Callable[[_Machine], None]] = {
        Collective.ALL_REDUCE: _final_all_reduce,
        Collective.REDUCE: _final_reduce,
        Collective.BROADCAST: _final_broadcast,
        Collective.REDUCE_SCATTER: _final_reduce_scatter,
        Collective.ALL_GATHER: _final_gather,
        Collective.GATHER: _final_gather,
        Collective.SCATTER: _final_scatter,
        Collective.ALL_TO_ALL: _final_all_to_all,
        Collective.ALL_TO_ALLV: _final_all_to_all,
        Collective.SENDRECV: _final_sendrecv,
        Collective.BARRIER: _final_barrier,
    }


def verify(schedule: Schedule, shapes: Iterable[CallShape] = (), *, in_place: bool | None = None) -> VerifyReport:
    """Prove `schedule` correct or raise VerificationError naming rank, step, chunk, expected vs found.

    `shapes`: call shapes whose element counts are checked on every transfer and local op
    (uneven splits). `in_place`: also run with IN and OUT aliased (default: for all_reduce,
    reduce and broadcast).
    """
    name = _name(schedule)
    check_layouts(schedule)
    shapes = list(shapes)
    transfers = check_matching(schedule)
    for shape in shapes:
        check_matching(schedule, shape)
    if in_place is None:
        in_place = schedule.collective in IN_PLACE
    modes = [False, True] if in_place else [False]
    for aliased in modes:
        if aliased and schedule.layouts[Buffer.IN] != schedule.layouts[Buffer.OUT]:
            raise VerificationError(f"{name}: IN and OUT layouts differ, so the schedule cannot run "
                                    "in place", hint="use the same layout for IN and OUT")
        m = _Machine(schedule, aliased, None)
        try:
            for step in range(schedule.nsteps):
                m.run_step(step)
            m.final_check()
        except VerificationError as exc:
            if aliased:
                raise VerificationError(f"in place (IN aliased to OUT): {exc.message}", rank=exc.rank,
                                        step=exc.step, chunk=exc.chunk,
                                        hint=exc.hint or "do not overwrite OUT before IN is read") from None
            raise
    return VerifyReport(schedule.collective.value, schedule.algorithm, schedule.nranks, schedule.nsteps,
                        transfers, bool(in_place), len(shapes))


def check_algorithm(collective: Collective | str, algorithm: str, nranks: int, *, root: int | None = None,
                    nsegs: int = 1, nchannels: int = 1, rings: Sequence[Sequence[int]] | None = None,
                    host_groups: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
    """Build a registered schedule, verify it on uneven counts (0, 1, n-1, 7n+3, in place too) and check
    its step and byte counts against the algorithm's closed form (VerificationError if they differ)."""
    from fractions import Fraction

    from .cost import traffic
    from .registry import collective_bytes, get_schedule, granule, info
    c = Collective.parse(collective)
    if (c.has_root or c == Collective.SENDRECV) and root is None:
        root = 0
    s = get_schedule(c, algorithm, nranks, root=root, nsegs=nsegs, nchannels=nchannels, rings=rings,
                     host_groups=host_groups)
    n = nranks
    if c == Collective.ALL_TO_ALLV:
        shapes = [CallShape(c, n, 0, splits=tuple(tuple((3 * i + 5 * j) % 4 for j in range(n)) for i in range(n)))]
    elif c == Collective.BARRIER:
        shapes = [CallShape(c, n, 0)]
    else:
        shapes = [CallShape(c, n, k) for k in sorted({0, 1, max(n - 1, 0), 7 * n + 3})]
    rep = verify(s, shapes)
    a = info(algorithm)
    out: dict[str, Any] = {"collective": c.value, "algorithm": a.name, "nranks": n, "steps": rep.nsteps,
                           "transfers": rep.transfers, "in_place_checked": rep.in_place_checked,
                           "cost_line": a.cost_lines[c]}
    if c == Collective.ALL_TO_ALLV:
        out.update(bytes_per_rank=traffic(s, shapes[0]).bytes_per_rank, bytes_fraction="-")
        return out
    count = granule(n, nsegs, nchannels) if c != Collective.BARRIER else 0
    shape = CallShape(c, n, count)
    tr = traffic(s, shape)
    cf = a.closed_form(c, n, nsegs, nchannels) if (root in (None, 0)) else None
    total = collective_bytes(c, n, count)
    out.update(bytes_per_rank=tr.bytes_per_rank, transfer_steps=tr.steps,
               bytes_fraction=str(Fraction(tr.bytes_per_rank, total)) if total else "0")
    if cf is not None and (tr.steps != cf.steps or tr.bytes_per_rank != cf.bytes_fraction * total):
        raise VerificationError(f"{_name(s)}: counts differ from the closed form: {tr.steps} transfer steps and "
                                f"{tr.bytes_per_rank} bytes per rank, closed form {cf.steps} steps and "
                                f"{cf.bytes_fraction * total} bytes ({a.cost_lines[c]})",
                                hint="fix the schedule or its closed form in registry.py")
    return out
