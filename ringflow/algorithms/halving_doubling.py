"""Recursive doubling, recursive halving-doubling and Rabenseifner, for any rank count.

Non-powers of two use MPICH's fold: with p = 2^floor(log2 n) and r = n - p, rank 2u (u < r)
first sends its whole input to rank 2u+1 and sits out; the p *survivors* (2u+1 for u < r,
u+r for u >= r) run the power-of-two algorithm; at the end 2u+1 sends the result back to 2u.
Survivor u stands for the original ranks [lo(u), lo(u+1)) with lo(u) = 2u (u < r) or u+r.

- ``recursive_doubling`` all_reduce: in round k survivor u exchanges its whole partial sum
  with u^2^k and both add (a+b == b+a bitwise, so all ranks end identical); all_gather: in
  round k survivor u exchanges the blocks it holds (those of survivors u with the low k bits
  varied) with u^2^k.
- ``halving_doubling`` all_reduce (gloo's name; this is Rabenseifner's all-reduce): recursive
  halving reduce-scatter (round k: keep the half of the current block range that holds block u,
  send the other half to u^(p/2^(k+1)) which reduces it) then recursive doubling all-gather.
  reduce_scatter: the same halving over the per-rank blocks.
- ``rabenseifner`` reduce: halving reduce-scatter then a binomial gather of the reduced blocks
  to the root (survivors relabelled by XOR with the root's survivor).
"""
from __future__ import annotations

from collections.abc import Callable

from ._common import blk, need_root, new_builder, pow2_floor, single_rank_copy, std_layouts
from .schedule import Buffer, ChunkRef, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


class Fold:
    """The survivor mapping of MPICH's non-power-of-two fold."""

    def __init__(self, n: int) -> None:
        self.n, self.p = n, pow2_floor(n)
        self.r = n - self.p
        self.log = self.p.bit_length() - 1

    def real(self, u: int) -> int:
        """The rank that plays survivor u."""
        return 2 * u + 1 if u < self.r else u + self.r

    def lo(self, u: int) -> int:
        """First original rank that survivor u stands for (lo(p) = n)."""
        return 2 * u if u < self.r else u + self.r

    def survivor_of(self, rank: int) -> int:
        return rank // 2 if rank < 2 * self.r else rank - self.r


def _fold_in(b: ScheduleBuilder, f: Fold, dst: Buffer, whole_in: ChunkRef, whole_dst: ChunkRef) -> int:
    """Step 0 of the fold: 2u sends its input to 2u+1, which reduces it into `dst`. Returns next step."""
    if f.r == 0:
        return 0
    for u in range(f.r):
        b.transfer(0, 2 * u, 2 * u + 1, whole_in, whole_dst, reduce=True, local=whole_in)
    return 1


def _fold_out(b: ScheduleBuilder, f: Fold, step: int, src: ChunkRef, dst: ChunkRef) -> int:
    if f.r == 0:
        return step
    for u in range(f.r):
        b.transfer(step, 2 * u + 1, 2 * u, src, dst)
    return step + 1


