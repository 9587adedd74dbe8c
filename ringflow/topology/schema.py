"""The versioned topology file schema (YAML or JSON) and its validation.

```yaml
schema: ringflow.topology      # required, exactly this
version: 1                     # required; this reader understands 1
name: dgx-h100                 # optional (default: file stem)
meta: {}                       # optional free-form mapping (the simulator keeps meta["sim"] here)
nodes:                         # required list
  - id: h0/gpu0                # required, unique string
    kind: gpu                  # required: gpu proc cpu nic pcie_switch nvswitch net_switch
    host: 0                    # optional int (default 0; -1 for fabric switches)
    index: 0                   # optional int (nvidia-smi GPU number; default per-host counter)
    model: H100                # any further key is kept as a node attribute
links:                         # required list
  - a: h0/gpu0                 # required node ids
    b: h0/nvsw0
    type: nvlink               # required: nvlink pcie qpi ib ethernet shm loopback
    bw_GBps: 450.0             # required, > 0, per direction (GB/s = 1e9 B/s)
    latency_us: 0.2            # required, >= 0
    nlinks: 18                 # optional int >= 1 (default 1)
    tier: nvlink               # optional: nvlink pcie qpi nic leaf-spine spine-core shm loopback
    bidirectional: true        # optional (default true): also add b -> a with the same figures
```
Errors are TopologyError naming the field, e.g. "links[3].bw_GBps: -5 must be a number > 0".
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from ..errors import TopologyError
from .graph import TIERS, LinkType, NodeKind

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Topology

SCHEMA = "ringflow.topology"
SCHEMA_VERSION = 1
_NODE_KEYS = ("id", "kind", "host", "index")
_LINK_KEYS = ("a", "b", "type", "bw_GBps", "latency_us", "nlinks", "tier", "bidirectional")


def _plain(v: Any) -> Any:
    if isinstance(v, (NodeKind, LinkType)):
        return v.value
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):
        return v.item()
    return v


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """Serialise: nodes sorted by (host, kind, index); a link pair with equal figures is one bidirectional entry."""
    g = topo.graph
    nodes = []
    for n in sorted(g.nodes, key=lambda n: (g.nodes[n]["host"], g.nodes[n]["kind"].value, g.nodes[n]["index"], n)):
        d = g.nodes[n]
        entry = {"id": n, "kind": d["kind"].value, "host": d["host"], "index": d["index"]}
        entry.update({k: _plain(v) for k, v in d.items() if k not in entry})
        nodes.append(entry)
    links = []
    done: set[tuple[str, str]] = set()
    for u, v, d in g.edges(data=True):
        if (u, v) in done:
            continue
        entry = {"a": u, "b": v, "type": d["type"].value, "bw_GBps": d["bw_GBps"], "latency_us": d["latency_us"],
                 "nlinks": d["nlinks"], "tier": d["tier"]}
        entry.update({k: _plain(x) for k, x in d.items() if k not in entry})
        back = g.edges[v, u] if g.has_edge(v, u) else None
        if back is not None and _plain(dict(back)) == _plain(dict(d)):
            entry["bidirectional"] = True
            entry["a"], entry["b"] = min(u, v), max(u, v)
            done.add((v, u))
        else:
            entry["bidirectional"] = False
        done.add((u, v))
        links.append(entry)
    links.sort(key=lambda x: (x["a"], x["b"]))
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "name": topo.name, "meta": _plain(topo.meta),
            "nodes": nodes, "links": links}


def _need(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise TopologyError(f"{where}.{key} is missing", f"every entry of {where.split('[')[0]} needs '{key}'")
    return d[key]


def _number(v: Any, where: str, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise TopologyError(f"{where}: {v!r} is not a number", "write a plain number")
    if positive and not v > 0:
        raise TopologyError(f"{where}: {v!r} must be a number > 0", "bandwidths are per-direction GB/s > 0")
    if not positive and v < 0:
        raise TopologyError(f"{where}: {v!r} must be >= 0", "latencies are microseconds >= 0")
    return float(v)


def _int(v: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TopologyError(f"{where}: {v!r} is not an integer", "write a whole number")
    if minimum is not None and v < minimum:
        raise TopologyError(f"{where}: {v} must be >= {minimum}", f"use an integer >= {minimum}")
    return v


def topology_from_dict(d: Any, default_name: str = "custom") -> Topology:
    """Validate and build a Topology; every error names the offending field."""
    from .graph import Topology
    meta = _checked_header(d)
    topo = Topology(str(d.get("name") or default_name), meta=meta)
    nodes = d.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TopologyError("nodes: must be a non-empty list", "list the devices under 'nodes:'")
    kinds = [k.value for k in NodeKind]
    for i, n in enumerate(nodes):
        _add_node_entry(topo, f"nodes[{i}]", n, kinds)
    links = d.get("links", [])
    if not isinstance(links, list):
        raise TopologyError("links: must be a list", "list the links under 'links:'")
    types = [t.value for t in LinkType]
    for i, ln in enumerate(links):
        _add_link_entry(topo, f"links[{i}]", ln, types)
    return topo


def _checked_header(d: Any) -> dict[str, Any]:
    """Check the top level (a mapping with the known keys, schema and version); the `meta` mapping."""
    if not isinstance(d, dict):
        raise TopologyError(f"a topology must be a mapping, got {type(d).__name__}",
                            f"start the file with 'schema: {SCHEMA}' and 'version: {SCHEMA_VERSION}'")
    if d.get("schema") != SCHEMA:
        raise TopologyError(f"schema: expected {SCHEMA!r}, got {d.get('schema')!r}",
                            f"add 'schema: {SCHEMA}' at the top of the file")
    unknown = sorted(set(d) - {"schema", "version", "name", "meta", "nodes", "links"})
    if unknown:
        raise TopologyError(f"unknown top-level key {unknown[0]!r}",
                            "the keys are schema, version, name, meta, nodes, links")
    version = d.get("version")
    if version != SCHEMA_VERSION:
        raise TopologyError(f"version: {version!r} is not supported (this reader knows {SCHEMA_VERSION})",
                            f"write 'version: {SCHEMA_VERSION}' or upgrade ringflow")
    meta = d.get("meta", {}) or {}
    if not isinstance(meta, dict):
        raise TopologyError("meta: must be a mapping", "write 'meta: {}' or remove it")
    return meta


def _add_node_entry(topo: Topology, where: str, n: Any, kinds: list[str]) -> None:
    """Check one entry of `nodes` and add it."""
    if not isinstance(n, dict):
        raise TopologyError(f"{where}: must be a mapping", "write '- id: ...' entries")
    nid = _need(n, "id", where)
    if not isinstance(nid, str) or not nid:
        raise TopologyError(f"{where}.id: {nid!r} must be a non-empty string", "name the node")
    kind = _need(n, "kind", where)
    if kind not in kinds:
        raise TopologyError(f"{where}.kind: {kind!r} is not a node kind", f"use one of {', '.join(kinds)}")
    host = _int(n.get("host", 0), f"{where}.host", -1)
    index = n.get("index")
    if index is not None:
        index = _int(index, f"{where}.index", 0)
    if nid in topo.graph:
        raise TopologyError(f"{where}.id: {nid!r} is used twice", "give every node a unique id")
    extra = {k: v for k, v in n.items() if k not in _NODE_KEYS}
    topo.add_node(nid, NodeKind(kind), host=host, index=index, **extra)


def _add_link_entry(topo: Topology, where: str, ln: Any, types: list[str]) -> None:
    """Check one entry of `links` and add it."""
    if not isinstance(ln, dict):
        raise TopologyError(f"{where}: must be a mapping", "write '- a: ... b: ...' entries")
    a, b = _need(ln, "a", where), _need(ln, "b", where)
    for key, node in (("a", a), ("b", b)):
        if node not in topo.graph:
            raise TopologyError(f"{where}.{key}: node {node!r} is not defined under nodes",
                                "define the node or fix the id")
    typ = _need(ln, "type", where)
    if typ not in types:
        raise TopologyError(f"{where}.type: {typ!r} is not a link type", f"use one of {', '.join(types)}")
    bw = _number(_need(ln, "bw_GBps", where), f"{where}.bw_GBps", True)
    lat = _number(_need(ln, "latency_us", where), f"{where}.latency_us", False)
    nlinks = _int(ln.get("nlinks", 1), f"{where}.nlinks", 1)
    tier = ln.get("tier")
    if tier is not None and tier not in TIERS:
        raise TopologyError(f"{where}.tier: {tier!r} is not a tier", f"use one of {', '.join(TIERS)}")
    bidir = ln.get("bidirectional", True)
    if not isinstance(bidir, bool):
        raise TopologyError(f"{where}.bidirectional: {bidir!r} must be true or false", "write true or false")
    if a == b:
        raise TopologyError(f"{where}: a and b are both {a!r}", "a link joins two different nodes")
    extra = {k: v for k, v in ln.items() if k not in _LINK_KEYS}
    topo.add_link(a, b, LinkType(typ), bw, lat, nlinks=nlinks, tier=tier, bidirectional=bidir, **extra)


def save_topology(topo: Topology, path: str) -> None:
    """Write YAML (.yaml/.yml) or JSON (.json)."""
    data = topology_to_dict(topo)
    ext = os.path.splitext(path)[1].lower()
    with open(path, "w") as fh:
        if ext in (".yaml", ".yml"):
            import yaml
            yaml.safe_dump(data, fh, sort_keys=False, default_flow_style=None, width=120)
        elif ext == ".json":
            json.dump(data, fh, indent=1)
            fh.write("\n")
        else:
            raise TopologyError(f"cannot save topology as {path!r}: unknown extension {ext!r}",
                                "use .yaml, .yml or .json")


def load_topology_file(path: str) -> Topology:
    """Read and validate a YAML/JSON topology file."""
    ext = os.path.splitext(path)[1].lower()
    if not os.path.exists(path):
        raise TopologyError(f"topology file {path!r} does not exist", "give a preset name or an existing file")
    try:
        with open(path) as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {path!r}: {exc.strerror if isinstance(exc, OSError) else exc}",
                            "give a readable YAML/JSON topology file or a preset name") from None
    import yaml
    try:
        data = json.loads(text) if ext == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TopologyError(f"{path}: cannot parse: {exc}".splitlines()[0], "fix the YAML/JSON syntax") from None
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        return topology_from_dict(data, default_name=name)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc.message}", exc.hint) from None
