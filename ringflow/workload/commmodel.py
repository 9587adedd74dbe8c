"""Communication time of one collective on a group of GPUs: ONE small interface, several engines.

``CommModel.time_s(collective, nbytes, group, topo)`` is all the step-time model and the planner call.

- `AlphaBetaModel` (default, closed form): a ring over the group, NCCL style, costed as ``base_us + steps x
  hop_us + factor x nbytes / B`` (an all-reduce inside one NVLS-capable NVSwitch domain: the faster of that and
  NVLS, ``base_us + 2 hop_us + (n + 1) / n x nbytes / (B x nvls_eff)``; a reduce-scatter or all-gather there:
  ``base_us + hop_us + nbytes / (B x nvls_eff)``) where ``factor`` is the ring's bytes per
  rank (all-reduce 2(n-1)/n, all-gather / reduce-scatter (n-1)/n, all-to-all (n-1)/n, send/recv 1) and ``B`` the
  ring's bandwidth per rank: NVLink egress of a GPU inside one server; across servers ``min(B_nvlink, k x
  B_nic)`` with ``k`` group members per server (NCCL runs one channel per NIC, each crossing the server boundary
  once) and ``B_nic`` the routed GPU->GPU bottleneck between servers (NIC or fabric). Link efficiencies and
  NCCL's per-call / per-hop latencies come from `ringflow.sim.params` (one place for those figures). ``nbytes``
  is the buffer size (the full tensor for all-reduce, all-gather's output, reduce-scatter's input, all-to-all's
  send buffer, the message for send/recv).
- `SimModel`: ringflow.sim's analytic engine on the tuner's algorithm (same call shape; the default).

Groups are homogeneous in a Megatron mapping, so results are cached by the group's *shape* (size, servers
spanned, members per server, rail of its first member).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidArgument
from ..hardware.nvlink import edge_efficiency_scale

_RING_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
_RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
    "all_to_all": lambda n: n - 1, "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1,
    "sendrecv": lambda n: 1,
}
# NVLS bytes per rank through its busier NVLink direction, per byte of nbytes (sim.nvls)
_NVLS_BYTES = {"all_reduce": lambda n: (n + 1) / n, "all_gather": lambda n: 1.0, "reduce_scatter": lambda n: 1.0}


class CommModel(Protocol):
    """Anything that times a collective on a group of topology endpoints."""

    name: str

    def time_s(self, collective: str, nbytes: float, group: Sequence[str], topo: Any) -> float:
        """Seconds for `collective` over `group` (topology node ids) moving a buffer of `nbytes`."""
        ...


def _norm(collective: str) -> str:
    key = str(getattr(collective, "value", collective)).lower().replace("-", "_")
    key = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
           "alltoall": "all_to_all", "p2p": "sendrecv", "send": "sendrecv"}.get(key, key)
    if key not in _RING_FACTOR:
        raise InvalidArgument(f"collective {collective!r} has no cost model",
                              f"use one of {', '.join(_RING_FACTOR)}")
    return key


@dataclass(frozen=True)
class GroupLinks:
    """What the ring of a group runs on: per-rank bandwidths (GB/s, efficiency applied) and hop latencies."""

    n: int
    servers: int
    per_server: int
    nvlink_GBps: float
    nic_GBps: float
    intra_hop_us: float
    inter_hop_us: float
    nvls_efficiency: float = 0.0   # > 0: the group sits on one NVSwitch that reduces in-switch (NVLS)

    @property
    def ring_GBps(self) -> float:
        """Per-rank bandwidth of a ring over the whole group."""
        if self.servers == 1:
            return self.nvlink_GBps
        inter = self.per_server * self.nic_GBps
        return min(self.nvlink_GBps, inter) if self.per_server > 1 else self.nic_GBps


class AlphaBetaModel:
    """Closed-form ring cost from the topology's link bandwidths (see module docstring)."""

    name = "alpha-beta"

    def __init__(self, sim_overrides: dict[str, Any] | None = None) -> None:
        self._overrides = sim_overrides
        self._cache: dict[tuple, GroupLinks] = {}
        self._base_us: dict[int, float] = {}

    def links(self, group: Sequence[str], topo: Any) -> GroupLinks:
        """Bandwidths and latencies of the ring over `group` (cached by group shape)."""
        hosts = [topo.host_of(g) for g in group]
        count = Counter(hosts)
        first = group[0]
        idx = topo.graph.nodes[first].get("index", 0)
        key = _shape_key(group, topo)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        from ..sim.params import params_for
        params = params_for(topo, self._overrides)
        simple = params.protocol("simple")
        eff = params.link_efficiency
        nv_GBps, intra_hop = float("inf"), 0.0
        same = [g for g in group if topo.host_of(g) == hosts[0]]
        if len(same) > 1:
            nv_GBps, intra_hop = self._intra(topo, same, eff, simple)
        nic_GBps, inter_hop = float("inf"), 0.0
        other = [g for g in group if topo.host_of(g) != hosts[0]]
        if other:
            peer = next((g for g in other if topo.graph.nodes[g].get("index") == idx), other[0])
            nic_GBps, inter_hop = self._path_bw(topo, first, peer, eff, simple)
        nvls = 0.0
        if not other and len(group) > 1:
            from ..sim.nvls import efficiency, nvls_switch
            switch = nvls_switch(topo, list(group))
            if switch is not None:
                nvls = efficiency(params, switch[1])
        gl = GroupLinks(len(group), len(count), max(count.values()), nv_GBps, nic_GBps, intra_hop, inter_hop, nvls)
        self._cache[key] = gl
        return gl

    @staticmethod
    def _path_bw(topo: Any, a: str, b: str, eff: dict[str, float], simple: Any) -> tuple[float, float]:
        edges = topo.path_edges(topo.path(a, b))
        data = [topo.graph.edges[e] for e in edges]
        tiers = {d["tier"] for d in data}
        cls = "net" if "nic" in tiers else ("nvlink" if tiers <= {"nvlink"} else "pci")

        def eff_of(d: dict) -> float:
            kind = str(getattr(d["type"], "value", d["type"]))
            # GPUDirect RDMA: the PCIe legs of a GPU->NIC path are not the CPU-staged copies that the
            # sim's PCIe efficiency (a device-to-host copy measurement) describes; only the network derates.
            if cls == "net" and kind == "pcie":
                return 1.0
            return eff.get(kind, 1.0) * edge_efficiency_scale(d)

        bw = min(d["bw_GBps"] * eff_of(d) for d in data)
        lat = sum(d["latency_us"] for d in data)
        return bw, lat + simple.msg_overhead_us.get(cls, 0.0)

    def _intra(self, topo: Any, same: list[str], eff: dict[str, float], simple: Any) -> tuple[float, float]:
        g = same[0]
        nv = [d for _, _, d in topo.graph.out_edges(g, data=True) if d.get("tier") == "nvlink"]
        bw_pair, hop = self._path_bw(topo, g, same[1], eff, simple)
        if not nv:
            return bw_pair, hop
        egress = sum(d["bw_GBps"] * edge_efficiency_scale(d) for d in nv) * eff.get("nvlink", 1.0)
        switched = any(topo.graph.nodes[v].get("kind") == "nvswitch" or
                       str(topo.graph.nodes[v].get("kind")) == "NodeKind.NVSWITCH"
                       for _, v in topo.graph.out_edges(g))
        if switched:
            return egress, hop
        # point-to-point NVLink mesh (DGX-1): the rings found on it carry what they carry
        try:
            from ..topology import find_rings
            rings = find_rings(topo, same)
            return max(sum(r.bottleneck_GBps for r in rings) * eff.get("nvlink", 1.0) * edge_efficiency_scale(nv[0]),
                       bw_pair), hop
        except Exception:  # ring search unavailable: one ring on the pair bottleneck
            return bw_pair, hop

    def time_s(self, collective: str, nbytes: float, group: Sequence[str], topo: Any) -> float:
        """Seconds for one collective call (see module docstring)."""
        c = _norm(collective)
        n = len(group)
        if n <= 1 or nbytes <= 0:
            return 0.0
        gl = self.links(group, topo)
        base_us = self._base_us.get(id(topo))
        if base_us is None:
            from ..sim.params import params_for
            base_us = self._base_us[id(topo)] = params_for(topo, self._overrides).protocol("simple").base_us
        steps = _RING_STEPS[c](n)
        if gl.servers == 1:
            hops_us = steps * gl.intra_hop_us
        else:
            hops_us = steps * max(gl.intra_hop_us, gl.inter_hop_us)
        if c == "all_to_all" and gl.servers > 1:
            # each rank sends (n-k)/n of its buffer across servers over its own NIC, (k-1)/n over NVLink
            k = gl.per_server
            t_bw = max((k - 1) / n * nbytes / (gl.nvlink_GBps * 1e9) if k > 1 else 0.0,
                       (n - k) / n * nbytes / (gl.nic_GBps * 1e9))
        elif c == "sendrecv":
            t_bw = nbytes / ((gl.nvlink_GBps if gl.servers == 1 else gl.nic_GBps) * 1e9)
        else:
            t_bw = _RING_FACTOR[c](n) * nbytes / (gl.ring_GBps * 1e9)
        t = (base_us + hops_us) * 1e-6 + t_bw
        if c in _NVLS_BYTES and gl.nvls_efficiency > 0:
            # NVLS (sim.nvls): an all-reduce moves (n + 1) / n of the buffer each way in two switch passes, a
            # reduce-scatter or all-gather all of it one way in one; taken where it is faster, as NCCL does
            passes = 2 if c == "all_reduce" else 1
            t_nvls = (base_us + passes * gl.intra_hop_us) * 1e-6 + \
                _NVLS_BYTES[c](n) * nbytes / (gl.nvlink_GBps * gl.nvls_efficiency * 1e9)
            t = min(t, t_nvls)
        return t


