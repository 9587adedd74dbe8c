"""What NCCL would choose: its tuning model (algorithm x protocol by predicted time) on a modelled machine.

NCCL prices every enabled (algorithm, protocol) pair of a call as ``latency + nBytes / (1000 x algbw)``
(microseconds) and runs the cheapest (``ncclTopoGetAlgoTime``). The latencies and bandwidths come from
``ncclTopoTuneModel``. The tables and rules below follow src/graph/tuning.cc of NVIDIA/nccl in its PAT
era (the version with PAT, Blackwell rows and NCCL_LL128_C2C: NCCL 2.23+; https://github.com/NVIDIA/nccl,
src/graph/tuning.cc); NCCL 2.20.3-1 (commit b6475625) has the same tables without PAT and Blackwell.

What NCCL reads from its topology search, ringflow takes from the topology:

- ``bw_intra_GBps``: one GPU's NVLink rate x the NVLink efficiency (NCCL's search finds 360 GB/s on
  H100: 12 channels x 30 GB/s, https://github.com/NVIDIA/nccl/issues/1367; ringflow: 450 x 0.822 = 370);
  PCIe rate x efficiency without NVLink;
- ``bw_inter_GBps``: the NICs of the server's ranks together (one per local GPU at most), each at its
  rate x the IB efficiency (NCCL's inter-node graph has one channel per NIC at the NIC's rate,
  https://github.com/NVIDIA/nccl/issues/1302);
- channels: 12 searched channels on NVSwitch servers (A100 and H100 both log 24 = 12 x 2 channels,
  https://github.com/NVIDIA/nccl/issues/578, #1367), one per NIC across servers, 2 on other servers;
  NCCL duplicates them at run time (2 per NIC), which the bandwidth model does not see. A ring or tree graph
  holds at most MAXCHANNELS / 2 = 32 channels, duplicates included (src/init.cc: ``ringGraph->maxChannels =
  MAXCHANNELS / 2``; src/graph/search.cc ``ncclTopoDupChannels``: ``min(nChannels * 2, maxChannels)``), and an
  NVLS graph at most NCCL_MAX_NVLS_ARITY = 32 heads (src/include/device.h): a node with more NICs than that (an
  NVL72 rack, 72 NICs) drives 32 of them, so its network rate is 32 NICs' worth;
- one rate per ring or tree channel: the search sets ``bwIntra = bwInter`` to one speed per channel
  (src/graph/search.cc, ``ncclTopoCompute``), so a channel runs at the slower of its NVLink share and its NIC.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..algorithms.schedule import Collective
from ..errors import InvalidArgument

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("ll", "ll128", "simple")
NCCL_TUNING_SOURCE = "NVIDIA/nccl src/graph/tuning.cc (PAT era, NCCL 2.23+)"

# baseLat [algorithm][LL, LL128, Simple], microseconds (PAT has none: its latency is set by a formula below)
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet_direct": (0, 0, 0),
            "collnet_chain": (0, 0, 0), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 0)}
# hwLat [NVLink, PCI, NET][algorithm][LL, LL128, Simple], microseconds per hop
HW_LAT = {
    "nvlink": {"tree": (.6, 1.25, 4.0), "ring": (.6, 1.9, 3.4), "collnet_direct": (0, 0, 3.7),
               "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0, 0, 3.7),
            "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0, 0, 31),
            "collnet_chain": (0, 0, 30), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 14), "pat": (0, 0, 0)},
}
# compute-capability index: Volta, Ampere, Hopper, Blackwell; second index: 1 node, 2 nodes, more
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (73.4, 73.4, 73.4))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (73.4, 73.4, 58.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (77.4, 82.8, 72.0))
# treeCorrectionFactor [protocol][log2(nBytes / 64)], 64 B to 256 MiB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
SEARCH_CHANNELS_NVSWITCH = 12   # nccl#578 (A100), nccl#1367 (H100): 12 searched, 24 after duplication
GRAPH_MAX_CHANNELS = 32   # ring / tree: MAXCHANNELS (64) / 2 with duplicates (init.cc); NVLS: NCCL_MAX_NVLS_ARITY
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}   # getNetOverhead (x86 vendors)

_COLL = {Collective.BROADCAST: "broadcast", Collective.REDUCE: "reduce", Collective.ALL_GATHER: "all_gather",
         Collective.REDUCE_SCATTER: "reduce_scatter", Collective.ALL_REDUCE: "all_reduce"}


# Collectives NCCL has no algorithm table for: it (or torch on top of it) runs them as grouped send/recv.
_P2P_COLLECTIVES = (Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV, Collective.GATHER, Collective.SCATTER,
                    Collective.SENDRECV)


def nccl_has(collective: Collective | str, algorithm: str) -> bool:
    """Whether NCCL itself runs this algorithm for this collective; False marks ringflow-only algorithms."""
    coll = Collective.parse(collective)
    if coll in _P2P_COLLECTIVES:   # pxn: its grouped sends relayed over NVLink to the rail's GPU (NCCL 2.12+)
        return algorithm in ("pairwise", "direct", "p2p") or (algorithm == "pxn" and coll == Collective.ALL_TO_ALL)
    if coll in (Collective.BROADCAST, Collective.REDUCE):
        return algorithm == "ring"
    if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return algorithm in ("pat", "ring", "nvls", "collnet_direct")
    if coll == Collective.ALL_REDUCE:
        return algorithm in ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain")
    return False   # barrier: NCCL has none (torch all-reduces one element)


def _log2i(x: float) -> int:
    return int(math.floor(math.log2(x))) if x >= 1 else 0


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL's tuning reads about a communicator (module docstring says where each figure comes from)."""

    nranks: int
    nnodes: int
    compcap: int                 # 70 Volta, 80 Ampere, 90 Hopper, 100 Blackwell
    bw_intra_GBps: float         # one GPU's intra-node bandwidth (all channels)
    bw_inter_GBps: float         # one node's network bandwidth (all NICs); 0 on one node
    nchannels_intra: int
    nics_per_node: int
    intra_hw: str = "nvlink"     # "nvlink" or "pci"
    nvswitch: bool = True
    nvls: bool = False           # NVLink SHARP capable (NVSwitch gen3+)
    collnet: bool = False        # IB SHARP switches enabled (NCCL_COLLNET_ENABLE=1)
    cpu_vendor: str = "intel"

    @property
    def ppn(self) -> float:
        """Ranks per node."""
        return self.nranks / self.nnodes

    @property
    def cc_index(self) -> int:
        """NCCL's compute-capability index into its tables."""
        return 3 if self.compcap >= 100 else 2 if self.compcap >= 90 else 1 if self.compcap >= 80 else 0

    def channels(self) -> int:
        """Searched channels of the graph: one per NIC across nodes, else the intra-node count."""
        nics = min(max(1, self.nics_per_node), GRAPH_MAX_CHANNELS)
        return nics if self.nnodes > 1 else self.nchannels_intra

    def run_channels(self) -> int:
        """Channels NCCL runs: the searched ones doubled (2 per NIC across servers, 24 on an NVSwitch server;
        https://github.com/NVIDIA/nccl/issues/524), at most the graph's 32 (``ncclTopoDupChannels``)."""
        return min(2 * self.channels(), GRAPH_MAX_CHANNELS)

    def per_channel(self, algo: str) -> tuple[float, float]:
        """(bwIntra, bwInter) per channel of the algorithm's graph."""
        nch = self.channels()
        if self.nnodes == 1:
            return self.bw_intra_GBps / nch, self.bw_intra_GBps / nch
        if algo in ("nvls", "nvls_tree"):
            return self.bw_intra_GBps / nch, self.bw_inter_GBps / nch
        one = min(self.bw_intra_GBps, self.bw_inter_GBps) / nch   # a ring / tree channel: one speed end to end
        return one, one


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's pick for one call, with every enabled candidate's predicted time (microseconds)."""

    collective: Collective
    nbytes: int
    algorithm: str
    protocol: str
    time_us: float
    candidates: dict[tuple[str, str], float] = field(default_factory=dict)


def enabled(sys_: NcclSystem, coll: Collective, algo: str, proto: str) -> bool:
    """NCCL's per-(collective, algorithm, protocol) rules: which pairs it prices at all."""
    if coll in (Collective.BROADCAST, Collective.REDUCE) and algo != "ring":
        return False
    if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) and algo not in ("pat", "ring", "nvls",
                                                                                   "collnet_direct"):
        return False
    if coll == Collective.ALL_REDUCE and algo == "pat":
        return False
    if algo in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat") and proto != "simple":
        return False
    if algo == "pat" and (sys_.nnodes != sys_.nranks or sys_.compcap < 60):
        return False   # PAT: one GPU per node only
    if algo == "nvls_tree" and (sys_.nnodes == 1 or not sys_.nvls):
        return False
    if algo == "nvls" and (not sys_.nvls or (sys_.nnodes > 1 and not sys_.collnet)):
        return False
    if algo in ("collnet_direct", "collnet_chain") and (not sys_.collnet or sys_.nnodes == 1):
        return False
    if algo == "collnet_direct" and (not sys_.nvswitch or sys_.ppn > 8):
        return False
    if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) and algo in ("nvls", "collnet_direct") \
            and sys_.nnodes > 1:
        return False   # needs one CollNet head per local GPU and collnet all-gather / reduce-scatter support
    if proto == "ll128" and (sys_.intra_hw != "nvlink" or sys_.compcap < 70):
        return False   # LL128: NVLink (up to NVB) on Volta and later only
    return True


