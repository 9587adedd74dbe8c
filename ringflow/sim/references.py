"""The registry of published measurements (``ringflow/data/published.yaml``) as the simulator reads it.

One file holds every published case: nccl-tests bus bandwidths and end-to-end training throughputs, each with
its source. This module reads it, builds the topology a case names (`build_topology`), and predicts the cases
marked ``gpu_reference`` with the simulator's own defaults (`evaluate`, `ringflow validate --gpu`). A case
marked ``sets_default`` is the figure a library default was derived from (its error is small by construction);
the others are independent checks. The fitted validation (fitting half, held-out half) is
`ringflow.workload.published`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import ConfigError

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "published.yaml"
TOPOLOGY_KEYS = ("preset", "nodes", "nic_gbps", "keep_nics", "nvlink_links", "nic_fabric", "standin", "fabric",
                 "nvl_partition")
TOPOLOGY_GAPS: dict[str, str] = {}   # topology keys named in data before a builder exists: what they describe


class NotExpressible(Exception):
    """The model cannot describe this case yet (the message says what is missing)."""


def read_registry(path: str | Path | None = None) -> dict[str, Any]:
    """The registry document (``cases`` and ``release``) as YAML gives it, anchors merged."""
    import yaml
    p = Path(path) if path else DATA_PATH
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read published cases {p}: {exc}", "give a readable YAML file") from exc
    cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(cases, list) or not cases:
        raise ConfigError(f"{p}: no 'cases' list", "the file holds 'cases:' with one entry per measurement")
    return doc


# ---- topologies ------------------------------------------------------------------------------------------------
_TOPO_CACHE: dict[str, tuple[Any, str]] = {}


def build_topology(spec: dict[str, Any], gpus: int | None = None) -> tuple[Any, str]:
    """The topology a case names (servers joined by a rail fabric when it spans several), and a note when a
    stand-in replaces a missing preset."""
    key = json.dumps([spec, gpus], sort_keys=True)
    if key not in _TOPO_CACHE:
        if len(_TOPO_CACHE) > 24:
            _TOPO_CACHE.pop(next(iter(_TOPO_CACHE)))
        _TOPO_CACHE[key] = _build(spec, gpus)
    return _TOPO_CACHE[key]


def _build(spec: dict[str, Any], gpus: int | None) -> tuple[Any, str]:
    from ..errors import TopologyError
    from ..topology import build_cluster, load_topology
    from ..topology.presets import preset_names
    unknown = [k for k in spec if k not in TOPOLOGY_KEYS]
    if unknown:
        raise NotExpressible("; ".join(f"{TOPOLOGY_GAPS.get(k, 'topology key ' + repr(k))} (no builder for {k!r})"
                                       for k in unknown))
    note = ""
    if spec["preset"] not in preset_names():
        standin = spec.get("standin")
        if not standin:
            raise NotExpressible(f"no topology preset {spec['preset']!r}")
        note = f"stand-in {standin['preset']} for missing preset {spec['preset']}"
        spec = {**{k: v for k, v in spec.items() if k not in ("standin", "preset")}, **standin}
    base = load_topology(spec["preset"])
    if spec.get("nvl_partition"):   # one NVLink partition of an NVL72 rack is the "server" the fabric joins
        from ..topology.presets_rack import nvl_partition
        base = nvl_partition(base, int(spec["nvl_partition"]))
    if spec.get("nvlink_links") or spec.get("keep_nics") or spec.get("nic_fabric"):
        base = _modified(base, spec.get("nvlink_links"), spec.get("keep_nics"), spec.get("nic_fabric"))
    per_server = len(base.endpoints())
    nodes = int(spec.get("nodes") or (math.ceil(gpus / per_server) if gpus else 1))
    if gpus and nodes * per_server < gpus:
        raise NotExpressible(f"{gpus} GPUs on {nodes} x {per_server}-GPU {spec['preset']}")
    if nodes == 1:
        return base, note
    try:
        topo = build_cluster(base, nodes, fabric=spec.get("fabric", "rail"), nic_gbps=spec.get("nic_gbps"))
    except TopologyError:
        topo = build_cluster(base, nodes, fabric=spec.get("fabric", "rail"), nic_gbps=spec.get("nic_gbps"), tiers=3)
    return topo, note


def _modified(base: Any, nvlink_links: int | None, keep_nics: int | None, nic_fabric: str | None = None) -> Any:
    """A copy with `nvlink_links` NVLinks per GPU (same per-link rate), only `keep_nics` of its NICs, and/or NICs
    on another fabric ('ethernet' for RoCE)."""
    topo = base.copy()
    for n in topo.nics() if nic_fabric else ():
        topo.graph.nodes[n]["fabric"] = nic_fabric
    if nvlink_links:
        for _u, _v, d in topo.graph.edges(data=True):
            if d.get("tier") == "nvlink" and d.get("nlinks") and not d.get("c2c"):
                d["bw_GBps"] = d["bw_GBps"] / d["nlinks"] * nvlink_links
                d["nlinks"] = nvlink_links
    if keep_nics:
        nics = topo.nics()
        step = max(1, len(nics) // keep_nics)
        for n in [x for i, x in enumerate(nics) if i % step]:
            topo.graph.remove_node(n)
    topo.invalidate()
    topo.name = f"{base.name}-modified"
    return topo


# ---- the simulator's defaults against the reference cases ------------------------------------------------------
def references(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The registry's collective cases marked ``gpu_reference``, in file order."""
    return [c for c in read_registry(path)["cases"] if c.get("kind") == "collective" and c.get("gpu_reference")]


def evaluate(cases: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Predicted busbw (the simulator's default parameters) and error (predicted / published - 1) per reference."""
    from .api import simulate
    rows = []
    for case in cases if cases is not None else references():
        topo, standin = build_topology(case["topology"])
        c = case["collective"]
        eps = [topo.gpus(h)[0] for h in topo.hosts()] if c.get("endpoints") == "gpu0" else None
        res = simulate(topo, c["collective"], int(c["size_bytes"]), algorithm=c.get("algorithm"), endpoints=eps,
                       nranks=c.get("nranks"))
        pred = float(res.busbw_GBps)
        src = case["source"]
        note = "; ".join(x for x in (case.get("sets_default", ""), standin, case.get("note", "")) if x)
        rows.append({"name": case["id"], "what": case.get("system", ""), "collective": c["collective"],
                     "reference_GBps": float(case["value"]), "predicted_GBps": pred,
                     "error": pred / float(case["value"]) - 1, "algorithm": res.algorithm, "protocol": res.protocol,
                     "size_bytes": int(c["size_bytes"]), "source": f"{src['url']} ({src.get('where', '')})",
                     "fitted": bool(case.get("sets_default")), "modelled": True, "note": note})
    return rows
