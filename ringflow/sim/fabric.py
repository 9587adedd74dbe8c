"""The topology as the engines see it: numbered links, rank placement and routed paths.

`Fabric` numbers every directed edge of the topology graph (link id), keeps per-link
arrays (achievable capacity in bytes/us, line rate, latency, type, tier) and resolves the
path of a (sender rank, receiver rank, channel) into sub-flows: one or more link lists
with the share of the message each carries (see SimParams.routing_*).
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from ..errors import TopologyError
from ..hardware.nvlink import edge_efficiency_scale
from .params import SimParams
from .topocache import per_topology


def _val(x: Any) -> str:
    return str(getattr(x, "value", x))


@dataclass
class PairRoute:
    """How one (src, dst, channel) message travels: sub-paths, their shares, fixed costs."""

    paths: list[np.ndarray]   # link ids per sub-path
    weights: np.ndarray       # share of the bytes per sub-path (sums to 1)
    latency_us: float         # sum of link latencies along the (first) path
    link_class: str           # one of params.LINK_CLASSES


@dataclass(frozen=True)
class _Links:
    """The numbered links of a topology under one set of parameters (shared, never modified)."""

    edge_index: dict[tuple[str, str], int]
    edges: list[tuple[str, str]]
    link_type: list[str]
    link_tier: list[str]
    line_Bpus: np.ndarray
    cap_Bpus: np.ndarray
    lat_us: np.ndarray


_LINKS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _links_of(topo: Any, params: SimParams) -> _Links:
    """Every directed edge of the topology graph as a link id with its arrays; cached per topology, node count
    and link efficiencies (a cluster of 16,384 GPUs has ~200k links: read once, not once per rank placement)."""
    g = topo.graph
    stamp = (id(g), len(g))   # as fabric_for and endpoints_of: a topology is not edited once simulated
    per = per_topology(_LINKS, topo)
    if per.get("stamp") != stamp:
        per.clear()
        per["stamp"] = stamp
    eff_key = tuple(sorted(params.link_efficiency.items()))
    hit = per.get(eff_key)
    if hit is not None:
        return hit
    if "base" not in per:
        per["base"] = _read_links(g)
    links, scale, types, type_code = per["base"]
    eff_of_type = np.array([params.link_efficiency.get(t, 1.0) for t in types] or [1.0])
    cap = links.line_Bpus * (eff_of_type[type_code] * scale)
    if np.any(cap <= 0):
        bad = [links.edges[i] for i in np.flatnonzero(cap <= 0)[:3]]
        raise TopologyError(f"links without bandwidth: {bad}", "every edge needs bw_GBps > 0")
    hit = per[eff_key] = dataclasses.replace(links, cap_Bpus=cap)
    for arr in (hit.line_Bpus, hit.cap_Bpus, hit.lat_us):
        arr.setflags(write=False)
    if len(per) > 10:
        per.pop(next(k for k in per if k not in ("stamp", "base")))
    return hit


def _read_links(g: Any) -> tuple[_Links, np.ndarray, list[str], np.ndarray]:
    """The graph's links (capacities not set), each one's efficiency scale, the link types, each one's type."""
    edges: list[tuple[str, str]] = []
    link_type: list[str] = []
    link_tier: list[str] = []
    bw: list[float] = []
    lat: list[float] = []
    scale: list[float] = []
    names: dict[Any, str] = {}   # a link type or tier's name, read once per distinct value
    for u, nbrs in g.adjacency():   # one pass, in g.edges order
        for v, d in nbrs.items():
            edges.append((u, v))
            t = d.get("type", "")
            tn = names.get(t) or names.setdefault(t, _val(t))
            link_type.append(tn)
            tier = d.get("tier") or t
            link_tier.append(names.get(tier) or names.setdefault(tier, _val(tier)))
            bw.append(float(d.get("bw_GBps", 0.0)) * 1e3)
            lat.append(float(d.get("latency_us", 0.0)))
            scale.append(edge_efficiency_scale(d) if tier == "nvlink" else 1.0)
    types = sorted(set(link_type))
    code = {t: i for i, t in enumerate(types)}
    links = _Links({e: i for i, e in enumerate(edges)}, edges, link_type, link_tier, np.array(bw), np.zeros(0),
                   np.array(lat))
    return links, np.array(scale), types, np.array([code[t] for t in link_type], dtype=np.int64)


