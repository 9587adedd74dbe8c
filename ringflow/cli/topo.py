"""`ringflow topo`: show, search rings/trees on, and detect topologies."""
from __future__ import annotations

import math
from typing import Any

import typer

from ..errors import TopologyError
from .common import (
    FABRIC_OPT,
    OVERSUB_OPT,
    PLANES_OPT,
    RADIX_OPT,
    TIERS_OPT,
    console,
    fabric_options,
    print_json,
    print_table,
)

topo_app = typer.Typer(help="Topologies: presets, files, clusters ('128xdgx-h100'), detection, ring/tree search.",
                       no_args_is_help=True)

SPEC_HELP = "preset (dgx1-v100, dgx-h100, ...), a .yaml/.json file (e.g. from detect --dump), or '<N>x<preset>'"


def _bw(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 3)


@topo_app.command("list")
def list_command(json_out: bool = typer.Option(False, "--json")) -> None:
    """List the preset machines."""
    from ..topology import PRESETS
    rows = [{"name": p.name, "description": p.description} for p in PRESETS.values()]
    if json_out:
        print_json(rows)
        return
    print_table("topology presets", ["name", "description"], [[r["name"], r["description"]] for r in rows],
                justify_right=False)


@topo_app.command("show")
def show_command(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    host: int = typer.Option(0, "--host", min=0, help="which server of a cluster to print"),
    json_out: bool = typer.Option(False, "--json", help="matrix, bandwidths and the full topology as JSON"),
) -> None:
    """Print a matrix like `nvidia-smi topo -m` plus the bottleneck bandwidth of every pair."""
    from ..topology import load_topology
    from ..topology.smi_parser import render_smi, smi_table
    t = load_topology(spec)
    if host not in t.hosts():
        raise TopologyError(f"host {host} is not in {t.name!r} (hosts {t.hosts()[0]}..{t.hosts()[-1]})",
                            "pick an existing --host")
    table = smi_table(t, host)
    if json_out:
        print_json({"name": t.name, "summary": t.summary(), "host": host, **table, "topology": t.to_dict()})
        return
    s = t.summary()
    console.print(f"# {t.name}: {s['hosts']} host(s), {s['endpoints']} endpoints, nodes {s['nodes']}, "
                  f"links {s['links']}", soft_wrap=True)
    console.print(render_smi(t, host), markup=False, highlight=False, soft_wrap=True)
    names = table["devices"]
    print_table("bottleneck GB/s per direction (routed path)", [""] + names,
                [[names[i]] + ["X" if v is None else f"{v:g}" for v in row] for i, row in enumerate(table["bw_GBps"])])
    links = []
    for u, v, d in t.graph.edges(data=True):
        if t.host_of(u) == host and t.host_of(v) == host and u < v:
            links.append([t.label(u), t.label(v), d["type"].value, d["nlinks"], f"{d['bw_GBps']:g}",
                          f"{d['latency_us']:g}"])
    print_table("links (per direction)", ["from", "to", "type", "links", "GB/s", "latency us"], links,
                justify_right=False)


