"""The typed topology graph: devices as nodes, links as directed edges, and the queries on it.

Both directions of a link are separate edges of a `networkx.DiGraph` so each direction has its own
bandwidth (per direction, GB/s = 1e9 B/s) and its own load in the simulator.

Node attributes: kind (NodeKind), host (server index, -1 for fabric switches), index (GPU number as
nvidia-smi prints it; per-host counter for other kinds), label, plus extras (model, numa, speed_gbps,
rail, tier, chips ...). Edge attributes: type (LinkType), bw_GBps, latency_us, nlinks, tier
("nvlink", "pcie", "qpi", "nic", "leaf-spine", "spine-core", "shm", "loopback") plus extras
(root: the host bridge a PCIe uplink enters, which separates PHB from NODE).

Routing (fixed, deterministic; see `routing.py`): NVLink first (direct or through NVSwitches), then the
widest PCIe/CPU path, and between hosts: GPU -> nearest NIC (same PCIe switch, same rail when possible)
-> leaf -> spine (-> core) -> leaf -> NIC -> GPU. `paths()` gives the ECMP set over spines/cores.
"""
from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

import networkx as nx

from ..errors import TopologyError

if TYPE_CHECKING:  # pragma: no cover
    from .routing import Router

#: the attributes of one node or link: the schema's fields (kind, host, index, type, bw_GBps, ...) plus free-form
#: extras from topology files, so genuinely dynamic
Attrs = dict[str, Any]
#: networkx's raw adjacency of a DiGraph: node -> neighbour -> the link's attributes
Adjacency = dict[str, dict[str, Attrs]]


class NodeKind(str, Enum):
    """What a node is."""

    GPU = "gpu"
    PROC = "proc"                # a CPU process slot that runs a rank on a GPU-less host
    CPU = "cpu"
    NIC = "nic"
    PCIE_SWITCH = "pcie_switch"
    NVSWITCH = "nvswitch"
    NET_SWITCH = "net_switch"


