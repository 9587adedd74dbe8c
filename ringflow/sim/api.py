"""The simulator's front door: a collective (or a ready schedule) on a topology -> SimResult."""
from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective, Schedule
from ..algorithms.verify_messages import opens_with_check
from ..errors import InvalidArgument
from . import analytic, flow
from .fabric import Fabric, _val, fabric_for
from .params import SimParams, params_for
from .results import SimResult, count_for_size, size_for_count
from .topocache import per_topology
from .transfers import TransferTable, coarsen, from_schedule

ENGINES = ("analytic", "flow")

ITEMSIZE = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8,
            "int32": 4, "int64": 8, "int8": 1, "uint8": 1}


def itemsize_of(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    try:
        return ITEMSIZE[str(dtype).lower()]
    except KeyError:
        raise InvalidArgument(f"unknown dtype {dtype!r}", f"use one of {', '.join(ITEMSIZE)}") from None


_EPS: weakref.WeakKeyDictionary[Any, tuple] = weakref.WeakKeyDictionary()


def endpoints_of(topo: Any) -> list[str]:
    """topo.endpoints(), cached per topology until its node count changes."""
    g = getattr(topo, "graph", None)
    stamp = (id(g), len(g)) if g is not None else None   # endpoints depend on nodes only
    try:
        hit = _EPS.get(topo)
    except TypeError:
        return list(topo.endpoints())
    if hit is None or hit[0] != stamp:
        hit = (stamp, list(topo.endpoints()))
        _EPS[topo] = hit
    return hit[1]


def _engine(name: str) -> str:
    if name not in ENGINES:
        raise InvalidArgument(f"unknown engine {name!r}", f"use one of {', '.join(ENGINES)}")
    return name


def simulate_schedule(topo: Any, schedule: Schedule, size_bytes: int, *, engine: str = "analytic",
                      dtype: str = "float32", params: SimParams | Mapping[str, Any] | None = None,
                      endpoints: Sequence[str] | None = None, protocol: str | None = None,
                      timeline: bool = False, progress: Callable[[float], None] | None = None) -> SimResult:
    """Simulate one call of `schedule` moving an nccl-tests `size_bytes` on `topo`."""
    return simulate_table(topo, from_schedule(schedule), size_bytes, engine=engine, dtype=dtype, params=params,
                          endpoints=endpoints, protocol=protocol, timeline=timeline, progress=progress,
                          checked=opens_with_check(schedule))


def simulate_table(topo: Any, tab: TransferTable, size_bytes: int, *, engine: str = "analytic",
                   dtype: str = "float32", params: SimParams | Mapping[str, Any] | None = None,
                   endpoints: Sequence[str] | None = None, protocol: str | None = None,
                   timeline: bool = False, progress: Callable[[float], None] | None = None,
                   checked: bool = False) -> SimResult:
    """Simulate a transfer table (from a schedule or the fast path) for one call size; `checked`:
    the runtime runs a CHECK exchange first (`CpuHostParams.check_us`)."""
    _engine(engine)
    prm = params if isinstance(params, SimParams) else params_for(topo, params)
    item = itemsize_of(dtype)
    count = count_for_size(tab.collective, tab.nranks, size_bytes, item)
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:tab.nranks]
    if len(eps) < tab.nranks:
        raise InvalidArgument(f"{tab.nranks} ranks but topology {getattr(topo, 'name', '?')!r} has "
                              f"{len(eps)} endpoints", "use a bigger topology (--nodes N) or fewer ranks")
    count_bytes = float(count * item)
    fab = fabric_for(topo, prm, eps)
    notes: list[str] = []
    if tab.coarsened > 1:
        notes.append(f"fast path: {tab.coarsened} identical ring steps per macro step")
    # protocol: the one the analytic model finds fastest for this size (NCCL picks per call too); NVLS
    # runs Simple only (NCCL's tuning disables LL and LL128 for it)
    if tab.in_switch is not None and protocol is None and any(p.name == "simple" for p in prm.protocols):
        protocol = "simple"
    model = analytic.model_for(tab, fab, prm)
    times, pick = model.times_us(np.array([count_bytes]))
    pidx = int(pick[0])
    if protocol is not None:
        names = [p.name for p in prm.protocols]
        if protocol not in names:
            raise InvalidArgument(f"protocol {protocol!r} not in {names}", "pick one of the listed protocols")
        pidx = names.index(protocol)
        times = np.array([_time_for_protocol(model, count_bytes, pidx)])
    proto = prm.protocols[pidx]
    coarse = tab.coarsened
    if engine == "analytic":
        t_us = float(times[0])
        finish = analytic.rank_finish_us(model, count_bytes, pidx)
        link_bytes = model.link_frac * count_bytes
        tl: list = []
        if timeline:
            dur = model.step_times_us(count_bytes, pidx)
            ends = model.base_us[pidx] + np.cumsum(dur)
            starts = ends - dur
            tl = _timeline(tab, starts[tab.step], ends[tab.step])
    else:
        ftab = coarsen(tab, prm.max_transfers)
        coarse = ftab.coarsened
        if ftab is not tab:
            notes.append(f"flow engine merged up to {coarse} consecutive steps per macro step "
                         f"({tab.ntransfers} -> {ftab.ntransfers} transfers)")
        flows = analytic.model_for(ftab, fab, prm).flows
        out = flow.simulate(ftab, fab, flows, prm, count_bytes, proto, progress=progress)
        t_us, finish, link_bytes = out.time_us, out.rank_finish_us, out.link_bytes
        notes.extend(out.notes)
        tl = _timeline(ftab, out.t_start_us, out.t_end_us) if timeline else []
    bound = ""
    if tab.in_switch is not None and tab.algorithm == "nvls":
        from .nvls import reduce_bound_us
        floor = reduce_bound_us(topo, eps, tab.collective, tab.nranks, count_bytes, prm)
        if floor > t_us:
            notes.append(f"nvls: bound by the NVSwitch adders ({floor:.0f} us against {t_us:.0f} us on the links)")
            finish = np.maximum(np.asarray(finish, dtype=float), floor)
            t_us, bound = floor, "nvls_reduce"
    check_us = prm.cpu.check_us
    if checked and check_us:
        t_us, finish = t_us + check_us, np.asarray(finish) + check_us
    return SimResult(tab.collective, tab.algorithm, tab.nranks, int(size_bytes), int(count),
                     str(dtype), engine, proto.name, t_us, finish, link_bytes, fab, coarse, tl, notes, bound)


