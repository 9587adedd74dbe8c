"""PAT (NCCL 2.23+ "Parallel Aggregated Trees"): all-gather and reduce-scatter in ceil(log2 n) steps.

NCCL describes PAT as a variant of Bruck's algorithm for one GPU per node at scale: a logarithmic
number of network steps, every rank the root of its own spanning tree (NCCL 2.23 release notes;
S. Jeaugey et al., arXiv:2506.20252). ringflow writes it with Bruck's exchange pattern:

- all-gather, step k (d = 2^k): rank r sends the min(d, n - d) blocks it holds, those of ranks
  r .. r + min(d, n - d) - 1, to rank r - d; blocks land at their final place in OUT;
- reduce-scatter is that all-gather run backwards: step t uses d = 2^(K-1-t), and rank r sends its
  partial sums of blocks r + d .. r + d + min(d, n - d) - 1 to rank r + d, which adds them to its own.
  Every contribution to block b travels up the reversed spanning tree of b once, so rank b ends with
  the full sum. Partial sums live in scratch until the last step writes OUT.

Not modelled: NCCL's bounded aggregation buffer (PAT moves at most a few chunks per step and splits
large calls), which is why NCCL only picks PAT for small sizes.
"""
from __future__ import annotations

import dataclasses

from . import bruck
from ._common import blk, ceil_log2, single_rank_copy, std_layouts
from .schedule import Buffer, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def _reduce_scatter(n: int, nsegs: int) -> Schedule:
    c = Collective.REDUCE_SCATTER
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, 1))
    b = ScheduleBuilder(c, n, "pat", layouts=lay, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    K = ceil_log2(n)
    touched: set[int] = set()   # offsets (block - rank) % n whose partial already left IN for scratch
    for t in range(K):
        d = 1 << (K - 1 - t)
        cnt = min(d, n - d)
        last = t == K - 1
        for r in range(n):
            dst = (r + d) % n
            for i0, span in _runs(r, d, cnt, n, touched):
                first = (r + d + i0) % n
                src = blk(SCR if (d + i0) % n in touched else IN, li, first, span)
                local = blk(SCR if i0 in touched else IN, li, first, span)
                if last:   # d = 1, cnt = 1: the receiver's own block, summed straight into OUT
                    b.transfer(t, r, dst, src, blk(OUT, lo, 0), reduce=True, local=local)
                else:
                    b.transfer(t, r, dst, src, blk(SCR, ls, first, span), reduce=True, local=local)
        touched |= set(range(cnt))
    return b.build()


def _runs(r: int, d: int, cnt: int, n: int, touched: set[int]) -> list[tuple[int, int]]:
    """Offsets 0..cnt-1 of rank r's send in a step, cut into (start, length) runs that neither wrap past
    block n - 1 nor mix scratch and input partials on either side (sender offset d + i, receiver offset i)."""
    runs: list[tuple[int, int]] = []
    keys: list[tuple[bool, bool]] = []
    for i in range(cnt):
        key = ((d + i) % n in touched, i in touched)
        if runs and key == keys[-1] and (r + d + i) % n != 0:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
            keys.append(key)
    return runs


def build_pat(collective: Collective, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """PAT all-gather or reduce-scatter on `nranks` ranks (one per node in NCCL)."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "pat")
    if collective == Collective.ALL_GATHER:
        return dataclasses.replace(bruck.build(collective, nranks, nsegs=nsegs), algorithm="pat")
    return _reduce_scatter(nranks, nsegs)