class Fabric:
    """Links and routes of a topology for a given rank placement and parameters."""

    def __init__(self, topo: Any, params: SimParams, endpoints: Sequence[str] | None = None) -> None:
        self.topo = topo
        self.params = params
        self.endpoints = list(endpoints) if endpoints is not None else list(topo.endpoints())
        if not self.endpoints:
            raise TopologyError(f"topology {getattr(topo, 'name', '?')!r} has no endpoints (GPUs or PROCs)",
                                "add GPU or PROC nodes, or pick another preset")
        links = _links_of(topo, params)
        self.edge_index: dict[tuple[str, str], int] = links.edge_index
        self.edges, self.link_type, self.link_tier = links.edges, links.link_type, links.link_tier
        self.line_Bpus, self.cap_Bpus, self.lat_us = links.line_Bpus, links.cap_Bpus, links.lat_us
        self.nlinks = len(links.edges)
        self._routes: dict[tuple[int, int, int], PairRoute] = {}
        self._pair_paths: dict[tuple[int, int], list[list[str]]] = {}
        self._hosts = [topo.host_of(e) for e in self.endpoints]
        self._ep_link: list[int] | None = None
        self._pool_link: dict[int, int] = {}
        self._add_cpu_links()

    def _add_cpu_links(self) -> None:
        """Virtual links for CPU-moved bytes: one per rank (its copy engine), one pool per host."""
        cpu = self.params.cpu
        eprate = cpu.endpoint_GBps
        if not eprate:
            return
        rate = eprate.get(cpu.transport) or next(iter(eprate.values()))
        caps: list[float] = []
        names: list[tuple[tuple[str, str], str]] = []
        self._ep_link = []
        for e in self.endpoints:
            self._ep_link.append(self.nlinks + len(caps))
            caps.append(rate * 1e3)
            names.append(((e, e), "endpoint"))
        if cpu.host_cores or cpu.host_pool_GBps:
            pool = cpu.host_pool_GBps or rate * int(cpu.host_cores or 1)
            for h in sorted(set(self._hosts)):
                self._pool_link[h] = self.nlinks + len(caps)
                caps.append(pool * 1e3)
                names.append(((f"cpu{h}", f"cpu{h}"), "cpu"))
        self._append_links(np.asarray(caps), np.zeros(len(caps)), names)

    def _append_links(self, cap: np.ndarray, lat_us: np.ndarray, names: list) -> None:
        self.cap_Bpus = np.concatenate([self.cap_Bpus, cap])
        self.line_Bpus = np.concatenate([self.line_Bpus, cap])
        self.lat_us = np.concatenate([self.lat_us, lat_us])
        # new lists: the topology's own links are shared by every Fabric of it (`_links_of`)
        self.edges = self.edges + [edge for edge, _ in names]
        self.link_type = self.link_type + [tier for _, tier in names]
        self.link_tier = self.link_tier + [tier for _, tier in names]
        self.nlinks += cap.size

    def transfer_work(self, table: Any) -> np.ndarray:
        """Per transfer of `table`: the link time its bytes take per byte (1 / the NVLS efficiency for
        switch operations; else 1)."""
        w = np.ones(table.ntransfers)
        if table.in_switch is not None:
            from .nvls import efficiency, require_nvls
            _, gen = require_nvls(self.topo, self.endpoints[:table.nranks], table.collective)
            w[table.in_switch > 0] /= efficiency(self.params, gen)
        return w

    def _cpu_wrap(self, src: int, dst: int, ids: np.ndarray) -> np.ndarray:
        """`ids` between the sender's engine and host pool and the receiver's (CPU hosts; else `ids`)."""
        if self._ep_link is None:
            return ids
        head, tail = [self._ep_link[src]], [self._ep_link[dst]]
        if self._pool_link:
            head.append(self._pool_link[self._hosts[src]])
            tail.insert(0, self._pool_link[self._hosts[dst]])
        return np.concatenate([np.asarray(head, dtype=np.int64), ids, np.asarray(tail, dtype=np.int64)])

    def local_us_per_byte(self, table: Any) -> np.ndarray:
        """Microseconds per byte of B of every (rank, step) local-work entry of `table`: copies at
        copy_GBps, reductions at reduce_GBps (free where None), slower where the host has fewer cores
        than ranks (`local_slowdown`)."""
        cpu = self.params.cpu
        per = np.zeros(table.lrank.size)
        if cpu.copy_GBps:
            per += table.lcopy / (cpu.copy_GBps * 1e3)
        if cpu.reduce_GBps:
            per += table.lreduce / (cpu.reduce_GBps * 1e3)
        return per * self.local_slowdown(table.nranks)[table.lrank]

    def local_slowdown(self, nranks: int) -> np.ndarray:
        """Per rank: how much slower its local work runs when its host has fewer cores than ranks."""
        cores = self.params.cpu.host_cores
        hosts = np.asarray(self._hosts[:nranks])
        if not cores or hosts.size == 0:
            return np.ones(nranks)
        _, inv, cnt = np.unique(hosts, return_inverse=True, return_counts=True)
        return np.maximum(1.0, cnt[inv.reshape(-1)] / float(cores))

    @property
    def nranks(self) -> int:
        """Ranks placed (one per endpoint)."""
        return len(self.endpoints)

    def host(self, rank: int) -> int:
        """Host index of a rank."""
        return self._hosts[rank]

    def _link_ids(self, path: list[str]) -> np.ndarray:
        try:
            return np.array([self.edge_index[(a, b)] for a, b in pairwise(path)], dtype=np.int64)
        except KeyError as exc:
            raise TopologyError(f"path {path} uses a missing edge {exc}", "check the topology's links") from None

    def _classify(self, ids: np.ndarray) -> str:
        types = {self.link_type[i] for i in ids}
        if types & {"ib", "ethernet"}:
            return "net"
        if "loopback" in types:
            return "tcp"
        if "shm" in types:
            return "shm"
        if "nvlink" in types:
            return "nvlink"
        return "pci"

    def _host_types(self, src: int, dst: int) -> set[str] | None:
        ht = self.params.cpu.host_transport
        if ht == "auto" or self._hosts[src] != self._hosts[dst]:
            return None
        a, b = self.endpoints[src], self.endpoints[dst]
        kind = lambda n: _val(self.topo.graph.nodes[n].get("kind"))  # noqa: E731
        if kind(a) != "proc" or kind(b) != "proc":
            return None
        return {"loopback"} if ht == "tcp" else {"shm"}

    def _typed_path(self, a: str, b: str, types: set[str]) -> list[str]:
        import networkx as nx
        g = self.topo.graph
        view = nx.subgraph_view(g, filter_edge=lambda u, v: _val(g.edges[u, v].get("type")) in types)
        try:
            return nx.shortest_path(view, a, b)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise TopologyError(f"no {'/'.join(sorted(types))} path from {a} to {b}",
                                "the topology needs those links for this host transport") from None

    def route(self, src: int, dst: int, chan: int = 0) -> PairRoute:
        """The route of a message from rank `src` to rank `dst` on channel `chan` (cached)."""
        mode = self.params.routing_intra if self._hosts[src] == self._hosts[dst] else self.params.routing_inter
        key = (src, dst, chan if mode == "ecmp" else 0)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        a, b = self.endpoints[src], self.endpoints[dst]
        if a == b:
            raise TopologyError(f"ranks {src} and {dst} sit on the same endpoint {a}",
                                "give each rank its own GPU / PROC")
        restrict = self._host_types(src, dst)
        if restrict is not None:
            paths = [self._typed_path(a, b, restrict)]
        elif mode == "fixed":
            paths = [self.topo.path(a, b)]
        else:
            known = self._pair_paths.get((src, dst))
            if known is None:   # the equal-cost set, once for every channel between the pair
                known = self._pair_paths[(src, dst)] = list(self.topo.paths(a, b)) or [self.topo.path(a, b)]
            paths = known
        if mode == "ecmp" and len(paths) > 1:
            paths = [paths[(src * 1_000_003 + dst * 7919 + chan * 104_729) % len(paths)]]
        ids = [self._link_ids(p) for p in paths]
        if len(ids) == 1:
            w = np.ones(1)
        else:  # spray in proportion to each path's bottleneck capacity
            bott = np.array([self.cap_Bpus[i].min() for i in ids])
            w = bott / bott.sum()
        cls = self._classify(ids[0])
        ids = [self._cpu_wrap(src, dst, i) for i in ids]
        route = PairRoute(ids, w, float(self.lat_us[ids[0]].sum()), cls)
        self._routes[key] = route
        return route


