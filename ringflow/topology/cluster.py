"""Cluster builders: N servers of a preset joined by a rail-optimised or fat-tree fabric (see fabric_plan).

Rail-optimised: NIC r of every server goes to a leaf of rail r (NCCL's "same NIC index on every node"
traffic then stays under one leaf); when fewer servers than leaf ports exist, floor(down / servers)
rails share a leaf. Fat-tree: NICs fill leaves in server order. With P planes each plane is its own
fabric of that shape over the NICs i with i % P == p (rails of a plane numbered i // P).
Parallel links between two switches are merged into one edge (nlinks, bw = nlinks x port speed).
Switches are NET_SWITCH nodes with host -1, `tier` 0 (leaf) / 1 (spine) / 2 (core), `plane`, leaf `rail`.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import networkx as nx

from ..errors import TopologyError
from ..hardware import LATENCY_US
from ..units import gbps_to_GBps
from .fabric_plan import DEFAULT_RADIX, FABRICS, FabricSpec, rail_plan
from .gcpause import gc_paused
from .graph import LinkType, NodeKind, Topology, node_attrs, predecessors, successors
from .presets import PRESETS, build_preset

__all__ = ["FABRICS", "FabricSpec", "build_cluster"]


def _replicate(template: Topology, topo: Topology, host: int) -> None:
    """Copy a one-host template into `topo` as host `host` (ids re-prefixed)."""
    g = template.graph
    hosts = template.hosts()
    if len(hosts) != 1:
        raise TopologyError(f"cluster template {template.name!r} has {len(hosts)} hosts", "give a one-server topology")
    rename = {}
    for n, d in g.nodes(data=True):
        base = n.split("/", 1)[1] if n.startswith(f"h{hosts[0]}/") else n
        rename[n] = f"h{host}/{base}"
        attrs = {k: v for k, v in d.items() if k not in ("kind", "host", "index")}
        attrs["label"] = rename[n] if attrs.get("label") == n else attrs.get("label", rename[n])
        topo.add_node(rename[n], d["kind"], host, d["index"], **attrs)
    for u, v, d in g.edges(data=True):
        attrs = {k: x for k, x in d.items() if k not in ("type", "bw_GBps", "latency_us", "nlinks", "tier")}
        topo.add_link(rename[u], rename[v], d["type"], d["bw_GBps"], d["latency_us"], d["nlinks"], d["tier"],
                      bidirectional=False, **attrs)


def build_cluster(preset: str | Topology, nodes: int, fabric: str = "rail", nic_gbps: float | None = None,
                  oversubscription: float | Sequence[float] = 1.0, tiers: int = 2, radix: int = DEFAULT_RADIX,
                  planes: int = 1) -> Topology:
    """`nodes` servers of `preset` on a rail-optimised or fat-tree fabric of `tiers` (2 or 3) switch tiers, with
    `oversubscription` per tier below the top (leaf[, spine]) and `planes` parallel independent fabrics."""
    with gc_paused():
        return _build_cluster(preset, nodes, fabric, nic_gbps, oversubscription, tiers, radix, planes)


def _build_cluster(preset: str | Topology, nodes: int, fabric: str, nic_gbps: float | None,
                   oversubscription: float | Sequence[float], tiers: int, radix: int, planes: int) -> Topology:
    spec = FabricSpec.make(fabric, tiers, radix, oversubscription, planes)
    if not isinstance(nodes, int) or nodes < 1:
        raise TopologyError(f"nodes={nodes!r} must be an integer >= 1", "give the number of servers")
    if nic_gbps is not None and not nic_gbps > 0:
        raise TopologyError(f"nic_gbps={nic_gbps} must be > 0", "give the NIC port speed in Gb/s, e.g. 400")
    name = preset if isinstance(preset, str) else preset.name
    suffix = "" if planes == 1 else f"-{planes}planes"
    topo = Topology(f"{nodes}x{name}-{fabric}{suffix}", meta={"cluster": {
        "preset": name, "nodes": nodes, "fabric": fabric, "nic_gbps": nic_gbps,
        "oversubscription": spec.leaf_oversub, "oversubscription_per_tier": list(spec.oversub),
        "tiers": tiers, "radix": radix, "planes": planes}})
    if not isinstance(preset, str) and (preset.meta or {}).get("sim"):
        topo.meta["sim"] = copy.deepcopy(preset.meta["sim"])   # a calibrated host's simulator parameters
    _add_servers(topo, preset, nodes, spec)
    nics = topo.nics()
    if nic_gbps is not None:
        for n in nics:
            topo.graph.nodes[n]["speed_gbps"] = float(nic_gbps)
    attrs = node_attrs(topo.graph)
    port_gbps = max(attrs[n]["speed_gbps"] for n in nics)
    fam = {attrs[n].get("fabric", "ib") for n in nics}
    ltype = LinkType.IB if fam == {"ib"} else LinkType.ETHERNET
    sw_lat = LATENCY_US["ib_switch"] if ltype == LinkType.IB else LATENCY_US["eth_switch"]
    switches = _Switches(topo, radix)
    down, up = spec.leaf_ports()
    link_GBps = gbps_to_GBps(port_gbps)
    nleaves = 0
    per_host: dict[int, list[str]] = {}
    for n in nics:   # sorted by (host, index): each host's NICs in order, one pass over the graph
        per_host.setdefault(int(attrs[n]["host"]), []).append(n)
    for p in range(planes):
        switches.prefix, switches.plane = ("" if planes == 1 else f"p{p}-"), p
        members = [[n for n in per_host.get(h, []) if _rail(topo, n) % planes == p] for h in range(nodes)]
        leaves = _add_leaves(topo, switches, spec, members, ltype)
        nleaves += len(leaves)
        if tiers == 2:
            _add_spines(topo, switches, leaves, up, ltype, link_GBps, sw_lat)
        else:
            _add_pods_and_cores(topo, switches, spec, leaves, ltype, link_GBps, sw_lat)
    topo.meta["cluster"].update({"leaves": nleaves, "leaf_down_ports": down, "leaf_up_ports": up,
                                 "port_gbps": port_gbps, "link_type": ltype.value})
    return topo


def _rail(topo: Topology, nic: str) -> int:
    d = node_attrs(topo.graph)[nic]
    return int(d["rail"] if "rail" in d else d["index"])


def _add_servers(topo: Topology, preset: str | Topology, nodes: int, spec: FabricSpec) -> None:
    """The `nodes` servers, host 0 first; the fabric is sized after host 0, before building the rest."""
    name = preset if isinstance(preset, str) else preset.name
    template = None   # host 0, once a fresh build of host 1 is its copy: the other hosts are copied from it
    counts: list[tuple[str, int]] = []
    for h in range(nodes):
        if isinstance(preset, str):
            if preset.partition(":")[0] not in PRESETS:
                raise TopologyError(f"unknown topology preset {preset!r}", f"use one of {', '.join(PRESETS)}")
            if template is not None:
                _copy_host(topo, template, h, counts)
                continue
            build_preset(preset, host=h, topo=topo)
            if h == 1 and _host_view(topo, 1) == _host_view(topo, 0, rename=1):
                template = _host_view(topo, 0)
                counts = _kind_counts(template)
        else:
            _replicate(preset, topo, h)
        if h == 0:
            per = len(topo.nics(0))
            if not per:
                raise TopologyError(f"preset {name!r} has no NICs to join servers", "use a preset with NICs")
            spec.check_fits(per, nodes)


_LinkRow = tuple[str, str, LinkType, float, float, int, str]
_HostView = tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str, dict[str, Any]]]]


def _host_view(topo: Topology, host: int, rename: int | None = None) -> _HostView:
    """A host's nodes and links in graph order, with attributes (ids, labels and host as host `rename`)."""
    g, pre = topo.graph, f"h{host}/"
    new = f"h{host if rename is None else rename}/"

    def ren(x: str) -> str:
        return new + x[len(pre):] if x.startswith(pre) else x

    def attrs(d: dict[str, Any]) -> dict[str, Any]:
        out = dict(d)
        if isinstance(out.get("label"), str):
            out["label"] = ren(out["label"])
        if rename is not None:
            out["host"] = rename
        return out
    nodes = [n for n, d in g.nodes(data=True) if d["host"] == host]
    return ([(ren(n), attrs(g.nodes[n])) for n in nodes],
            [(ren(u), ren(v), d) for u in nodes for v, d in g.adj[u].items()])


