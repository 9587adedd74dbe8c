"""NCCL's all-to-all across servers as it runs: PXN relays inside the OS host over shared connections.

NCCL runs all-to-all as grouped point-to-point sends. A send to a rank on another NVLink domain leaves
through a NIC chosen by `ncclTopoGetNetDev` (NVIDIA/nccl src/graph/search.cc, NCCL_P2P_PXN_LEVEL=2, the
default): the local GPU with the peer's device index (``ncclTopoDevToRank(comm->topo, comm->topo->systemId,
peer nvmlDev)``) relays it over NVLink to its NIC when that NIC is closer to it (PXN). ``comm->topo`` is
the process's own machine, so the relay is a GPU of the sender's OS host: on an HGX server the whole
server, on an NVL72 rack one compute tray (4 GPUs, 4 NICs), never a GPU of another tray even though the
trays share the NVLink domain (src/init.cc doubles NCCL_P2P_NET_CHUNKSIZE on GB platforms because "GBx
platforms only have 4 GPUs per host, which reduces the aggregation factor"). The relay's local GPUs share
its connections to a remote peer (NCCL_NET_SHARED_COMMS=1, src/transport/net.cc: one connection per NIC,
remote rank and channel; the user guide: it "allows for message aggregation but can also decrease the
entropy of network packets"), so a (relay, peer) pair is as many flows for the fabric's ECMP hashing as it
has p2p channels per network peer (at most its local GPUs).

NCCL's p2p channels per network peer (src/graph/paths.cc ``ncclTopoGetNchannels`` and
``ncclTopoComputeP2pChannels``): max(local NICs, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW = 14)) rounded
up to a power of two, then, across NVLink domains, halved while it times ceil(ranks / 8)
(NCCL_MAX_DEV_WORK_P2P_PER_BATCH, src/include/device.h) exceeds the p2p channels: the communicator's channels
rounded up to a power of two, 2 per NIC of the OS host across servers, at most 32
(`nccl_tuner.NcclSystem.run_channels`).

A channel runs its work batches in sequence, at most NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8 peers each, and a
small send takes one channel where the ranks outnumber the p2p channels (src/enqueue.cc
``scheduleP2pTasksToPlan``): with ceil(ceil((n - 1) / channels) / 8) batches per channel, every network row
pays a per-message network overhead (`params.NCCL_PROTOCOLS`) for each earlier batch, which counts at small
sizes on hundreds of ranks (2 batches at 256 ranks on 16 p2p channels, 8 at 1,024).

- `os_host_groups(topo, eps)`: rank groups per OS host (a tray of an NVL72 rack, else the server);
- `net_channels_per_peer(topo, eps)`: NCCL's p2p channels per network peer for these ranks;
- `pxn_table(topo, eps)`: the PXN all-to-all table with those relays and channels (cached per topology and
  placement);
- `p2p_protocol(...)`: the protocol NCCL's p2p sends run (Simple across servers, LL only for small blocks).
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..errors import InvalidArgument
from .topocache import per_topology
from .transfers import TransferTable, from_schedule, pipelined

P2P_PER_CHANNEL_NET_GBPS = 14   # NCCL_P2P_PER_CHANNEL_NET_BW default, src/graph/paths.cc
MAX_P2P_PER_BATCH = 8           # NCCL_MAX_DEV_WORK_P2P_PER_BATCH, src/include/device.h


def os_host_groups(topo: Any, eps: Sequence[str]) -> list[list[int]]:
    """Rank groups (positions in `eps`) per OS host: the GPUs of one compute tray (node attribute ``tray``)
    inside each server, or the whole server where its GPUs carry no tray."""
    out: list[list[int]] = []
    for group in topo.host_groups(list(eps)):
        trays: dict[Any, list[int]] = {}
        for r in group:
            trays.setdefault(topo.graph.nodes[eps[r]].get("tray"), []).append(r)
        out.extend(trays[k] for k in sorted(trays, key=lambda t: -1 if t is None else int(t)))
    return out


def pxn_relay_groups(topo: Any, eps: Sequence[str]) -> list[list[int]] | None:
    """The OS hosts PXN relays inside, or None where they are the servers themselves (or uneven, where NCCL's
    rank-to-device match has no single rule: relays stay the servers)."""
    servers = topo.host_groups(list(eps))
    hosts = os_host_groups(topo, eps)
    if len(hosts) == len(servers) or len({len(h) for h in hosts}) != 1:
        return None
    return hosts


_TABLES: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def pxn_table(topo: Any, eps: Sequence[str], nsegs: int = 1) -> TransferTable:
    """The PXN all-to-all of the ranks on `eps` as NCCL runs it (module docstring): relays inside each OS host,
    the NVLink hop and the NIC send overlapping chunk by chunk (`transfers.pipelined`)."""
    from ..algorithms.nccl_pxn import build_pxn
    eps = list(eps)
    if nsegs < 1:
        raise InvalidArgument(f"nsegs={nsegs}", "give 1 or more pipeline segments")
    key = (tuple(eps), nsegs)
    per = per_topology(_TABLES, topo)
    hit = per.get(key)
    if hit is None:
        groups = topo.host_groups(eps)
        sched = build_pxn(Collective.ALL_TO_ALL, len(eps), nsegs=nsegs, host_groups=groups,
                          relay_groups=pxn_relay_groups(topo, eps), net_channels=net_channels_per_peer(topo, eps))
        hit = pipelined(from_schedule(sched))
        batches = p2p_batches(len(eps), _nic_rate_and_p2p_channels(topo, eps)[1])
        if batches > 1:   # a network row waits on its channel's earlier work batches, a message each
            domain = {r: d for d, grp in enumerate(groups) for r in grp}
            across = np.array([domain[a] != domain[b] for a, b in zip(hit.src.tolist(), hit.dst.tolist(), strict=True)])
            hit = dataclasses.replace(hit, nmsg=np.where(across, hit.nmsg + batches - 1, hit.nmsg))
        per[key] = hit
        if len(per) > 32:
            per.pop(next(iter(per)))
    return hit


def _nic_rate_and_p2p_channels(topo: Any, eps: Sequence[str]) -> tuple[float, int]:
    """(GB/s of the first OS host's NIC, p2p channels: 2 per NIC of that host, a power of two, at most 32);
    (0, 1) without NICs."""
    from .nccl_tuner import GRAPH_MAX_CHANNELS
    g = topo.graph
    hosts = os_host_groups(topo, eps)
    nics = [x for x in topo.nics(host=topo.host_of(eps[0]))
            if g.nodes[x].get("tray") == g.nodes[eps[0]].get("tray")][:len(hosts[0])]
    if not nics:
        return 0.0, 1
    nic_GBps = max(float(g.nodes[x].get("speed_gbps", 0.0)) for x in nics) / 8.0
    return nic_GBps, 1 << (min(2 * len(nics), GRAPH_MAX_CHANNELS) - 1).bit_length()


def net_channels_per_peer(topo: Any, eps: Sequence[str]) -> int:
    """NCCL's p2p channels per network peer for the ranks on `eps` (module docstring); 1 without NICs."""
    nic_GBps, p2p_channels = _nic_rate_and_p2p_channels(topo, eps)
    return channels_per_net_peer(nic_GBps, len(eps), p2p_channels) if nic_GBps > 0 else 1


def p2p_batches(nranks: int, p2p_channels: int) -> int:
    """Work batches one p2p channel runs in sequence for an all-to-all: its share of the n - 1 peers (one
    channel each while nranks exceeds the p2p channels, src/enqueue.cc ``scheduleP2pTasksToPlan``), at most
    NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8 peers per batch."""
    if nranks < 1 or p2p_channels < 1:
        raise InvalidArgument(f"{nranks} ranks, {p2p_channels} p2p channels", "give 1 or more of each")
    return max(1, math.ceil(math.ceil((nranks - 1) / p2p_channels) / MAX_P2P_PER_BATCH))


def channels_per_net_peer(nic_GBps: float, nranks: int, p2p_channels: int, local_nics: int = 1) -> int:
    """NCCL's rule (module docstring) for a GPU with `local_nics` NICs of `nic_GBps` among `nranks` ranks on
    several NVLink domains, with `p2p_channels` p2p channels."""
    if nic_GBps <= 0 or nranks < 1 or p2p_channels < 1 or local_nics < 1:
        raise InvalidArgument(f"NIC {nic_GBps} GB/s x {local_nics}, {nranks} ranks, {p2p_channels} p2p channels",
                              "give a NIC rate > 0 GB/s, 1 or more ranks, NICs and p2p channels")
    per_peer = max(local_nics, math.ceil(nic_GBps / P2P_PER_CHANNEL_NET_GBPS))
    per_peer = 1 << (per_peer - 1).bit_length()
    while per_peer * math.ceil(nranks / MAX_P2P_PER_BATCH) > p2p_channels and per_peer > 1:
        per_peer //= 2
    return per_peer


P2P_LL_THRESHOLD_BYTES = 16384   # NCCL_P2P_LL_THRESHOLD default, src/enqueue.cc


def p2p_protocol(topo: Any, algorithm: str, nranks: int, size_bytes: int, eps: Sequence[str]) -> str | None:
    """The protocol NCCL's point-to-point sends of a GPU all-to-all run (src/enqueue.cc ``addP2pToPlan``): never
    LL128; LL only where the connection has LL buffers and a peer's block fits NCCL_P2P_LL_THRESHOLD per channel
    (16 KiB on one channel), else Simple. Network connections get LL buffers only with
    NCCL_ALLOC_P2P_NET_LL_BUFFERS=1 (default 0), so an all-to-all across servers runs Simple throughout. None
    for other algorithms and for CPU endpoints (ringflow's runtime picks its own)."""
    if algorithm not in ("pxn", "pairwise") or nranks < 2:
        return None
    g = topo.graph
    if any(str(getattr(g.nodes[e].get("kind"), "value", g.nodes[e].get("kind"))) != "gpu" for e in eps[:nranks]):
        return None
    if algorithm == "pxn" or len({topo.host_of(e) for e in eps[:nranks]}) > 1:
        return "simple"
    return "ll" if size_bytes / nranks <= P2P_LL_THRESHOLD_BYTES else "simple"
