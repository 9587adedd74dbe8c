"""Pairwise / direct exchange: all-to-all(v), all-gather, reduce-scatter, one-shot all-reduce,
and direct (linear) gather / scatter.

Pairwise (n-1 steps, any n): in step i = 1..n-1 rank r sends to (r+i)%n and receives from
(r-i)%n, one message each way, so every link direction carries one block per step.

One-shot all-reduce (one step): every rank sends its whole buffer to every other rank,
receives n-1 buffers into scratch and sums all n contributions in rank order
(((x0+x1)+x2)+...), so every rank computes the same bits regardless of arrival order.

Direct gather / scatter (one step): the root exchanges with all n-1 other ranks at once.
"""
from __future__ import annotations

from ._common import blk, need_root, new_builder, reduce_copies_in_rank_order, single_rank_copy, std_layouts
from .schedule import Buffer, Collective, Schedule

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_pairwise(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """Pairwise exchange for all_to_all, all_to_allv, all_gather, reduce_scatter."""
    c = Collective.parse(collective)
    n = nranks
    scratch = (IN, 1) if c == Collective.REDUCE_SCATTER and n > 2 else None
    lay = std_layouts(c, n, 1, nsegs, scratch=scratch)
    b = new_builder(c, n, "pairwise", lay, None, nsegs=nsegs)
    li, lo = lay[IN], lay[OUT]
    for r in range(n):
        if c in (Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV):
            b.copy(r, 0, blk(OUT, lo, r), blk(IN, li, r))
        elif c == Collective.ALL_GATHER:
            b.copy(r, 0, blk(OUT, lo, r), blk(IN, li, 0))
        elif n == 1:
            b.copy(r, 0, blk(OUT, lo, 0), blk(IN, li, 0))
    for i in range(1, n):
        for r in range(n):
            to = (r + i) % n
            if c in (Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV):
                b.transfer(i - 1, r, to, blk(IN, li, to), blk(OUT, lo, r))
            elif c == Collective.ALL_GATHER:
                b.transfer(i - 1, r, to, blk(IN, li, 0), blk(OUT, lo, r))
            else:  # reduce_scatter: receiver accumulates its own block, in a fixed order (arrival i)
                last = i == n - 1
                acc = blk(OUT, lo, 0) if last else blk(SCR, lay[SCR], to)
                local = blk(IN, li, to) if i == 1 else blk(SCR, lay[SCR], to)
                b.transfer(i - 1, r, to, blk(IN, li, to), acc, reduce=True, local=local)
    return b.build()


def build_one_shot(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """One-shot all_reduce: everyone sends everything to everyone, then sums in rank order."""
    c = Collective.parse(collective)
    n = nranks
    if n == 1:
        return single_rank_copy(c, nsegs, "one_shot")
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, n))
    b = new_builder(c, n, "one_shot", lay, None, nsegs=nsegs)
    li, ls = lay[IN], lay[SCR]
    for r in range(n):
        for i in range(1, n):
            to = (r + i) % n
            b.transfer(0, r, to, blk(IN, li, 0), blk(SCR, ls, 0, copy=r))
    for r in range(n):
        reduce_copies_in_rank_order(b, r, 0, lay)
    return b.build()


def build_direct(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
                 **_: object) -> Schedule:
    """Direct (linear) gather or scatter: the root talks to every rank in one step."""
    c = Collective.parse(collective)
    n, root = nranks, need_root(root, nranks)
    lay = std_layouts(c, n, 1, nsegs)
    b = new_builder(c, n, "direct", lay, root, nsegs=nsegs)
    li, lo = lay[IN], lay[OUT]
    if c == Collective.GATHER:
        b.copy(root, 0, blk(OUT, lo, root), blk(IN, li, 0))
        for i in range(1, n):
            r = (root + i) % n
            b.transfer(0, r, root, blk(IN, li, 0), blk(OUT, lo, r))
    else:
        b.copy(root, 0, blk(OUT, lo, 0), blk(IN, li, root))
        for i in range(1, n):
            r = (root + i) % n
            b.transfer(0, root, r, blk(IN, li, r), blk(OUT, lo, 0))
    return b.build()