def _time_for_protocol(model: analytic.AnalyticModel, count_bytes: float, p: int) -> float:
    return float(model.base_us[p] + model.step_times_us(count_bytes, p).sum())


def _timeline(tab: TransferTable, t0: np.ndarray, t1: np.ndarray, limit: int = 200_000) -> list:
    n = min(tab.ntransfers, limit)
    return list(zip(tab.step[:n].tolist(), tab.src[:n].tolist(), tab.dst[:n].tolist(), tab.chan[:n].tolist(),
                    np.asarray(t0[:n], dtype=float).tolist(), np.asarray(t1[:n], dtype=float).tolist(), strict=True))


# ------------------------------------------------------------------------------ collectives
def _layout_args(topo: Any, coll: Collective, algorithm: str, eps: list[str],
                 nchannels: int | None) -> dict[str, Any]:
    from ..algorithms import registry
    kwargs: dict[str, Any] = {}
    info = registry.info(algorithm)
    if algorithm == "hierarchical" or (info.grouped and algorithm == "pxn"):
        kwargs["host_groups"] = [list(g) for g in topo.host_groups(eps)]
    if info.multichannel:
        from ..topology import find_rings
        from .subtopo import servers_view
        rings = find_rings(servers_view(topo, {topo.host_of(e) for e in eps}), eps, nchannels)
        kwargs["rings"] = [tuple(r.ranks) for r in rings]
        kwargs["nchannels"] = len(rings)
    return kwargs


