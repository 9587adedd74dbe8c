"""Ring and tree search on a topology, NCCL style.

Ring bandwidth model: a ring sends on every hop at once, so a link carried by k hops of the ring (in one
direction) gives each of them bw/k. The bottleneck of a ring = min over directed edges of
residual_bw(e) / load(e). Several rings (channels) are found greedily: best ring on the residual
capacities, subtract its bandwidth x load, repeat while a new ring keeps the link class of the first
(all-NVLink stays all-NVLink) and at least half the first ring's bandwidth — NCCL's channel search.

Single host: exact branch-and-bound DFS over ring orders (exhaustive for <= 9 endpoints, budgeted and
seeded with a greedy order beyond). Several hosts: every host is one contiguous segment of the ring, so
the ring crosses the network exactly once per host (the minimum); each segment enters at a GPU and leaves
from a GPU that share a nearby NIC on the same rail (same PCIe switch when the machine has one), and
identical hosts reuse the same local order. `RINGFLOW_RINGS` overrides the search.
"""
from __future__ import annotations

import itertools
import math
import operator
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .. import config
from ..errors import TopologyError

if TYPE_CHECKING:  # pragma: no cover
    from .graph import LinkType, Topology
    from .routing import Router

Edge = tuple[str, str]
MAX_DFS_NODES = 300    # beyond this many endpoints in one host: greedy order instead of the DFS
MAX_SEGMENT_TRIES = 8  # (entry, exit) pairs tried per channel on multi-host rings, most network room first
SEARCH_TRIES = 8     # tie-break orders tried for the channel set on one host of <= 16 endpoints
_EPS = 1e-9


@dataclass(frozen=True)
class Ring:
    """One ring (channel): `ranks` are positions in the endpoint list, in ring order."""

    ranks: tuple[int, ...]
    bottleneck_GBps: float

    def hops(self) -> list[tuple[int, int]]:
        """(sender, receiver) rank pairs of the ring, closing hop included."""
        n = len(self.ranks)
        return [(self.ranks[i], self.ranks[(i + 1) % n]) for i in range(n)] if n > 1 else []


# ----------------------------------------------------------------------------- RINGFLOW_RINGS
def parse_rings(text: str, n: int) -> list[tuple[int, ...]]:
    """Parse NCCL_RINGS syntax ('0 1 2 3|3 2 1 0' or '0-1-2-3'); each ring must be a permutation of 0..n-1."""
    if n < 1:
        raise TopologyError(f"cannot parse rings for {n} ranks", "need at least one rank")
    rings: list[tuple[int, ...]] = []
    parts = [p for p in str(text).split("|")]
    if not any(p.strip() for p in parts):
        raise TopologyError("RINGFLOW_RINGS is empty", "write rings like '0 1 2 3|3 2 1 0' or unset it")
    for i, part in enumerate(parts):
        tokens = [t for t in part.replace("-", " ").replace(",", " ").split() if t]
        if not tokens:
            raise TopologyError(f"RINGFLOW_RINGS ring {i} is empty", "remove the stray '|' or list the ranks")
        ranks = []
        for t in tokens:
            if not t.isdigit():
                raise TopologyError(f"RINGFLOW_RINGS ring {i}: {t!r} is not a rank number",
                                    "ranks are integers separated by '-' or ' ', rings by '|'")
            ranks.append(int(t))
        bad = [r for r in ranks if r >= n]
        if bad:
            raise TopologyError(f"RINGFLOW_RINGS ring {i}: rank {bad[0]} does not exist "
                                f"(there are {n} ranks, 0..{n - 1})",
                                "use ranks 0..n-1 of this communicator")
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        missing = sorted(set(range(n)) - set(ranks))
        if dup or missing:
            what = []
            if dup:
                what.append(f"rank(s) {dup} repeated")
            if missing:
                what.append(f"rank(s) {missing} missing")
            raise TopologyError(f"RINGFLOW_RINGS ring {i} is not a permutation of the {n} ranks: {'; '.join(what)}",
                                "every ring must visit each rank exactly once")
        rings.append(tuple(ranks))
    return rings