@topo_app.command("rings")
def rings_command(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    gpus: str | None = typer.Option(None, "--gpus", help="comma-separated GPU numbers (nvidia-smi numbering, host 0)"),
    nchannels: int | None = typer.Option(None, "--nchannels", min=1, help="exactly this many rings"),
    json_out: bool = typer.Option(False, "--json", help="JSON: {rings: [{ranks, bottleneck_GBps, ...}], trees: ...}"),
) -> None:
    """Find the rings (channels) with the best bottleneck bandwidth, and the double binary trees."""
    from ..topology import double_binary_tree, find_rings, load_topology, ring_hop_types
    t = load_topology(spec)
    eps = t.endpoints()
    if gpus:
        try:
            wanted = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError:
            raise TopologyError(f"--gpus {gpus!r} is not a comma-separated list of numbers",
                                "e.g. --gpus 0,1,2,3") from None
        eps = [t.find(f"GPU{g}") if t.gpus() else t.find(f"PROC{g}") for g in wanted]
    rings = find_rings(t, eps, nchannels)
    multi = len(t.hosts()) > 1
    names = [(f"{t.host_of(e)}:{t.graph.nodes[e]['index']}" if multi else t.graph.nodes[e]["index"]) for e in eps]
    out_rings: list[dict[str, Any]] = []
    for r in rings:
        out_rings.append({"ranks": [names[i] if not multi else i for i in r.ranks],
                          "positions": list(r.ranks),
                          "bottleneck_GBps": _bw(r.bottleneck_GBps),
                          "hop_types": ring_hop_types(t, r, eps)})
        if multi:
            out_rings[-1]["gpus"] = [names[i] for i in r.ranks]
    t0, t1 = double_binary_tree(len(eps))
    host_trees = None
    if multi:
        from ..topology import hierarchical_trees
        host_trees = [{"parent": p} for p in hierarchical_trees(t, eps)]
    total = sum(r.bottleneck_GBps for r in rings if not math.isinf(r.bottleneck_GBps))
    result = {"topology": t.name, "endpoints": [t.label(e) for e in eps], "rings": out_rings,
              "total_GBps": round(total, 3),
              "trees": [{"parent": t0}, {"parent": t1}]}
    if host_trees:
        result["host_trees"] = host_trees
    if json_out:
        print_json(result)
        return
    console.print(f"# rings on {t.name} over {len(eps)} endpoints (ranks in nvidia-smi numbering"
                  f"{', host:gpu' if multi else ''}); bandwidth per direction", soft_wrap=True)
    for i, ring in enumerate(out_rings):
        shown = ring.get("gpus", ring["ranks"])
        order = " -> ".join(str(x) for x in list(shown) + [shown[0]]) if len(shown) <= 16 else \
            " -> ".join(str(x) for x in shown[:8]) + f" -> ... ({len(shown)} ranks)"
        kinds = sorted(set(ring["hop_types"]))
        console.print(f"ring {i}: {order}   bottleneck {ring['bottleneck_GBps']} GB/s   hops: {', '.join(kinds)}",
                      soft_wrap=True)
    console.print(f"total over {len(out_rings)} ring(s): {result['total_GBps']} GB/s per direction", soft_wrap=True)
    if len(eps) <= 32:
        console.print(f"double binary tree 0 parents: {t0}", soft_wrap=True)
        console.print(f"double binary tree 1 parents: {t1}", soft_wrap=True)
    else:
        console.print(f"double binary trees over {len(eps)} ranks{' and host trees' if host_trees else ''}: see --json",
                      soft_wrap=True)