def table_for(topo: Any, collective: Collective | str, nranks: int, algorithm: str, *, root: int = 0,
              nchannels: int | None = None, nsegs: int | None = None,
              endpoints: Sequence[str] | None = None, max_transfers: int | None = None) -> TransferTable:
    """The transfer table of `algorithm` on `topo`: the registry's schedule, or the fast path when huge."""
    coll = Collective.parse(collective)
    key = (coll, algorithm, nranks, root, nchannels, nsegs, tuple(endpoints) if endpoints else None, max_transfers)
    per = per_topology(_TABLES, topo)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = _table_for(topo, coll, nranks, algorithm, root, nchannels, nsegs, endpoints, max_transfers)
        if len(per) > 256:
            per.pop(next(iter(per)))
    return hit


_TABLES: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _table_for(topo: Any, coll: Collective, nranks: int, algorithm: str, root: int, nchannels: int | None,
               nsegs: int | None, endpoints: Sequence[str] | None, max_transfers: int | None) -> TransferTable:
    from ..algorithms import registry
    from .fastpath import FASTPATH_MIN_TRANSFERS, expected_transfers, fast_table
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    if algorithm == "nvls":   # in-switch reduction: a table only (sim.nvls), no runtime schedule
        from .nvls import cached_table, require_nvls
        require_nvls(topo, eps[:nranks], coll)
        return cached_table(nranks, nsegs or 1, coll)
    kw = _layout_args(topo, coll, algorithm, eps, nchannels)
    nch = kw.get("nchannels", 1)
    if expected_transfers(algorithm, nranks, nch, kw.get("host_groups")) > FASTPATH_MIN_TRANSFERS:
        fast = fast_table(coll, algorithm, nranks, rings=kw.get("rings"), groups=kw.get("host_groups"),
                          nsegs=nsegs or 1, max_transfers=max_transfers)
        if fast is not None:
            return fast
    if coll.has_root or algorithm == "param_server":
        kw["root"] = root
    if nsegs is not None:
        kw["nsegs"] = nsegs
    if algorithm == "pxn":   # NCCL's PXN relays inside each OS host (sim.alltoall_net)
        from .alltoall_net import pxn_table
        return pxn_table(topo, eps[:nranks], nsegs or 1)
    if algorithm in ("ring", "hierarchical"):
        from .fastpath import schedule_equal_table
        exact = schedule_equal_table(coll, algorithm, nranks, rings=kw.get("rings"), groups=kw.get("host_groups"),
                                     nsegs=nsegs or 1)
        if exact is not None:
            return exact
    return from_schedule(registry.get_schedule(coll, algorithm, nranks, **kw))


def pxn_applies(topo: Any, coll: Collective, eps: Sequence[str]) -> bool:
    """True for an all-to-all over two or more servers of equally many (two or more) GPUs, each GPU with a NIC
    on its server: where NCCL runs all-to-all as grouped sends with PXN (NCCL_PXN_DISABLE=0, the default since
    NCCL 2.12; NVIDIA, "Doubling all2all Performance with NVIDIA Collective Communication Library 2.12"): every
    peer at once, remote blocks through the local GPU on the destination's rail."""
    if coll != Collective.ALL_TO_ALL or not hasattr(topo, "host_groups") or not hasattr(topo, "nics"):
        return False
    groups = topo.host_groups(list(eps))
    if len(groups) < 2 or len({len(g) for g in groups}) != 1 or len(groups[0]) < 2:
        return False
    gpus = set(topo.gpus())
    if not all(e in gpus for e in eps) or not all(topo.nics(host=topo.host_of(eps[g[0]])) for g in groups):
        return False
    first = [eps[r] for r in groups[0]]   # PXN relays over NVLink only: every GPU pair of a server on NVLink
    g = topo.graph
    return all(_val(g.edges[u, v].get("type")) == "nvlink"
               for i, a in enumerate(first) for b in first[i + 1:] for u, v in topo.path_edges(topo.path(a, b)))


def schedule_for(topo: Any, collective: Collective | str, nranks: int, algorithm: str, *,
                 root: int = 0, nchannels: int | None = None, nsegs: int | None = None,
                 endpoints: Sequence[str] | None = None) -> Schedule:
    """The registry's schedule for `algorithm`, with the topology's rings and host groups."""
    from ..algorithms import registry
    coll = Collective.parse(collective)
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    kw = _layout_args(topo, coll, algorithm, eps, nchannels)
    if coll.has_root or algorithm == "param_server":
        kw["root"] = root
    if nsegs is not None:
        kw["nsegs"] = nsegs
    return registry.get_schedule(coll, algorithm, nranks, **kw)