# ----------------------------------------------------------------------------- double binary tree
def _btree(n: int, rank: int) -> tuple[int, int, int]:
    """NCCL's ncclGetBtree: (parent, child0, child1) of `rank` in an in-order binary tree (-1 = none)."""
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if n > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= n:
        lowbit >>= 1
        down1 = -1 if lowbit == 0 else rank + lowbit
    return up, down0, down1



def tree_children(parent: Sequence[int]) -> list[list[int]]:
    """Children lists from a parent array (parent[r] = -1 for the root)."""
    kids: list[list[int]] = [[] for _ in parent]
    for r, p in enumerate(parent):
        if p >= 0:
            kids[p].append(r)
    return kids


def double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """Two binary trees over n ranks (parent per rank, -1 = root) whose leaves are the other's inner nodes.

    Tree 0 is NCCL's in-order binary tree (odd ranks are leaves); tree 1 mirrors it (r -> n-1-r) when n is
    even, or shifts it by one when n is odd (NCCL's ncclGetDtree), so no rank is a leaf in both trees.
    """
    if n < 1:
        raise TopologyError(f"a tree needs at least one rank, got {n}", "pass n >= 1")
    t0 = [_btree(n, r)[0] for r in range(n)]
    t1 = []
    for r in range(n):
        if n % 2 == 1:
            u = _btree(n, (r - 1 + n) % n)[0]
            t1.append(-1 if u == -1 else (u + 1) % n)
        else:
            u = _btree(n, n - 1 - r)[0]
            t1.append(-1 if u == -1 else n - 1 - u)
    return t0, t1


def hierarchical_trees(topo: Topology, endpoints: list[str] | None = None) -> tuple[list[int], list[int]]:
    """NCCL-style trees over several hosts: a chain inside each host (in the best ring's local order, so
    hops stay on NVLink) hanging from the host leader; leaders joined by the double binary tree over hosts.

    Returns parent[r] per tree (-1 for the root). On one host both trees are that chain.
    """
    eps = topo.endpoints() if endpoints is None else list(endpoints)
    groups = topo.host_groups(eps)
    ring = find_rings(topo, eps, nchannels=1)[0].ranks if len(eps) > 1 else (0,)
    pos = {r: k for k, r in enumerate(ring)}
    chains = [sorted(g, key=lambda r: pos[r]) for g in groups]
    host_trees = double_binary_tree(len(chains))
    out: list[list[int]] = []
    for ht in host_trees:
        parent = [-1] * len(eps)
        for h, chain in enumerate(chains):
            for k in range(1, len(chain)):
                parent[chain[k]] = chain[k - 1]
            parent[chain[0]] = -1 if ht[h] == -1 else chains[ht[h]][0]
        out.append(parent)
    return out[0], out[1]


# ----------------------------------------------------------------------------- ring evaluation
class _Hops:
    """Cached hop edges and capacities for a set of endpoints."""

    def __init__(self, topo: Topology, eps: list[str]) -> None:
        self.topo = topo
        self.eps = eps
        self._edges: dict[tuple[int, int], tuple[Edge, ...]] = {}
        self.known_edges = self._edges   # read-only view for loops over many hops (`ring_loads`)
        self._ends: dict[tuple[int, ...], tuple[dict[int, set[Edge]], dict[int, set[Edge]]]] = {}

    def end_edges(self, nodes: list[int]) -> tuple[dict[int, set[Edge]], dict[int, set[Edge]]]:
        """Per node: the distinct first edges of its routes to the others, and last edges of routes into it."""
        key = tuple(nodes)
        got = self._ends.get(key)
        if got is None:
            firsts: dict[int, set[Edge]] = {u: set() for u in nodes}
            lasts: dict[int, set[Edge]] = {u: set() for u in nodes}
            for u in nodes:
                for v in nodes:
                    if u != v:
                        es = self.edges(u, v)
                        firsts[u].add(es[0])
                        lasts[v].add(es[-1])
            got = self._ends[key] = (firsts, lasts)
        return got

    def edges(self, i: int, j: int) -> tuple[Edge, ...]:
        key = (i, j)
        e = self._edges.get(key)
        if e is None:
            p = self.topo.path(self.eps[i], self.eps[j])
            e = tuple(itertools.pairwise(p))
            self._edges[key] = e
        return e