def _copy_host(topo: Topology, template: _HostView, dst: int, counts: list[tuple[str, int]]) -> None:
    """Add host `dst` as a copy of `template` (host 0's `_host_view`, checked equal to a fresh build of host 1;
    `counts`: its `_kind_counts`)."""
    nodes, links = template
    new = f"h{dst}/"
    ids = {n: new + n[3:] if n.startswith("h0/") else n for n, _ in nodes}
    g = topo.graph
    node_rows = [(ids[n], {**d, "host": dst, "label": ids.get(d["label"], d["label"])}) for n, d in nodes]
    edge_rows = [(ids[u], ids[v], dict(d)) for u, v, d in links]
    if type(g) is nx.DiGraph and not any(n in g for n, _ in node_rows):
        # the same dicts, in the same order, as add_nodes_from / add_edges_from make, without their per-item checks
        attrs: dict[str, dict[str, Any]] = g._node  # type: ignore[attr-defined]
        succ, pred = successors(g), predecessors(g)
        for n, d in node_rows:
            attrs[n] = d
            succ[n] = {}
            pred[n] = {}
        for u, v, d in edge_rows:
            succ[u][v] = d
            pred[v][u] = d
        nx._clear_cache(g)
    else:
        g.add_nodes_from(node_rows)
        g.add_edges_from(edge_rows)
    for kind, top in counts:
        key = (dst, kind)
        topo._counters[key] = max(topo._counters.get(key, 0), top)
    topo.invalidate()


