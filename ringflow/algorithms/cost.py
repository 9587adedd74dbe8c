"""Counts and alpha-beta cost of a schedule, from the schedule alone (plus a topology).

``traffic(schedule, shape)`` counts transfer steps, bytes sent / received per rank and bytes
per rank pair, using ``layout.chunk_bounds`` (the one chunk -> element mapping).

``schedule_cost(schedule, shape, topo=None, alpha_us=, beta_GBps=, msg_us=)`` prices it, step by step
(steps are lock-step, so the total is the sum of the step times):

- without a topology, every rank has one link of ``beta_GBps`` each way to an ideal switch and pays
  ``msg_us`` for each message it sends or receives (LogGP's per-message overhead o, beside the per-step
  latency alpha): step time = alpha + o x max over ranks of (messages sent + received)
  + max over ranks of max(bytes sent, bytes received) / beta;
- with a topology (rank r on ``topo.endpoints()[r]``), every transfer's bytes are spread over
  its equal-cost paths (``topo.paths``) and added to the load of each directed link; a
  transfer takes alpha + path latency + max over its links of (link load / link bandwidth),
  and the step takes as long as its slowest transfer. Links shared by a step's transfers
  (a NIC, a PCIe switch, an oversubscribed uplink) therefore slow all of them.

Local copies and reductions are free in this model (memory bandwidth >> link bandwidth);
the fuller engine in ``ringflow.sim`` models more.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TopologyError
from ..hardware.latency import HOST_SHM_GBPS_DEFAULT
from .layout import CallShape, buffer_elements, chunk_bounds, ref_bounds
from .schedule import Buffer, OpKind, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from ..topology import Topology

# Without a topology (one host, ranks are processes exchanging through shared memory):
# beta is the host-cpu preset's shared-memory link figure (ringflow.hardware.latency, where its
# source is cited: one DDR4-3200 channel, UNCALIBRATED); alpha = 10 us per step is an UNCALIBRATED
# assumption for a cross-process wake-up plus the Python/numpy call overhead of one step (it also stands
# for TCP peers and the Python executor). MSG = 0.16 us per message a rank sends or receives is measured:
# the least-squares line through the 8-byte all-reduce and broadcast of every algorithm on 3-16 ranks of a
# 16-core host (benchmarks/small_message_cost.py: 0.16 us per message, 0.27 us per step on the native
# executor). `ringflow calibrate` measures this machine's figures (its host model, docs/hostmodel.md).
DEFAULT_ALPHA_US = 10.0
DEFAULT_MSG_US = 0.16
DEFAULT_BETA_GBPS = HOST_SHM_GBPS_DEFAULT
# With a topology the link latencies come from its links; this is the per-step software
# overhead added on top: NCCL's per-hop NVLink latency is 0.4-0.5 us (LL) to 1.9-2.5 us
# (LL128) in src/graph/tuning.cc (hwLat table); 1 us sits between them. NCCL's latency model there
# (baseLat + steps x hwLat) has no per-message term, and neither has the topology default.
DEFAULT_TOPO_ALPHA_US = 1.0
DEFAULT_TOPO_MSG_US = 0.0


@dataclass(frozen=True)
class Traffic:
    """What a schedule moves for one call shape."""

    steps: int                              # steps that move data
    nsteps: int                             # all steps (incl. local-only ones)
    bytes_sent: tuple[int, ...]             # per rank
    bytes_recv: tuple[int, ...]             # per rank
    pair_bytes: dict[tuple[int, int], int]  # (src, dst) -> bytes
    per_step: tuple[tuple[tuple[int, int, int], ...], ...]  # per step: (src, dst, nbytes) per rank pair
    msgs_per_step: tuple[int, ...] = ()     # per step: the most messages any rank sends + receives

    @property
    def messages(self) -> int:
        """Sum over steps of the most messages any rank sends + receives in the step (each send op is one)."""
        return sum(self.msgs_per_step)

    @property
    def bytes_per_rank(self) -> int:
        """Max over ranks of max(bytes sent, bytes received) (the closed forms' figure)."""
        return max((max(s, r) for s, r in zip(self.bytes_sent, self.bytes_recv, strict=True)), default=0)


@dataclass(frozen=True)
class Cost:
    """The predicted cost of one schedule for one call shape."""

    collective: str
    algorithm: str
    nranks: int
    nbytes: int                  # S of the closed forms
    time_s: float
    steps: int
    bytes_per_rank: int
    bytes_sent: tuple[int, ...]
    bytes_recv: tuple[int, ...]
    step_times_s: tuple[float, ...]
    params: dict[str, Any]
    scratch_bytes: int = 0       # largest scratch buffer of any rank
    messages: int = 0            # sum over steps of the most messages any rank sends + receives

    @property
    def algbw_GBps(self) -> float:
        """nbytes / time (nccl-tests' algorithm bandwidth)."""
        return self.nbytes / self.time_s / 1e9 if self.time_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without per-rank vectors)."""
        return {"collective": self.collective, "algorithm": self.algorithm, "nranks": self.nranks,
                "nbytes": self.nbytes, "time_s": self.time_s, "time_us": self.time_s * 1e6, "steps": self.steps,
                "messages": self.messages, "bytes_per_rank": self.bytes_per_rank, "scratch_bytes": self.scratch_bytes,
                "algbw_GBps": self.algbw_GBps, **self.params}


_TRAFFIC_CACHE: OrderedDict[tuple[int, CallShape], tuple[Schedule, Traffic]] = OrderedDict()


def traffic(schedule: Schedule, shape: CallShape) -> Traffic:
    """Count steps, bytes per rank and per pair of `schedule` for `shape` (cached per schedule object)."""
    key = (id(schedule), shape)
    hit = _TRAFFIC_CACHE.get(key)
    if hit is not None and hit[0] is schedule:
        _TRAFFIC_CACHE.move_to_end(key)
        return hit[1]
    tr = _traffic(schedule, shape)
    _TRAFFIC_CACHE[key] = (schedule, tr)
    if len(_TRAFFIC_CACHE) > 1024:
        _TRAFFIC_CACHE.popitem(last=False)
    return tr


def _traffic(schedule: Schedule, shape: CallShape) -> Traffic:
    n = schedule.nranks
    sent, recv = [0] * schedule.nparticipants, [0] * schedule.nparticipants   # switches last, not reported
    pairs: dict[tuple[int, int], int] = {}
    per_step: list[tuple[tuple[int, int, int], ...]] = []
    msgs_per_step: list[int] = []
    isz = shape.itemsize
    bcache: dict[tuple[Buffer, int], tuple[tuple[int, int], ...]] = {}
    for step in range(schedule.nsteps):
        agg: dict[tuple[int, int], int] = {}   # messages of one step merged per (src, dst)
        msgs = [0] * schedule.nparticipants
        for r, prog in enumerate(schedule.programs):
            for op in (prog[step] if step < len(prog) else ()):
                if op.kind == OpKind.SEND:
                    assert op.src is not None and op.peer is not None
                    bkey = (op.src.buffer, r)
                    bounds = bcache.get(bkey)
                    if bounds is None:
                        bounds = bcache[bkey] = chunk_bounds(shape, schedule, op.src.buffer, r)
                    nb = ref_bounds(bounds, op.src.index, op.src.span)[1] * isz
                    agg[(r, op.peer)] = agg.get((r, op.peer), 0) + nb
                    msgs[r] += 1
                    msgs[op.peer] += 1
                    sent[r] += nb
                    recv[op.peer] += nb
                    pairs[(r, op.peer)] = pairs.get((r, op.peer), 0) + nb
        per_step.append(tuple((a, b, nb) for (a, b), nb in agg.items()))
        msgs_per_step.append(max(msgs[:n], default=0))
    return Traffic(sum(1 for m in per_step if m), schedule.nsteps, tuple(sent[:n]), tuple(recv[:n]), pairs,
                   tuple(per_step), tuple(msgs_per_step))


def _step_time_flat(msgs: tuple[tuple[int, int, int], ...], nmsgs: int, n: int, alpha_s: float, msg_s: float,
                    beta_Bps: float) -> float:
    if not msgs:
        return 0.0
    out, inn = [0] * n, [0] * n
    for a, b, nb in msgs:
        out[a] += nb
        inn[b] += nb
    return alpha_s + msg_s * nmsgs + max(max(out), max(inn)) / beta_Bps


class _Routes:
    """Cached equal-cost paths, links, bandwidths and latencies of a topology."""

    def __init__(self, topo: Topology, endpoints: list[str]) -> None:
        self.topo, self.ep = topo, endpoints
        self.cache: dict[tuple[int, int], tuple[list[list[tuple[str, str]]], float]] = {}

    def get(self, a: int, b: int) -> tuple[list[list[tuple[str, str]]], float]:
        key = (a, b)
        if key not in self.cache:
            pa, pb = self.ep[a], self.ep[b]
            paths = self.topo.paths(pa, pb) or [self.topo.path(pa, pb)]
            edges = [self.topo.path_edges(p) for p in paths]
            self.cache[key] = (edges, self.topo.latency_us(pa, pb) * 1e-6)
        return self.cache[key]


_route_cache: dict[tuple[int, int], _Routes] = {}


def _routes(topo: Topology, endpoints: list[str]) -> _Routes:
    key = (id(topo), len(endpoints))
    r = _route_cache.get(key)
    if r is None or r.topo is not topo or r.ep != endpoints:
        r = _route_cache[key] = _Routes(topo, endpoints)
    return r


def _step_time_topo(msgs: tuple[tuple[int, int, int], ...], routes: _Routes, alpha_s: float) -> float:
    if not msgs:
        return 0.0
    g = routes.topo.graph
    load: dict[tuple[str, str], float] = {}
    for a, b, nb in msgs:
        edges, _ = routes.get(a, b)
        share = nb / len(edges)
        for path in edges:
            for e in path:
                load[e] = load.get(e, 0.0) + share
    worst = 0.0
    for a, b, _nb in msgs:
        edges, lat_s = routes.get(a, b)
        t = max((load[e] / (g.edges[e]["bw_GBps"] * 1e9) for path in edges for e in path), default=0.0)
        worst = max(worst, alpha_s + lat_s + t)
    return worst


def schedule_cost(schedule: Schedule, shape: CallShape, topo: Topology | None = None, *,
                  alpha_us: float | None = None, beta_GBps: float = DEFAULT_BETA_GBPS,
                  endpoints: list[str] | None = None, msg_us: float | None = None) -> Cost:
    """Alpha-beta time (plus `msg_us` per message a rank sends or receives) of `schedule` for `shape`, on `topo`
    (rank r on endpoints[r]) or a flat switch."""
    tr = traffic(schedule, shape)
    n = schedule.nranks
    if topo is None:
        alpha_s = (DEFAULT_ALPHA_US if alpha_us is None else alpha_us) * 1e-6
        msg_s = (DEFAULT_MSG_US if msg_us is None else msg_us) * 1e-6
        times = tuple(_step_time_flat(m, k, n, alpha_s, msg_s, beta_GBps * 1e9)
                      for m, k in zip(tr.per_step, tr.msgs_per_step, strict=True))
    else:
        eps = endpoints if endpoints is not None else topo.endpoints()
        if len(eps) < n:
            raise TopologyError(f"topology {topo.name!r} has {len(eps)} endpoints, the job has {n} ranks",
                                "use a larger topology (e.g. build_cluster) or fewer ranks")
        routes = _routes(topo, list(eps[:n]))
        alpha_s = (DEFAULT_TOPO_ALPHA_US if alpha_us is None else alpha_us) * 1e-6
        msg_s = (DEFAULT_TOPO_MSG_US if msg_us is None else msg_us) * 1e-6
        # lock-step phases repeat the same traffic pattern step after step
        memo: dict[tuple[tuple[int, int, int], ...], float] = {}
        times = tuple((memo[m] if m in memo else memo.setdefault(m, _step_time_topo(m, routes, alpha_s)))
                      + (msg_s * k if m else 0.0) for m, k in zip(tr.per_step, tr.msgs_per_step, strict=True))
    from .registry import collective_bytes
    params = {"nsegs": int(schedule.params.get("nsegs", 1)), "nchannels": schedule.nchannels}
    scratch = 0
    if Buffer.SCRATCH in schedule.layouts:
        scratch = max(buffer_elements(shape, schedule, Buffer.SCRATCH, r) for r in range(n)) * shape.itemsize
    return Cost(schedule.collective.value, schedule.algorithm, n,
                collective_bytes(schedule.collective, n, shape.count, shape.itemsize), sum(times), tr.steps,
                tr.bytes_per_rank, tr.bytes_sent, tr.bytes_recv, times, params, scratch, tr.messages)