def ring_loads(order: Sequence[int], hops: _Hops) -> dict[Edge, int]:
    """How many hops of the ring cross each directed edge."""
    pairs = list(zip(order, list(order[1:]) + list(order[:1]), strict=True))
    known = list(map(hops.known_edges.get, pairs))   # hops seen before, without a call per hop
    hop_edges = [e if e is not None else hops.edges(*p) for e, p in zip(known, pairs, strict=True)] \
        if None in known else cast("list[tuple[Edge, ...]]", known)
    return Counter(itertools.chain.from_iterable(hop_edges))


def ring_bw(order: Sequence[int], hops: _Hops, cap: dict[Edge, float]) -> float:
    """min over edges of cap/load for the ring `order` (inf for a single rank)."""
    if len(order) < 2:
        return math.inf
    load = ring_loads(order, hops)
    return float(min(map(operator.truediv, map(cap.__getitem__, load), load.values())))


def _ring_classes(order: Sequence[int], hops: _Hops) -> frozenset[LinkType]:
    g = hops.topo.graph
    return frozenset(g.edges[e]["type"] for e in ring_loads(order, hops))


# ----------------------------------------------------------------------------- local order search
def _best_order(nodes: list[int], start: int, end: int | None, hops: _Hops, cap: dict[Edge, float],
                budget: int = 200_000, tiebreak: dict[int, int] | None = None,
                memo: _PairMemo | None = None) -> tuple[list[int], float]:
    """Order of `nodes` from `start` (to `end`, or back to start when end is None) maximising min cap/load;
    `memo`: what earlier searches on the same `cap` and `tiebreak` found (filled in)."""
    if len(nodes) == 1:
        return [start], math.inf
    search = _OrderSearch(nodes, start, end, hops, cap, budget, tiebreak, memo)
    if len(nodes) > MAX_DFS_NODES:   # too deep to recurse: widest-next greedy order
        best_order = _greedy_order(nodes, start, end, search.others, search.pair_bw)
        return best_order, _order_bw(best_order, end is None, hops, cap)
    search.dfs(math.inf)
    if not search.best_order:  # budget hit before any complete order: take the greedy identity-like order
        best_order = [start] + search.others + ([end] if end is not None and end != start else [])
        return best_order, _order_bw(best_order, end is None, hops, cap)
    return search.best_order, search.best


class _PairMemo:
    """Hop bottlenecks on one set of capacities, and per node set each node's others widest hop first (ties by
    the tie-break order): shared by the searches that read the same capacities and tie-break."""

    def __init__(self) -> None:
        self.bw: dict[tuple[int, int], float] = {}
        self.rows: dict[tuple[int, ...], dict[int, list[int]]] = {}