class LinkType(str, Enum):
    """What a link is."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    QPI = "qpi"                  # QPI / UPI / xGMI socket link
    IB = "ib"
    ETHERNET = "ethernet"
    SHM = "shm"                  # host shared memory between PROCs
    LOOPBACK = "loopback"        # TCP over the host's loopback


TIERS = ("nvlink", "pcie", "qpi", "nic", "leaf-spine", "spine-core", "shm", "loopback")
_DEFAULT_TIER = {LinkType.NVLINK: "nvlink", LinkType.PCIE: "pcie", LinkType.QPI: "qpi", LinkType.IB: "nic",
                 LinkType.ETHERNET: "nic", LinkType.SHM: "shm", LinkType.LOOPBACK: "loopback"}
ENDPOINT_KINDS = (NodeKind.GPU, NodeKind.PROC)


class Topology:
    """A machine or cluster: a directed graph of devices and links with routing queries."""

    def __init__(self, name: str = "custom", meta: dict[str, Any] | None = None) -> None:
        self.name = name
        self.meta: dict[str, Any] = dict(meta or {})
        self.graph: nx.DiGraph[str] = nx.DiGraph()
        self._counters: dict[tuple[int, str], int] = {}
        self._router: Router | None = None
        self._hosts: list[int] | None = None

    # ----------------------------------------------------------------- building
    def add_node(self, node_id: str, kind: NodeKind, host: int = 0, index: int | None = None, **attrs: Any) -> str:
        """Add a device; `index` defaults to a per-host, per-kind counter. Returns the id."""
        kind = NodeKind(kind)
        if node_id in self.graph:
            raise TopologyError(f"node {node_id!r} already exists", "give every node a unique id")
        key = (int(host), kind.value)
        if index is None:
            index = self._counters.get(key, 0)
        self._counters[key] = max(self._counters.get(key, 0), int(index) + 1)
        attrs.setdefault("label", node_id)
        self.graph.add_node(node_id, kind=kind, host=int(host), index=int(index), **attrs)
        self.invalidate()
        return node_id

    def add_link(self, a: str, b: str, type: LinkType, bw_GBps: float, latency_us: float,  # noqa: A002
                 nlinks: int = 1, tier: str | None = None, bidirectional: bool = True, **attrs: Any) -> None:
        """Add a link a->b (and b->a when bidirectional) with per-direction bandwidth and latency."""
        self.graph.add_edges_from(self._link_edges(a, b, type, bw_GBps, latency_us, nlinks, tier, bidirectional,
                                                   attrs))
        self.invalidate()

    def add_links(self, links: Iterable[tuple[str, str, LinkType, float, float, int, str | None]]) -> None:
        """Add bidirectional links (a, b, type, bw_GBps, latency_us, nlinks, tier), in order, as `add_link` does
        one by one."""
        rows: list[tuple[str, str, Attrs]] = []
        for a, b, type_, bw_GBps, latency_us, nlinks, tier in links:
            rows.extend(self._link_edges(a, b, type_, bw_GBps, latency_us, nlinks, tier, True, {}))
        g = self.graph
        if type(g) is nx.DiGraph:   # what add_edges_from does with rows whose nodes exist, without its checks
            succ, pred = successors(g), predecessors(g)
            for u, v, d in rows:
                have = succ[u].get(v)
                if have is not None:   # a repeated link updates the attributes of the one there
                    have.update(d)
                    d = have
                succ[u][v] = d
                pred[v][u] = d
            nx._clear_cache(g)
        else:
            g.add_edges_from(rows)
        self.invalidate()

    def _link_edges(self, a: str, b: str, type_: LinkType, bw_GBps: float, latency_us: float, nlinks: int,
                    tier: str | None, bidirectional: bool, attrs: Attrs) -> list[tuple[str, str, Attrs]]:
        """The checked edge a->b (and b->a) of one link, with its attributes."""
        type_ = type_ if type(type_) is LinkType else LinkType(type_)
        for n in (a, b):
            if n not in self.graph:
                raise TopologyError(f"link {a}->{b}: node {n!r} does not exist", "add the node before its links")
        if a == b:
            raise TopologyError(f"link {a}->{b} is a self-loop", "links join two different nodes")
        if not bw_GBps > 0:
            raise TopologyError(f"link {a}->{b}: bw_GBps={bw_GBps!r} must be > 0", "give the per-direction GB/s")
        if latency_us < 0:
            raise TopologyError(f"link {a}->{b}: latency_us={latency_us!r} must be >= 0", "give microseconds")
        tier = tier or _DEFAULT_TIER[type_]
        if tier not in TIERS:
            raise TopologyError(f"link {a}->{b}: tier {tier!r} is not known", f"use one of {', '.join(TIERS)}")
        data = dict(type=type_, bw_GBps=float(bw_GBps), latency_us=float(latency_us), nlinks=int(nlinks),
                    tier=tier, **attrs)
        return [(a, b, data), (b, a, dict(data))] if bidirectional else [(a, b, data)]

    def invalidate(self) -> None:
        """Forget cached routes; call after changing edge bandwidths or the graph directly."""
        self._router = None
        self._hosts = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_router"] = None          # caches are rebuilt on demand
        state["_hosts"] = None
        return state

    # ----------------------------------------------------------------- lookups
    def kind(self, node: str) -> NodeKind:
        """The NodeKind of a node."""
        return cast(NodeKind, self._attrs(node)["kind"])

    def _attrs(self, node: str) -> Attrs:
        try:
            return self.graph.nodes[node]
        except KeyError:
            raise TopologyError(f"node {node!r} is not in topology {self.name!r}",
                                "use an id from topo.endpoints() / topo.graph.nodes") from None

    def nodes(self, kind: NodeKind | None = None, host: int | None = None) -> list[str]:
        """Nodes of a kind (and host), sorted by (host, index, id)."""
        keyed = sorted((d["host"], d["index"], n) for n, d in self.graph.nodes(data=True)
                       if (kind is None or d["kind"] == kind) and (host is None or d["host"] == host))
        return [n for _, _, n in keyed]

    def endpoints(self) -> list[str]:
        """The nodes that run ranks (GPUs, else PROCs) in global rank order: sorted by (host, index)."""
        gpus = self.nodes(NodeKind.GPU)
        return gpus if gpus else self.nodes(NodeKind.PROC)

    def gpus(self, host: int | None = None) -> list[str]:
        """GPU nodes (of one host), sorted by (host, index)."""
        return self.nodes(NodeKind.GPU, host)

    def nics(self, host: int | None = None) -> list[str]:
        """NIC nodes (of one host), sorted by (host, index)."""
        return self.nodes(NodeKind.NIC, host)

    def hosts(self) -> list[int]:
        """Server indices that hold devices (fabric switches, host -1, excluded)."""
        if self._hosts is None:
            self._hosts = sorted({d["host"] for _, d in self.graph.nodes(data=True) if d["host"] >= 0})
        return list(self._hosts)

    def host_of(self, node: str) -> int:
        """The server index of a node."""
        return int(self._attrs(node)["host"])

    def host_groups(self, endpoints: list[str] | None = None) -> list[list[int]]:
        """Rank indices (positions in `endpoints`) grouped per host, hosts in ascending order."""
        eps = self.endpoints() if endpoints is None else list(endpoints)
        groups: dict[int, list[int]] = {}
        for r, n in enumerate(eps):
            groups.setdefault(self.host_of(n), []).append(r)
        return [groups[h] for h in sorted(groups)]

    def link(self, u: str, v: str) -> Attrs:
        """The attribute dict of edge u->v (live: writing to it changes the topology; then `invalidate()`)."""
        try:
            return self.graph.edges[u, v]
        except KeyError:
            raise TopologyError(f"there is no link {u}->{v} in topology {self.name!r}",
                                "use consecutive nodes of topo.path(a, b)") from None

    def label(self, node: str) -> str:
        """Short display name: GPU3, NIC1, CPU0, ... (prefixed with the host when there are several)."""
        d = self._attrs(node)
        short = {NodeKind.GPU: "GPU", NodeKind.PROC: "PROC", NodeKind.CPU: "CPU", NodeKind.NIC: "NIC",
                 NodeKind.PCIE_SWITCH: "PCISW", NodeKind.NVSWITCH: "NVSW", NodeKind.NET_SWITCH: "SW"}[d["kind"]]
        name = f"{short}{d['index']}"
        if d["kind"] == NodeKind.NET_SWITCH:
            return str(d.get("label", node))
        return name if len(self.hosts()) <= 1 else f"h{d['host']}/{name}"

    def find(self, label_or_id: str, host: int = 0) -> str:
        """A node by id or by display label ('GPU3', 'NIC0') on `host`."""
        if label_or_id in self.graph:
            return label_or_id
        text = label_or_id.upper()
        for kind, short in ((NodeKind.GPU, "GPU"), (NodeKind.NIC, "NIC"), (NodeKind.CPU, "CPU"),
                            (NodeKind.PROC, "PROC")):
            if text.startswith(short) and text[len(short):].isdigit():
                idx = int(text[len(short):])
                for n in self.nodes(kind, host):
                    if self.graph.nodes[n]["index"] == idx:
                        return n
        raise TopologyError(f"no node {label_or_id!r} on host {host} of {self.name!r}",
                            "use GPU<i>, NIC<i>, CPU<i> or a node id")

    # ----------------------------------------------------------------- routing queries
    @property
    def router(self) -> Router:
        """The (cached) router; rebuilt after any change."""
        if self._router is None:
            from .routing import Router
            self._router = Router(self)
        return self._router

    def path(self, a: str, b: str) -> list[str]:
        """The routed path a -> b (fixed, deterministic routing; see module docstring)."""
        return self.router.path(a, b)

    def paths(self, a: str, b: str, limit: int = 16) -> list[list[str]]:
        """The equal-cost paths a -> b (ECMP over spines/cores); the first is `path(a, b)`."""
        return self.router.paths(a, b, limit)

    @staticmethod
    def path_edges(path: list[str]) -> list[tuple[str, str]]:
        """Consecutive (u, v) pairs of a path."""
        return list(pairwise(path))

    def bottleneck_GBps(self, a: str, b: str) -> float:
        """Minimum per-direction bandwidth along path(a, b) (inf when a == b)."""
        edges = self.path_edges(self.path(a, b))
        return cast(float, min((self.graph.edges[e]["bw_GBps"] for e in edges), default=float("inf")))

    def latency_us(self, a: str, b: str) -> float:
        """Sum of link latencies along path(a, b)."""
        return cast(float, sum(self.graph.edges[e]["latency_us"] for e in self.path_edges(self.path(a, b))))

    def path_class_smi(self, a: str, b: str) -> str:
        """nvidia-smi topo -m vocabulary: X, NV#, PIX, PXB, PHB, NODE, SYS (NET across hosts)."""
        from .classes import smi_class
        return smi_class(self, a, b)

    def path_class_nccl(self, a: str, b: str) -> str:
        """NCCL vocabulary: LOC (same device), NVL, NVB, PIX, PXB, PHB, SYS, NET."""
        from .classes import nccl_class
        return nccl_class(self, a, b)

    # ----------------------------------------------------------------- (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """The documented, versioned schema (docs/topology.md)."""
        from .schema import topology_to_dict
        return topology_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        """Build from the schema; TopologyError names the bad field."""
        from .schema import topology_from_dict
        return topology_from_dict(d)

    def save(self, path: str) -> None:
        """Write as YAML (.yaml/.yml) or JSON (.json)."""
        from .schema import save_topology
        save_topology(self, path)

    @classmethod
    def load(cls, path: str) -> Topology:
        """Read a YAML/JSON topology file."""
        from .schema import load_topology_file
        return load_topology_file(path)

    def copy(self) -> Topology:
        """A deep copy (graph, meta)."""
        return Topology.from_dict(self.to_dict())

    def summary(self) -> dict[str, Any]:
        """Counts per node kind and link type, for display."""
        kinds: dict[str, int] = {}
        for _, d in self.graph.nodes(data=True):
            kinds[d["kind"].value] = kinds.get(d["kind"].value, 0) + 1
        links: dict[str, int] = {}
        for u, v, d in self.graph.edges(data=True):
            if u < v or not self.graph.has_edge(v, u):
                links[d["type"].value] = links.get(d["type"].value, 0) + 1
        return {"name": self.name, "hosts": len(self.hosts()), "endpoints": len(self.endpoints()),
                "nodes": kinds, "links": links}

    def __repr__(self) -> str:
        s = self.summary()
        return f"Topology({self.name!r}, hosts={s['hosts']}, endpoints={s['endpoints']}, nodes={s['nodes']})"


def successors(g: nx.DiGraph[str]) -> Adjacency:
    """The raw successor dicts of `g` (networkx's `g._succ`, live): the routing loops read them without
    building networkx's view objects on every step."""
    return cast(Adjacency, g._succ)  # type: ignore[attr-defined]


def node_attrs(g: nx.DiGraph[str]) -> dict[str, Attrs]:
    """The raw node attribute dicts of `g` (networkx's `g._node`, live)."""
    return cast(dict[str, Attrs], g._node)  # type: ignore[attr-defined]


def predecessors(g: nx.DiGraph[str]) -> Adjacency:
    """The raw predecessor dicts of `g` (networkx's `g._pred`, live)."""
    return cast(Adjacency, g._pred)  # type: ignore[attr-defined]
