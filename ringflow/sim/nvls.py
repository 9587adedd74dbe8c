"""NVLink SHARP (NVLS): the NVSwitch reduces and multicasts, the GPUs only stream.

NCCL's default all-reduce inside a Hopper server (NCCL_ALGO=NVLS). Every GPU owns 1/n of the
buffer. Its reduce-scatter half is one `multimem.ld_reduce` per shard: the switch reads shard j
from all n GPUs (GPU j's own copy included, over its own NVLink), sums it and delivers one stream
to GPU j. Its all-gather half is one `multimem.st` per shard: GPU j writes its summed shard once,
and the switch copies it to all n GPUs (itself included). NCCL pipelines the two halves over
chunks, so a GPU's egress carries the reduce-scatter's reads while its ingress carries the
all-gather's copies.

Per GPU and direction that is (n + 1) / n x S for a buffer of S bytes, against 2 (n - 1) / n x S for
a ring: busbw = 2 (n - 1) / (n + 1) x the link rate (1.56x on 8 GPUs).

Reduce-scatter and all-gather are one half each (NCCL 2.19+, NCCL_ALGO=NVLS): a GPU sends S and
receives S / n in a reduce-scatter, the reverse in an all-gather, where a ring moves (n - 1) / n x S
each way (S. Jeaugey, https://github.com/NVIDIA/nccl/issues/1083). The busier direction carries
more than the ring's, so for large buffers NVLS is slower there (300 against 350 GB/s all-gather
busbw on 8 H100s, https://github.com/NVIDIA/nccl/issues/1506) and NCCL, like the simulator's own
choice, keeps the ring; NVLS wins only where the ring's n - 1 steps of latency dominate.

The runtime cannot run it (CPU ranks have no switch that adds). The engines run it as a transfer table,
as `fastpath` builds for huge rings (the verified schedule of the same movement, with the switch as a
participant, is `algorithms.nccl_nvls`):
- C chunks, C + 1 steps: step t reduces chunk t and multicasts chunk t - 1 (the pipeline);
- each switch operation is a set of rows marked `in_switch`: 1, the rows that the switch
  reduces into one stream to their receiver; 2, the rows that it copies from one sender. A row
  whose sender is its receiver is that GPU's own leg (its own shard to the switch, its own copy
  back);
- `fabric.route_table` counts the bytes of one switch operation once on the link it shares
  (switch -> receiver for a reduction, sender -> switch for a multicast): `Flows.p_weight`;
- `Fabric.transfer_work` slows the rows by NCCL's NVLS efficiency (`NVLS_EFFICIENCY`).

The chunk count is chosen per call like a protocol: the fastest of `NVLS_CHUNKS` at that size.
Only one server's NVSwitch domain (NCCL's NVLS across servers needs CollNet / SHARP switches, not
modelled): the simulator refuses NVLS elsewhere with a clear error.

Schedules with switch participants (NVLS-Tree, CollNet) run through `simulate_switch_table`: each switch is
placed on a topology node (`switch_nodes`), its adds are free, its NVLink transfers run at the NVLS efficiency.
CollNet's tables come from its schedules (`simulate_switch_schedule`), NVLS-Tree's are written directly
(`nvls_tree.tree_table`: the same rows without the schedule's m x m switch messages per server and segment).
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..errors import InvalidArgument
from .columns import column_keys
from .fabric import _val
from .transfers import TransferTable

# NCCL's measured NVLS efficiency per GPU generation (src/graph/tuning.cc `nvlsEfficiency`: Hopper 0.85,
# Blackwell 0.74; Volta and Ampere 0, no NVLS), keyed here by the NVSwitch generation that serves them.
NVLS_EFFICIENCY: dict[int, float] = {3: 0.85, 4: 0.74}

# pipeline chunk counts tried per call (fill and drain cost 1/C of the bandwidth, each step a hop latency)
NVLS_CHUNKS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

REDUCE, MULTICAST = 1, 2

# the collectives an NVLS table exists for (NCCL has no NVLS broadcast, reduce or all-to-all)
NVLS_COLLECTIVES = (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)


_SWITCHES: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def nvls_switch(topo: Any, endpoints: Sequence[str]) -> tuple[str, int] | None:
    """(node, generation) of the one NVLS-capable NVSwitch every endpoint hangs off, or None (cached per
    topology while its graph keeps its node count, as `api.endpoints_of`)."""
    g = topo.graph
    key = (id(g), len(g), tuple(endpoints))
    try:
        per = _SWITCHES.setdefault(topo, {})
    except TypeError:
        return _nvls_switch(g, endpoints)
    if key not in per:
        if len(per) > 256:
            per.clear()
        per[key] = _nvls_switch(g, endpoints)
    return per[key]


def _nvls_switch(g: Any, endpoints: Sequence[str]) -> tuple[str, int] | None:
    common: set[str] | None = None
    for e in endpoints:
        sw = {v for _, v in g.out_edges(e)
              if _val(g.nodes[v].get("kind")) == "nvswitch" and g.nodes[v].get("generation") in NVLS_EFFICIENCY}
        common = sw if common is None else common & sw
        if not common:
            return None
    if not common:
        return None
    node = sorted(common)[0]
    return node, int(g.nodes[node]["generation"])


def efficiency(params: Any, generation: int) -> float:
    """The fraction of the NVLink rate NVLS moves bytes at: `params.nvls_efficiency`, else NCCL's figure for
    the NVSwitch generation."""
    return params.nvls_efficiency or NVLS_EFFICIENCY[generation]


def reduce_bound_us(topo: Any, endpoints: Sequence[str], collective: Collective, nranks: int, count_bytes: float,
                    params: Any) -> float:
    """The floor the switches' adders put under an NVLS reduction: n - 1 adds per 32-bit word of the reduced buffer,
    spread over the domain's NVSwitch chips at `params.nvls_reduce_gflops` (else the catalog's rate) each; 0 where
    nothing is reduced in the switch. Beyond one server's 8 GPUs it, not the links, paces NVLS (72 GPUs on 18
    chips reduce no faster than 8 on 2)."""
    from ..hardware.nvlink import NVSWITCH_REDUCE_GFLOPS
    if collective not in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER) or nranks < 2:
        return 0.0
    hit = nvls_switch(topo, endpoints[:nranks])
    if hit is None:
        return 0.0
    node, gen = hit
    rate = params.nvls_reduce_gflops or NVSWITCH_REDUCE_GFLOPS.get(gen)
    if not rate:
        return 0.0
    chips = int(topo.graph.nodes[node].get("chips") or 1)
    buffer_bytes = count_bytes * (nranks if collective == Collective.REDUCE_SCATTER else 1)
    return (nranks - 1) * buffer_bytes / 4.0 / (chips * rate * 1e9) * 1e6


def _require_collective(collective: Collective) -> None:
    """InvalidArgument unless NVLS implements `collective` (NVLS_COLLECTIVES)."""
    if collective not in NVLS_COLLECTIVES:
        raise InvalidArgument(f"nvls implements all_reduce, reduce_scatter and all_gather, not {collective.value}",
                              "use --algo ring (or leave --algo out) for other collectives")


def require_nvls(topo: Any, endpoints: Sequence[str], collective: Collective) -> tuple[str, int]:
    """The NVSwitch that runs NVLS for these endpoints, or InvalidArgument naming what is missing."""
    _require_collective(collective)
    hit = nvls_switch(topo, endpoints)
    if hit is None:
        raise InvalidArgument("nvls needs every rank on one NVSwitch with in-switch reduction (NVSwitch gen3, "
                              "Hopper, or later; one server)",
                              "use --topo dgx-h100 with ranks inside one server, or another --algo")
    return hit


def nvls_table(nranks: int, nchunks: int, collective: Collective = Collective.ALL_REDUCE) -> TransferTable:
    """The NVLS `collective` on `nranks` GPUs in `nchunks` chunks (module docstring): an all-reduce
    pipelines its two halves (C + 1 steps), a reduce-scatter or all-gather is one half (C steps)."""
    if nranks < 2 or nchunks < 1:
        raise InvalidArgument(f"nvls needs 2 or more ranks and 1 or more chunks (got {nranks}, {nchunks})",
                              "simulate at least 2 ranks")
    _require_collective(collective)
    n, C = nranks, nchunks
    owner_grid, peer_grid = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")   # owner j of the shard, peer i
    owner, peer = owner_grid.ravel(), peer_grid.ravel()
    reduces = collective != Collective.ALL_GATHER
    copies = collective != Collective.REDUCE_SCATTER
    nsteps = C + 1 if reduces and copies else C
    rows = []
    for t in range(nsteps):
        if reduces and t < C:    # the switch reads shard j of chunk t from every GPU i (i == j: j's own leg), sums it
            rows.append((np.full(n * n, t), peer, owner, np.full(n * n, REDUCE)))
        if copies and (t > 0 or not reduces):   # GPU j writes its shard of a chunk once; the switch copies it to all
            rows.append((np.full(n * n, t), owner, peer, np.full(n * n, MULTICAST)))
    step, src, dst, kind = (np.concatenate([r[k] for r in rows]).astype(np.int64) for k in range(4))
    T = step.size
    # an all-reduce's rows are fractions of the buffer (a shard's chunk: 1 / (n C)); a reduce-scatter's and an
    # all-gather's of one rank's block, the size their ring tables count in (a chunk of it: 1 / C)
    frac = 1.0 / (n * C) if collective == Collective.ALL_REDUCE else 1.0 / C
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    return TransferTable(collective, "nvls", n, nsteps, step, src, dst, np.zeros(T, dtype=np.int64),
                         np.full(T, frac), np.ones(T, dtype=np.int64), empty_i, empty_i, empty_f, empty_f,
                         in_switch=kind.astype(np.int8))


@functools.lru_cache(maxsize=64)
def cached_table(nranks: int, nchunks: int, collective: Collective) -> TransferTable:
    """`nvls_table`, built once per arguments (tables are never modified)."""
    return nvls_table(nranks, nchunks, collective)


def template(table: TransferTable) -> tuple[TransferTable, np.ndarray, float] | None:
    """(a few-step table, the step of it each step of `table` repeats, the byte scale) where `table` is an NVLS
    table of 2**k > 2 chunks (`nvls_table`) or an NVLS-Tree table of 2**k segments above its template's
    (`nvls_tree.tree_template`); None otherwise. Its middle steps all move the same rows, each row
    1 / C of a block, so the analytic model of C chunks is that of 2 (all-reduce: fill, steady, drain) or 1
    (reduce-scatter, all-gather) with every step's bytes scaled by a power of two: exact in floating point."""
    if table.algorithm == "nvls_tree":
        from .nvls_tree import tree_template
        return tree_template(table)
    if table.algorithm != "nvls" or table.in_switch is None or table.collective not in NVLS_COLLECTIVES:
        return None
    both = table.collective == Collective.ALL_REDUCE
    chunks = table.nsteps - 1 if both else table.nsteps
    small = 2 if both else 1
    if chunks <= small or chunks & (chunks - 1) or table.lrank.size:
        return None
    full = cached_table(table.nranks, chunks, table.collective)
    if full is not table and not all(np.array_equal(getattr(full, f), getattr(table, f))
                                     for f in ("step", "src", "dst", "chan", "frac", "nmsg", "in_switch")):
        return None
    step_map = np.ones(table.nsteps, dtype=np.int64) if both else np.zeros(table.nsteps, dtype=np.int64)
    if both:
        step_map[0], step_map[-1] = 0, 2
    return cached_table(table.nranks, small, table.collective), step_map, small / chunks