_FABRICS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def fabric_for(topo: Any, params: SimParams, endpoints: Sequence[str] | None = None) -> Fabric:
    """A cached Fabric per (topology object, parameters, placement)."""
    key = (repr(params), tuple(endpoints) if endpoints is not None else None)
    try:
        per = _FABRICS.setdefault(topo, {})
    except TypeError:  # unhashable / no weakref: no caching
        return Fabric(topo, params, endpoints)
    fab = per.get(key)
    if fab is None:
        fab = per[key] = Fabric(topo, params, endpoints)
    return fab


def ragged(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges [starts[i], starts[i] + counts[i]) and the owner i of each element."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    owner = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    if total == 0:
        return np.zeros(0, dtype=np.int64), owner
    offs = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + offs, owner


@dataclass
class Flows:
    """A transfer table routed on a fabric: sub-flows and their link incidence."""

    t_lat_us: np.ndarray     # [T] path latency per transfer
    t_class: np.ndarray      # [T] index into params.LINK_CLASSES
    t_flow_ptr: np.ndarray   # [T+1] CSR: flows of each transfer
    f_transfer: np.ndarray   # [F] owning transfer (sorted)
    f_frac: np.ndarray       # [F] bytes / count_bytes carried by the sub-flow
    f_pair_ptr: np.ndarray   # [F+1] CSR: incidence pairs of each flow
    p_flow: np.ndarray       # [P] flow of each (flow, link) pair (sorted)
    p_link: np.ndarray       # [P] link id
    p_weight: np.ndarray | None = None   # [P] share of the flow's bytes the link carries (`nvls`); None: 1

    def pair_frac(self) -> np.ndarray:
        """[P] bytes per byte of the call's count each (flow, link) pair puts on its link: the flow's
        bytes, counted once per switch operation on the link its rows share (`p_weight`)."""
        frac = self.f_frac[self.p_flow]
        return frac if self.p_weight is None else frac * self.p_weight


def route_table(table: Any, fab: Fabric) -> Flows:
    """Resolve every transfer of `table` into sub-flows on `fab` (routes cached per pair)."""
    from .params import LINK_CLASSES
    if table.nranks > fab.nranks:
        raise TopologyError(f"the schedule has {table.nranks} ranks but the topology places only "
                            f"{fab.nranks} endpoints", "use a bigger topology (--nodes) or fewer ranks")
    key = (table.src * (table.nranks + 1) + table.dst) * (int(table.chan.max(initial=0)) + 1) + table.chan
    own = None
    if table.in_switch is not None:   # a GPU's own leg to / from its switch (`nvls`): routed by its kind
        from .nvls import REDUCE, require_nvls
        switch, _ = require_nvls(fab.topo, fab.endpoints[:table.nranks], table.collective)
        own = table.src == table.dst
        key = key * 3 + np.where(own, table.in_switch, 0)
    ukey, uinv = np.unique(key, return_inverse=True)
    uinv = uinv.reshape(-1)
    first = np.zeros(ukey.size, dtype=np.int64)
    first[uinv[::-1]] = np.arange(key.size - 1, -1, -1)
    u_nsub, u_lat, u_cls = [], [], []
    sub_w: list[float] = []
    sub_len: list[int] = []
    sub_links: list[np.ndarray] = []
    for t in first:
        if own is not None and own[t]:
            ep = fab.endpoints[int(table.src[t])]
            leg = fab._link_ids([ep, switch] if table.in_switch[t] == REDUCE else [switch, ep])
            r = PairRoute([leg], np.ones(1), float(fab.lat_us[leg].sum()), fab._classify(leg))
        else:
            r = fab.route(int(table.src[t]), int(table.dst[t]), int(table.chan[t]))
        u_nsub.append(len(r.paths))
        u_lat.append(r.latency_us)
        u_cls.append(LINK_CLASSES.index(r.link_class))
        sub_w.extend(r.weights.tolist())
        sub_len.extend(len(p) for p in r.paths)
        sub_links.extend(r.paths)
    u_nsub_a = np.asarray(u_nsub, dtype=np.int64)
    u_sub_start = np.cumsum(u_nsub_a) - u_nsub_a
    sub_len_a = np.asarray(sub_len, dtype=np.int64)
    sub_link_start = np.cumsum(sub_len_a) - sub_len_a
    sub_links_a = np.concatenate(sub_links) if sub_links else np.zeros(0, dtype=np.int64)
    sub_w_a = np.asarray(sub_w)
    t_nsub = u_nsub_a[uinv]
    f_sub, f_transfer = ragged(u_sub_start[uinv], t_nsub)
    t_flow_ptr = np.concatenate([[0], np.cumsum(t_nsub)])
    f_len = sub_len_a[f_sub]
    pidx, p_flow = ragged(sub_link_start[f_sub], f_len)
    p_link = sub_links_a[pidx]
    weight = None
    if table.in_switch is not None:
        from .nvls import switch_weights
        weight = switch_weights(table, f_transfer, p_flow, p_link)
    return Flows(np.asarray(u_lat)[uinv], np.asarray(u_cls, dtype=np.int64)[uinv], t_flow_ptr, f_transfer,
                 table.frac[f_transfer] * sub_w_a[f_sub], np.concatenate([[0], np.cumsum(f_len)]),
                 p_flow, p_link, weight)
