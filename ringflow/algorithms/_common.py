"""Small helpers shared by the algorithm modules: layouts, chunk refs, rank maps, ranges."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from .schedule import Buffer, BufferLayout, ChunkRef, Collective, Schedule, ScheduleBuilder


def std_layouts(collective: Collective, nranks: int, blocks: int, nsegs: int,
                scratch: tuple[Buffer, int] | None = None) -> dict[Buffer, BufferLayout]:
    """IN/OUT layouts: `blocks` per part for per-rank-partitioned buffers, `blocks` in all otherwise.

    `scratch=(like, copies)` adds a scratch buffer shaped like IN or OUT.
    """
    if nsegs < 1:
        raise InvalidArgument(f"nsegs={nsegs}", "need at least one segment per block")
    partitioned = {
        Collective.ALL_GATHER: {Buffer.OUT}, Collective.GATHER: {Buffer.OUT},
        Collective.REDUCE_SCATTER: {Buffer.IN}, Collective.SCATTER: {Buffer.IN},
        Collective.ALL_TO_ALL: {Buffer.IN, Buffer.OUT}, Collective.ALL_TO_ALLV: {Buffer.IN, Buffer.OUT},
    }.get(collective, set())
    lay = {b: BufferLayout(blocks * nranks if b in partitioned else blocks, nsegs) for b in (Buffer.IN, Buffer.OUT)}
    if scratch is not None:
        like, copies = scratch
        base = lay[like]
        lay[Buffer.SCRATCH] = BufferLayout(base.nblocks, nsegs, like=like, copies=copies)
    return lay


def blk(buf: Buffer, lay: BufferLayout, block: int, nblocks: int = 1, copy: int = 0) -> ChunkRef:
    """All segments of blocks [block, block + nblocks) (of scratch copy `copy`)."""
    return ChunkRef(buf, lay.chunk(block, 0, copy), nblocks * lay.nsegs)


def seg(buf: Buffer, lay: BufferLayout, block: int, s: int, copy: int = 0) -> ChunkRef:
    """One segment of one block."""
    return ChunkRef(buf, lay.chunk(block, s, copy), 1)


def wrapped(start: int, length: int, n: int) -> list[tuple[int, int]]:
    """[start, start+length) modulo n as at most two (start, length) contiguous ranges."""
    start %= n
    if length <= 0:
        return []
    first = min(length, n - start)
    out = [(start, first)]
    if length > first:
        out.append((0, length - first))
    return out


def check_ring(order: Sequence[int], nranks: int) -> tuple[int, ...]:
    """Validate a ring order (a permutation of range(nranks))."""
    t = tuple(int(x) for x in order)
    if sorted(t) != list(range(nranks)):
        raise InvalidArgument(f"ring order {t} is not a permutation of 0..{nranks - 1}",
                              "give every rank exactly once, e.g. RINGFLOW_RINGS='0 1 2 3'")
    return t


def default_rings(nranks: int, nchannels: int) -> tuple[tuple[int, ...], ...]:
    """Channel c uses 0..n-1 forward for even c, backward for odd c (both link directions)."""
    fwd = tuple(range(nranks))
    bwd = tuple([0] + list(range(nranks - 1, 0, -1)))
    return tuple(fwd if c % 2 == 0 else bwd for c in range(nchannels))


def resolve_rings(rings: Sequence[Sequence[int]] | None, nranks: int, nchannels: int) -> tuple[tuple[int, ...], ...]:
    """Ring order per channel: given rings cycled over channels, else default_rings."""
    if nchannels < 1:
        raise InvalidArgument(f"nchannels={nchannels}", "need at least one channel")
    if not rings:
        return default_rings(nranks, nchannels)
    rs = [check_ring(r, nranks) for r in rings]
    return tuple(rs[c % len(rs)] for c in range(nchannels))


def single_rank_copy(c: Collective, nsegs: int, name: str, **params: Any) -> Schedule:
    """The schedule of any algorithm on one rank: OUT := IN."""
    lay = std_layouts(c, 1, 1, nsegs)
    b = new_builder(c, 1, name, lay, 0 if c.has_root else None, nsegs=nsegs, **params)
    b.copy(0, 0, blk(Buffer.OUT, lay[Buffer.OUT], 0), blk(Buffer.IN, lay[Buffer.IN], 0))
    return b.build()


def reduce_copies_in_rank_order(b: ScheduleBuilder, rank: int, step: int, lay: dict[Buffer, BufferLayout],
                                block: int = 0) -> None:
    """`rank`'s OUT block := its scratch copies 0..n-1 summed in rank order, its own input copied in first.

    The own input goes to scratch before OUT is written (OUT may alias IN), and every rank sums in the
    same order, so results are bitwise identical on every rank.
    """
    li, lo, ls = lay[Buffer.IN], lay[Buffer.OUT], lay[Buffer.SCRATCH]
    b.copy(rank, step, blk(Buffer.SCRATCH, ls, 0, copy=rank), blk(Buffer.IN, li, block))
    b.copy(rank, step, blk(Buffer.OUT, lo, block), blk(Buffer.SCRATCH, ls, 0, copy=0))
    for q in range(1, b.nranks):
        b.reduce(rank, step, blk(Buffer.OUT, lo, block), blk(Buffer.SCRATCH, ls, 0, copy=q))


def pow2_floor(n: int) -> int:
    """Largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def ceil_log2(n: int) -> int:
    """ceil(log2(n)) for n >= 1."""
    return (n - 1).bit_length()


def need_root(root: int | None, nranks: int, default: int | None = None) -> int:
    """A validated root (or `default`)."""
    if root is None:
        if default is None:
            raise InvalidArgument("this collective needs a root", "pass root=<rank>")
        root = default
    if not 0 <= root < nranks:
        raise InvalidArgument(f"root {root} outside [0, {nranks})", "pass a rank of the group")
    return root


def new_builder(collective: Collective, nranks: int, algorithm: str, layouts: dict[Buffer, BufferLayout],
                root: int | None, nchannels: int = 1, **params: object) -> ScheduleBuilder:
    """A builder that only passes `root` for rooted collectives and sendrecv."""
    r = root if (collective.has_root or collective == Collective.SENDRECV) else None
    return ScheduleBuilder(collective, nranks, algorithm, layouts=layouts, root=r, nchannels=nchannels, **params)
