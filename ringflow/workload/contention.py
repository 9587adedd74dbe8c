"""Contention: every group of a parallel dimension communicating at once, on the simulator's flow engine.

The step-time model prices one representative group per dimension. In a real step all of them run together:
the 64 DP all-reduces of a 8 x 8 x 16 layout share spine links on a fat-tree (with ECMP collisions), the
TP x DP point-to-point pairs of a pipeline boundary share NIC uplinks, and so on. `dimension_factor` merges the
transfer tables of every group of a dimension (disjoint ranks, so each rank still follows only its own steps)
into one flow simulation and returns ``time(all groups together) / time(one group alone)``; `step_time(...,
contention=True)` multiplies that dimension's communication by it. Cost: one flow-engine run per dimension
(about 0.5 s for 64 x 16-rank rings on a rail fabric, tens of seconds on an oversubscribed fat-tree), so the
planner does not use it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..errors import InvalidArgument

_PARTITIONED = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL, Collective.GATHER,
                Collective.SCATTER)


def merge_tables(tabs: Sequence[Any]) -> Any:
    """One TransferTable holding several same-collective tables on disjoint ranks (ranks renumbered)."""
    from ..sim.transfers import TransferTable
    names = ("step", "src", "dst", "chan", "frac", "nmsg", "lrank", "lstep", "lcopy", "lreduce", "nserial")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
    off = 0
    for t in tabs:
        parts["step"].append(t.step)
        parts["src"].append(t.src + off)
        parts["dst"].append(t.dst + off)
        parts["chan"].append(t.chan)
        parts["frac"].append(t.frac)
        parts["nmsg"].append(t.nmsg)
        parts["lrank"].append(t.lrank + off)
        parts["lstep"].append(t.lstep)
        parts["lcopy"].append(t.lcopy)
        parts["lreduce"].append(t.lreduce)
        parts["nserial"].append(t.serial())
        off += t.nranks
    t0 = tabs[0]
    # in-switch rows (NVLS: a rank's own leg to and from its NVSwitch) stay marked, or they would route as
    # messages from a rank to itself
    switched = [t.in_switch for t in tabs if t.in_switch is not None]
    if switched and len(switched) != len(tabs):
        raise InvalidArgument("tables with and without in-switch rows", "merge tables of one algorithm")
    return TransferTable(t0.collective, t0.algorithm, off, max(t.nsteps for t in tabs),
                         **{k: np.concatenate(v) for k, v in parts.items()},
                         coarsened=max(t.coarsened for t in tabs),
                         in_switch=np.concatenate(switched) if switched else None)


def dimension_factor(topo: Any, collective: str, nbytes: float, groups: Sequence[Sequence[str]],
                     max_groups: int = 128) -> dict[str, Any]:
    """Slowdown of one call when every group in `groups` runs it at the same time (flow engine)."""
    from ..sim.api import choose_algorithm, simulate_table, table_for
    groups = [list(g) for g in groups if len(g) > 1]
    if not groups or nbytes <= 0:
        return {"factor": 1.0, "groups": 0}
    if len(groups) > max_groups:  # an even sample keeps the spread over servers and rails
        step = len(groups) / max_groups
        groups = [groups[int(i * step)] for i in range(max_groups)]
    coll = Collective.parse(collective)
    n = len(groups[0])
    size = max(int(nbytes), 2 * n)
    algo = choose_algorithm(topo, coll, n, size, "bfloat16")
    if algo == "nvls":   # in-switch traffic never leaves its NVSwitch: only groups on the first one's compete
        from ..sim.nvls import nvls_switch
        home = nvls_switch(topo, groups[0])
        groups = [g for g in groups if nvls_switch(topo, g) == home]
    tabs = [table_for(topo, coll, n, algo, endpoints=g) for g in groups]
    one = simulate_table(topo, tabs[0], size, engine="flow", dtype="bfloat16", endpoints=groups[0]).time_us
    merged = merge_tables(tabs)
    # count_for_size divides partitioned collectives by nranks: give the merged call the same per-rank count
    msize = size * len(groups) if coll in _PARTITIONED else size
    together = simulate_table(topo, merged, msize, engine="flow", dtype="bfloat16",
                              endpoints=[e for g in groups for e in g]).time_us
    return {"factor": max(1.0, together / one) if one > 0 else 1.0, "groups": len(groups), "algorithm": algo,
            "alone_s": one * 1e-6, "together_s": together * 1e-6}