class _OrderSearch:
    """Depth-first branch and bound over the orders of `nodes` (widest next hop first), stopping at the upper
    bound or after `budget` expansions; `best_order`/`best` hold the widest complete order found."""

    def __init__(self, nodes: list[int], start: int, end: int | None, hops: _Hops, cap: dict[Edge, float],
                 budget: int, tiebreak: dict[int, int] | None, memo: _PairMemo | None) -> None:
        self.start, self.end, self.hops, self.cap = start, end, hops, cap
        self.budget, self.tiebreak = budget, tiebreak
        self.nodes = nodes
        self.others = [x for x in nodes if x != start and x != end]
        shared = _PairMemo() if memo is None else memo
        self.memo = shared.bw
        self.rows = shared.rows.setdefault(tuple(nodes), {})
        self.best_order: list[int] = []
        self.best = -1.0
        self.ub = _order_upper_bound(nodes, start, end, hops, cap)
        self.load: dict[Edge, int] = {}
        self.order = [start]
        self.used = {start}
        self.expansions = 0
        self.open_end = end is not None and end != start   # the order ends at `end` (not back at start)
        self.full_len = len(nodes) - (1 if self.open_end else 0)

    def pair_bw(self, i: int, j: int) -> float:
        v = self.memo.get((i, j))
        if v is None:
            v = self.memo[(i, j)] = min(map(self.cap.__getitem__, self.hops.edges(i, j)))
        return v

    def widest_first(self, u: int) -> list[int]:
        """The nodes other than `u`, widest hop from `u` first (ties by the tie-break order, else by index)."""
        tiebreak = self.tiebreak
        return sorted((v for v in self.nodes if v != u),
                      key=lambda v: (-self.pair_bw(u, v), tiebreak[v] if tiebreak else v))

    def add(self, i: int, j: int, cur: float) -> tuple[float, list[Edge]]:
        m = cur
        es = self.hops.edges(i, j)
        load, cap = self.load, self.cap
        for e in es:
            k = load.get(e, 0) + 1
            load[e] = k
            m = min(m, cap[e] / k)
        return m, list(es)

    def remove(self, es: list[Edge]) -> None:
        load = self.load
        for e in es:
            load[e] -= 1

    def close(self, u: int, cur: float) -> bool:
        """Complete the order after `u` (to `end`, or back to start); True when the search should stop."""
        if self.open_end:
            assert self.end is not None
            m, es = self.add(u, self.end, cur)
            self.order.append(self.end)
            if m > self.best + _EPS:
                self.best, self.best_order = m, list(self.order)
            self.order.pop()
            self.remove(es)
        else:
            m, es = self.add(u, self.start, cur)
            if m > self.best + _EPS:
                self.best, self.best_order = m, list(self.order)
            self.remove(es)
        return self.best >= self.ub - _EPS or self.expansions > self.budget

    def dfs(self, cur: float) -> bool:
        self.expansions += 1
        order, used = self.order, self.used
        u = order[-1]
        if len(order) == self.full_len:
            return self.close(u, cur)
        row = self.rows.get(u)
        if row is None:
            row = self.rows[u] = self.widest_first(u)
        end = self.end
        cands = [v for v in row if v not in used and v != end]   # `start` is used from the first step
        for v in cands:
            m, es = self.add(u, v, cur)
            if m > self.best + _EPS:
                order.append(v)
                used.add(v)
                stop = self.dfs(m)
                order.pop()
                used.discard(v)
                self.remove(es)
                if stop:
                    return True
            else:
                self.remove(es)
            if self.expansions > self.budget:
                return True
        return False


def _order_upper_bound(nodes: list[int], start: int, end: int | None, hops: _Hops, cap: dict[Edge, float]) -> float:
    """Every node sends once (except the exit) and receives once (except the entry); a hop can never be
    wider than the widest residual link leaving its sender or entering its receiver."""
    firsts, lasts = hops.end_edges(nodes)
    ub = math.inf
    for u in nodes:
        if (end is None or u != end) and firsts[u]:
            ub = min(ub, max(cap[e] for e in firsts[u]))
        if (end is None or u != start) and lasts[u]:
            ub = min(ub, max(cap[e] for e in lasts[u]))
    return ub


def _greedy_order(nodes: list[int], start: int, end: int | None, others: list[int],
                  pair_bw: Callable[[int, int], float]) -> list[int]:
    """Widest-next order from `start` (then `end`, when it differs from start)."""
    order = [start]
    used = {start}
    while len(order) < len(nodes) - (1 if end is not None and end != start else 0):
        u = order[-1]
        v = min((x for x in others if x not in used), key=lambda x: (-pair_bw(u, x), x))
        order.append(v)
        used.add(v)
    return order + ([end] if end is not None and end != start else [])