TUNER_MAX_RANKS = 64


def choose_algorithm(topo: Any, collective: Collective | str, nranks: int, size_bytes: int,
                     dtype: str = "float32", params: SimParams | None = None,
                     endpoints: Sequence[str] | None = None) -> str:
    """The algorithm for this call: the tuner's choice (as the runtime makes it) up to TUNER_MAX_RANKS
    ranks; above, the fastest of the fast-path algorithms under the analytic engine (the tuner
    builds every candidate schedule, which is too slow for thousands of ranks). An all-reduce,
    reduce-scatter or all-gather inside one NVLS-capable NVSwitch domain takes NVLS where the simulator
    finds it faster (sim.nvls); an all-reduce over several such servers with two or more ranks on each
    takes NVLS-Tree where it is faster (NCCL's default across Hopper servers, `nvls_tree_faster`); an
    all-to-all over servers of GPUs with NICs takes PXN (`pxn_applies`)."""
    coll = Collective.parse(collective)
    if pxn_applies(topo, coll, (list(endpoints) if endpoints is not None else endpoints_of(topo))[:nranks]):
        return "pxn"
    flat, flat_us = _flat_choice(topo, coll, nranks, size_bytes, dtype, params, endpoints)
    from .nvls import NVLS_COLLECTIVES, nvls_switch
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    if coll not in NVLS_COLLECTIVES or nvls_switch(topo, eps[:nranks]) is None:
        if nvls_tree_faster(topo, coll, nranks, size_bytes, flat, flat_us, dtype, params, eps):
            return "nvls_tree"
        return flat
    # NCCL's default inside a Hopper server: NVLS where it is faster than the flat choice
    prm = params or params_for(topo)

    def time_us(algo: str) -> float:
        return simulate(topo, coll, size_bytes, algorithm=algo, nranks=nranks, dtype=dtype, params=prm,
                        endpoints=endpoints).time_us
    return "nvls" if time_us("nvls") < (time_us(flat) if flat_us is None else flat_us) else flat


def nvls_tree_faster(topo: Any, coll: Collective, nranks: int, size_bytes: int, flat: str, flat_us: float | None,
                     dtype: str, params: SimParams | None, eps: list[str]) -> bool:
    """True where an all-reduce spans several servers, each with an NVLS-capable NVSwitch and two or more of the
    ranks, and NVLS-Tree beats the flat choice (groups up to TUNER_MAX_RANKS ranks, for the cost of the trial)."""
    from .nvls import nvls_switch, simulate_switch_algorithm
    if coll != Collective.ALL_REDUCE or nranks > TUNER_MAX_RANKS or not hasattr(topo, "host_groups"):
        return False
    groups = topo.host_groups(eps[:nranks])
    if len(groups) < 2 or min(len(g) for g in groups) < 2 or \
            any(nvls_switch(topo, [eps[r] for r in g]) is None for g in groups):
        return False
    prm = params or params_for(topo)
    try:
        tree_us = simulate_switch_algorithm(topo, "nvls_tree", nranks, size_bytes, endpoints=eps, params=prm,
                                            dtype=dtype).time_us
    except InvalidArgument:
        return False
    if flat_us is None:
        flat_us = simulate(topo, coll, size_bytes, algorithm=flat, nranks=nranks, dtype=dtype, params=prm,
                           endpoints=eps).time_us
    return tree_us < flat_us