def bandwidth_GBps(sys_: NcclSystem, coll: Collective, algo: str, proto: str) -> float:
    """comm->bandwidths[coll][algo][proto]: the algorithm bandwidth NCCL's model assigns."""
    n, nn, ppn = sys_.nranks, sys_.nnodes, sys_.ppn
    nch = sys_.channels()
    ci, i2 = sys_.cc_index, (nn - 1 if nn <= 2 else 2)
    i1 = ci if nn == 1 else (1 if sys_.cpu_vendor == "amd" else 0)
    ll_max = LL_MAX_BW[i1][i2]
    intra, inter = sys_.per_channel(algo)
    collnet = algo in ("collnet_direct", "collnet_chain")
    bw = intra if nn <= 2 or collnet else inter
    if algo == "nvls":
        bw = min(intra, inter) if coll == Collective.ALL_REDUCE else min(intra * (ppn - 1) / ppn, inter * 0.9)
    if algo == "nvls_tree":
        bw = min(intra, inter if nn <= 2 else inter / 2)
    bus = nch * bw
    if algo == "ring" and proto == "ll":
        bus = min(ll_max, bus * .5)
    if algo == "ring" and proto == "ll128":
        bus = min(bus * 0.92, nch * PER_CH_MAX_RING_LL128[ci][i2])
    if algo == "tree" and coll == Collective.ALL_REDUCE:
        bus = min(bus * .92, nch * PER_CH_MAX_TREE[ci][i2])
    if algo == "tree" and proto == "ll":
        bus = min(bus / 3.8, ll_max)
    if algo == "tree" and proto == "ll128":
        bus = min(bus * (7.0 / 9.0 if nn == 1 else 120.0 / 128.0), nch * PER_CH_MAX_TREE_LL128[ci][i2])
    if algo == "pat":
        bus *= .75
    if algo == "collnet_direct":
        if coll in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            bus = ppn * min(intra, inter * 0.9)
        else:
            factor = ppn / nch
            factor -= (factor - 1) / 2
            bus /= factor
            if sys_.compcap >= 90:
                bus *= .85
    if not (algo != "ring" and coll in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)):
        if algo == "ring":
            nsteps = 2 * (n - 1) if coll == Collective.ALL_REDUCE else \
                n - 1 if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) else n
            bus *= n / nsteps
        elif algo in ("nvls", "nvls_tree"):
            bus *= 5.0 / 6.0
        else:
            bus *= .5
    return bus