def switch_weights(table: TransferTable, f_transfer: np.ndarray, p_flow: np.ndarray, p_link: np.ndarray) -> np.ndarray:
    """Per (flow, link) pair: 1 / the rows of the same switch operation on that link (their bytes cross
    it once), 1 elsewhere."""
    w = np.ones(p_link.size)
    if table.in_switch is None or not p_link.size:
        return w
    tr = f_transfer[p_flow]
    kind = table.in_switch[tr].astype(np.int64)
    on = np.flatnonzero(kind > 0)
    anchor = np.where(kind[on] == REDUCE, table.dst[tr[on]], table.src[tr[on]])
    key = column_keys(np.stack([table.step[tr[on]], kind[on], anchor, p_link[on]]))
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    w[on] = 1.0 / cnt[inv.reshape(-1)]
    return w


# ----------------------------------------------------------------------------- schedules with switch participants
def switch_nodes(topo: Any, schedule: Any, endpoints: Sequence[str]) -> list[str]:
    """The topology node that plays each switch participant of `schedule`: per server the NVSwitch for NVLS-Tree
    (switch h serves host group h), the network switch nearest to every rank (the SHARP aggregation root) for
    CollNet."""
    if schedule.algorithm == "nvls_tree":
        return server_switches(topo, schedule_groups(schedule), endpoints)
    g = topo.graph
    nets = [v for v in g if _val(g.nodes[v].get("kind")) == "net_switch"]
    if not nets:
        raise InvalidArgument(f"{schedule.algorithm} needs a network switch (IB SHARP)", "use --nodes 2 or more")
    hops = {v: max(len(topo.path(e, v)) for e in endpoints[:schedule.nranks]) for v in nets}
    return [min(nets, key=lambda v: (hops[v], int(g.nodes[v].get("tier", 0)), v))] * schedule.nswitches


