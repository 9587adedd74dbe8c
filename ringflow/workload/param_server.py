"""Parameter servers (Li et al., OSDI 2014; SSP: Ho et al., NIPS 2013): where the server lives, how consistent
the workers are, and what it costs.

Layouts (W workers, a gradient of S bytes):

- ``cpu``: ``k`` CPU server hosts, each behind one NIC of ``B`` GB/s; every step all W workers push S and
  pull S: the servers' NICs receive W S and send W S -> incast time ``2 W S / (k B)``;
- ``gpu0``: worker 0's GPU is the server: the simulator prices ringflow's ``param_server`` schedule (reduce to
  rank 0, broadcast back) on the group, which is the same incast through one GPU's links;
- ``sharded``: every worker serves 1/W of the parameters (``sharded_ps``, a two-shot all-reduce): no incast.

Consistency (per worker iteration: compute c_i[k] from the slow-worker distribution, then push + pull):

    finish_i[k] = max(finish_i[k-1], max_j finish_j[k-1-s]) + c_i[k] + comm

BSP is s = 0 (everyone waits for the slowest each step), SSP(s) lets the fastest run s steps ahead of the
slowest (Ho et al. 2013, "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server"),
ASP is s = infinity (no waiting; staleness unbounded). Server capacity caps the update rate at
``capacity / (2 S)`` updates per second for the central layouts. We report time per *global step* (W worker
updates) so the three compare with a ring all-reduce BSP step on the same cluster.

Slow-worker distributions (``--straggler``): ``none``; ``lognormal:SIGMA`` (compute x exp(N(0, SIGMA^2)));
``bernoulli:P:X`` (each worker, each step, is X times slower with probability P); ``exp:MEAN_FRACTION``
(compute + Exp(mean = fraction x compute)).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument

LAYOUTS = ("cpu", "gpu0", "sharded")


def parse_straggler(spec: str) -> tuple[str, tuple[float, ...]]:
    """Parse a slow-worker distribution spec (see module docstring)."""
    parts = str(spec).strip().lower().split(":")
    kind, args = parts[0], parts[1:]
    want = {"none": 0, "lognormal": 1, "bernoulli": 2, "exp": 1}
    if kind not in want or len(args) != want[kind]:
        raise InvalidArgument(f"straggler distribution {spec!r}",
                              "use none, lognormal:SIGMA, bernoulli:P:SLOWDOWN or exp:MEAN_FRACTION")
    try:
        vals = tuple(float(a) for a in args)
    except ValueError:
        raise InvalidArgument(f"straggler distribution {spec!r} has a non-number", "e.g. bernoulli:0.05:3") from None
    if any(v < 0 for v in vals) or (kind == "bernoulli" and (vals[0] > 1 or vals[1] < 1)):
        raise InvalidArgument(f"straggler distribution {spec!r} out of range",
                              "probability in [0, 1], slowdown >= 1, sigma and mean >= 0")
    return kind, vals


def sample_compute(spec: str, compute_s: float, workers: int, iters: int, seed: int = 0) -> np.ndarray:
    """Compute time of every worker at every iteration, shape (iters, workers)."""
    kind, a = parse_straggler(spec)
    rng = np.random.default_rng(seed)
    base = np.full((iters, workers), float(compute_s))
    if kind == "lognormal":
        return base * np.exp(rng.normal(0.0, a[0], base.shape))
    if kind == "bernoulli":
        return base * np.where(rng.random(base.shape) < a[0], a[1], 1.0)
    if kind == "exp":
        return base + rng.exponential(a[0] * compute_s, base.shape)
    return base


def ssp_finish_times(compute: np.ndarray, comm_s: float, staleness: float) -> np.ndarray:
    """Finish time of every (iteration, worker) under SSP with bound `staleness` (inf = ASP, 0 = BSP)."""
    iters, W = compute.shape
    fin = np.zeros((iters, W))
    prev = np.zeros(W)
    for k in range(iters):
        start = prev.copy()
        if np.isfinite(staleness):
            j = k - 1 - int(staleness)
            if j >= 0:
                start = np.maximum(start, fin[j].max())
        fin[k] = start + compute[k] + comm_s
        prev = fin[k]
    return fin


@dataclass
class PSResult:
    """Per-global-step time of a PS layout under one consistency model, and its traffic."""

    layout: str
    consistency: str
    step_time_s: float
    comm_s: float
    server_time_s: float
    bytes_per_step: float
    server_in_bytes: float
    bottleneck: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)


def ps_comm(layout: str, nbytes: float, group: Sequence[str], topo: Any, *, cpu_servers: int = 1,
            cpu_nic_GBps: float | None = None) -> tuple[float, float, float, str]:
    """(per-worker push+pull seconds without contention, whole-step server time, server inbound bytes, bottleneck)."""
    from ..sim import simulate
    W = len(group)
    if layout not in LAYOUTS:
        raise InvalidArgument(f"parameter-server layout {layout!r}", f"use one of {', '.join(LAYOUTS)}")
    size = max(int(nbytes), 2 * W)
    if layout == "sharded":
        t = simulate(topo, "all_reduce", size, algorithm="sharded_ps", nranks=W, endpoints=list(group),
                     dtype="float32").time_us * 1e-6
        return t, t, nbytes * (W - 1) / W, "every worker's own link (no incast)"
    if layout == "gpu0":
        t = simulate(topo, "all_reduce", size, algorithm="param_server", nranks=W, endpoints=list(group),
                     dtype="float32").time_us * 1e-6
        one = simulate(topo, "all_reduce", size, algorithm="param_server", nranks=2,
                       endpoints=[group[0], group[-1]], dtype="float32").time_us * 1e-6
        return one, t, nbytes * (W - 1), f"server GPU {group[0]}'s links (incast of {W - 1} workers)"
    # CPU servers outside the GPU cluster: each behind one NIC
    from .commmodel import AlphaBetaModel
    gl = AlphaBetaModel().links([group[0], group[-1]] if W > 1 else list(group), topo)
    nic = cpu_nic_GBps or (gl.nic_GBps if np.isfinite(gl.nic_GBps) else 25.0)
    per_worker = 2 * nbytes / (min(nic, gl.nic_GBps if np.isfinite(gl.nic_GBps) else nic) * 1e9)
    server = 2 * W * nbytes / (cpu_servers * nic * 1e9)
    return per_worker, server, nbytes * W, f"{cpu_servers} CPU server NIC(s) (incast of {W} workers)"


def compare(nbytes: float, compute_s: float, group: Sequence[str], topo: Any, *, straggler: str = "none",
            staleness: int = 3, cpu_servers: int = 1, cpu_nic_GBps: float | None = None, iters: int = 200,
            seed: int = 0) -> list[PSResult]:
    """Every PS layout x {BSP, SSP(s), ASP}, plus ring all-reduce BSP, on the same workers and stragglers."""
    from ..sim import simulate
    W = len(group)
    if W < 2:
        raise InvalidArgument("a parameter server needs at least 2 workers", "give more GPUs")
    compute = sample_compute(straggler, compute_s, W, iters, seed)
    out: list[PSResult] = []
    for layout in LAYOUTS:
        per_worker, server_s, server_in, where = ps_comm(layout, nbytes, group, topo, cpu_servers=cpu_servers,
                                                         cpu_nic_GBps=cpu_nic_GBps)
        for name, s in (("BSP", 0.0), (f"SSP({staleness})", float(staleness)), ("ASP", float("inf"))):
            if name == "BSP":
                # everyone pushes at once: the step's communication is the whole incast
                fin = ssp_finish_times(compute, server_s, 0.0)
                step = float(fin[-1].max()) / iters
            else:
                fin = ssp_finish_times(compute, per_worker, s)
                step = float(fin[-1].max()) / iters
                # the servers cannot absorb more than their capacity: W updates need server_s seconds
                step = max(step, server_s)
            out.append(PSResult(layout, name, step, per_worker, server_s, 2 * nbytes * W, server_in, where))
    ring = simulate(topo, "all_reduce", max(int(nbytes), 2 * W), algorithm="ring", nranks=W,
                    endpoints=list(group), dtype="float32").time_us * 1e-6
    fin = ssp_finish_times(compute, ring, 0.0)
    out.append(PSResult("ring all-reduce", "BSP", float(fin[-1].max()) / iters, ring, 0.0,
                        2 * nbytes * (W - 1), 0.0, "ring: every link carries 2(W-1)/W S"))
    return out