def _order_bw(order: list[int], closed: bool, hops: _Hops, cap: dict[Edge, float]) -> float:
    load: dict[Edge, int] = {}
    pairs = list(itertools.pairwise(order)) + ([(order[-1], order[0])] if closed else [])
    for i, j in pairs:
        for e in hops.edges(i, j):
            load[e] = load.get(e, 0) + 1
    return min((cap[e] / k for e, k in load.items()), default=math.inf)


# ----------------------------------------------------------------------------- public search
def _capacities(topo: Topology) -> dict[Edge, float]:
    from .graph import successors
    return {(u, v): d["bw_GBps"] for u, nbrs in successors(topo.graph).items() for v, d in nbrs.items()}


def _subtract(order: Sequence[int], bw: float, hops: _Hops, cap: dict[Edge, float]) -> None:
    for e, k in ring_loads(order, hops).items():
        cap[e] = max(0.0, cap[e] - bw * k)


def _single_host_ring(n: int, hops: _Hops, cap: dict[Edge, float],
                      tiebreak: dict[int, int] | None = None) -> tuple[list[int], float]:
    budget = 10**7 if n <= 9 else 200_000
    return _best_order(list(range(n)), 0, None, hops, cap, budget, tiebreak)


def _host_fingerprint(topo: Topology, eps: list[str], idx: list[int]) -> tuple[tuple[int, str | None], ...]:
    g = topo.graph
    return tuple((g.nodes[eps[i]]["index"], g.nodes[eps[i]].get("model")) for i in idx)


def _multi_host_ring(topo: Topology, groups: list[list[int]], hops: _Hops,
                     cap: dict[Edge, float]) -> tuple[list[int], float]:
    eps = hops.eps
    router = topo.router
    first = groups[0]
    # candidate (entry, exit) pairs inside a host: share a nearby NIC rail (same PCIe switch first)
    rails = {i: [router._rail(x) for x in router.near_nics(eps[i])] for i in first}
    pairs = [(s, e) for s in first for e in first if s != e and set(rails[s]) & set(rails[e])]
    if not pairs:
        pairs = [(first[k], first[(k + 1) % len(first)]) for k in range(min(8, len(first)))] if len(first) > 1 else []
    if len(first) == 1:
        pairs = [(first[0], first[0])]
    pairs = sorted(pairs, key=lambda p: -_rail_room(p, rails, eps, router, cap))[:MAX_SEGMENT_TRIES]
    fps = [_host_fingerprint(topo, eps, g) for g in groups]
    best_ring: list[int] = []
    best = -1.0
    memo = _PairMemo()   # `cap` stays as it is until the ring is chosen
    for s, e in pairs:
        local, _ = _best_order(first, s, None if s == e else e, hops, cap,
                               budget=10**6 if len(first) <= 9 else 100_000, memo=memo)
        pos = [first.index(x) for x in local]
        # same order on every host, and (for entry/exit GPUs on different rails) the order reversed on every
        # other host, so that host h's exit GPU feeds the same-index GPU of host h+1: inter-host hops stay on
        # one rail instead of all crossing rails through the spines (what NCCL's rail-aligned rings do)
        for alternate in (False, True):
            ring: list[int] = []
            for h, (g, fp) in enumerate(zip(groups, fps, strict=True)):
                if fp == fps[0] and len(g) == len(first):
                    ring.extend(g[p] for p in (pos[::-1] if alternate and h % 2 else pos))
                else:
                    ls, le = _entry_exit(g, set(rails.get(s, [])) & set(rails.get(e, [])), eps, router)
                    sub, _ = _best_order(g, ls, None if ls == le else le, hops, cap, budget=100_000, memo=memo)
                    ring.extend(sub)
            bw = ring_bw(ring, hops, cap)
            if bw > best + _EPS:
                best, best_ring = bw, ring
    return best_ring, best


