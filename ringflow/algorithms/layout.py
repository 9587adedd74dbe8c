"""The one mapping from chunk indices to element ranges, used by every engine.

A collective call is described by `CallShape`: the collective, the number of
ranks, `count` (see below), the element size and, for all-to-allv, the split
matrix. `count` follows torch.distributed / NCCL:

- all_reduce, reduce, broadcast: elements in the buffer;
- all_gather, gather: elements each rank contributes (output holds n x count);
- reduce_scatter, scatter: elements each rank receives (input holds n x count);
- all_to_all: elements sent to each peer (input and output hold n x count);
- all_to_allv: ignored; `splits[r][j]` = elements rank r sends to rank j;
- barrier: 0; sendrecv: elements of the message.

Uneven splits: `split_counts(total, parts)` gives the first `total % parts`
parts one element more than the rest (MPI's and NCCL's convention).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

from ..errors import InvalidArgument
from .schedule import Buffer, BufferLayout, Collective, Schedule


def split_counts(total: int, parts: int) -> tuple[int, ...]:
    """Split `total` elements into `parts` nearly equal parts (larger ones first)."""
    if parts <= 0:
        raise InvalidArgument(f"cannot split into {parts} parts")
    q, r = divmod(total, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


@cache
def partitioned(collective: Collective, buffer: Buffer) -> bool:
    """True if `buffer` of `collective` holds one part per rank (all-gather output, all-to-all, ...);
    cached: the runtime asks on every call."""
    if collective in (Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV):
        return buffer in (Buffer.IN, Buffer.OUT)
    if collective in (Collective.ALL_GATHER, Collective.GATHER):
        return buffer == Buffer.OUT
    if collective in (Collective.REDUCE_SCATTER, Collective.SCATTER):
        return buffer == Buffer.IN
    return False


@dataclass(frozen=True)
class CallShape:
    """What a collective call moves, independent of algorithm."""

    collective: Collective
    nranks: int
    count: int
    itemsize: int = 4
    splits: tuple[tuple[int, ...], ...] | None = None  # all_to_allv only

    def __post_init__(self) -> None:
        if self.count < 0:
            raise InvalidArgument(f"count={self.count} is negative")
        if self.collective == Collective.ALL_TO_ALLV:
            s = self.splits
            if s is None or len(s) != self.nranks or any(len(row) != self.nranks for row in s):
                raise InvalidArgument("all_to_allv needs an nranks x nranks split matrix",
                                      "pass splits[r][j] = elements rank r sends to rank j")
            if any(v < 0 for row in s for v in row):
                raise InvalidArgument("all_to_allv split counts must be >= 0")

    def part_count(self, buffer: Buffer, rank: int, part: int) -> int:
        """Elements of part `part` (one per rank) of a per-rank-partitioned buffer."""
        if self.collective == Collective.ALL_TO_ALLV:
            assert self.splits is not None
            return self.splits[rank][part] if buffer == Buffer.IN else self.splits[part][rank]
        return self.count

    def is_partitioned(self, buffer: Buffer) -> bool:
        """True if the buffer holds one part per rank (all-gather output, all-to-all, ...)."""
        return partitioned(self.collective, buffer)

    def buffer_count(self, buffer: Buffer, rank: int) -> int:
        """Total elements of a rank's IN or OUT buffer."""
        if self.is_partitioned(buffer):
            return sum(self.part_count(buffer, rank, p) for p in range(self.nranks))
        return self.count


def block_counts(shape: CallShape, layout: BufferLayout, buffer: Buffer, rank: int) -> tuple[int, ...]:
    """Elements in each block of one rank's buffer (one copy for scratch)."""
    base = layout.like if buffer == Buffer.SCRATCH else buffer
    if base is None:
        raise InvalidArgument("scratch layout needs like=IN or like=OUT")
    if shape.is_partitioned(base):
        if layout.nblocks % shape.nranks:
            raise InvalidArgument(f"{base.value} of {shape.collective.value} holds one part per rank: "
                                  f"nblocks={layout.nblocks} must be a multiple of nranks={shape.nranks}")
        per = layout.nblocks // shape.nranks
        blocks = tuple(c for p in range(shape.nranks) for c in split_counts(shape.part_count(base, rank, p), per))
    else:
        blocks = split_counts(shape.count, layout.nblocks)
    if buffer == Buffer.SCRATCH and layout.own_block:
        return (blocks[rank],)  # the rank's own block only
    return blocks


def chunk_bounds(shape: CallShape, schedule: Schedule, buffer: Buffer, rank: int) -> tuple[tuple[int, int], ...]:
    """(offset, length) in elements of every chunk of one rank's buffer."""
    return _chunk_bounds_cached(shape, schedule.layouts[buffer], buffer, rank)


@lru_cache(maxsize=4096)
def _chunk_bounds_cached(shape: CallShape, layout: BufferLayout, buffer: Buffer,
                         rank: int) -> tuple[tuple[int, int], ...]:
    one: list[tuple[int, int]] = []
    off = 0
    for b in block_counts(shape, layout, buffer, rank):
        for seg in split_counts(b, layout.nsegs):
            one.append((off, seg))
            off += seg
    copies = layout.copies if buffer == Buffer.SCRATCH else 1  # scratch copies repeat one copy's chunks
    return tuple((c * off + o, ln) for c in range(copies) for o, ln in one)


def ref_bounds(bounds: tuple[tuple[int, int], ...], index: int, span: int) -> tuple[int, int]:
    """(offset, length) of chunks [index, index + span) given a buffer's chunk bounds."""
    first, last = bounds[index], bounds[index + span - 1]
    return first[0], last[0] + last[1] - first[0]


def buffer_elements(shape: CallShape, schedule: Schedule, buffer: Buffer, rank: int) -> int:
    """Elements a rank must allocate for a buffer (scratch included)."""
    b = chunk_bounds(shape, schedule, buffer, rank)
    return b[-1][0] + b[-1][1] if b else 0