def build_recursive_doubling(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """Recursive doubling all_reduce (whole vector per round) or all_gather."""
    c = Collective.parse(collective)
    n, f = nranks, Fold(nranks)
    if n == 1:
        return single_rank_copy(c, nsegs, "recursive_doubling")
    lay = std_layouts(c, n, 1, nsegs)
    b = new_builder(c, n, "recursive_doubling", lay, None, nsegs=nsegs)
    li, lo = lay[IN], lay[OUT]
    if c == Collective.ALL_REDUCE:
        win, wout = blk(IN, li, 0), blk(OUT, lo, 0)
        step = _fold_in(b, f, OUT, win, wout)
        for k in range(f.log):
            for u in range(f.p):
                v = u ^ (1 << k)
                init = k > 0 or u < f.r
                b.transfer(step, f.real(u), f.real(v), wout if init else win, wout, reduce=True,
                           local=wout if (k > 0 or v < f.r) else win)
            step += 1
        _fold_out(b, f, step, wout, wout)
        return b.build()
    # all_gather
    step = 0
    if f.r:
        for u in range(f.r):
            b.transfer(0, 2 * u, 2 * u + 1, blk(IN, li, 0), blk(OUT, lo, 2 * u))
        step = 1
    for rank in range(n):
        if not (rank < 2 * f.r and rank % 2 == 0):
            b.copy(rank, 0, blk(OUT, lo, rank), blk(IN, li, 0))
    for k in range(f.log):
        d = 1 << k
        for u in range(f.p):
            a = u & ~(d - 1)
            first, cnt = f.lo(a), f.lo(a + d) - f.lo(a)
            v = u ^ d
            src = blk(IN, li, 0) if (step == 0 and k == 0) else blk(OUT, lo, first, cnt)
            b.transfer(step, f.real(u), f.real(v), src, blk(OUT, lo, first, cnt))
        step += 1
    _fold_out(b, f, step, blk(OUT, lo, 0, n), blk(OUT, lo, 0, n))
    return b.build()


Pieces = Callable[[int, int, int], list[tuple[int, int, Buffer, int]]]


def _halving_rounds(b: ScheduleBuilder, f: Fold, step: int, blocks_of: Callable[[int], int], inited: set[int],
                    src_buf: Buffer, acc_buf: Buffer, final_dst: Pieces | None = None) -> int:
    """Recursive halving reduce-scatter over survivors; survivor u owns blocks [blocks_of(u), blocks_of(u+1)).

    Partial sums go to `acc_buf` (OUT or SCRATCH); `final_dst(v, first, cnt)` splits the last
    round's blocks kept by survivor v into (first, cnt, buffer, block in that buffer) pieces.
    `inited` holds the survivors whose `acc_buf` already holds partial sums (the fold receivers).
    """
    for k in range(f.log):
        d = f.p >> (k + 1)
        for u in range(f.p):
            v = u ^ d
            send_a = v & ~(d - 1)           # the partner keeps the survivors [send_a, send_a + d)
            first, end = blocks_of(send_a), blocks_of(send_a + d)
            if end == first:
                continue
            pieces = [(first, end - first, acc_buf, first)]
            if d == 1 and final_dst is not None:
                pieces = final_dst(v, first, end - first)
            for pf, cnt, dbuf, dblock in pieces:
                sbuf = acc_buf if u in inited else src_buf
                lbuf = acc_buf if v in inited else src_buf
                b.transfer(step, f.real(u), f.real(v), blk(sbuf, b.layouts[sbuf], pf, cnt),
                           blk(dbuf, b.layouts[dbuf], dblock, cnt), reduce=True,
                           local=blk(lbuf, b.layouts[lbuf], pf, cnt))
        inited.update(range(f.p))
        step += 1
    return step


def build_halving_doubling(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """Recursive halving reduce-scatter (+ recursive doubling all-gather for all_reduce)."""
    c = Collective.parse(collective)
    n, f = nranks, Fold(nranks)
    if n == 1:
        return single_rank_copy(c, nsegs, "halving_doubling")
    if c == Collective.ALL_REDUCE:
        lay = std_layouts(c, n, f.p, nsegs)
        b = new_builder(c, n, "halving_doubling", lay, None, nsegs=nsegs)
        lo = lay[OUT]
        step = _fold_in(b, f, OUT, blk(IN, lay[IN], 0, f.p), blk(OUT, lo, 0, f.p))
        step = _halving_rounds(b, f, step, lambda u: u, set(range(f.r)), IN, OUT)
        step = _doubling_out(b, f, step, lambda u: u)
        _fold_out(b, f, step, blk(OUT, lo, 0, f.p), blk(OUT, lo, 0, f.p))
        return b.build()
    # reduce_scatter: survivor u owns the blocks of ranks [lo(u), lo(u+1))
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, 1))
    b = new_builder(c, n, "halving_doubling", lay, None, nsegs=nsegs)
    li, ls, lo = lay[IN], lay[SCR], lay[OUT]
    step = _fold_in(b, f, SCR, blk(IN, li, 0, n), blk(SCR, ls, 0, n))

    def final_dst(v: int, first: int, cnt: int) -> list[tuple[int, int, Buffer, int]]:
        own = f.real(v)  # the survivor's own block goes to OUT, its folded partner's stays in scratch
        return [(x, 1, OUT, 0) if x == own else (x, 1, SCR, x) for x in range(first, first + cnt)]

    step = _halving_rounds(b, f, step, f.lo, set(range(f.r)), IN, SCR, final_dst)
    if f.r:
        for u in range(f.r):
            b.transfer(step, 2 * u + 1, 2 * u, blk(SCR, ls, 2 * u), blk(OUT, lo, 0))
    return b.build()


def _doubling_out(b: ScheduleBuilder, f: Fold, step: int, blocks_of: Callable[[int], int]) -> int:
    """Recursive doubling all-gather of complete blocks held in OUT."""
    lo = b.layouts[OUT]
    for k in range(f.log):
        d = 1 << k
        for u in range(f.p):
            a = u & ~(d - 1)
            first, end = blocks_of(a), blocks_of(a + d)
            if end > first:
                b.transfer(step, f.real(u), f.real(u ^ d), blk(OUT, lo, first, end - first),
                           blk(OUT, lo, first, end - first))
        step += 1
    return step


def build_rabenseifner(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
                       **_: object) -> Schedule:
    """Rabenseifner reduce: halving reduce-scatter, then binomial gather of the blocks to the root."""
    c = Collective.parse(collective)
    n, f = nranks, Fold(nranks)
    root = need_root(root, n)
    if n == 1:
        return single_rank_copy(c, nsegs, "rabenseifner")
    lay = std_layouts(c, n, f.p, nsegs)
    b = new_builder(c, n, "rabenseifner", lay, root, nsegs=nsegs)
    lo = lay[OUT]
    step = _fold_in(b, f, OUT, blk(IN, lay[IN], 0, f.p), blk(OUT, lo, 0, f.p))
    step = _halving_rounds(b, f, step, lambda u: u, set(range(f.r)), IN, OUT)
    u0 = f.survivor_of(root)
    for k in range(f.log):
        d = 1 << k
        for u in range(f.p):
            w = u ^ u0
            if w % (2 * d) == d:
                first = (u0 ^ w) & ~(d - 1)
                b.transfer(step, f.real(u), f.real(u ^ d), blk(OUT, lo, first, d), blk(OUT, lo, first, d))
        step += 1
    if f.real(u0) != root:
        b.transfer(step, f.real(u0), root, blk(OUT, lo, 0, f.p), blk(OUT, lo, 0, f.p))
    return b.build()
