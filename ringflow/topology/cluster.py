"""Cluster builders: N servers of a preset joined by a rail-optimised or fat-tree (2 or 3 tiers) fabric.

Sizing (switch radix R ports, oversubscription o = down:up at the leaf):
  leaf: down = round(R * o / (1 + o)) NIC ports, up = R - down ports
  2 tiers: spines = ceil(leaves * up / R); each leaf -> each spine with max(1, up // spines) parallel links
  3 tiers: pods of R/2 leaves with their own spines (R/2 down, R/2 up); cores = ceil(pods * spines_per_pod * R/2 / R)
Rail-optimised: NIC r of every server goes to a leaf of rail r (NCCL's "same NIC index on every node"
traffic then stays under one leaf); when fewer servers than leaf ports exist, floor(down / servers)
rails share a leaf. Fat-tree: NICs fill leaves in server order.
Parallel links between two switches are merged into one edge (nlinks, bw = nlinks x port speed).
Switches are NET_SWITCH nodes with host -1, `tier` 0 (leaf) / 1 (spine) / 2 (core), leaf `rail`.
Default radix 64 = NVIDIA Quantum-2 QM9700 (64 x 400 Gb/s NDR ports, datasheet).
"""
from __future__ import annotations

import copy
import math

from ..errors import TopologyError
from ..hardware import LATENCY_US
from ..units import gbps_to_GBps
from .graph import LinkType, NodeKind, Topology
from .presets import PRESETS, build_preset

FABRICS = ("rail", "fat-tree")


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
                  oversubscription: float = 1.0, tiers: int = 2, radix: int = 64) -> Topology:
    """`nodes` servers of `preset` on a rail-optimised or fat-tree fabric of `tiers` (2 or 3) switch tiers."""
    _check_cluster_args(nodes, fabric, oversubscription, tiers, radix)
    name = preset if isinstance(preset, str) else preset.name
    topo = Topology(f"{nodes}x{name}-{fabric}", meta={"cluster": {
        "preset": name, "nodes": nodes, "fabric": fabric, "nic_gbps": nic_gbps, "oversubscription": oversubscription,
        "tiers": tiers, "radix": radix}})
    if not isinstance(preset, str) and (preset.meta or {}).get("sim"):
        topo.meta["sim"] = copy.deepcopy(preset.meta["sim"])   # a calibrated host's simulator parameters
    down = max(1, min(radix - 1, round(radix * oversubscription / (1 + oversubscription))))
    up = radix - down
    _add_servers(topo, preset, nodes, fabric, tiers, radix, down, up)
    nics = topo.nics()
    if not nics:
        raise TopologyError(f"preset {name!r} has no NICs to join servers", "use a preset with NICs")
    if nic_gbps is not None:
        if not nic_gbps > 0:
            raise TopologyError(f"nic_gbps={nic_gbps} must be > 0", "give the NIC port speed in Gb/s, e.g. 400")
        for n in nics:
            topo.graph.nodes[n]["speed_gbps"] = float(nic_gbps)
    speeds = {topo.graph.nodes[n]["speed_gbps"] for n in nics}
    port_gbps = max(speeds)
    fam = {topo.graph.nodes[n].get("fabric", "ib") for n in nics}
    ltype = LinkType.IB if fam == {"ib"} else LinkType.ETHERNET
    sw_lat = LATENCY_US["ib_switch"] if ltype == LinkType.IB else LATENCY_US["eth_switch"]
    switches = _Switches(topo, radix)
    leaves = _add_leaves(topo, switches, fabric, nodes, down, ltype)
    # ---- spines (and cores)
    link_GBps = gbps_to_GBps(port_gbps)
    if tiers == 2:
        _add_spines(topo, switches, leaves, up, ltype, link_GBps, sw_lat)
    else:
        _add_pods_and_cores(topo, switches, leaves, up, ltype, link_GBps, sw_lat)
    topo.meta["cluster"].update({"leaves": len(leaves), "leaf_down_ports": down, "leaf_up_ports": up,
                                 "port_gbps": port_gbps, "link_type": ltype.value})
    return topo


def _check_cluster_args(nodes: int, fabric: str, oversubscription: float, tiers: int, radix: int) -> None:
    if fabric not in FABRICS:
        raise TopologyError(f"fabric {fabric!r} is not known", f"use one of {', '.join(FABRICS)}")
    if not isinstance(nodes, int) or nodes < 1:
        raise TopologyError(f"nodes={nodes!r} must be an integer >= 1", "give the number of servers")
    if tiers not in (2, 3):
        raise TopologyError(f"tiers={tiers} is not supported", "use 2 (leaf-spine) or 3 (leaf-spine-core)")
    if not oversubscription >= 1.0:
        raise TopologyError(f"oversubscription={oversubscription} must be >= 1", "1 = non-blocking, 2 = 2:1, ...")
    if radix < 4:
        raise TopologyError(f"radix={radix} is too small", "switches have at least 4 ports")