def _flat_choice(topo: Any, coll: Collective, nranks: int, size_bytes: int, dtype: str,
                 params: SimParams | None, endpoints: Sequence[str] | None) -> tuple[str, float | None]:
    """The algorithm among the registry's (runtime) schedules (choose_algorithm), and its simulated time
    where choosing it took one (above TUNER_MAX_RANKS; None where the tuner chose)."""
    from ..algorithms import registry, tuner
    if nranks <= TUNER_MAX_RANKS:
        from .subtopo import servers_view
        item = itemsize_of(dtype)
        S = registry.collective_bytes(coll, nranks, count_for_size(coll, nranks, size_bytes, item), item)
        # the tuner searches the topology's first `nranks` endpoints: on their servers only
        first = endpoints_of(topo)[:nranks]
        view = servers_view(topo, {topo.host_of(e) for e in first}) if hasattr(topo, "host_of") else topo
        return str(tuner.choose(coll, S, nranks, topo=view, dtype_size=item, root=0 if coll.has_root else None)
                   .algorithm), None
    prm = params or params_for(topo)
    best, best_t = "", float("inf")
    for algo in ("ring", "hierarchical"):
        if algo not in registry.algorithms_for(coll):
            continue
        try:
            t = simulate(topo, coll, size_bytes, algorithm=algo, nranks=nranks, dtype=dtype, params=prm,
                         endpoints=endpoints).time_us
        except (InvalidArgument, ValueError):
            continue
        if t < best_t:
            best, best_t = algo, t
    return (best, best_t) if best else (registry.algorithms_for(coll)[0], None)


def simulate(topo: Any, collective: Collective | str, size_bytes: int, *, algorithm: str | None = None,
             nranks: int | None = None, engine: str = "analytic", dtype: str = "float32", root: int = 0,
             nchannels: int | None = None, nsegs: int | None = None,
             params: SimParams | Mapping[str, Any] | None = None, timeline: bool = False,
             progress: Callable[[float], None] | None = None, endpoints: Sequence[str] | None = None) -> SimResult:
    """Simulate one collective call on `topo` (algorithm from the tuner when not given).

    `endpoints` places rank r on endpoints[r] (default: the topology's first `nranks` endpoints)."""
    n = nranks or (len(endpoints) if endpoints is not None else len(endpoints_of(topo)))
    if n < 1:
        from ..errors import TopologyError
        raise TopologyError(f"topology {getattr(topo, 'name', '?')!r} has no GPU or PROC endpoints to run ranks on",
                            "on a GPU-less machine use --topo host-cpu:N")
    prm = params if isinstance(params, SimParams) else params_for(topo, params)
    if Collective.parse(collective) == Collective.ALL_TO_ALLV:
        return _uniform_all_to_allv(topo, size_bytes, algorithm, n, engine=engine, dtype=dtype, params=prm,
                                    timeline=timeline, progress=progress, endpoints=endpoints)
    algo = algorithm or choose_algorithm(topo, collective, n, size_bytes, dtype, prm, endpoints)
    if nsegs is None and algo not in SWITCH_ALGORITHMS and pipelines(algo, collective):
        if algo == "tree" and Collective.parse(collective) == Collective.ALL_REDUCE and nchannels is None \
                and _across_servers(topo, endpoints, n):   # NCCL's tree: chains in servers, trees of servers
            from .nccl_tree import simulate_nccl_tree
            return simulate_nccl_tree(topo, n, size_bytes, endpoints=endpoints, params=prm, engine=engine,
                                      dtype=dtype)
        return _fastest_segments(topo, collective, size_bytes, algo, n, engine=engine, dtype=dtype, root=root,
                                 nchannels=nchannels, params=prm, timeline=timeline, progress=progress,
                                 endpoints=endpoints)
    if algo in SWITCH_ALGORITHMS:   # switches take part in the schedule: placed on the topology's switches
        from ..errors import InvalidArgument
        from .nvls import simulate_switch_algorithm
        if Collective.parse(collective) != Collective.ALL_REDUCE:
            raise InvalidArgument(f"{algo} is an all_reduce algorithm, not {Collective.parse(collective).value}",
                                  "leave --algo out (the default picks per collective), or choose another algorithm")
        have = len(endpoints) if endpoints is not None else len(endpoints_of(topo))
        if not 2 <= n <= have:
            raise InvalidArgument(f"{algo} on {n} ranks, but the ranks can be placed on {have} endpoints",
                                  "simulate 2 or more ranks, at most one per endpoint (--nodes N for more)")
        return simulate_switch_algorithm(topo, algo, n, size_bytes, endpoints=endpoints, params=prm, engine=engine,
                                         dtype=dtype, timeline=timeline, progress=progress)
    tab = table_for(topo, collective, n, algo, root=root, nchannels=nchannels, nsegs=nsegs,
                    endpoints=endpoints, max_transfers=prm.max_transfers)
    proto = None
    if tab.collective == Collective.ALL_TO_ALL:   # NCCL's p2p sends: LL or Simple by its own rule (sim.alltoall_net)
        from .alltoall_net import p2p_protocol
        eps = list(endpoints) if endpoints is not None else endpoints_of(topo)
        proto = p2p_protocol(topo, algo, n, size_bytes, eps)
        proto = proto if proto in {p.name for p in prm.protocols} else None
    return simulate_table(topo, tab, size_bytes, engine=engine, dtype=dtype, params=prm,
                          timeline=timeline, progress=progress, endpoints=endpoints, protocol=proto)


