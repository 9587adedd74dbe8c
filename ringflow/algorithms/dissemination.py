"""The dissemination pattern's schedules: in round k rank r sends to (r+2^k)%n and receives from (r-2^k)%n.

After ceil(log2 n) = K rounds every rank has heard, transitively, from every other, for any n (Hensgen, Finkel
and Manber's barrier). These schedules move their data on exactly that pattern, and no byte reaches IN or OUT
before the last round, so under the log-depth argument check (`check_rounds`) their own messages carry the
check and a small call costs K rounds in all.

- ``barrier``: a zero-byte token per round.
- ``all_reduce``: Bruck's all-gather of every rank's whole vector into scratch (slot j of rank r holds rank
  (r-j)%n's vector, so a round's blocks are contiguous at both ends: one message), then every rank sums the n
  vectors in rank order after the last round (bitwise the same result on every rank). Bytes per rank: (n-1) S,
  as the one-shot all-reduce, in K rounds instead of one round of n-1 messages.
- ``broadcast``: binomial doubling from the root (round k: relative ranks below 2^k send to relative + 2^k),
  received into scratch and copied to OUT after the last round.
"""
from __future__ import annotations

from ._common import blk, ceil_log2, need_root, new_builder, single_rank_copy, std_layouts
from .schedule import Buffer, BufferLayout, ChunkRef, Collective, Schedule

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH
NAME = "dissemination"


def _barrier(n: int) -> Schedule:
    lay = {IN: BufferLayout(1), OUT: BufferLayout(1), SCR: BufferLayout(1, like=IN)}
    b = new_builder(Collective.BARRIER, n, NAME, lay, None)
    token_in, token_scr = ChunkRef(IN, 0), ChunkRef(SCR, 0)
    for k in range(ceil_log2(n)):
        for r in range(n):
            b.transfer(k, r, (r + (1 << k)) % n, token_in, token_scr)
    return b.build()


def _all_reduce(n: int, nsegs: int) -> Schedule:
    c = Collective.ALL_REDUCE
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, n))
    b = new_builder(c, n, NAME, lay, None, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    last = ceil_log2(n) - 1

    def slots(first: int, count: int) -> ChunkRef:
        return ChunkRef(SCR, ls.chunk(0, 0, first), count * ls.nsegs)

    for k in range(last + 1):
        d = 1 << k
        m = min(d, n - d)   # the last round sends only the vectors its receiver still lacks
        for r in range(n):
            b.transfer(k, r, (r + d) % n, blk(IN, li, 0) if k == 0 else slots(0, m), slots(d, m))
    for r in range(n):
        b.copy(r, 0, slots(0, 1), blk(IN, li, 0))
        b.copy(r, last, blk(OUT, lo, 0), slots(r % n, 1))   # rank 0's vector sits in slot r
        for q in range(1, n):
            b.reduce(r, last, blk(OUT, lo, 0), slots((r - q) % n, 1))
    return b.build()


def _broadcast(n: int, root: int, nsegs: int) -> Schedule:
    c = Collective.BROADCAST
    lay = std_layouts(c, n, 1, nsegs, scratch=(OUT, 1))
    b = new_builder(c, n, NAME, lay, root, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    last = ceil_log2(n) - 1
    for k in range(last + 1):
        d = 1 << k
        for rel in range(min(d, n - d)):
            r = (root + rel) % n
            b.transfer(k, r, (r + d) % n, blk(IN, li, 0) if rel == 0 else blk(SCR, ls, 0), blk(SCR, ls, 0))
    for r in range(n):
        b.copy(r, last, blk(OUT, lo, 0), blk(IN, li, 0) if r == root else blk(SCR, ls, 0))
    return b.build()


def build(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
          **_: object) -> Schedule:
    """The dissemination barrier, all-reduce or broadcast on `nranks` ranks."""
    c = Collective.parse(collective)
    if c == Collective.BARRIER:
        return _barrier(nranks)
    if c == Collective.BROADCAST:
        root = need_root(root, nranks)
    if nranks == 1:
        return single_rank_copy(c, nsegs, NAME)
    if c == Collective.ALL_REDUCE:
        return _all_reduce(nranks, nsegs)
    return _broadcast(nranks, root or 0, nsegs)