def latency_us(sys_: NcclSystem, coll: Collective, algo: str, proto: str) -> float:
    """comm->latencies[coll][algo][proto]: NCCL's fixed cost of one call, microseconds."""
    p = PROTOS.index(proto)
    n, nn, ppn = sys_.nranks, sys_.nnodes, sys_.ppn
    hw = sys_.intra_hw if nn == 1 else "net"
    intra = HW_LAT[sys_.intra_hw][algo][p]
    inter = HW_LAT["net"]["tree" if ppn == 1 else algo][p]
    lat = BASE_LAT[algo][p]
    local = n // nn
    if algo == "ring":
        nsteps = 2 * (n - 1) if coll == Collective.ALL_REDUCE else \
            n - 1 if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) else n
        if coll in (Collective.REDUCE, Collective.BROADCAST):
            return lat + nsteps * (HW_LAT[hw]["tree"][p] if proto == "simple" else HW_LAT[hw]["ring"][p])
        overhead = NET_OVERHEAD_US.get(sys_.cpu_vendor, 1.0) * (3 if proto == "simple" else 1) if nn > 1 else 0.0
        intra = max(intra, overhead)
        ninter = 0 if nn == 1 else 2 * (nn - 1) if coll == Collective.ALL_REDUCE else nn - 1
        return lat + (nsteps - ninter) * intra + ninter * inter
    if algo == "tree":
        return lat + (2 * ((local - 1) * intra + _log2i(nn) * inter) if coll == Collective.ALL_REDUCE else 0)
    if algo == "collnet_direct":
        return lat + 2 * (min(1, local - 1) * intra + (local - 1) * 0.4) + inter
    if algo == "collnet_chain":
        return lat + 2 * (local - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nn > 1 else 0.0)
    if algo == "nvls_tree":
        return lat + intra + 2 * _log2i(nn) * inter
    return 8 + _log2i(nn) * (inter / 3.5) + n * 2.8    # pat