def server_switches(topo: Any, groups: Sequence[Sequence[int]], endpoints: Sequence[str]) -> list[str]:
    """The NVLS-capable NVSwitch of each host group (NVLS-Tree's switch participants, in group order)."""
    out = []
    for g in groups:
        hit = nvls_switch(topo, [endpoints[r] for r in g])
        if hit is None:
            raise InvalidArgument("nvls_tree needs an NVLS-capable NVSwitch in every server",
                                  "use --topo dgx-h100 (Hopper or later) servers")
        out.append(hit[0])
    return out


def schedule_groups(schedule: Any) -> list[list[int]]:
    """The host groups an NVLS-Tree schedule was built on: the ranks that talk to each switch."""
    n = schedule.nranks
    groups: dict[int, set[int]] = {}
    for r, _step, op in schedule.ops():
        if r < n and op.peer is not None and op.peer >= n:
            groups.setdefault(op.peer - n, set()).add(r)
    return [sorted(groups[h]) for h in sorted(groups)]


def switch_schedule_table(schedule: Any) -> TransferTable:
    """The transfer table a schedule with switch participants runs as: the switches' adds left out (free), and
    each row between a rank and a switch one message, however many blocks it merges. A rank's blocks to or from
    its switch in one step move in one primitive (NCCL's NVLS scatter and gather warps write or read all the
    NVLS heads' pieces of a chunk in one `prims.scatter` / `prims.gather` step, src/device/all_reduce.h,
    NVLS_TREE), and the scatter and gather warps run side by side, so a step pays one message latency, not one
    per block: m x that latency would make a 72-GPU rack's all-reduce of 8 bytes take hundreds of microseconds."""
    import dataclasses

    from .transfers import from_schedule
    n = schedule.nranks
    tab = from_schedule(schedule)
    keep = tab.lrank < n                         # in-network adds cost no GPU time
    one = (tab.src >= n) | (tab.dst >= n)
    return dataclasses.replace(tab, nranks=schedule.nparticipants, nmsg=np.where(one, 1, tab.nmsg),
                               lrank=tab.lrank[keep], lstep=tab.lstep[keep], lcopy=tab.lcopy[keep],
                               lreduce=tab.lreduce[keep])