class SimModel:
    """The simulator's analytic engine (ringflow.sim) behind the same interface.

    The tuner picks the algorithm for the call's size and group (ring, tree, hierarchical ...), the
    registry builds its schedule with the topology's rings, and the analytic engine prices it on the
    group's own endpoints (shared links, protocol choice). Results are cached by group shape and size.
    """

    name = "sim-analytic"

    def __init__(self, engine: str = "analytic") -> None:
        from .. import sim  # noqa: F401  (ImportError when the simulator is absent)
        self.engine = engine
        self._cache: dict[tuple, float] = {}

    def time_s(self, collective: str, nbytes: float, group: Sequence[str], topo: Any) -> float:
        """Seconds of one call as the simulator predicts it."""
        from ..sim import choose_algorithm, simulate
        from ..topology.gcpause import gc_paused
        c = _norm(collective)
        n = len(group)
        if n <= 1 or nbytes <= 0:
            return 0.0
        key = (_shape_key(group, topo), c, int(nbytes))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        size = max(int(nbytes), n * 2)
        coll = "sendrecv" if c == "sendrecv" else c
        with gc_paused():   # a first call on a large cluster builds its link tables, rings and schedules
            algo = choose_algorithm(topo, coll, n, size, "bfloat16", endpoints=list(group))
            # simulate() takes the fast path for huge ring/hierarchical groups and caches tables per group
            res = simulate(topo, coll, size, algorithm=algo, nranks=n, engine=self.engine, dtype="bfloat16",
                           endpoints=list(group))
        out = float(res.time_us) * 1e-6
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = out
        return out


