"""Fixed, deterministic routing on a Topology, cached and structure-aware (fast on 1,024+ GPUs).

Path selection, in order:
1. same device: [a].
2. same host: NVLink first — the widest path that uses only NVLink edges (direct links, NVSwitches,
   NVLink-C2C); otherwise the widest path over PCIe / CPU / QPI (and SHM / loopback for PROCs);
   only if neither exists, a path relaying through a GPU (NCCL PXN/NVB, e.g. GB200 GPU -> another
   Grace's NIC via that Grace's GPU).
   "Widest" = maximal bottleneck bandwidth; ties go to fewer hops, then lower latency.
   GPUs, PROCs and NICs are never transit nodes inside a host.
3. different hosts: a -> the NIC nearest a (fewest hops, then widest; among equals the NIC on the
   rail the other side also reaches, then the endpoint's "own" NIC with the same index) -> leaf ->
   spine (-> core) -> leaf -> NIC nearest b -> b. The switch part is a shortest path in the switch
   graph; `paths()` returns the whole equal-cost set (ECMP), `path()` picks one of them by a stable
   hash of (a, b) so load spreads over spines like ECMP hashing does.
4. anything else (hand-made graphs without NICs/switch tiers): the widest path over the whole graph;
   if none exists without relaying through a GPU, the widest path that relays through one (NCCL's
   PXN/NVB: e.g. a GB200 GPU to the NIC of another Grace, via NVLink to that Grace's GPU).

Every result is cached per (a, b); the per-host searches touch only that host's nodes, so the cost of a
cross-host route does not grow with the cluster size (only the switch-level BFS does, cached per leaf pair).
"""
from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

from ..errors import TopologyError
from .graph import Attrs, LinkType, NodeKind, node_attrs, predecessors, successors

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Topology

_NO_TRANSIT = (NodeKind.GPU, NodeKind.PROC, NodeKind.NIC)
_MODES = ("nvlink", "all", "relay")
_NET_TYPES = (LinkType.IB, LinkType.ETHERNET)
_EPS = 1e-9
#: routes inside a host by the host's structure (`Router._shared_routes`), shared by every topology's router
_SharedRoutes = dict[tuple[str, str], tuple[str, list[tuple[str, list[str]]]]]
#: a node's links a search may take, as (to, bw_GBps, latency_us)
_Edges = Callable[[str], "list[tuple[str, float, float]]"]
_SHARED_INTRA: dict[tuple[Any, ...], _SharedRoutes] = {}
MAX_SHARED_HOSTS = 8
#: a host's local structure: its nodes (id without the host prefix, kind, index) and links (ends, type,
#: bandwidth, latency, nlinks); hosts with equal fingerprints share routes
_HostFingerprint = tuple[tuple[tuple[str, str, int], ...], tuple[tuple[str, str, str, float, float, int], ...]]


