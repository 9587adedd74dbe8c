"""A cluster cut down to some of its servers and its whole switch fabric, for searches over a few servers.

Servers are never transit nodes (a route between two servers leaves one by a NIC, crosses switches only and
enters the other by a NIC), so every route between devices of the kept servers, and every ring or tree searched
over them, is the full cluster's; a search then costs the kept servers, not the 2,048 of a 16,384-GPU cluster.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

_VIEWS: weakref.WeakKeyDictionary[Any, OrderedDict] = weakref.WeakKeyDictionary()
_SERIAL = itertools.count(1)
MAX_VIEWS = 32   # per topology (a view of k servers holds k servers' nodes and the fabric's)


def servers_view(topo: Any, hosts: Iterable[int]) -> Any:
    """`topo` restricted to the servers `hosts` and (for two or more) every switch outside a server (host < 0),
    nodes and links in the full graph's order; `topo` itself when the cut would keep more than half of its
    servers."""
    keep_hosts = frozenset(int(h) for h in hosts)
    g = getattr(topo, "graph", None)
    if g is None or not hasattr(topo, "hosts"):
        return topo
    all_hosts = topo.hosts()
    if 2 * len(keep_hosts) > len(all_hosts):
        return topo
    stamp = (id(g), len(g))
    try:
        per = _VIEWS.setdefault(topo, OrderedDict())
    except TypeError:
        return topo
    if per.get("stamp") != stamp:
        per.clear()
        per["stamp"] = stamp
    hit = per.get(keep_hosts)
    if hit is not None:
        per.move_to_end(keep_hosts)
        return hit
    view = _build(topo, keep_hosts)
    per[keep_hosts] = view
    if len(per) > MAX_VIEWS + 1:
        oldest = next(k for k in per if k != "stamp")
        per.pop(oldest)
    return view


def _build(topo: Any, keep_hosts: frozenset[int]) -> Any:
    import networkx as nx

    from ..topology import Topology
    from ..topology.graph import predecessors, successors
    g = topo.graph
    # a unique name: the tuner caches choices by (id, name) of the topology, and ids are reused
    view = Topology(f"{topo.name}#servers{next(_SERIAL)}", meta=topo.meta)
    h: nx.DiGraph[str] = nx.DiGraph()
    # one server: no route between its devices leaves it (the router searches a host's own nodes only)
    fabric = len(keep_hosts) > 1
    keep = {n: d for n, d in g.nodes(data=True) if d["host"] in keep_hosts or (fabric and d["host"] < 0)}
    succ = successors(g)
    if type(g) is nx.DiGraph:   # networkx's own dicts, filled as add_nodes_from / add_edges_from fill them
        h_node: dict[str, dict[str, Any]] = h._node  # type: ignore[attr-defined]
        h_succ, h_pred = successors(h), predecessors(h)
        for n, d in keep.items():
            h_node[n] = dict(d)
            h_succ[n] = {}
            h_pred[n] = {}
        for u in keep:
            out = h_succ[u]
            for v, d in succ[u].items():
                if v in keep:
                    out[v] = h_pred[v][u] = dict(d)
        nx._clear_cache(h)
    else:
        h.add_nodes_from(keep.items())
        h.add_edges_from((u, v, d) for u in keep for v, d in succ[u].items() if v in keep)
    pred, full = predecessors(h), predecessors(g)
    for v, ins in pred.items():   # each node's in-links in the full graph's order too (the router reads them)
        if len(ins) > 1:
            items = [(u, ins[u]) for u in full[v] if u in ins]
            ins.clear()
            ins.update(items)
    view.graph = h
    return view


__all__ = ["servers_view"]