def algo_time_us(sys_: NcclSystem, coll: Collective, algo: str, proto: str, nbytes: int) -> float | None:
    """ncclTopoGetAlgoTime: predicted microseconds, None where NCCL disables the pair."""
    if not enabled(sys_, coll, algo, proto):
        return None
    bw = bandwidth_GBps(sys_, coll, algo, proto)
    if bw <= 0:
        return None
    lat = latency_us(sys_, coll, algo, proto)
    log_size = _log2i(nbytes >> 6) if nbytes >= 64 else -1
    if algo == "tree" and coll == Collective.ALL_REDUCE and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOS.index(proto)][log_size]
    if algo == "ring" and proto == "simple" and sys_.nnodes > 1 and coll == Collective.ALL_REDUCE \
            and nbytes / (2 * sys_.channels() * sys_.nranks) >= 64:
        lat *= 1.9 if sys_.compcap < 80 else 1.4    # ring plateau (comm->nChannels: duplicated channels)
    return lat + nbytes / (1000 * bw)


def choose(sys_: NcclSystem, collective: Collective | str, nbytes: int) -> NcclChoice:
    """NCCL's (algorithm, protocol) for a call of `nbytes` (nccl-tests' size), cheapest predicted time."""
    coll = Collective.parse(collective)
    if coll not in _COLL:
        raise InvalidArgument(f"NCCL's tuning model covers broadcast, reduce, all_gather, reduce_scatter and "
                              f"all_reduce, not {coll.value}", "leave out --nccl for this collective")
    if sys_.nranks == 1:
        return NcclChoice(coll, nbytes, "ring", "simple", 0.0, {("ring", "simple"): 0.0})
    cands = {(a, p): t for a in ALGOS for p in PROTOS
             if (t := algo_time_us(sys_, coll, a, p, max(int(nbytes), 0))) is not None}
    if not cands:   # NCCL falls back to ring when nothing is enabled
        cands = {("ring", "simple"): latency_us(sys_, coll, "ring", "simple")
                 + nbytes / (1000 * bandwidth_GBps(sys_, coll, "ring", "simple"))}
    (a, p), t = min(cands.items(), key=lambda kv: (kv[1], ALGOS.index(kv[0][0]), PROTOS.index(kv[0][1])))
    return NcclChoice(coll, int(nbytes), a, p, t, cands)