class Router:
    """Routes on one Topology; built lazily by `Topology.router` and dropped on any change."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.g = topo.graph
        self._succ = successors(self.g)
        self._pred = predecessors(self.g)
        self._cache: dict[tuple[str, str], list[str]] = {}
        self._intra_cache: dict[tuple[str, str, str], list[str] | None] = {}
        self._intra_done: set[tuple[str, str]] = set()
        self._rep_of: dict[int, int] = {}
        self._fp_rep: dict[int, tuple[int, _HostFingerprint]] = {}
        self._near: dict[str, list[str]] = {}
        self._sw_paths: dict[tuple[str, str], list[list[str]]] = {}
        self._sw_succ: dict[str, list[str]] | None = None
        self._sw_preds: dict[str, dict[str, list[str]]] = {}
        #: search.find_rings' results on this topology (with the link capacities they were found on)
        self.found_rings: dict[Any, Any] = {}
        self._host_nodes: dict[int, set[str]] = {}
        self._attrs = node_attrs(self.g)
        self._host_nics: dict[int, list[str]] = {}
        for n, d in self._attrs.items():
            self._host_nodes.setdefault(d["host"], set()).add(n)
        self._shared_of: dict[int, tuple[str, _SharedRoutes]] = {}
        #: per (host, NVLink only?): each node's links inside the host as (to, bw_GBps, latency_us), in graph order
        self._host_adj: dict[tuple[int, bool], dict[str, list[tuple[str, float, float]]]] = {}

    # ----------------------------------------------------------------- public
    def path(self, a: str, b: str) -> list[str]:
        """The routed path a -> b."""
        key = (a, b)
        p = self._cache.get(key)
        if p is None:
            p = self._route(a, b)
            self._cache[key] = p
        return list(p)

    def paths(self, a: str, b: str, limit: int = 16) -> list[list[str]]:
        """The equal-cost path set a -> b; the first entry equals path(a, b)."""
        first = self.path(a, b)
        ha, hb = self._host(a), self._host(b)
        if a == b or (ha == hb and ha >= 0):
            return [first]
        parts = self._inter_parts(a, b)
        if parts is None:
            return [first]
        p1, nets, p3 = parts
        out = [first]
        for net in nets:
            cand = p1[:-1] + net + p3[1:]
            if cand != first:
                out.append(cand)
            if len(out) >= limit:
                break
        return out

    # ----------------------------------------------------------------- dispatch
    def _host(self, n: str) -> int:
        try:
            return cast(int, self._attrs[n]["host"])
        except KeyError:
            raise TopologyError(f"node {n!r} is not in topology {self.topo.name!r}",
                                "use an id from topo.endpoints() / topo.graph.nodes") from None

    def _route(self, a: str, b: str) -> list[str]:
        ha, hb = self._host(a), self._host(b)
        if a == b:
            return [a]
        p: list[str] | None = None
        if ha == hb and ha >= 0:
            p = self._intra(a, b)
        elif ha >= 0 and hb >= 0:
            parts = self._inter_parts(a, b)
            if parts is not None:
                p1, nets, p3 = parts
                net = nets[zlib.crc32(f"{a}|{b}".encode()) % len(nets)]
                p = p1[:-1] + net + p3[1:]
        if p is None:
            p = self._widest(a, b, None, lambda d: True)
        if p is None:   # relay through a GPU (NCCL's PXN/NVB), e.g. to a NIC only another GPU's CPU reaches
            p = self._widest(a, b, None, lambda d: True, blocked=(NodeKind.PROC,))
        if p is None:
            raise TopologyError(f"no route from {a} to {b} in topology {self.topo.name!r}",
                                "connect them (a NIC and a network switch between hosts, or a link)")
        return p

    # ----------------------------------------------------------------- inside one host
    def _rep(self, host: int) -> int:
        """A host with the same local structure whose routes can be reused (itself if none / ids not 'h<i>/...')."""
        if host in self._rep_of:
            return self._rep_of[host]
        prefix = f"h{host}/"
        nodes = self._host_nodes.get(host, set())
        if host < 0 or not nodes or not all(n.startswith(prefix) for n in nodes):
            self._rep_of[host] = host
            return host
        g = self.g
        cut = len(prefix)
        edges = []
        for n in nodes:
            for v, d in self._succ[n].items():
                if v in nodes:
                    edges.append((n[cut:], v[cut:], d["type"].value, round(d["bw_GBps"], 9),
                                  round(d["latency_us"], 9), d["nlinks"]))
        fp = (tuple(sorted((n[cut:], g.nodes[n]["kind"].value, g.nodes[n]["index"]) for n in nodes)),
              tuple(sorted(edges)))
        rep = self._fp_rep.setdefault(hash(fp), (host, fp))
        self._rep_of[host] = rep[0] if rep[1] == fp else host
        return self._rep_of[host]

    def _intra(self, a: str, b: str, modes: tuple[str, ...] = _MODES) -> list[str] | None:
        h = self._host(a)
        rep = self._rep(h)
        if rep != h:
            cut = len(f"h{h}/")
            p = self._intra(f"h{rep}/{a[cut:]}", f"h{rep}/{b[cut:]}", modes)
            return None if p is None else [f"h{h}/{n[len(f'h{rep}/'):]}" for n in p]
        for mode in modes:
            key = (a, b, mode)
            if key not in self._intra_cache:
                if (a, mode) in self._intra_done:
                    self._intra_cache[key] = None
                else:
                    self._intra_from(a, mode)
                    self._intra_cache.setdefault(key, None)
            if self._intra_cache[key] is not None:
                return self._intra_cache[key]
        return None

    def _intra_from(self, a: str, mode: str) -> None:
        """Routes from `a` to every node of its host at once (one widest search, one BFS per bottleneck value).

        mode "nvlink": NVLink edges only; "all": any intra-host edge, GPUs/NICs not transit; "relay": any
        intra-host edge, GPUs may relay (NCCL PXN/NVB) — only used when the other modes find no route.
        """
        self._intra_done.add((a, mode))
        host = self._host(a)
        prefix, shared = self._shared_routes(host)
        cut = len(prefix)
        known = shared.get((a[cut:], mode))
        if known is not None:   # found on another topology: a host of the same structure
            their, theirs = known
            if their == prefix:   # the same ids: the same (never modified) path lists
                for t, p in theirs:
                    self._intra_cache[(a, t, mode)] = p
            else:
                n = len(their)
                for t, p in theirs:
                    self._intra_cache[(a, prefix + t[n:], mode)] = [prefix + x[n:] for x in p]
            return
        adj = self._adjacency(host, mode == "nvlink")
        blocked = (NodeKind.PROC, NodeKind.NIC) if mode == "relay" else _NO_TRANSIT
        best = self._widest_values(a, adj.__getitem__, blocked)
        by_floor: dict[float, list[str]] = {}
        for t, bw in best.items():
            if t != a:
                by_floor.setdefault(round(bw, 9), []).append(t)
        found: list[tuple[str, list[str]]] = []
        for floor, targets in by_floor.items():
            pred = self._short_tree(a, adj.__getitem__, floor - _EPS, blocked)
            for t in targets:
                if t not in pred:
                    continue
                out = [t]
                while out[-1] != a:
                    out.append(pred[out[-1]])
                path = self._intra_cache[(a, t, mode)] = out[::-1]
                found.append((t, path))
        shared[(a[cut:], mode)] = (prefix, found)

    def _shared_routes(self, host: int) -> tuple[str, _SharedRoutes]:
        """The prefix of `host`'s node ids ('h<i>/', else '') and the routes found inside hosts of its structure
        on any topology (per source without the prefix: the finder's prefix and its paths): keyed by every node,
        kind and link the searches read."""
        hit = self._shared_of.get(host)
        if hit is None:
            nodes = self._host_nodes[host]
            prefix = f"h{host}/" if host >= 0 and all(n.startswith(f"h{host}/") for n in nodes) else ""
            cut, attrs, succ = len(prefix), self._attrs, self._succ
            key = tuple(sorted((u[cut:], attrs[u]["kind"], tuple((v[cut:], d["type"], d["bw_GBps"], d["latency_us"])
                                                        for v, d in succ[u].items() if v in nodes))
                               for u in nodes))
            store = _SHARED_INTRA.pop(key, None)
            _SHARED_INTRA[key] = store = {} if store is None else store   # most recently used last
            while len(_SHARED_INTRA) > MAX_SHARED_HOSTS:
                _SHARED_INTRA.pop(next(iter(_SHARED_INTRA)))
            hit = self._shared_of[host] = (prefix, store)
        return hit

    def _adjacency(self, host: int, nvlink_only: bool) -> dict[str, list[tuple[str, float, float]]]:
        """The links a search inside `host` may take, per node: NVLink only, or any but the network's."""
        key = (host, nvlink_only)
        adj = self._host_adj.get(key)
        if adj is None:
            nodes = self._host_nodes[host]
            ok: Callable[[Attrs], bool] = ((lambda d: d["type"] == LinkType.NVLINK) if nvlink_only
                                          else (lambda d: d["type"] not in _NET_TYPES))
            adj = self._host_adj[key] = {
                u: [(v, d["bw_GBps"], d["latency_us"]) for v, d in self._succ[u].items() if v in nodes and ok(d)]
                for u in nodes}
        return adj

    def _edges(self, nodes: set[str] | None, ok: Callable[[Attrs], bool]) -> _Edges:
        """Each node's links `ok` to nodes within `nodes` (None: any), as (to, bw_GBps, latency_us) in graph order."""
        succ = self._succ
        return lambda u: [(v, d["bw_GBps"], d["latency_us"]) for v, d in succ[u].items()
                          if (nodes is None or v in nodes) and ok(d)]

    def _widest_values(self, a: str, edges: _Edges, blocked: tuple[NodeKind, ...],
                       target: str | None = None) -> dict[str, float]:
        """Max-bottleneck value from a to every node reachable over `edges` (modified Dijkstra); stops at `target`
        if given."""
        attrs = self._attrs
        best = {a: float("inf")}
        heap = [(-float("inf"), a)]
        done: set[str] = set()
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            negbw, u = pop(heap)
            if u in done:
                continue
            done.add(u)
            if u == target:
                break
            if u != a and attrs[u]["kind"] in blocked:
                continue
            cur = -negbw
            for v, bw, _ in edges(u):
                nb = bw if bw < cur else cur
                if nb > best.get(v, -1.0) + _EPS:
                    best[v] = nb
                    push(heap, (-nb, v))
        return best

    def _short_tree(self, a: str, edges: _Edges, floor: float, blocked: tuple[NodeKind, ...],
                    target: str | None = None) -> dict[str, str]:
        """Predecessors of the fewest-hops-then-least-latency tree over `edges` at least `floor` wide."""
        attrs = self._attrs
        dist: dict[str, tuple[int, float]] = {a: (0, 0.0)}
        pred: dict[str, str] = {}
        heap: list[tuple[int, float, str]] = [(0, 0.0, a)]
        seen: set[str] = set()
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            hops, lat, u = pop(heap)
            if u in seen:
                continue
            seen.add(u)
            if u == target:
                break
            if u != a and attrs[u]["kind"] in blocked:
                continue
            nxt = hops + 1
            for v, bw, lat_us in edges(u):
                if bw < floor:
                    continue
                cand = (nxt, round(lat + lat_us, 9))
                have = dist.get(v)
                if have is None or cand < have:
                    dist[v] = cand
                    pred[v] = u
                    push(heap, (nxt, cand[1], v))
        return pred

    def _widest(self, a: str, b: str, nodes: set[str] | None, ok: Callable[[Attrs], bool],
                blocked: tuple[NodeKind, ...] | None = None) -> list[str] | None:
        """Max-bottleneck path (then fewest hops, then lowest latency) using edges `ok` within `nodes`;
        nodes of a `blocked` kind are never transit (default: GPU/PROC/NIC in a host, GPU/PROC globally)."""
        if blocked is None:
            blocked = _NO_TRANSIT if nodes is not None else (NodeKind.GPU, NodeKind.PROC)
        edges = self._edges(nodes, ok)
        best = self._widest_values(a, edges, blocked, target=b)
        if b not in best:
            return None
        # phase 2: fewest hops, then least latency, over edges at least as wide as the bottleneck
        pred = self._short_tree(a, edges, best[b] - _EPS, blocked, target=b)
        if b not in pred:
            return None
        out = [b]
        while out[-1] != a:
            out.append(pred[out[-1]])
        return out[::-1]

    # ----------------------------------------------------------------- across hosts
    def near_nics(self, x: str) -> list[str]:
        """The NICs of x's host at the smallest distance from x (fewest hops, then widest path)."""
        if x in self._near:
            return self._near[x]
        d = self.g.nodes[x]
        h = d["host"]
        rep = self._rep(h) if h >= 0 else h
        if rep != h:
            cut, rcut = len(f"h{h}/"), len(f"h{rep}/")
            self._near[x] = [f"h{h}/{n[rcut:]}" for n in self.near_nics(f"h{rep}/{x[cut:]}")]
            return self._near[x]
        if d["kind"] == NodeKind.NIC:
            self._near[x] = [x]
            return self._near[x]
        scored = []
        succ = self._succ
        nics = self._host_nics.get(h)
        if nics is None:
            nics = self._host_nics[h] = [n for n in self._host_nodes.get(h, ())
                                         if self._attrs[n]["kind"] == NodeKind.NIC]
        relayed = []
        for nic in nics:
            p = self._intra(x, nic, _MODES[:2])
            if p is None:
                relayed.append(nic)
                continue
            bw = min(succ[u][v]["bw_GBps"] for u, v in pairwise(p))
            scored.append(((len(p), -round(bw, 6)), nic))
        if relayed:   # a route through a GPU is searched only where it may have as few nodes as the best so far
            bound = min(s for s, _ in scored)[0] if scored else None
            fewest = self._fewest_nodes(x, h) if bound is not None else {}
            for nic in relayed:
                if bound is not None and fewest.get(nic, bound + 1) > bound:
                    continue
                p = self._intra(x, nic)
                if p is None:
                    continue
                bw = min(succ[u][v]["bw_GBps"] for u, v in pairwise(p))
                scored.append(((len(p), -round(bw, 6)), nic))
        if not scored:
            self._near[x] = []
            return []
        top = min(s for s, _ in scored)
        own = d["index"]
        cands = sorted((n for s, n in scored if s == top),
                       key=lambda n: (self.g.nodes[n]["index"] != own, self.g.nodes[n]["index"], n))
        self._near[x] = cands
        return cands

    def _fewest_nodes(self, x: str, host: int) -> dict[str, int]:
        """Nodes on the shortest path from `x` to each node of `host` over its links, any node transit: no route
        inside the host (`_intra`, any mode) has fewer."""
        adj = self._adjacency(host, False)
        count = {x: 1}
        frontier = [x]
        while frontier:
            nxt = []
            for u in frontier:
                k = count[u] + 1
                for v, _, _ in adj[u]:
                    if v not in count:
                        count[v] = k
                        nxt.append(v)
            frontier = nxt
        return count

    def _rail(self, nic: str) -> int:
        d = self.g.nodes[nic]
        return int(d.get("rail", d["index"]))

    def nic_pair(self, a: str, b: str) -> tuple[str, str] | None:
        """The (source NIC, destination NIC) a cross-host route a -> b uses."""
        ca, cb = self.near_nics(a), self.near_nics(b)
        if not ca or not cb:
            return None
        ra = {self._rail(n): n for n in reversed(ca)}
        rb = {self._rail(n): n for n in reversed(cb)}
        common = set(ra) & set(rb)
        if common:
            for pref in (self._rail(cb[0]), self._rail(ca[0])):
                if pref in common:
                    return ra[pref], rb[pref]
            r = min(common)
            return ra[r], rb[r]
        return ca[0], cb[0]

    def _inter_parts(self, a: str, b: str) -> tuple[list[str], list[list[str]], list[str]] | None:
        pair = self.nic_pair(a, b)
        if pair is None:
            return None
        na, nb = pair
        p1 = [a] if a == na else self._intra(a, na)
        p3 = [b] if b == nb else self._intra(nb, b)
        if p1 is None or p3 is None:
            return None
        nets = self._net_paths(na, nb)
        if not nets:
            return None
        return p1, nets, p3

    def _net_paths(self, na: str, nb: str) -> list[list[str]]:
        g = self.g
        if g.has_edge(na, nb):
            return [[na, nb]]
        la = [s for s in self._succ[na] if g.nodes[s]["kind"] == NodeKind.NET_SWITCH]
        lb = [s for s in self._pred[nb] if g.nodes[s]["kind"] == NodeKind.NET_SWITCH]
        if not la or not lb:
            return []
        best: list[list[str]] = []
        for x in la:
            for y in lb:
                sw = self._switch_paths(x, y)
                if sw and (not best or len(sw[0]) < len(best[0])):
                    best = sw
        return [[na] + sp + [nb] for sp in best]

    def _switch_succ(self) -> dict[str, list[str]]:
        """Each node's network-switch successors, in adjacency order (read once per Router)."""
        if self._sw_succ is None:
            nodes = self.g.nodes
            is_switch = {n: d["kind"] == NodeKind.NET_SWITCH for n, d in nodes(data=True)}
            self._sw_succ = {u: [v for v in self._succ[u] if is_switch[v]] for u, sw in is_switch.items() if sw}
        return self._sw_succ

    def _switch_preds(self, x: str) -> dict[str, list[str]]:
        """BFS from switch `x` over the switch-only graph: every switch it reaches with all its predecessors on
        shortest paths from `x` (the ECMP sets), cached per `x`. A BFS stopped at the level of some switch y
        has the same predecessors up to that level, so one full BFS serves every y."""
        hit = self._sw_preds.get(x)
        if hit is not None:
            return hit
        sw_succ = self._switch_succ()
        level = {x: 0}
        preds: dict[str, list[str]] = {x: []}
        frontier = [x]
        while frontier:
            nxt = []
            for u in frontier:
                up = level[u] + 1
                for v in sw_succ.get(u, ()):
                    if v not in level:
                        level[v] = up
                        preds[v] = [u]
                        nxt.append(v)
                    elif level[v] == up:
                        preds[v].append(u)
            frontier = nxt
        self._sw_preds[x] = preds
        return preds

    def _switch_paths(self, x: str, y: str, limit: int = 64) -> list[list[str]]:
        key = (x, y)
        if key in self._sw_paths:
            return self._sw_paths[key]
        if x == y:
            res = [[x]]
        else:
            preds = self._switch_preds(x)
            res = []
            if y in preds:
                stack = [[y]]
                while stack and len(res) < limit:
                    p = stack.pop()
                    if p[-1] == x:
                        res.append(p[::-1])
                        continue
                    for u in sorted(preds[p[-1]], reverse=True):
                        stack.append(p + [u])
            res.sort()
        self._sw_paths[key] = res
        return res