def _kind_counts(template: _HostView) -> list[tuple[str, int]]:
    """Per node kind of `template`: one past its highest index (the host's next free index of that kind)."""
    out: dict[str, int] = {}
    for _, d in template[0]:
        kind = str(getattr(d["kind"], "value", d["kind"]))
        out[kind] = max(out.get(kind, 0), int(d["index"]) + 1)
    return list(out.items())


class _Switches:
    """Adds the fabric's NET_SWITCH nodes (host -1), numbered in the order they are made."""

    def __init__(self, topo: Topology, radix: int) -> None:
        self.topo, self.radix, self.count = topo, radix, 0
        self.prefix, self.plane = "", 0

    def add(self, tier: int, label: str, **kw: object) -> str:
        label = self.prefix + label
        sid = f"net/{label}"
        self.topo.add_node(sid, NodeKind.NET_SWITCH, -1, self.count, tier=tier, label=label, ports=self.radix,
                           plane=self.plane, **kw)
        self.count += 1
        return sid


def _add_leaves(topo: Topology, switches: _Switches, spec: FabricSpec, members: list[list[str]],
                ltype: LinkType) -> list[str]:
    """One plane's leaf switches, every NIC of `members` (per host) linked to its leaf (rail-optimised: by rail;
    fat-tree: in server order)."""
    down = spec.leaf_ports()[0]
    nodes = len(members)
    leaves: list[str] = []
    if spec.kind == "rail":
        per_host = max(len(m) for m in members)
        rpl, lpg = rail_plan(per_host, nodes, down)
        for grp in range(math.ceil(per_host / rpl)):
            rails = list(range(grp * rpl, min(per_host, (grp + 1) * rpl)))
            tag = f"r{rails[0]}" if len(rails) == 1 else f"r{rails[0]}-{rails[-1]}"
            for j in range(lpg):
                leaves.append(switches.add(0, f"leaf-{tag}-{j}", rail=rails[0], rails=rails))
        topo.add_links(_nic_link(topo, nic, leaves[((_rail(topo, nic) // spec.planes) % per_host // rpl) * lpg
                                                   + h // down], ltype)
                       for h, nics in enumerate(members) for nic in nics)
    else:
        nics = [n for m in members for n in m]
        leaves = [switches.add(0, f"leaf{j}") for j in range(math.ceil(len(nics) / down))]
        topo.add_links(_nic_link(topo, nic, leaves[g // down], ltype) for g, nic in enumerate(nics))
    return leaves


def _add_spines(topo: Topology, switches: _Switches, leaves: list[str], up: int, ltype: LinkType,
                link_GBps: float, sw_lat: float) -> None:
    """2 tiers: every leaf to every spine."""
    nspine = _divisor_at_least(up, math.ceil(len(leaves) * up / switches.radix))
    k = up // nspine
    spines = [switches.add(1, f"spine{s}") for s in range(nspine)]
    topo.add_links((lf, sp, ltype, k * link_GBps, sw_lat, k, "leaf-spine") for lf in leaves for sp in spines)


def _add_pods_and_cores(topo: Topology, switches: _Switches, spec: FabricSpec, leaves: list[str], ltype: LinkType,
                        link_GBps: float, sw_lat: float) -> None:
    """3 tiers: pods of (spine down ports) leaves, each with its own spines; spine j of every pod joins core
    group j (every core of the group)."""
    radix = switches.radix
    up = spec.leaf_ports()[1]
    d2, u2 = spec.spine_ports()
    npods = math.ceil(len(leaves) / d2)
    spp = _divisor_at_least(up, math.ceil(min(d2, len(leaves)) * up / d2))
    k1 = up // spp
    per_group = _divisor_at_least(u2, math.ceil(npods * u2 / radix))
    k2 = u2 // per_group
    groups = [[switches.add(2, f"core{j * per_group + c}", group=j) for c in range(per_group)] for j in range(spp)]
    for p in range(npods):
        pod = leaves[p * d2:(p + 1) * d2]
        spines = [switches.add(1, f"spine-p{p}-{s}", pod=p) for s in range(spp)]
        for lf in pod:
            topo.graph.nodes[lf]["pod"] = p
        topo.add_links((lf, sp, ltype, k1 * link_GBps, sw_lat, k1, "leaf-spine") for lf in pod for sp in spines)
        topo.add_links((sp, co, ltype, k2 * link_GBps, sw_lat, k2, "spine-core")
                       for j, sp in enumerate(spines) for co in groups[j])


def _divisor_at_least(ports: int, need: int) -> int:
    """The fewest upper switches >= `need` among which `ports` uplinks split evenly (no uplink left unused)."""
    need = max(1, need)
    return next((d for d in range(need, ports + 1) if ports % d == 0), max(need, ports))


def _nic_link(topo: Topology, nic: str, leaf: str, ltype: LinkType) -> _LinkRow:
    """The link of `nic` to its leaf, as `Topology.add_links` takes it."""
    speed = node_attrs(topo.graph)[nic]["speed_gbps"]
    return (nic, leaf, ltype, gbps_to_GBps(speed), LATENCY_US["nic"], 1, "nic")
