"""CollNet (IB SHARP): the network switches reduce across servers; CollNet Direct and CollNet Chain.

One switch participant (``r{n}``) stands for the SHARP aggregation tree of the fabric: it receives one
partial per server, sums them in server order and returns the sum to every server (the switch's
multicast). Servers are `host_groups` (equal sizes m; H servers). Pipelined in C = ``nsegs`` segments.

- **collnet_direct** (NCCL_ALGO=CollNetDirect, NVSwitch servers): the buffer is split into m blocks,
  block j headed by local GPU j (NCCL's "heads", one per NIC). Segment s: step s, every GPU sends block j
  to local GPU j over NVLink, which sums the m copies (its own first, then local order); step s+1, head j
  sends its server's partial to the switch; step s+2, the switch returns the global sum to head j of
  every server; step s+3, head j copies it to the other GPUs of its server.
- **collnet_chain** (NCCL_ALGO=CollNetChain): a chain through the server's GPUs, local rank 0 -> 1 ->
  ... -> m-1 (the GPU next to the NIC), reducing the whole buffer on the way up; the chain's top sends
  the partial to the switch, gets the sum back and passes it down the chain.
"""
from __future__ import annotations

from collections.abc import Sequence

from ._common import seg, single_rank_copy, std_layouts
from .nccl_nvls import host_groups_of, switch_reduce
from .schedule import Buffer, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_collnet_direct(collective: Collective, nranks: int, *, nsegs: int = 1,
                         host_groups: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """CollNet Direct all-reduce (module docstring)."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "collnet_direct")
    groups = host_groups_of(host_groups, nranks)
    H, m = len(groups), len(groups[0])
    c = Collective.ALL_REDUCE
    lay = std_layouts(c, nranks, m, nsegs, scratch=(IN, max(m, H)))
    b = ScheduleBuilder(c, nranks, "collnet_direct", layouts=lay, nswitches=1, nsegs=nsegs)
    sw, li, lo, ls = nranks, lay[IN], lay[OUT], lay[SCR]
    heads = [[g[j] for g in groups] for j in range(m)]
    for s in range(nsegs):
        for g in groups:
            for j, head in enumerate(g):    # intra-server direct reduce-scatter to the heads
                for q, r in enumerate(g):
                    if r != head:
                        b.transfer(s, r, head, seg(IN, li, j, s), seg(SCR, ls, j, s, copy=q))
                b.copy(head, s, seg(OUT, lo, j, s), seg(IN, li, j, s))
                for q, r in enumerate(g):
                    if r != head:
                        b.reduce(head, s, seg(OUT, lo, j, s), seg(SCR, ls, j, s, copy=q))
        for j in range(m):
            switch_reduce(b, s + 1, sw, heads[j], j, s, {h: OUT for h in heads[j]})
            for head in heads[j]:
                b.transfer(s + 2, sw, head, seg(SCR, ls, j, s), seg(OUT, lo, j, s))
        for g in groups:                    # heads copy the sum to their server
            for j, head in enumerate(g):
                for r in g:
                    if r != head:
                        b.transfer(s + 3, head, r, seg(OUT, lo, j, s), seg(OUT, lo, j, s))
    return b.build()


def build_collnet_chain(collective: Collective, nranks: int, *, nsegs: int = 1,
                        host_groups: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """CollNet Chain all-reduce (module docstring)."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "collnet_chain")
    groups = host_groups_of(host_groups, nranks)
    H, m = len(groups), len(groups[0])
    c = Collective.ALL_REDUCE
    lay = std_layouts(c, nranks, 1, nsegs, scratch=(IN, max(H, 1)))
    b = ScheduleBuilder(c, nranks, "collnet_chain", layouts=lay, nswitches=1, nsegs=nsegs)
    sw, lo, ls = nranks, lay[OUT], lay[SCR]
    tops = [g[-1] for g in groups]
    for s in range(nsegs):
        for g in groups:
            for q in range(m - 1):          # up the chain: q sends at step s + q, q + 1 reduces it in
                src = IN if q == 0 else OUT
                b.transfer(s + q, g[q], g[q + 1], seg(src, lo, 0, s), seg(OUT, lo, 0, s), reduce=True,
                           local=seg(IN, lo, 0, s))
        switch_reduce(b, s + m - 1, sw, tops, 0, s, {t: OUT for t in tops} if m > 1 else {})
        for g in groups:
            b.transfer(s + m, sw, g[-1], seg(SCR, ls, 0, s), seg(OUT, lo, 0, s))
            for k, q in enumerate(range(m - 1, 0, -1)):   # down the chain
                b.transfer(s + m + 1 + k, g[q], g[q - 1], seg(OUT, lo, 0, s), seg(OUT, lo, 0, s))
    return b.build()
