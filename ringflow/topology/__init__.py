"""Topology: the typed graph of a machine or cluster, presets, cluster builders, detection and ring search.

```python
from ringflow.topology import load_topology, find_rings
topo = load_topology("dgx1-v100")          # a preset, a .yaml/.json file, "detect", or "4xdgx-h100[@fat-tree]"
rings = find_rings(topo)                   # channels: Ring(ranks=(0, 3, 2, 1, 5, 6, 7, 4), bottleneck_GBps=50.0), ...
```
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .. import config
from ..errors import TopologyError
from ..lazy import lazy_attributes

if TYPE_CHECKING:
    from .cluster import FABRICS, build_cluster
    from .graph import LinkType, NodeKind, Topology
    from .presets import PRESETS, build_preset, preset_names
    from .schema import SCHEMA, SCHEMA_VERSION
    from .search import (
        Ring,
        all_nvlink,
        double_binary_tree,
        find_rings,
        hierarchical_trees,
        parse_rings,
        ring_hop_types,
        tree_children,
    )

#: module (of this package) that defines each public name; loaded on first use (networkx is heavy)
_WHERE = {
    **dict.fromkeys(("FABRICS", "build_cluster"), "cluster"),
    **dict.fromkeys(("LinkType", "NodeKind", "Topology"), "graph"),
    **dict.fromkeys(("PRESETS", "build_preset", "preset_names"), "presets"),
    **dict.fromkeys(("SCHEMA", "SCHEMA_VERSION"), "schema"),
    **dict.fromkeys(("Ring", "all_nvlink", "double_binary_tree", "find_rings", "hierarchical_trees", "parse_rings",
                     "ring_hop_types", "tree_children"), "search"),
}

_CLUSTER_SPEC = re.compile(r"^(\d+)x([a-z0-9-]+(?::\d+)?)(?:@(rail|fat-tree))?$")


def load_topology(spec: str) -> Topology:
    """A preset name, a topology file (.yaml/.yml/.json, e.g. from `topo detect --dump`), "detect", or a
    cluster spec "<N>x<preset>[@rail|@fat-tree]" (e.g. "128xdgx-h100"). "detect" honours RINGFLOW_TOPO_FILE."""
    if not isinstance(spec, str) or not spec:
        raise TopologyError(f"topology spec {spec!r} is empty", "give a preset name, a file, or 'detect'")
    from .cluster import build_cluster
    from .graph import Topology
    from .presets import build_preset
    if spec == "detect":
        path = config.get("TOPO_FILE")
        if path:
            return Topology.load(path)
        from .detect import detect_topology
        return detect_topology()
    ext = os.path.splitext(spec)[1].lower()
    if ext in (".yaml", ".yml", ".json") or os.path.sep in spec or os.path.exists(spec):
        return Topology.load(spec)
    m = _CLUSTER_SPEC.match(spec)
    if m:
        return build_cluster(m.group(2), int(m.group(1)), fabric=m.group(3) or "rail")
    return build_preset(spec)


__all__ = [
    "Topology", "NodeKind", "LinkType", "load_topology", "find_rings", "Ring", "double_binary_tree",
    "parse_rings", "build_cluster", "build_preset", "preset_names", "PRESETS", "FABRICS", "SCHEMA",
    "SCHEMA_VERSION", "tree_children", "ring_hop_types", "all_nvlink", "hierarchical_trees",
]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, __all__)