def simulate_switch_schedule(topo: Any, schedule: Any, size_bytes: int, *, endpoints: Sequence[str] | None = None,
                             params: Any = None, engine: str = "analytic", dtype: str = "float32",
                             protocol: str | None = "simple", timeline: bool = False,
                             progress: Callable[[float], None] | None = None) -> Any:
    """Simulate an all-reduce schedule with switch participants (nvls_tree, collnet_*): each switch is a node of
    the topology (`switch_nodes`), its adds are free, and its NVLink transfers run at NVLS efficiency. The
    timeline's ranks from `nranks` on are the switches (`SimResult.switches` names their nodes)."""
    from .api import endpoints_of
    if schedule.collective != Collective.ALL_REDUCE or not schedule.nswitches:
        raise InvalidArgument(f"{schedule.algorithm}: only all-reduce schedules with switches go this way",
                              "simulate other schedules with simulate_schedule")
    n = schedule.nranks
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:n]
    return simulate_switch_table(topo, switch_schedule_table(schedule), n, switch_nodes(topo, schedule, eps),
                                 size_bytes, endpoints=eps, params=params, engine=engine, dtype=dtype,
                                 protocol=protocol, timeline=timeline, progress=progress)


def simulate_switch_table(topo: Any, tab: TransferTable, nranks: int, switches: Sequence[str], size_bytes: int, *,
                          endpoints: Sequence[str], params: Any = None, engine: str = "analytic",
                          dtype: str = "float32", protocol: str | None = "simple", timeline: bool = False,
                          progress: Callable[[float], None] | None = None) -> Any:
    """Simulate the table of a switch schedule (participants from `nranks` on are `switches`, topology nodes):
    NVLS algorithms' NVLink transfers at NVLS efficiency; the result counts the `nranks` GPUs only."""
    import dataclasses

    from .api import simulate_table
    from .params import params_for
    prm = params if params is not None else params_for(topo)
    if tab.algorithm.startswith("nvls"):   # switch operations at NCCL's NVLS efficiency
        gen = int(topo.graph.nodes[switches[0]]["generation"])
        eff = dict(prm.link_efficiency)
        eff["nvlink"] = eff.get("nvlink", 1.0) * efficiency(prm, gen)
        prm = dataclasses.replace(prm, link_efficiency=eff)
    eps = list(endpoints)[:nranks] + list(switches)
    res = simulate_table(topo, tab, size_bytes, engine=engine, dtype=dtype, params=prm, endpoints=eps,
                         protocol=protocol, timeline=timeline, progress=progress)
    return dataclasses.replace(res, nranks=nranks, rank_finish_us=res.rank_finish_us[:nranks],
                               switches=list(switches))