def _add_servers(topo: Topology, preset: str | Topology, nodes: int, fabric: str, tiers: int, radix: int,
                 down: int, up: int) -> None:
    """The `nodes` servers, host 0 first; a 2-tier fabric is sized after host 0, before building the rest."""
    for h in range(nodes):
        if h == 1 and tiers == 2:   # size check before building every server
            per = len(topo.nics(0))
            rpl, lpg = _rail_plan(per, nodes, down)
            nleaf = (math.ceil(per / rpl) * lpg) if fabric == "rail" else math.ceil(per * nodes / down)
            if math.ceil(nleaf * up / radix) > up:
                raise TopologyError(f"{nleaf} leaves of radix {radix} do not fit a 2-tier fabric",
                                    "use tiers=3, a larger radix, or fewer nodes")
        if isinstance(preset, str):
            if preset.partition(":")[0] not in PRESETS:
                raise TopologyError(f"unknown topology preset {preset!r}", f"use one of {', '.join(PRESETS)}")
            build_preset(preset, host=h, topo=topo)
        else:
            _replicate(preset, topo, h)


class _Switches:
    """Adds the fabric's NET_SWITCH nodes (host -1), numbered in the order they are made."""

    def __init__(self, topo: Topology, radix: int) -> None:
        self.topo, self.radix, self.count = topo, radix, 0

    def add(self, tier: int, label: str, **kw: object) -> str:
        sid = f"net/{label}"
        self.topo.add_node(sid, NodeKind.NET_SWITCH, -1, self.count, tier=tier, label=label, ports=self.radix, **kw)
        self.count += 1
        return sid


def _add_leaves(topo: Topology, switches: _Switches, fabric: str, nodes: int, down: int,
                ltype: LinkType) -> list[str]:
    """The leaf switches, every NIC linked to its leaf (rail-optimised: by rail; fat-tree: in server order)."""
    leaves: list[str] = []
    if fabric == "rail":
        per_host = max(len(topo.nics(h)) for h in range(nodes))
        rpl, lpg = _rail_plan(per_host, nodes, down)
        for grp in range(math.ceil(per_host / rpl)):
            rails = list(range(grp * rpl, min(per_host, (grp + 1) * rpl)))
            tag = f"r{rails[0]}" if len(rails) == 1 else f"r{rails[0]}-{rails[-1]}"
            for j in range(lpg):
                leaves.append(switches.add(0, f"leaf-{tag}-{j}", rail=rails[0], rails=rails))
        for h in range(nodes):
            for nic in topo.nics(h):
                r = int(topo.graph.nodes[nic].get("rail", topo.graph.nodes[nic]["index"])) % per_host
                leaf = leaves[(r // rpl) * lpg + h // down]
                _nic_link(topo, nic, leaf, ltype)
    else:
        nics = topo.nics()
        nleaf = math.ceil(len(nics) / down)
        leaves = [switches.add(0, f"leaf{j}") for j in range(nleaf)]
        for g, nic in enumerate(nics):
            _nic_link(topo, nic, leaves[g // down], ltype)
    return leaves


def _add_spines(topo: Topology, switches: _Switches, leaves: list[str], up: int, ltype: LinkType,
                link_GBps: float, sw_lat: float) -> None:
    """2 tiers: every leaf to every spine."""
    radix = switches.radix
    nspine = max(1, math.ceil(len(leaves) * up / radix))
    if nspine > up:
        raise TopologyError(f"{len(leaves)} leaves of radix {radix} do not fit a 2-tier fabric",
                            "use tiers=3, a larger radix, or fewer nodes")
    k = max(1, up // nspine)
    spines = [switches.add(1, f"spine{s}") for s in range(nspine)]
    for lf in leaves:
        for sp in spines:
            topo.add_link(lf, sp, ltype, k * link_GBps, sw_lat, nlinks=k, tier="leaf-spine")


def _add_pods_and_cores(topo: Topology, switches: _Switches, leaves: list[str], up: int, ltype: LinkType,
                        link_GBps: float, sw_lat: float) -> None:
    """3 tiers: pods of radix/2 leaves, each with its own spines; every spine to every core."""
    radix = switches.radix
    pod_leaves = max(1, radix // 2)
    npods = math.ceil(len(leaves) / pod_leaves)
    spp = max(1, math.ceil(min(pod_leaves, len(leaves)) * up / (radix // 2)))
    k1 = max(1, up // spp)
    all_spines = []
    for p in range(npods):
        pod = leaves[p * pod_leaves:(p + 1) * pod_leaves]
        spines = [switches.add(1, f"spine-p{p}-{s}", pod=p) for s in range(spp)]
        all_spines.extend(spines)
        for lf in pod:
            topo.graph.nodes[lf]["pod"] = p
            for sp in spines:
                topo.add_link(lf, sp, ltype, k1 * link_GBps, sw_lat, nlinks=k1, tier="leaf-spine")
    ncore = max(1, math.ceil(len(all_spines) * (radix // 2) / radix))
    k2 = max(1, (radix // 2) // ncore)
    cores = [switches.add(2, f"core{c}") for c in range(ncore)]
    for sp in all_spines:
        for co in cores:
            topo.add_link(sp, co, ltype, k2 * link_GBps, sw_lat, nlinks=k2, tier="spine-core")


def _rail_plan(per_host: int, nodes: int, down: int) -> tuple[int, int]:
    """(rails sharing one leaf, leaves per rail group): one rail per leaf once a rail fills a leaf."""
    if nodes >= down:
        return 1, math.ceil(nodes / down)
    return max(1, min(per_host, down // nodes)), 1


def _nic_link(topo: Topology, nic: str, leaf: str, ltype: LinkType) -> None:
    speed = topo.graph.nodes[nic]["speed_gbps"]
    topo.add_link(nic, leaf, ltype, gbps_to_GBps(speed), LATENCY_US["nic"], nlinks=1, tier="nic")
