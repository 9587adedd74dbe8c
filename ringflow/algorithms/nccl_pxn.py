"""PXN (PCI x NVLink, NCCL 2.12+): reach a remote GPU through the NIC on its rail, via a local peer GPU.

On rail-optimised clusters NIC j of every server hangs off leaf switch j, so traffic from GPU i of one
server to GPU j of another crosses a spine unless it leaves through NIC j. With PXN, GPU i first moves
the data over NVLink to local GPU j, whose NIC (rail j) sends it; messages of several local GPUs for
the same remote GPU are aggregated on the way (NCCL_PXN_DISABLE=0, the default since 2.12; NVIDIA
blog "Doubling all2all Performance with NVIDIA Collective Communication Library 2.12").

- **pxn** all-to-all over `host_groups` (H servers of m GPUs): step 0, GPU (h, i) sends GPU (h, j) its
  block for (h, j) and its blocks for every remote (h', j) (NVLink); step 1, GPU (h, j) sends GPU
  (h', j) the m blocks its server has for it (rail j). No transfer crosses rails.
- `pxn_route(topo, src, dst)`: the links one PXN message takes: NVLink to the peer GPU on the
  destination's rail, then that peer's NIC, the fabric, the destination.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ._common import blk, single_rank_copy, std_layouts
from .nccl_nvls import host_groups_of
from .schedule import Buffer, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_pxn(collective: Collective, nranks: int, *, nsegs: int = 1,
              host_groups: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """PXN all-to-all (module docstring)."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "pxn")
    groups = host_groups_of(host_groups, nranks)
    m = len(groups[0])
    c = Collective.ALL_TO_ALL
    lay = std_layouts(c, nranks, 1, nsegs, scratch=(IN, m))   # copy i at (h, j): blocks of local GPU i
    b = ScheduleBuilder(c, nranks, "pxn", layouts=lay, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    for g in groups:
        for i, src in enumerate(g):
            b.copy(src, 0, blk(OUT, lo, src), blk(IN, li, src))
            for j, peer in enumerate(g):
                if peer == src:
                    continue
                b.transfer(0, src, peer, blk(IN, li, peer), blk(OUT, lo, src))
                for g2 in groups:
                    if g2 is not g:
                        b.transfer(0, src, peer, blk(IN, li, g2[j]), blk(SCR, ls, g2[j], copy=i))
    for g in groups:
        for j, relay in enumerate(g):
            for g2 in groups:
                if g2 is g:
                    continue
                for i, src in enumerate(g):
                    data = blk(IN, li, g2[j]) if src == relay else blk(SCR, ls, g2[j], copy=i)
                    b.transfer(1, relay, g2[j], data, blk(OUT, lo, src))
    return b.build()


def rail_nic(topo: Any, gpu: str) -> str:
    """The NIC a GPU uses for the network: the NIC of the same index on its server (GPU i <-> NIC i, rail i,
    as on DGX servers), else the NIC with the lowest-latency path from it."""
    host = topo.host_of(gpu)
    nics = topo.nics(host=host)
    if not nics:
        raise InvalidArgument(f"{gpu} has no NIC on its server", "use a topology with NICs (e.g. dgx-h100)")
    idx = topo.graph.nodes[gpu].get("index")
    same = [x for x in nics if topo.graph.nodes[x].get("index") == idx]
    return str(same[0] if same else min(nics, key=lambda x: (topo.latency_us(gpu, x), x)))


def pxn_route(topo: Any, src: str, dst: str) -> list[str]:
    """Nodes a PXN message from GPU `src` to GPU `dst` on another server crosses: NVLink to the local GPU
    whose NIC is on dst's rail, that NIC, the fabric, dst. Same server or same rail: the direct path."""
    if topo.host_of(src) == topo.host_of(dst):
        return list(topo.path(src, dst))
    want = topo.graph.nodes[rail_nic(topo, dst)].get("rail")
    local = [gp for gp in topo.gpus(host=topo.host_of(src))
             if topo.graph.nodes[rail_nic(topo, gp)].get("rail") == want]
    if not local or local[0] == src:
        return list(topo.path(src, dst))
    peer = local[0]
    nic = rail_nic(topo, peer)
    hop1 = list(topo.path(src, peer))
    hop2 = list(topo.path(peer, nic))
    hop3 = list(topo.path(nic, dst))
    return hop1 + hop2[1:] + hop3[1:]