def pipelines(algo: str, collective: Collective | str) -> bool:
    """True where `algo` pipelines `collective` in segments (the registry's `pipelined`)."""
    from ..algorithms import registry
    a = registry.ALGORITHMS.get(algo) or registry.NCCL_ALGORITHMS.get(algo)
    return a is not None and Collective.parse(collective) in a.pipelined


def segment_counts(size_bytes: int) -> list[int]:
    """The pipeline segment counts a call of `size_bytes` is tried at: 1-64, none under the runtime tuner's
    `MIN_SEG_BYTES` (smaller segments only add steps)."""
    from ..algorithms.tuner import MIN_SEG_BYTES
    from .nvls import NVLS_CHUNKS
    return [c for c in NVLS_CHUNKS if c == 1 or size_bytes // c >= MIN_SEG_BYTES]


def _across_servers(topo: Any, endpoints: Sequence[str] | None, n: int) -> bool:
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)
    return hasattr(topo, "host_groups") and len(topo.host_groups(eps[:n])) > 1


def _fastest_segments(topo: Any, collective: Collective | str, size_bytes: int, algo: str, n: int, *,
                      timeline: bool, progress: Callable[[float], None] | None, **kw: Any) -> SimResult:
    """A pipelined algorithm at the segment count that is fastest for this call, chosen like a protocol: NCCL
    cuts every call into chunks, so one unsegmented pass (the schedule's default) would price a ring
    broadcast or a tree as store-and-forward (`segment_counts`)."""
    counts = segment_counts(size_bytes)
    runs = {c: simulate(topo, collective, size_bytes, algorithm=algo, nranks=n, nsegs=c, **kw) for c in counts}
    best = min(runs, key=lambda c: runs[c].time_us)
    res = runs[best] if not (timeline or progress) else \
        simulate(topo, collective, size_bytes, algorithm=algo, nranks=n, nsegs=best, timeline=timeline,
                 progress=progress, **kw)
    res.notes.append(f"{algo}: {best} pipeline segments (fastest of {len(counts)})")
    return res


def _uniform_all_to_allv(topo: Any, size_bytes: int, algorithm: str | None, n: int, **kw: Any) -> SimResult:
    """An all_to_allv with no split matrix given (as from the command line): uniform splits, which is the
    all_to_all of the same size (its schedules with a split matrix: `simulate_schedule` via `from_schedule`)."""
    import dataclasses

    from ..algorithms import registry
    allowed = registry.algorithms_for(Collective.ALL_TO_ALLV)
    if algorithm is not None and algorithm not in allowed:
        raise InvalidArgument(f"{algorithm} is not an all_to_allv algorithm", f"use one of {', '.join(allowed)}")
    res = simulate(topo, Collective.ALL_TO_ALL, size_bytes, algorithm=algorithm or allowed[0], nranks=n, **kw)
    res.notes.append("all_to_allv with uniform splits: the all_to_all of the same size")
    return dataclasses.replace(res, collective=Collective.ALL_TO_ALLV)


# algorithms whose schedules have switch participants (in-network reduction): sim/nvls.py places the switches
SWITCH_ALGORITHMS = ("nvls_tree", "collnet_direct", "collnet_chain")


__all__ = ["simulate", "simulate_schedule", "simulate_table", "schedule_for", "table_for", "choose_algorithm",
           "itemsize_of", "size_for_count", "ENGINES", "Fabric"]
