"""Bruck's algorithms: all-gather and all-to-all in ceil(log2 n) steps for any n (small messages).

All-gather: in step k rank r sends the min(2^k, n-2^k) blocks it holds, those of ranks
r, r+1, ... (mod n), to rank r-2^k and receives the next ones from r+2^k. Blocks go straight
to their final place in OUT, so the usual final rotation is not needed.

All-to-all: slot i of rank r starts as the block r sends to rank r+i. In step k every slot
whose index has bit k set moves to rank r+2^k (packed into one message through scratch, so
one send per step); after all steps slot i of rank r holds the block rank r-i sent to r.
Bytes per rank: sum over k of |{i < n : bit k of i set}| blocks, about (n/2) log2 n blocks.
"""
from __future__ import annotations

from ._common import blk, ceil_log2, new_builder, std_layouts, wrapped
from .schedule import Buffer, ChunkRef, Collective, Schedule

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def _all_gather(n: int, nsegs: int) -> Schedule:
    c = Collective.ALL_GATHER
    lay = std_layouts(c, n, 1, nsegs)
    b = new_builder(c, n, "bruck", lay, None, nsegs=nsegs)
    li, lo = lay[IN], lay[OUT]
    for r in range(n):
        b.copy(r, 0, blk(OUT, lo, r), blk(IN, li, 0))
    for k in range(ceil_log2(n)):
        d = 1 << k
        m = min(d, n - d)
        for r in range(n):
            dst = (r - d) % n
            for first, cnt in wrapped(r, m, n):
                src = blk(IN, li, 0) if k == 0 else blk(OUT, lo, first, cnt)
                b.transfer(k, r, dst, src, blk(OUT, lo, first, cnt))
    return b.build()


def _all_to_all(n: int, nsegs: int) -> Schedule:
    c = Collective.ALL_TO_ALL
    K = ceil_log2(n)
    # scratch copies: 0 = slots in flight, 1 = send pack, 2 = receive pack
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, 3))
    b = new_builder(c, n, "bruck", lay, None, nsegs=nsegs)
    li, ls, lo = lay[IN], lay[SCR], lay[OUT]
    for r in range(n):
        b.copy(r, 0, blk(OUT, lo, r), blk(IN, li, r))
    if n == 1:
        return b.build()
    # where[r][i]: the ChunkRef holding slot i of rank r now
    where = [[blk(IN, li, (r + i) % n) for i in range(n)] for r in range(n)]
    # step 0 only packs (local ops); transfer k happens in step k+1
    for k in range(K):
        d = 1 << k
        slots = [i for i in range(n) if i & d]
        step = k + 1
        for r in range(n):
            for j, i in enumerate(slots):
                b.copy(r, step - 1, blk(SCR, ls, j, copy=1), where[r][i])
        for r in range(n):
            to = (r + d) % n
            b.transfer(step, r, to, ChunkRef(SCR, ls.chunk(0, 0, 1), len(slots) * ls.nsegs),
                       ChunkRef(SCR, ls.chunk(0, 0, 2), len(slots) * ls.nsegs))
        for r in range(n):
            for j, i in enumerate(slots):
                final = not any(i & (1 << kk) for kk in range(k + 1, K))
                dst = blk(OUT, lo, (r - i) % n) if final else blk(SCR, ls, i, copy=0)
                b.copy(r, step, dst, blk(SCR, ls, j, copy=2))
                where[r][i] = dst
    return b.build()


def build(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """Bruck all_gather or all_to_all."""
    c = Collective.parse(collective)
    return _all_gather(nranks, nsegs) if c == Collective.ALL_GATHER else _all_to_all(nranks, nsegs)
