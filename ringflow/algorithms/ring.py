"""Ring algorithms: all-reduce (the seed's exact indices), reduce-scatter, all-gather, and the
pipelined ring chain for broadcast and reduce; one ring per channel over given ring orders.

Ring all-reduce on ring order ``order`` (position j holds rank ``order[j]``), n positions,
blocks of channel c are ``c*n .. c*n+n-1``. Scatter-reduce, step i = 0..n-2: position j sends
block (j-i)%n to position j+1 and receives block (j-i-1)%n from position j-1, reducing it
(the seed's formulas). Then position j holds the complete block (j+1)%n. All-gather, step
i = 0..n-2: position j sends block (j-i+1)%n and receives (j-i)%n, replacing. (The seed writes
(j-i-1)%n and (j-i-2)%n for this phase: those indices send a block the rank does not have yet;
`tests/test_algo_ring.py` shows the table and proves the seed's literal version wrong.)

Segments: ring all-reduce / reduce-scatter / all-gather send each block as ``nsegs`` separate
messages inside the same step (a runtime can reduce segment k while segment k+1 arrives; the
lock-step step count is unchanged). Broadcast and reduce pipeline segments along the chain:
segment s crosses hop k at step s+k, so the chain takes S+n-2 steps of N/S bytes: the seed's
N(S+K-2)/(S B).
"""
from __future__ import annotations

from collections.abc import Sequence

from ._common import blk, need_root, new_builder, resolve_rings, seg, std_layouts
from .schedule import Buffer, BufferLayout, ChunkRef, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def seed_allreduce_blocks(n: int, i: int, j: int, phase: str) -> tuple[int, int]:
    """(block sent, block received) by position j at step i of a phase ('scatter_reduce'|'all_gather')."""
    if phase == "scatter_reduce":
        return (j - i) % n, (j - i - 1) % n
    return (j - i + 1) % n, (j - i) % n


def _group_refs(lay: BufferLayout, buf: Buffer, first_block: int, nsegs: int, span_blocks: int) -> list[ChunkRef]:
    if span_blocks == 1:
        return [seg(buf, lay, first_block, s) for s in range(nsegs)]
    return [blk(buf, lay, first_block, span_blocks)]


def ring_rs_ops(b: ScheduleBuilder, order: Sequence[int], block_of: Sequence[int], nsegs: int, step0: int,
                channel: int, *, span_blocks: int = 1, first_buf: Buffer = IN) -> int:
    """Seed scatter-reduce over `order` into OUT: afterwards position j holds group (j+1)%n complete.

    Group q = blocks [block_of[q], +span_blocks); `first_buf` holds the inputs (IN, or OUT when an
    earlier phase left partial sums there). Returns the next free step.
    """
    n, lay = len(order), b.layouts[OUT]
    out_refs = [_group_refs(lay, OUT, block_of[q], nsegs, span_blocks) for q in range(n)]
    first_refs = [_group_refs(lay, first_buf, block_of[q], nsegs, span_blocks) for q in range(n)]
    for i in range(n - 1):
        for j in range(n):
            snd, _ = seed_allreduce_blocks(n, i, j, "scatter_reduce")
            a, nxt = order[j], order[(j + 1) % n]
            src_refs = first_refs[snd] if i == 0 else out_refs[snd]
            for sref, dref, lref in zip(src_refs, out_refs[snd], first_refs[snd], strict=True):
                b.transfer(step0 + i, a, nxt, sref, dref, reduce=True, local=lref, channel=channel)
    return step0 + max(n - 1, 0)


def ring_ag_ops(b: ScheduleBuilder, order: Sequence[int], block_of: Sequence[int], nsegs: int, step0: int,
                channel: int, *, span_blocks: int = 1, literal_seed: bool = False) -> int:
    """All-gather after ring_rs_ops (position j starts with group (j+1)%n in OUT)."""
    n, lay = len(order), b.layouts[OUT]
    out_refs = [_group_refs(lay, OUT, block_of[q], nsegs, span_blocks) for q in range(n)]
    for i in range(n - 1):
        for j in range(n):
            snd = (j - i - 1) % n if literal_seed else seed_allreduce_blocks(n, i, j, "all_gather")[0]
            a, nxt = order[j], order[(j + 1) % n]
            for ref in out_refs[snd]:
                b.transfer(step0 + i, a, nxt, ref, ref, channel=channel)
    return step0 + max(n - 1, 0)


def ring_allreduce_ops(b: ScheduleBuilder, order: Sequence[int], block_of: Sequence[int], nsegs: int,
                       step0: int, channel: int, *, span_blocks: int = 1, first_buf: Buffer = IN,
                       ag_literal_seed: bool = False) -> int:
    """Ring all-reduce (scatter-reduce then all-gather) over positions of `order`; returns next step."""
    step = ring_rs_ops(b, order, block_of, nsegs, step0, channel, span_blocks=span_blocks, first_buf=first_buf)
    return ring_ag_ops(b, order, block_of, nsegs, step, channel, span_blocks=span_blocks,
                       literal_seed=ag_literal_seed)


def _all_reduce(n: int, nsegs: int, rings: tuple[tuple[int, ...], ...], ag_literal_seed: bool = False) -> Schedule:
    C = len(rings)
    lay = std_layouts(Collective.ALL_REDUCE, n, n * C, nsegs)
    b = new_builder(Collective.ALL_REDUCE, n, "ring", lay, None, C, nsegs=nsegs, rings=[list(r) for r in rings])
    if n == 1:
        b.copy(0, 0, blk(OUT, lay[OUT], 0, n * C), blk(IN, lay[IN], 0, n * C))
        return b.build()
    for c, order in enumerate(rings):
        ring_allreduce_ops(b, order, [c * n + q for q in range(n)], nsegs, 0, c, ag_literal_seed=ag_literal_seed)
    return b.build()


