"""Parameter-server all-reduce, as in the seed's "CPU / GPU0 / all GPUs as parameter server".

``param_server``: every worker pushes its whole gradient to one server rank (``root``,
default 0), the server sums all n contributions in rank order and pushes the sum back.
2 steps; the server sends and receives (n-1) S bytes, so it is the bottleneck.

``sharded_ps``: the server role is spread over all ranks: rank j serves block j of the
buffer (workers push block j to rank j, which sums in rank order, then every server pushes
its block to everyone). Scratch: n copies of the rank's own block (S in all). 2 steps,
2(n-1)/n S bytes each way per rank: the same traffic as a ring all-reduce in 2 steps instead
of 2(n-1), at the cost of n-1 concurrent peers per rank (NCCL/TensorRT-LLM call this pattern
"two-shot").
"""
from __future__ import annotations

from ._common import blk, need_root, new_builder, reduce_copies_in_rank_order, single_rank_copy, std_layouts
from .schedule import Buffer, BufferLayout, Collective, Schedule

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_param_server(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
                       **_: object) -> Schedule:
    """Reduce to one server (root, default 0) in rank order, then broadcast from it."""
    c = Collective.parse(collective)
    n = nranks
    server = need_root(root, n, default=0)
    if n == 1:
        return single_rank_copy(c, nsegs, "param_server", server=server)
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, n))
    b = new_builder(c, n, "param_server", lay, None, server=server, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    for w in range(n):
        if w != server:
            b.transfer(0, w, server, blk(IN, li, 0), blk(SCR, ls, 0, copy=w))
    reduce_copies_in_rank_order(b, server, 0, lay)
    for i in range(1, n):
        b.transfer(1, server, (server + i) % n, blk(OUT, lo, 0), blk(OUT, lo, 0))
    return b.build()


def build_sharded(collective: Collective | str, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """Sharded servers: rank j reduces block j (rank order) and pushes it to everyone."""
    c = Collective.parse(collective)
    n = nranks
    if n == 1:
        return single_rank_copy(c, nsegs, "sharded_ps")
    lay = std_layouts(c, n, n, nsegs)
    lay[SCR] = BufferLayout(n, nsegs, like=IN, copies=n, own_block=True)  # own block only: S of scratch, not n S
    b = new_builder(c, n, "sharded_ps", lay, None, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    for r in range(n):
        for i in range(1, n):
            j = (r + i) % n
            b.transfer(0, r, j, blk(IN, li, j), blk(SCR, ls, 0, copy=r))
    for j in range(n):
        reduce_copies_in_rank_order(b, j, 0, lay, block=j)
    for r in range(n):
        for i in range(1, n):
            b.transfer(1, r, (r + i) % n, blk(OUT, lo, r), blk(OUT, lo, r))
    return b.build()
