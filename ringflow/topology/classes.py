"""Path classes in nvidia-smi's (NV#, PIX, PXB, PHB, NODE, SYS) and NCCL's (NVL, NVB, ...) vocabulary.

nvidia-smi topo -m legend: X = self; NV# = # NVLinks (through NVSwitches: the links of the GPU to the
fabric); PIX = at most one PCIe bridge; PXB = several PCIe bridges, no host bridge; PHB = through a
PCIe host bridge (the CPU); NODE = between host bridges within a NUMA node; SYS = across the SMP
interconnect (QPI/UPI) between NUMA nodes. NCCL (src/graph/topo.h): LOC, NVL, NVB (NVLink through an
intermediate GPU), PIX, PXB, PHB (NODE folds into PHB), SYS, NET (another host).
"""
from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

from .graph import LinkType, NodeKind, predecessors, successors

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Topology


def nvlink_count(topo: Topology, a: str, b: str) -> int:
    """NVLinks between a and b: a direct link, or through NVSwitch nodes only (0 if none)."""
    g = topo.graph
    if g.has_edge(a, b) and g.edges[a, b]["type"] == LinkType.NVLINK:
        return int(g.edges[a, b]["nlinks"])
    # through NVSwitch fabric: both attach by NVLink to NVSwitch nodes that are connected by NVLink
    succ = successors(g)
    sa = {s: d["nlinks"] for s, d in succ[a].items()
          if d["type"] == LinkType.NVLINK and g.nodes[s]["kind"] == NodeKind.NVSWITCH}
    sb = {s: d["nlinks"] for s, d in predecessors(g)[b].items()
          if d["type"] == LinkType.NVLINK and g.nodes[s]["kind"] == NodeKind.NVSWITCH}
    if not sa or not sb:
        return 0
    reach = set(sa)
    frontier = list(sa)
    while frontier:
        u = frontier.pop()
        for v, d in succ[u].items():
            if v not in reach and d["type"] == LinkType.NVLINK and g.nodes[v]["kind"] == NodeKind.NVSWITCH:
                reach.add(v)
                frontier.append(v)
    if not reach & set(sb):
        return 0
    return int(min(sum(sa.values()), sum(sb.values())))


def _pcie_class(topo: Topology, a: str, b: str) -> str:
    """PIX/PXB/PHB/NODE/SYS from the non-NVLink path between a and b inside one host."""
    g = topo.graph
    router = topo.router
    nodes = router._host_nodes[topo.host_of(a)]
    p = router._widest(a, b, nodes, lambda d: d.get("c2c", False)
                       or d["type"] not in (LinkType.NVLINK, LinkType.IB, LinkType.ETHERNET))
    if p is None:
        return "SYS"
    edges = list(pairwise(p))
    if any(g.edges[e]["type"] == LinkType.QPI for e in edges):
        return "SYS"
    transit = p[1:-1]
    cpus = [i for i, n in enumerate(transit, start=1) if g.nodes[n]["kind"] == NodeKind.CPU]
    if cpus:
        for i in cpus:
            r_in = g.edges[p[i - 1], p[i]].get("root", 0)
            r_out = g.edges[p[i], p[i + 1]].get("root", 0)
            if r_in != r_out:
                return "NODE"
        return "PHB"
    nsw = sum(1 for n in transit if g.nodes[n]["kind"] == NodeKind.PCIE_SWITCH)
    return "PIX" if nsw <= 1 else "PXB"


def smi_class(topo: Topology, a: str, b: str) -> str:
    """nvidia-smi class of the connection a <-> b (NET when on different hosts)."""
    if a == b:
        return "X"
    if topo.host_of(a) != topo.host_of(b):
        return "NET"
    k = nvlink_count(topo, a, b)
    if k:
        return f"NV{k}"
    return _pcie_class(topo, a, b)


def nccl_class(topo: Topology, a: str, b: str) -> str:
    """NCCL path type of a -> b."""
    if a == b:
        return "LOC"
    if topo.host_of(a) != topo.host_of(b):
        return "NET"
    if nvlink_count(topo, a, b):
        return "NVL"
    g = topo.graph
    if g.nodes[a]["kind"] == NodeKind.GPU and g.nodes[b]["kind"] == NodeKind.GPU:
        for k, d in successors(g)[a].items():
            if (d["type"] == LinkType.NVLINK and g.nodes[k]["kind"] == NodeKind.GPU
                    and nvlink_count(topo, k, b)):
                return "NVB"
    cls = _pcie_class(topo, a, b)
    return "PHB" if cls == "NODE" else cls