def simulate_switch_algorithm(topo: Any, algorithm: str, nranks: int, size_bytes: int, *,
                              endpoints: Sequence[str] | None = None, params: Any = None, engine: str = "analytic",
                              dtype: str = "float32", timeline: bool = False,
                              progress: Callable[[float], None] | None = None) -> Any:
    """The registry's `algorithm` all-reduce (nvls_tree, collnet_direct, collnet_chain) on the topology's servers,
    its pipeline segment count chosen per call like NVLS's chunks (the fastest of NVLS_CHUNKS up to 32); the
    timeline and progress are those of the run with the chosen count. NVLS-Tree runs from its table written
    directly (`nvls_tree.tree_table`, the same rows as the schedule's), the others from their schedules."""
    from ..algorithms import registry
    from .api import endpoints_of
    from .params import params_for
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    groups = [list(g) for g in topo.host_groups(eps[:nranks])]
    prm = params if params is not None else params_for(topo)
    if algorithm == "nvls_tree":
        from .nvls_tree import tree_table
        sw = server_switches(topo, groups, eps)

        def run(c: int, want: bool) -> Any:
            return simulate_switch_table(topo, tree_table(groups, c), nranks, sw, size_bytes, endpoints=eps,
                                         params=prm, engine=engine, dtype=dtype, timeline=want and timeline,
                                         progress=progress if want else None)
    else:
        def run(c: int, want: bool) -> Any:
            s = registry.get_schedule(Collective.ALL_REDUCE, algorithm, nranks, nsegs=c, host_groups=groups)
            return simulate_switch_schedule(topo, s, size_bytes, endpoints=eps, params=prm, engine=engine,
                                            dtype=dtype, timeline=want and timeline,
                                            progress=progress if want else None)
    runs = {c: run(c, False) for c in NVLS_CHUNKS if c <= 32}
    chunks = min(runs, key=lambda c: runs[c].time_us)   # the first of equal times, as NVLS's chunk choice
    best = run(chunks, True) if timeline or progress else runs[chunks]
    best.notes.append(f"{algorithm}: {chunks} pipeline segments (fastest of those tried)")
    return best