def _rail_room(pair: tuple[int, int], rails: dict[int, list[int]], eps: list[str], router: Router,
               cap: dict[Edge, float]) -> float:
    """Residual network bandwidth of the best NIC the pair's entry and exit GPUs share (0 if none)."""
    from .graph import LinkType, successors  # networkx: loaded by the searches, not by the tree helpers
    s, e = pair
    shared = set(rails.get(s, [])) & set(rails.get(e, []))
    g = router.g
    room = 0.0
    for nic in router.near_nics(eps[s]):
        if router._rail(nic) in shared or not shared:
            for v in successors(g)[nic]:
                if g.edges[nic, v]["type"] in (LinkType.IB, LinkType.ETHERNET):
                    room = max(room, min(cap[(nic, v)], cap.get((v, nic), 0.0)))
    return room


def _entry_exit(group: list[int], want: set[int], eps: list[str], router: Router) -> tuple[int, int]:
    """Entry and exit endpoints of a host segment that reach a NIC on one of the rails `want` (else the ends)."""
    if len(group) == 1:
        return group[0], group[0]
    near = [i for i in group if want & {router._rail(x) for x in router.near_nics(eps[i])}]
    if len(near) >= 2:
        return near[0], near[1]
    if len(near) == 1:
        return near[0], next(i for i in group if i != near[0])
    return group[0], group[-1]


def find_rings(topo: Topology, endpoints: list[str] | None = None, nchannels: int | None = None) -> list[Ring]:
    """Best-bottleneck ring(s) over `endpoints` (default: all); several channels that together use the bandwidth.

    RINGFLOW_RINGS (NCCL_RINGS syntax) overrides the search; its rings are validated and evaluated.
    With `nchannels`, exactly that many rings are returned (found rings repeated, sharing their bandwidth).
    """
    from .graph import NodeKind
    eps = topo.endpoints() if endpoints is None else list(endpoints)
    n = len(eps)
    if n == 0:
        raise TopologyError(f"topology {topo.name!r} has no endpoints to build rings on",
                            "add GPU or PROC nodes, or pass endpoints=")
    if len(set(eps)) != n:
        raise TopologyError("find_rings: an endpoint is listed twice", "pass each GPU once")
    for x in eps:
        if topo.kind(x) not in (NodeKind.GPU, NodeKind.PROC):
            raise TopologyError(f"find_rings: {x!r} is a {topo.kind(x).value}, not a GPU/PROC",
                                "pass GPU or PROC nodes")
    if nchannels is not None and nchannels < 1:
        raise TopologyError(f"nchannels={nchannels} must be >= 1", "ask for at least one channel")
    cap = _capacities(topo)
    # kept with the router (dropped on any `invalidate()`, as the routes the search reads are) while every
    # link's bandwidth is what it was
    store = topo.router.found_rings
    if store.get("cap") != cap:
        store.clear()
        store["cap"] = cap
    key = (tuple(eps), nchannels, config.get("RINGS"), config.get("NCHANNELS"), MAX_DFS_NODES, MAX_SEGMENT_TRIES,
           SEARCH_TRIES)
    hit = store.get(key)
    if hit is None:
        hit = store[key] = tuple(_search_rings(topo, eps, nchannels, dict(cap)))
    return list(hit)


