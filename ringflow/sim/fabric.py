"""The topology as the engines see it: numbered links, rank placement and routed paths.

`Fabric` numbers every directed edge of the topology graph (link id), keeps per-link
arrays (achievable capacity in bytes/us, line rate, latency, type, tier) and resolves the
path of a (sender rank, receiver rank, channel) into sub-flows: one or more link lists
with the share of the message each carries (see SimParams.routing_*).
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from ..errors import TopologyError
from .params import SimParams


def _val(x: Any) -> str:
    return str(getattr(x, "value", x))


@dataclass
class PairRoute:
    """How one (src, dst, channel) message travels: sub-paths, their shares, fixed costs."""

    paths: list[np.ndarray]   # link ids per sub-path
    weights: np.ndarray       # share of the bytes per sub-path (sums to 1)
    latency_us: float         # sum of link latencies along the (first) path
    link_class: str           # one of params.LINK_CLASSES


def _step_roles(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per local-work entry of `table`: whether its rank sends, and whether it receives, in the same step."""
    width = table.nranks
    here = table.lstep * width + table.lrank
    return (np.isin(here, np.unique(table.step * width + table.src)),
            np.isin(here, np.unique(table.step * width + table.dst)))


def _beside_transfer(table: Any, shares_cores: bool = False, receive_share: float = 1.0) -> np.ndarray:
    """Per local-work entry of `table`: 1.0 where its rank receives in the same step (a sender whose
    receiver reads its buffer, a scatter's root, does not fill its own cache with the message),
    `receive_share` where it receives without sending; with `shares_cores`, the fraction of the ranks
    copying beside a receive in that step instead."""
    width = table.nranks
    sends, receives = _step_roles(table)
    beside = receives.astype(np.float64)
    if receive_share != 1.0 and beside.size:
        beside[receives & ~sends] = receive_share
    if shares_cores and beside.size:
        on = (table.lcopy > 0) & (beside > 0)
        ranks = np.unique(table.lstep[on] * width + table.lrank[on])   # a rank counts once per step
        copying = np.bincount(ranks // width, minlength=int(table.lstep.max()) + 1)
        beside *= copying[table.lstep] / width
    return beside


def step_size_factor(params: SimParams, table: Any) -> np.ndarray:
    """Per step of `table`: what its bytes cost per byte over what the call's largest message's do, where
    its messages are smaller (`SimParams.small_step_costs`: the calibrated exchange's per-byte cost at the
    step's message, with reduction where a rank reduces in the step; at least 1); 1 elsewhere."""
    nsteps = int(max(table.nsteps, table.step.max(initial=-1) + 1, table.lstep.max(initial=-1) + 1))
    out = np.ones(nsteps)
    if params.small_step_costs is None or not table.ntransfers:
        return out
    sizes, exchange, reducing, msg_bytes = params.small_step_costs
    per_msg = table.frac / np.maximum(table.nmsg, 1)
    step_msg = np.zeros(nsteps)
    np.maximum.at(step_msg, table.step, per_msg / max(float(per_msg.max()), 1e-300) * msg_bytes)
    reduces = np.zeros(nsteps, dtype=bool)
    reduces[table.lstep[table.lreduce > 0]] = True
    lx = np.log(np.asarray(sizes, dtype=np.float64))

    def at(curve: tuple, x: np.ndarray | float) -> np.ndarray:
        return np.exp(np.interp(np.log(x), lx, np.log(np.asarray(curve, dtype=np.float64))))
    smaller = (step_msg > 0) & (step_msg < msg_bytes)
    x = step_msg[smaller]
    ratio = np.where(reduces[smaller], at(reducing, x) / at(reducing, msg_bytes),
                     at(exchange, x) / at(exchange, msg_bytes))
    out[smaller] = np.maximum(ratio, 1.0)
    return out


class Fabric:
    """Links and routes of a topology for a given rank placement and parameters."""

    def __init__(self, topo: Any, params: SimParams, endpoints: Sequence[str] | None = None) -> None:
        self.topo = topo
        self.params = params
        self.endpoints = list(endpoints) if endpoints is not None else list(topo.endpoints())
        if not self.endpoints:
            raise TopologyError(f"topology {getattr(topo, 'name', '?')!r} has no endpoints (GPUs or PROCs)",
                                "add GPU or PROC nodes, or pick another preset")
        g = topo.graph
        edges = list(g.edges(data=True))
        self.edge_index: dict[tuple[str, str], int] = {(u, v): i for i, (u, v, _) in enumerate(edges)}
        self.edges = [(u, v) for u, v, _ in edges]
        self.link_type = [_val(d.get("type", "")) for _, _, d in edges]
        self.link_tier = [_val(d.get("tier") or d.get("type", "")) for _, _, d in edges]
        self.line_Bpus = np.array([float(d.get("bw_GBps", 0.0)) * 1e3 for _, _, d in edges])
        eff = np.array([params.link_efficiency.get(t, 1.0) for t in self.link_type])
        self.cap_Bpus = self.line_Bpus * eff
        if np.any(self.cap_Bpus <= 0):
            bad = [self.edges[i] for i in np.flatnonzero(self.cap_Bpus <= 0)[:3]]
            raise TopologyError(f"links without bandwidth: {bad}", "every edge needs bw_GBps > 0")
        self.lat_us = np.array([float(d.get("latency_us", 0.0)) for _, _, d in edges])
        self.nlinks = len(edges)
        self._routes: dict[tuple[int, int, int], PairRoute] = {}
        self._hosts = [topo.host_of(e) for e in self.endpoints]
        self._ep_link: list[int] | None = None
        self._pool_link: dict[int, int] = {}
        self._pair_link: dict[tuple[int, int], int] = {}
        self._lone: tuple[np.ndarray, np.ndarray] | None = None   # _lone_links, cached
        self._add_cpu_links()

    def _add_cpu_links(self) -> None:
        """Virtual links for CPU-moved bytes: one per rank (its copy engine), one pool per host."""
        eprate = self.params.endpoint_GBps
        if not eprate:
            return
        transport = "tcp" if self.params.host_transport == "tcp" else "shm"
        rate = eprate.get(transport) or next(iter(eprate.values()))
        caps: list[float] = []
        names: list[tuple[tuple[str, str], str]] = []
        self._ep_link = []
        for e in self.endpoints:
            self._ep_link.append(self.nlinks + len(caps))
            caps.append(rate * 1e3)
            names.append(((e, e), "endpoint"))
        if self.params.host_cores or self.params.host_pool_GBps:
            pool = self.params.host_pool_GBps or rate * int(self.params.host_cores or 1)
            for h in sorted(set(self._hosts)):
                self._pool_link[h] = self.nlinks + len(caps)
                caps.append(pool * 1e3)
                names.append(((f"cpu{h}", f"cpu{h}"), "cpu"))
        self._append_links(np.asarray(caps), np.zeros(len(caps)), names)

    def _append_links(self, cap: np.ndarray, lat_us: np.ndarray, names: list) -> None:
        self.cap_Bpus = np.concatenate([self.cap_Bpus, cap])
        self.line_Bpus = np.concatenate([self.line_Bpus, cap])
        self.lat_us = np.concatenate([self.lat_us, lat_us])
        for (edge, tier) in names:
            self.edges.append(edge)
            self.link_type.append(tier)
            self.link_tier.append(tier)
        self.nlinks += cap.size

    def _pair_path(self, src: int, dst: int, ids: np.ndarray) -> np.ndarray:
        """One private link for the pair (src, dst) at the bottleneck of its typed path (see
        SimParams.pair_links): what ranks share on a calibrated CPU host are its cores (the
        engine and pool links), not the virtual shared-memory or loopback hops."""
        hit = self._pair_link.get((src, dst))
        if hit is None:
            hit = self._pair_link[(src, dst)] = self.nlinks
            self._append_links(np.array([self.cap_Bpus[ids].min()]), np.array([self.lat_us[ids].sum()]),
                               [((self.endpoints[src], self.endpoints[dst]), self.link_type[int(ids[0])])])
        return np.array([hit], dtype=np.int64)

    @property
    def pool_links(self) -> np.ndarray:
        """Link ids of the host pools (CPU hosts), empty elsewhere."""
        return np.fromiter(self._pool_link.values(), dtype=np.int64, count=len(self._pool_link))

    @property
    def lone_speedups(self) -> bool:
        """True when some host link speeds up for a transfer alone on its host (`lone_factor` is not all 1)."""
        return ((self.params.lone_pair_speedup > 1.0 and bool(self._pair_link))
                or (self.params.lone_pool_speedup > 1.0 and bool(self._pool_link)))

    def _lone_links(self) -> tuple[np.ndarray, np.ndarray]:
        """Per link: its host's index (-1 for links that are neither a pair link nor a host pool) and
        the speed-up a transfer alone on that host gets on it."""
        if self._lone is None or self._lone[0].size != self.nlinks:   # pair links are added lazily
            hid = {h: i for i, h in enumerate(dict.fromkeys(self._hosts))}
            host = np.full(self.nlinks, -1, dtype=np.int64)
            speed = np.ones(self.nlinks)
            for (src, _), lid in self._pair_link.items():
                host[lid], speed[lid] = hid[self._hosts[src]], self.params.lone_pair_speedup
            for h, lid in self._pool_link.items():
                host[lid], speed[lid] = hid[h], self.params.lone_pool_speedup
            self._lone = (host, speed)
        return self._lone

    def lone_factor(self, group: np.ndarray, transfer: np.ndarray, link: np.ndarray) -> np.ndarray:
        """Per (group, transfer, link) entry, the capacity factor of its link: the link's lone speed-up
        (`lone_pair_speedup` on a private pair link, `lone_pool_speedup` on a host pool) where its
        transfer is the only one on that host's pair and pool links within the group (a step, or the
        flows in flight), else 1."""
        out = np.ones(link.size)
        if not self.lone_speedups or not link.size:
            return out
        host, speed = self._lone_links()
        on = np.flatnonzero(host[link] >= 0)
        if not on.size:
            return out
        key = np.asarray(group)[on] * len(self._hosts) + host[link[on]]
        pairs = np.unique(np.stack([key, np.asarray(transfer)[on]]), axis=1)   # distinct (key, transfer)
        keys, ntr = np.unique(pairs[0], return_counts=True)
        lone = on[ntr[np.searchsorted(keys, key)] == 1]
        out[lone] = speed[link[lone]]
        return out

    def transfer_work(self, table: Any) -> np.ndarray:
        """Per transfer of `table`: the link time its bytes take relative to a pair exchange's
        (`relay_step_slowdown` in ring steps, `shift_step_slowdown` in shifts, `chained_step_factor` in a step
        right after another transfer step, `slot_reduce_factor` one-way into an in-place reduction; 1 / the NVLS
        efficiency for switch operations; else 1)."""
        w = np.ones(table.ntransfers)
        later = table.step > 0 if self.params.relay_skips_opening_step else np.ones(table.ntransfers, dtype=bool)
        if self.params.relay_step_slowdown != 1.0:
            w[table.in_relay_step & later] = self.params.relay_step_slowdown
        if self.params.shift_step_slowdown != 1.0:
            w[table.in_shift_step & later] = self.params.shift_step_slowdown
        if self.params.chained_step_factor != 1.0:
            # a single copy completes when its receiver has read it: in a relay step that ties every rank to
            # the next, so none is ahead when the step starts (4 shm ranks' pairwise all-to-alls at 1-2 MiB
            # went -0.10 -> -0.15 with them discounted, binomial broadcasts at 256 KiB-1 MiB +0.13 -> 0)
            on = table.chained_step & ~table.in_relay_step if self.params.sender_free else table.chained_step
            w[on] *= self.params.chained_step_factor
        if self.params.slot_reduce_factor != 1.0:
            w[table.oneway_into_inplace_reduction] *= self.params.slot_reduce_factor
        if self.params.small_step_costs is not None and table.ntransfers:
            w *= step_size_factor(self.params, table)[table.step]
        if table.in_switch is not None:
            from .nvls import efficiency, require_nvls
            _, gen = require_nvls(self.topo, self.endpoints[:table.nranks], table.collective)
            w[table.in_switch > 0] /= efficiency(self.params, gen)
        return w

    def _cpu_wrap(self, src: int, dst: int, ids: np.ndarray) -> np.ndarray:
        if self._ep_link is None:
            return ids
        head = [] if self.params.sender_free else [self._ep_link[src]]
        tail = [self._ep_link[dst]]
        if self._pool_link:
            if not self.params.sender_free:
                head.append(self._pool_link[self._hosts[src]])
            tail.insert(0, self._pool_link[self._hosts[dst]])
        return np.concatenate([np.asarray(head, dtype=np.int64), ids, np.asarray(tail, dtype=np.int64)])

    def local_us_per_byte(self, table: Any) -> np.ndarray:
        """Microseconds per byte of B of every (rank, step) local-work entry of `table`: copies at
        copy_GBps (faster where fewer ranks than the calibration's copy at once: `_copy_share`),
        reductions at reduce_GBps (into their own operand: reduce_inplace_GBps), slower
        when the host has fewer cores than ranks, and
        reductions out of place slower still when several ranks of the step reduce at once
        (`reduce_busy_slowdown`: the rate with every rank reducing, over the rate of one alone); bytes
        a rank sends fresh (written earlier in the call; by its copies, with fresh_send_scope "copied") cost
        it fresh_send_GBps extra (the other fresh bytes fresh_slot_GBps, the sender's slot copy), and copies in a
        step where the rank also receives copy_beside_transfer_GBps extra (beside_receive_share of it where
        it only receives; on shared cores in proportion to the ranks doing so), where it only sends
        copy_beside_send_GBps extra."""
        p = self.params
        per = np.zeros(table.lrank.size)
        if p.copy_GBps:
            per += table.lcopy / (p.copy_GBps * 1e3) * self._copy_share(table)
        if p.reduce_GBps:
            inplace = table.lreduce_inplace if table.lreduce_inplace is not None and p.reduce_inplace_GBps \
                else np.zeros(table.lrank.size)
            red = (table.lreduce - inplace) / (p.reduce_GBps * 1e3)
            if p.reduce_busy_slowdown > 1.0 and table.nranks > 1 and red.size:
                busy = np.bincount(table.lstep[table.lreduce > 0], minlength=int(table.lstep.max()) + 1)
                k = busy[table.lstep]
                red = red * (1.0 + (p.reduce_busy_slowdown - 1.0) * np.clip(k - 1, 0, None) / (table.nranks - 1))
            # the in-place rate is timed with every pair's receiver reducing: no busy slowdown on top
            per += red + (inplace / (p.reduce_inplace_GBps * 1e3) if inplace.any() and p.reduce_inplace_GBps else 0.0)
        fresh = table.lfresh if p.fresh_send_scope == "all" else table.lfresh_copied
        if fresh is not None and p.fresh_send_GBps:
            per += fresh / (p.fresh_send_GBps * 1e3)
        if p.fresh_slot_GBps and p.fresh_send_scope != "all" and table.lfresh is not None:
            forwarded = table.lfresh - (table.lfresh_copied if table.lfresh_copied is not None else 0.0)
            per += forwarded / (p.fresh_slot_GBps * 1e3)
        if p.copy_beside_transfer_GBps and table.lrank.size and table.ntransfers:
            per += table.lcopy * _beside_transfer(table, p.beside_shares_cores, p.beside_receive_share) \
                / (p.copy_beside_transfer_GBps * 1e3)
        if p.copy_beside_send_GBps and table.lrank.size and table.ntransfers:
            sends, receives = _step_roles(table)
            per += table.lcopy * (sends & ~receives) / (p.copy_beside_send_GBps * 1e3)
        if p.small_step_costs is not None and table.lrank.size:
            per = per * step_size_factor(p, table)[table.lstep]
        return per * self.local_slowdown(table.nranks)[table.lrank]

    def _copy_share(self, table: Any) -> np.ndarray | float:
        """Per local-work entry: its copy's time over the calibrated copy's (`SimParams.shared_cores`):
        the calibration copied on all n ranks at once, cores / n of a core each; j ranks copying in a
        step get min(1, cores / j) each."""
        k = self.params.shared_cores
        n = table.nranks
        if not k or n <= k or not table.lrank.size:
            return 1.0
        copying = table.lcopy > 0
        j = np.bincount(table.lstep[copying], minlength=int(table.lstep.max()) + 1)[table.lstep]
        return min(1.0, k / n) / np.minimum(1.0, k / np.maximum(j, 1))

    def local_slowdown(self, nranks: int) -> np.ndarray:
        """Per rank: how much slower its local work runs when its host has fewer cores than ranks."""
        cores = self.params.host_cores
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
        ht = self.params.host_transport
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
            paths = list(self.topo.paths(a, b)) or [self.topo.path(a, b)]
        ids = [self._link_ids(p) for p in paths]
        if restrict is not None and self.params.pair_links:
            ids = [self._pair_path(src, dst, ids[0])]
        if mode == "ecmp" and len(ids) > 1:
            pick = (src * 1_000_003 + dst * 7919 + chan * 104_729) % len(ids)
            ids = [ids[pick]]
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