def _reduce_scatter(n: int, nsegs: int, rings: tuple[tuple[int, ...], ...]) -> Schedule:
    C = len(rings)
    lay = std_layouts(Collective.REDUCE_SCATTER, n, C, nsegs, scratch=(IN, 1) if n > 2 else None)
    b = new_builder(Collective.REDUCE_SCATTER, n, "ring", lay, None, C, nsegs=nsegs, rings=[list(r) for r in rings])
    li, lo = lay[IN], lay[OUT]
    if n == 1:
        b.copy(0, 0, blk(OUT, lo, 0, C), blk(IN, li, 0, C))
        return b.build()
    for c, order in enumerate(rings):
        for i in range(n - 1):
            last = i == n - 2
            for j in range(n):
                q = (j - i - 1) % n                      # position whose block travels
                a, nxt = order[j], order[(j + 1) % n]
                blkno = order[q] * C + c
                for s in range(nsegs):
                    src = seg(IN if i == 0 else SCR, li if i == 0 else lay[SCR], blkno, s)
                    dst = seg(OUT, lo, c, s) if last else seg(SCR, lay[SCR], blkno, s)
                    b.transfer(i, a, nxt, src, dst, reduce=True, local=seg(IN, li, blkno, s), channel=c)
    return b.build()


def _all_gather(n: int, nsegs: int, rings: tuple[tuple[int, ...], ...]) -> Schedule:
    C = len(rings)
    lay = std_layouts(Collective.ALL_GATHER, n, C, nsegs)
    b = new_builder(Collective.ALL_GATHER, n, "ring", lay, None, C, nsegs=nsegs, rings=[list(r) for r in rings])
    li, lo = lay[IN], lay[OUT]
    for r in range(n):
        b.copy(r, 0, blk(OUT, lo, r * C, C), blk(IN, li, 0, C))
    for c, order in enumerate(rings):
        for i in range(n - 1):
            for j in range(n):
                q = (j - i) % n
                a, nxt = order[j], order[(j + 1) % n]
                for s in range(nsegs):
                    src = seg(IN, li, c, s) if i == 0 else seg(OUT, lo, order[q] * C + c, s)
                    b.transfer(i, a, nxt, src, seg(OUT, lo, order[q] * C + c, s), channel=c)
    return b.build()


def chain_broadcast_ops(b: ScheduleBuilder, chain: Sequence[int], block: int, nsegs: int, step0: int,
                        channel: int, src_buf: Buffer = IN) -> int:
    """Pipelined chain chain[0] -> chain[1] -> ...: segment s crosses hop k at step step0+s+k."""
    lay = b.layouts[OUT]
    for s in range(nsegs):
        for k in range(len(chain) - 1):
            src = seg(src_buf if k == 0 else OUT, lay, block, s)
            b.transfer(step0 + s + k, chain[k], chain[k + 1], src, seg(OUT, lay, block, s), channel=channel)
    return step0 + nsegs + len(chain) - 2


def chain_reduce_ops(b: ScheduleBuilder, chain: Sequence[int], block: int, nsegs: int, step0: int,
                     channel: int) -> int:
    """Pipelined chain reduction ending at chain[-1]: partial sums in OUT."""
    lay = b.layouts[OUT]
    for s in range(nsegs):
        for k in range(len(chain) - 1):
            src = seg(IN if k == 0 else OUT, lay, block, s)
            b.transfer(step0 + s + k, chain[k], chain[k + 1], src, seg(OUT, lay, block, s), reduce=True,
                       local=seg(IN, lay, block, s), channel=channel)
    return step0 + nsegs + len(chain) - 2


def _rooted(collective: Collective, n: int, root: int, nsegs: int, rings: tuple[tuple[int, ...], ...]) -> Schedule:
    C = len(rings)
    lay = std_layouts(collective, n, C, nsegs)
    b = new_builder(collective, n, "ring", lay, root, C, nsegs=nsegs, rings=[list(r) for r in rings])
    if n == 1 or collective == Collective.BROADCAST:
        b.copy(root, 0, blk(OUT, lay[OUT], 0, C), blk(IN, lay[IN], 0, C))
    if n == 1:
        return b.build()
    for c, order in enumerate(rings):
        rp = order.index(root)
        if collective == Collective.BROADCAST:
            chain_broadcast_ops(b, [order[(rp + k) % n] for k in range(n)], c, nsegs, 0, c)
        else:
            chain_reduce_ops(b, [order[(rp + 1 + k) % n] for k in range(n)], c, nsegs, 0, c)
    return b.build()


def build(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
          nchannels: int = 1, rings: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """Ring schedule for all_reduce, reduce_scatter, all_gather, broadcast or reduce."""
    c = Collective.parse(collective)
    rs = resolve_rings(rings, nranks, nchannels)
    if c == Collective.ALL_REDUCE:
        return _all_reduce(nranks, nsegs, rs)
    if c == Collective.REDUCE_SCATTER:
        return _reduce_scatter(nranks, nsegs, rs)
    if c == Collective.ALL_GATHER:
        return _all_gather(nranks, nsegs, rs)
    return _rooted(c, nranks, need_root(root, nranks), nsegs, rs)


def build_seed_literal(nranks: int) -> Schedule:
    """Ring all-reduce with the seed's literal all-gather indices (for the test that shows they fail)."""
    return _all_reduce(nranks, 1, resolve_rings(None, nranks, 1), ag_literal_seed=True)