def _search_rings(topo: Topology, eps: list[str], nchannels: int | None, cap: dict[Edge, float]) -> list[Ring]:
    """find_rings' search (on `cap`, which it uses up)."""
    n = len(eps)
    hops = _Hops(topo, eps)
    text = config.get("RINGS")
    if text:
        orders = parse_rings(text, n)
        return _share(orders, hops, cap, nchannels)
    if n == 1:
        return [Ring((0,), math.inf)] * (nchannels or 1)
    groups = topo.host_groups(eps)
    max_ch = nchannels if nchannels is not None else (config.get("NCHANNELS") or 32)
    found = _greedy_channels(groups, hops, cap, max_ch, None, topo)
    if len(groups) == 1 and n <= 16:
        # greedy channel choice depends on which of several equally good rings comes first: try a few
        # deterministic tie-break orders and keep the set that carries the most bandwidth in total
        for seed in range(1, SEARCH_TRIES):
            perm = list(range(n))
            random.Random(seed).shuffle(perm)
            alt = _greedy_channels(groups, hops, _capacities(topo), max_ch, {v: k for k, v in enumerate(perm)}, topo)
            if sum(r.bottleneck_GBps for r in alt) > sum(r.bottleneck_GBps for r in found) + _EPS:
                found = alt
    if not found:  # every ring has zero residual bandwidth: should not happen on a connected graph
        raise TopologyError(f"no ring with positive bandwidth over {n} endpoints of {topo.name!r}",
                            "check that the endpoints are connected")
    if nchannels is not None and len(found) < nchannels:
        return _share([r.ranks for r in found] * math.ceil(nchannels / len(found)), hops, _capacities(topo),
                      nchannels)
    return found


def _greedy_channels(groups: list[list[int]], hops: _Hops, cap: dict[Edge, float], max_ch: int,
                     tiebreak: dict[int, int] | None, topo: Topology) -> list[Ring]:
    """Best ring on the residual capacities, subtract, repeat (same link classes, >= half the first ring)."""
    n = len(hops.eps)
    found: list[Ring] = []
    first_classes: frozenset[LinkType] | None = None
    while len(found) < max_ch:
        if len(groups) == 1:
            order, bw = _single_host_ring(n, hops, cap, tiebreak)
        else:
            order, bw = _multi_host_ring(topo, groups, hops, cap)
        if not order or bw <= _EPS:
            break
        classes = _ring_classes(order, hops)
        if found:
            assert first_classes is not None
            if bw < 0.5 * found[0].bottleneck_GBps - _EPS or not classes <= first_classes:
                break
        else:
            first_classes = classes
        found.append(Ring(tuple(order), bw))
        _subtract(order, bw, hops, cap)
    return found


def _share(orders: list[tuple[int, ...]], hops: _Hops, cap: dict[Edge, float],
           nchannels: int | None) -> list[Ring]:
    """Rings that run at the same time: each gets an equal share of the links they have in common."""
    if nchannels is not None:
        orders = [orders[i % len(orders)] for i in range(nchannels)]
    if len(orders[0]) < 2:
        return [Ring(tuple(o), math.inf) for o in orders]
    load: dict[Edge, int] = {}
    for o in orders:
        for e, k in ring_loads(o, hops).items():
            load[e] = load.get(e, 0) + k
    per = min(cap[e] / k for e, k in load.items())
    return [Ring(tuple(o), per) for o in orders]


def ring_hop_types(topo: Topology, ring: Ring, endpoints: list[str] | None = None) -> list[str]:
    """Link types used by each hop of a ring ('nvlink', 'pcie+qpi', 'pcie+ib', ...)."""
    eps = topo.endpoints() if endpoints is None else endpoints
    out = []
    for i, j in ring.hops():
        p = topo.path(eps[i], eps[j])
        types = []
        for e in itertools.pairwise(p):
            t = topo.graph.edges[e]["type"].value
            if t not in types:
                types.append(t)
        out.append("+".join(types))
    return out


def all_nvlink(topo: Topology, ring: Ring, endpoints: list[str] | None = None) -> bool:
    """True when every hop of the ring travels only over NVLink."""
    from .graph import LinkType
    return all(t == LinkType.NVLINK.value for t in ring_hop_types(topo, ring, endpoints))


def brute_force_best_ring(topo: Topology, endpoints: list[str] | None = None) -> float:
    """Exhaustive best single-ring bottleneck (for tests on <= 8 endpoints)."""
    eps = topo.endpoints() if endpoints is None else list(endpoints)
    hops = _Hops(topo, eps)
    cap = _capacities(topo)
    best = 0.0
    for perm in itertools.permutations(range(1, len(eps))):
        best = max(best, ring_bw((0,) + perm, hops, cap))
    return best