class BudgetSpent(RuntimeError):
    """A `DeadlineModel` was asked for a time after its deadline."""


class DeadlineModel:
    """`inner` until `deadline_s` (on `clock`), then `BudgetSpent`: a pass over many layouts stops within
    one call of its budget (a layout's step time makes several calls, each one simulation)."""

    def __init__(self, inner: CommModel, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner, self.deadline_s, self.clock = inner, deadline_s, clock
        self.name = inner.name

    def time_s(self, collective: str, nbytes: float, group: Sequence[str], topo: Any) -> float:
        """The inner model's seconds, or BudgetSpent once the deadline has passed."""
        if self.clock() >= self.deadline_s:
            raise BudgetSpent(f"{self.name}: the time budget ran out")
        return self.inner.time_s(collective, nbytes, group, topo)


def _shape_key(group: Sequence[str], topo: Any) -> tuple:
    """Groups with equal keys cost the same in a homogeneous cluster (size, servers, members, rails)."""
    hosts = [topo.host_of(g) for g in group]
    count = Counter(hosts)
    idx = tuple(topo.graph.nodes[g].get("index", 0) for g in group if topo.host_of(g) == hosts[0])
    stride = tuple(sorted({(hosts[i + 1] - hosts[i]) for i in range(len(hosts) - 1)}))[:4]
    return (id(topo), len(group), len(count), max(count.values()), idx, stride)


def default_comm_model(kind: str = "auto") -> CommModel:
    """'alpha-beta', 'sim' or 'auto' (the simulator's analytic engine when available, else alpha-beta)."""
    if kind in ("alpha-beta", "alphabeta"):
        return AlphaBetaModel()
    if kind in ("sim", "auto"):
        try:
            return SimModel()
        except ImportError:
            if kind == "sim":
                raise InvalidArgument("ringflow.sim has no analytic engine in this build",
                                      "use --comm alpha-beta") from None
            return AlphaBetaModel()
    raise InvalidArgument(f"unknown comm model {kind!r}", "use auto, alpha-beta or sim")