@topo_app.command("cluster")
def cluster_command(
    preset: str = typer.Argument(..., help="server preset (dgx-h100, dgx-a100, ...) or a one-server topology file"),
    nodes: int = typer.Option(..., "--nodes", min=1, help="number of servers (-n is a rank count elsewhere)"),
    fabric: str = FABRIC_OPT,
    nic: str | None = typer.Option(None, "--nic", help="NIC port speed, e.g. 400G (default: the preset's)"),
    oversub: str = OVERSUB_OPT,
    tiers: int | None = TIERS_OPT,
    radix: int = RADIX_OPT,
    planes: int = PLANES_OPT,
    dump: str | None = typer.Option(None, "--dump",
                                    help="save the cluster (YAML/JSON) for any PRESET_OR_FILE argument"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Build N servers on a rail-optimised or fat-tree fabric and print its size and capacities."""
    from ..topology import load_topology
    from ..topology.graph import NodeKind
    from ..units import parse_rate_gbps
    base = load_topology(preset) if ("." in preset or "/" in preset) else preset
    fab = fabric_options(fabric, tiers, radix, oversub, planes)
    t = fab.build(base, nodes, nic_gbps=parse_rate_gbps(nic) if nic else None)
    if dump:
        t.save(dump)
    sw = t.nodes(NodeKind.NET_SWITCH)
    per_tier = {name: sum(1 for x in sw if t.graph.nodes[x]["tier"] == k)
                for k, name in enumerate(("leaf", "spine", "core"))}
    cap: dict[str, float] = {}
    for u, v, d in t.graph.edges(data=True):   # capacity leaving each tier upwards, per direction
        up = (t.kind(u) == NodeKind.NIC and t.kind(v) == NodeKind.NET_SWITCH) or (
            t.kind(u) == NodeKind.NET_SWITCH and t.kind(v) == NodeKind.NET_SWITCH
            and t.graph.nodes[u]["tier"] < t.graph.nodes[v]["tier"])
        if up:
            cap[d["tier"]] = cap.get(d["tier"], 0.0) + d["bw_GBps"]
    info = {"name": t.name, "summary": t.summary(), "switches": per_tier, "cluster": t.meta["cluster"],
            "upward_GBps": {k: round(v, 3) for k, v in cap.items()}, "dump": dump}
    if json_out:
        print_json(info)
        return
    c = t.meta["cluster"]
    console.print(f"# {t.name}: {len(t.hosts())} servers, {len(t.endpoints())} GPUs, {len(t.nics())} NICs at "
                  f"{c['port_gbps']:g} Gb/s ({c['link_type']})", soft_wrap=True)
    over = ", ".join(f"{o:g}:1" for o in c["oversubscription_per_tier"])
    console.print(f"switches: {per_tier['leaf']} leaves ({c['leaf_down_ports']} down / {c['leaf_up_ports']} up ports), "
                  f"{per_tier['spine']} spines, {per_tier['core']} cores in {c['tiers']} tiers; radix {radix}, "
                  f"oversubscription {over}; {c['planes']} plane(s)", soft_wrap=True)
    for tier, gbps in cap.items():
        console.print(f"upward capacity at tier {tier}: {gbps:,.1f} GB/s per direction", soft_wrap=True)
    if dump:
        console.print(f"written to {dump}", soft_wrap=True)


def _device(t, text: str) -> str:
    host, sep, label = text.partition(":")
    if sep and host.isdigit():
        return t.find(label, host=int(host))
    return t.find(text)


@topo_app.command("path")
def path_command(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    src: str = typer.Argument(..., help="GPU3, NIC0, or host:GPU3 on clusters (e.g. 5:GPU3)"),
    dst: str = typer.Argument(..., help="destination, same syntax"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Print the routed path between two devices: hops, bandwidth, latency, path classes, ECMP count."""
    from ..topology import load_topology
    t = load_topology(spec)
    a, b = _device(t, src), _device(t, dst)
    p = t.path(a, b)
    hops = [{"from": u, "to": v, "type": t.link(u, v)["type"].value, "tier": t.link(u, v)["tier"],
             "bw_GBps": t.link(u, v)["bw_GBps"], "latency_us": t.link(u, v)["latency_us"]} for u, v in t.path_edges(p)]
    out = {"path": p, "hops": hops, "bottleneck_GBps": _bw(t.bottleneck_GBps(a, b)), "latency_us": t.latency_us(a, b),
           "smi_class": t.path_class_smi(a, b), "nccl_class": t.path_class_nccl(a, b), "ecmp_paths": len(t.paths(a, b))}
    if json_out:
        print_json(out)
        return
    console.print(f"{src} -> {dst} on {t.name}: {out['smi_class']} (NCCL {out['nccl_class']}), bottleneck "
                  f"{out['bottleneck_GBps']} GB/s per direction, latency {out['latency_us']:.3g} us, "
                  f"{out['ecmp_paths']} equal-cost path(s)", soft_wrap=True)
    print_table(None, ["from", "to", "type", "tier", "GB/s", "latency us"],
                [[h["from"], h["to"], h["type"], h["tier"], f"{h['bw_GBps']:g}", f"{h['latency_us']:g}"] for h in hops],
                justify_right=False)


@topo_app.command("detect")
def detect_command(
    nvidia_smi_text: str | None = typer.Option(None, "--nvidia-smi-text",
                                               help="build from a saved `nvidia-smi topo -m`"),
    dump: str | None = typer.Option(None, "--dump", help="write the topology (YAML/JSON by extension)"),
    gpu_model: str | None = typer.Option(None, "--gpu-model", help="GPU model for NV# bandwidths (H100, B200, ...)"),
    json_out: bool = typer.Option(False, "--json", help="print summary and topology as JSON"),
) -> None:
    """Detect this machine (CPUs/NUMA and NICs from sysfs, GPUs from nvidia-smi); succeeds without GPUs."""
    from ..topology.detect import detect_topology, load_smi_file
    from ..topology.smi_parser import render_smi
    text = load_smi_file(nvidia_smi_text) if nvidia_smi_text else None
    if gpu_model is not None:
        from ..hardware import gpu_model as _check
        _check(gpu_model)
    t = detect_topology(text, gpu_model=gpu_model)
    if dump:
        t.save(dump)
    info = t.meta["detected"]
    if json_out:
        print_json({"summary": t.summary(), "detected": info, "dump": dump, "topology": t.to_dict()})
        return
    console.print(f"# {t.name}: {info['note']}", soft_wrap=True)
    print_table("CPUs / NUMA nodes", ["cpu", "numa", "socket", "cores", "cpulist"],
                [[t.label(c), t.graph.nodes[c].get("numa"), t.graph.nodes[c].get("socket", ""),
                  t.graph.nodes[c].get("cores"), t.graph.nodes[c].get("cpulist", "")]
                 for c in t.nodes(kind=None) if t.kind(c).value == "cpu"],
                justify_right=False)
    print_table("NICs", ["nic", "name", "Gb/s", "numa"],
                [[t.label(n), t.graph.nodes[n].get("name", ""),
                  f"{t.graph.nodes[n]['speed_gbps']:g}"
                  + ("" if t.graph.nodes[n].get("speed_known", True) else " (assumed)"),
                  t.graph.nodes[n].get("numa")] for n in t.nics()], justify_right=False)
    if t.gpus():
        console.print(render_smi(t), markup=False, highlight=False, soft_wrap=True)
    if dump:
        console.print(f"topology written to {dump} (use it with RINGFLOW_TOPO_FILE={dump} "
                      "or any PRESET_OR_FILE argument)", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `ringflow topo ...`."""
    app.add_typer(topo_app, name="topo")