# ------------------------------------------------------------------------------------------- topology -> system
def _compcap(model: str) -> int:
    m = (model or "").upper()
    for prefix, cc in (("GB", 100), ("B", 100), ("H", 90), ("A", 80), ("V", 70), ("P", 60)):
        if m.startswith(prefix):
            return cc
    return 80


def system_for(topo: Any, nranks: int, endpoints: Sequence[str] | None = None, params: Any = None,
               collnet: bool = False) -> NcclSystem:
    """The NcclSystem of `nranks` GPUs of `topo` (ranks on its first endpoints unless `endpoints`)."""
    from .nvls import nvls_switch
    from .params import params_for
    prm = params or params_for(topo)
    eps = list(endpoints) if endpoints is not None else list(topo.endpoints())[:nranks]
    if len(eps) < nranks:
        raise InvalidArgument(f"{nranks} ranks but the topology has {len(eps)} endpoints", "use --nodes N")
    g = topo.graph
    hosts = sorted({topo.host_of(e) for e in eps})
    nnodes = len(hosts)
    gpu = eps[0]
    eff = prm.link_efficiency
    nvl = sum(float(d["bw_GBps"]) for _, _, d in g.out_edges(gpu, data=True)
              if str(getattr(d.get("type"), "value", d.get("type"))) == "nvlink" and not d.get("c2c"))
    pcie = max((float(d["bw_GBps"]) for _, _, d in g.out_edges(gpu, data=True)
                if str(getattr(d.get("type"), "value", d.get("type"))) == "pcie"), default=0.0)
    nvswitch = any(str(getattr(g.nodes[v].get("kind"), "value", g.nodes[v].get("kind"))) == "nvswitch"
                   for _, v in g.out_edges(gpu))
    intra = nvl * eff.get("nvlink", 1.0) if nvl else pcie * eff.get("pcie", 1.0)
    first_host = [e for e in eps if topo.host_of(e) == hosts[0]]
    nics = topo.nics(host=hosts[0])[:len(first_host)]   # NCCL uses the NICs next to its GPUs (rail-local)
    inter = sum(float(g.nodes[x].get("speed_gbps", 0.0)) / 8.0   # the NICs a graph of <= 32 channels drives
                * eff.get(str(g.nodes[x].get("fabric", "ib")), eff.get("ib", 1.0)) for x in nics[:GRAPH_MAX_CHANNELS])
    cpus = topo.nodes(kind=None, host=hosts[0])
    vendor = "amd" if any("EPYC" in str(g.nodes[c].get("model", "")) for c in cpus) else "intel"
    return NcclSystem(nranks=nranks, nnodes=nnodes, compcap=_compcap(str(g.nodes[gpu].get("model", ""))),
                      bw_intra_GBps=intra, bw_inter_GBps=inter if nnodes > 1 else 0.0,
                      nchannels_intra=SEARCH_CHANNELS_NVSWITCH if nvswitch else 2, nics_per_node=len(nics),
                      intra_hw="nvlink" if nvl else "pci", nvswitch=nvswitch,
                      nvls=nvls_switch(topo, first_host) is not None, collnet=collnet, cpu_vendor=vendor)


