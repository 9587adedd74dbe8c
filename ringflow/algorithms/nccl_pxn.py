"""PXN (PCI x NVLink, NCCL 2.12+): reach a remote GPU through the NIC on its rail, via a local peer GPU.

On rail-optimised clusters NIC j of every server hangs off leaf switch j, so traffic from GPU i of one
server to GPU j of another crosses a spine unless it leaves through NIC j. With PXN, GPU i first moves
the data over NVLink to local GPU j, whose NIC (rail j) sends it; messages of several local GPUs for
the same remote GPU are aggregated on the way (NCCL_PXN_DISABLE=0, the default since 2.12; NVIDIA
blog "Doubling all2all Performance with NVIDIA Collective Communication Library 2.12").

- **pxn** all-to-all over `host_groups` (H servers of m GPUs): step 0, GPU (h, i) sends GPU (h, j) its
  block for (h, j) and its blocks for every remote (h', j) (NVLink); step 1, GPU (h, j) sends GPU
  (h', j) the m blocks its server has for it (rail j). No transfer crosses rails.
- `relay_groups`: where a server (NVLink domain) holds several OS hosts (the trays of an NVL72 rack), NCCL
  relays only inside the sender's OS host, to the local GPU with the destination's device index
  (src/graph/search.cc `ncclTopoGetNetDev`); GPUs of one domain still exchange straight over NVLink.
- `net_channels`: the relay's local GPUs share its connections to a remote peer (NCCL_NET_SHARED_COMMS=1,
  src/transport/net.cc), one per p2p channel: the step-1 rows to a peer spread over that many channels,
  which is all the entropy ECMP hashing sees.
- `pxn_route(topo, src, dst)`: the links one PXN message takes: NVLink to the peer GPU on the
  destination's rail, then that peer's NIC, the fabric, the destination.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ._common import blk, single_rank_copy, std_layouts
from .hierarchical import check_host_groups
from .nccl_nvls import host_groups_of
from .schedule import Buffer, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_pxn(collective: Collective, nranks: int, *, nsegs: int = 1,
              host_groups: Sequence[Sequence[int]] | None = None,
              relay_groups: Sequence[Sequence[int]] | None = None, net_channels: int = 1, **_: object) -> Schedule:
    """PXN all-to-all (module docstring); `relay_groups`: the OS hosts inside the servers (default: the servers);
    `net_channels`: the connections a relay keeps to each remote peer (its local GPUs' data share them)."""
    if not isinstance(net_channels, int) or net_channels < 1:
        raise InvalidArgument(f"net_channels={net_channels!r}", "give 1 or more network channels per peer")
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "pxn")
    groups = host_groups_of(host_groups, nranks)
    relays = relay_groups_of(groups, relay_groups, nranks)
    m = len(relays[0])
    domain = {r: d for d, g in enumerate(groups) for r in g}
    local = {r: i for h in relays for i, r in enumerate(h)}
    c = Collective.ALL_TO_ALL
    lay = std_layouts(c, nranks, 1, nsegs, scratch=(IN, m))   # copy i at a relay: blocks of its host's GPU i
    b = ScheduleBuilder(c, nranks, "pxn", layouts=lay, nsegs=nsegs)
    li, lo, ls = lay[IN], lay[OUT], lay[SCR]
    remote = [[r for r in range(nranks) if domain[r] != d] for d in range(len(groups))]
    for host in relays:
        for i, src in enumerate(host):
            b.copy(src, 0, blk(OUT, lo, src), blk(IN, li, src))
            for peer in groups[domain[src]]:   # same NVLink domain: straight over NVLink
                if peer != src:
                    b.transfer(0, src, peer, blk(IN, li, peer), blk(OUT, lo, src))
            for dst in remote[domain[src]]:    # another domain: to the local GPU of dst's index, for its NIC
                if host[local[dst]] != src:
                    b.transfer(0, src, host[local[dst]], blk(IN, li, dst), blk(SCR, ls, dst, copy=i))
    for host in relays:
        for j, relay in enumerate(host):
            for dst in remote[domain[relay]]:
                if local[dst] != j:
                    continue
                for i, src in enumerate(host):
                    data = blk(IN, li, dst) if src == relay else blk(SCR, ls, dst, copy=i)
                    b.transfer(1, relay, dst, data, blk(OUT, lo, src), channel=i % net_channels)
    return b.build()


def relay_groups_of(groups: Sequence[Sequence[int]], relay_groups: Sequence[Sequence[int]] | None,
                    nranks: int) -> tuple[tuple[int, ...], ...]:
    """The OS hosts PXN relays inside: equal groups, each inside one server (NVLink domain); default the servers."""
    if relay_groups is None:
        return tuple(tuple(g) for g in groups)
    relays = check_host_groups(relay_groups, nranks)
    domain = {r: d for d, g in enumerate(groups) for r in g}
    if any(len({domain[r] for r in h}) != 1 for h in relays):
        raise InvalidArgument(f"PXN relay groups {relays} straddle the servers {tuple(map(tuple, groups))}",
                              "give relay groups (OS hosts) that each lie inside one server's NVLink domain")
    return relays


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