# ------------------------------------------------------------------------------------------------ sim rows
# NCCL choices ringflow's simulator also runs (all of NCCL's, the switch schedules through `nvls.simulate_switch_*`)
SIMULATED = ("ring", "tree", "nvls", "pat", "nvls_tree", "collnet_direct", "collnet_chain")


def _simulated_us(topo: Any, coll: Collective, ch: NcclChoice, sys_: NcclSystem, size: int, nranks: int,
                  endpoints: Sequence[str] | None, params: Any, engine: str, dtype: str) -> float | None:
    """ringflow's simulation of NCCL's choice; None where the simulator does not run it (NVLS across servers)."""
    from .api import pipelines, segment_counts, simulate, simulate_table, table_for
    if ch.algorithm not in SIMULATED or nranks < 2:
        return None
    try:
        if ch.algorithm in ("nvls_tree", "collnet_direct", "collnet_chain"):
            from .nvls import simulate_switch_algorithm
            return float(simulate_switch_algorithm(topo, ch.algorithm, nranks, size, endpoints=endpoints,
                                                   params=params, engine=engine, dtype=dtype).time_us)
        if ch.algorithm == "tree" and sys_.nnodes > 1 and coll == Collective.ALL_REDUCE:
            from .nccl_tree import simulate_nccl_tree
            return float(simulate_nccl_tree(topo, nranks, size, endpoints=endpoints, params=params, engine=engine,
                                            dtype=dtype, protocol=ch.protocol).time_us)
        if ch.algorithm == "nvls":
            return simulate(topo, coll, size, algorithm="nvls", nranks=nranks, engine=engine, dtype=dtype,
                            params=params, endpoints=endpoints).time_us
        nch = sys_.run_channels() if ch.algorithm == "ring" else None
        counts: list[int | None] = list(segment_counts(size)) if pipelines(ch.algorithm, coll) else [None]
        return min(simulate_table(topo, table_for(topo, coll, nranks, ch.algorithm, endpoints=endpoints, nchannels=nch,
                                                  nsegs=c), size, engine=engine, dtype=dtype, params=params,
                                  protocol=ch.protocol, endpoints=endpoints).time_us for c in counts)
    except InvalidArgument:
        return None


def nccl_rows(topo: Any, collective: Collective | str, sizes: Sequence[int], nranks: int, *, dtype: str = "float32",
              engine: str = "analytic", params: Any = None, collnet: bool = False,
              endpoints: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per size: NCCL's choice, its predicted time (nccl-tests' time, algbw, busbw) and, for SIMULATED
    algorithms, ringflow's simulation of the same algorithm and protocol (`sim_time_us`, else None).
    `endpoints` places the ranks (default: the topology's first `nranks` endpoints)."""
    from .api import itemsize_of
    from .results import busbw_factor, count_for_size
    coll = Collective.parse(collective)
    sys_ = system_for(topo, nranks, endpoints, params=params, collnet=collnet)
    item = itemsize_of(dtype)
    rows = []
    for size in sizes:
        ch = choose(sys_, coll, size)
        sim_us = _simulated_us(topo, coll, ch, sys_, size, nranks, endpoints, params, engine, dtype)
        algbw = size / (ch.time_us * 1e3) if ch.time_us > 0 else 0.0
        rows.append({"collective": coll.value, "nranks": nranks, "size_bytes": int(size),
                     "count": count_for_size(coll, nranks, size, item), "dtype": dtype,
                     "time_us": round(ch.time_us, 4), "algbw_GBps": round(algbw, 4),
                     "busbw_GBps": round(algbw * busbw_factor(coll, nranks), 4), "wrong": None,
                     "algorithm": ch.algorithm, "engine": "nccl-model", "protocol": ch.protocol,
                     "sim_time_us": None if sim_us is None else round(sim_us, 4),
                     "nchannels": sys_.run_channels(), "source": NCCL_TUNING_SOURCE})
    return rows
