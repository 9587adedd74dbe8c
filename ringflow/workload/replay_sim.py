"""Replay a recorded trace on a modelled cluster: ranks placed on its GPUs, each operation simulated.

Each collective is simulated on the endpoints its members were placed on (the simulator's tuner picks the
algorithm for that placement and size), each send/recv pair as one message between its two endpoints;
results are cached per (operation, size, endpoints). Contention: after a first replay, operations of the
same kind and size that overlap in time on different GPUs (the data-parallel copies' pipeline sends, every
tensor-parallel group's all-reduce) are simulated together on the flow engine (`contention.
dimension_factor`), and the replay is run again with each one's duration times that slowdown; operations of
different kinds that overlap do not slow each other down here. Compute gaps are the recorded ones times
`compute_scale` (the recording host's compute, not the GPU's: scale it to the ratio you expect).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .replay import Call, Key, Replay, instance_key, nranks_of, per_rank, replay, step_marks

MAPS = ("block", "round-robin")
GATHERED = ("all_gather", "gather")   # the recorded count is one rank's part; the simulator's size is all parts


def size_bytes_of(op: str, nbytes: int, nranks: int) -> int:
    """The simulator's (nccl-tests') size of a call whose input on each rank is `nbytes`."""
    return nbytes * nranks if op in GATHERED else nbytes


def placement(nranks: int, endpoints: list[str], mapping: str, hosts: int) -> list[str]:
    """The endpoint of each global rank: `block` (rank r on endpoint r, hosts filled in turn), `round-robin`
    (rank r on host r mod hosts), or a JSON file listing one endpoint name per rank."""
    if nranks > len(endpoints):
        raise InvalidArgument(f"the trace has {nranks} ranks but the cluster only {len(endpoints)} GPUs",
                              "add --nodes, or record fewer ranks")
    if mapping == "block":
        return endpoints[:nranks]
    if mapping == "round-robin":
        per = len(endpoints) // max(1, hosts)
        return [endpoints[(r % hosts) * per + r // hosts] for r in range(nranks)]
    p = Path(mapping)
    if not p.exists():
        raise InvalidArgument(f"--map {mapping!r} is neither {' nor '.join(MAPS)} nor a file",
                              "give block, round-robin, or a JSON list of endpoint names, one per rank")
    names = json.loads(p.read_text())
    if not isinstance(names, list) or len(names) < nranks or any(n not in endpoints for n in names[:nranks]):
        raise InvalidArgument(f"{p} must list {nranks} endpoint names of the cluster",
                              f"endpoints look like {endpoints[0]!r}")
    return [str(n) for n in names[:nranks]]


class SimDurations:
    """Operation durations from the simulator, cached; adds up every link's bytes for the busiest links."""

    def __init__(self, topo: Any, trace: dict[str, Any], where: list[str], engine: str = "flow") -> None:
        self.topo, self.trace, self.where, self.engine = topo, trace, where, engine
        self._cache: dict[tuple, Any] = {}
        self.link_bytes: dict[int, np.ndarray] = {}
        self.fabrics: dict[int, Any] = {}

    def result(self, k: Key, cs: list[Call]) -> Any:
        """The simulator's result for one operation (None: nothing to simulate)."""
        from ..sim.api import simulate
        c0 = cs[0]
        if k[0] == "p2p":
            src, dst = int(k[2]), int(k[3])
            key: tuple = ("sendrecv", int(c0.get("nbytes") or 0), self.where[src], self.where[dst])
            if key not in self._cache:
                self._cache[key] = simulate(self.topo, "sendrecv", key[1], algorithm="p2p", engine=self.engine,
                                            endpoints=[key[2], key[3]], root=0)
            return self._cache[key]
        members = [m for m in self.trace["groups"].get(k[1], []) if m is not None]
        if len(members) < 2:
            return None
        op = str(c0["op"])
        nbytes = max(int(c.get("nbytes") or 0) for c in cs)
        eps = tuple(self.where[m] for m in members)
        root = c0.get("root")
        key = (op, nbytes, eps, root)
        if key not in self._cache:
            self._cache[key] = simulate(self.topo, op, size_bytes_of(op, nbytes, len(members)), engine=self.engine,
                                        dtype=str(c0.get("dtype") or "float32"), endpoints=list(eps),
                                        root=int(root) if root is not None else 0)
        return self._cache[key]

    def endpoints(self, k: Key) -> list[str]:
        """The GPUs an operation runs on."""
        if k[0] == "p2p":
            return [self.where[int(k[2])], self.where[int(k[3])]]
        return [self.where[m] for m in self.trace["groups"].get(k[1], []) if m is not None]

    def __call__(self, k: Key, cs: list[Call]) -> float:
        res = self.result(k, cs)
        if res is None:
            return 0.0
        if res.fabric is not None:
            fid = id(res.fabric)
            self.fabrics[fid] = res.fabric
            acc = self.link_bytes.get(fid)
            self.link_bytes[fid] = res.link_bytes.astype(float) if acc is None else acc + res.link_bytes
        return float(res.time_us) / 1e6

    def busiest(self, span_s: float, k: int = 5) -> list[dict[str, Any]]:
        """The k links that carried the most bytes over the replay, with their mean utilisation over `span_s`."""
        rows = []
        for fid, b in self.link_bytes.items():
            fab = self.fabrics[fid]
            name = getattr(fab.topo, "label", lambda n: n)
            for i in np.argsort(-b)[:k]:
                if b[i] > 0:
                    util = float(b[i] / (fab.line_Bpus[i] * span_s * 1e6)) if span_s > 0 else 0.0
                    rows.append({"link": f"{name(fab.edges[i][0])}->{name(fab.edges[i][1])}",
                                 "tier": fab.link_tier[i], "bytes": float(b[i]), "util": util})
        return sorted(rows, key=lambda r: -r["bytes"])[:k]


def contention_factors(topo: Any, rep: Replay, dur: SimDurations, members: dict[Key, list[Call]],
                       max_groups: int = 64) -> dict[Key, float]:
    """Per operation: its slowdown when run together with the operations of the same kind and size that
    overlap it in the replay `rep` on other GPUs (1 when alone)."""
    from .contention import dimension_factor
    kinds: dict[tuple, list[Key]] = defaultdict(list)
    for k, cs in members.items():
        if k in rep.ops and rep.ops[k][1] > rep.ops[k][0]:
            op = "sendrecv" if k[0] == "p2p" else str(cs[0]["op"])
            kinds[(op, max(int(c.get("nbytes") or 0) for c in cs), len(dur.endpoints(k)))].append(k)
    out: dict[Key, float] = {}
    cache: dict[tuple, float] = {}
    for (op, nbytes, n), ks in kinds.items():
        if n < 2 or len(ks) < 2:
            continue
        ks.sort(key=lambda k: rep.ops[k][0])
        i = 0
        while i < len(ks):   # sweep: the operations that start before the first of a cluster ends
            end = rep.ops[ks[i]][1]
            j = i + 1
            while j < len(ks) and rep.ops[ks[j]][0] < end:
                j += 1
            cluster: list[list[str]] = []
            used: set[str] = set()
            for k in ks[i:j]:
                eps = dur.endpoints(k)
                if not used.intersection(eps):
                    cluster.append(eps)
                    used.update(eps)
            if len(cluster) > 1:
                key = (op, nbytes, tuple(tuple(e) for e in cluster))
                if key not in cache:
                    size = size_bytes_of(op, nbytes, n) if op != "sendrecv" else nbytes
                    cache[key] = float(dimension_factor(topo, op, size, cluster, max_groups)["factor"])
                for k in ks[i:j]:
                    out[k] = cache[key]
            i = j
    return out


def step_rows(trace: dict[str, Any], rep: Replay, marker: str | None = None) -> list[dict[str, Any]]:
    """Per step (`replay.step_marks`, on the lowest rank): its predicted time, the share of rank-time spent
    in operations, and the exposed communication (time ranks were blocked in a call, mean over ranks)."""
    _, idx = step_marks(trace, marker)
    calls = per_rank(trace)
    if not calls or not idx:
        return []
    low = min(calls)
    edges = [*(rep.issues[low][i][1] for i in idx), rep.makespan_s]
    busy: dict[int, list[tuple[float, float, bool]]] = defaultdict(list)
    for r, iss in rep.issues.items():
        for k, t, blocking in iss:
            s, e = rep.ops[k]
            busy[r].append((s if not blocking else t, e, blocking))
    rows = []
    for i in range(len(edges) - 1):
        a, b = edges[i], edges[i + 1]
        span = b - a
        if span <= 0:
            continue
        in_ops = exposed = 0.0
        for ivs in busy.values():
            for s, e, blocking in ivs:
                o = max(0.0, min(e, b) - max(s, a))
                in_ops += o
                exposed += o if blocking else 0.0
        nr = max(1, len(busy))
        rows.append({"step": i, "time_s": span, "comm_share": min(1.0, in_ops / (nr * span)),
                     "exposed_comm_s": exposed / nr})
    return rows


def grow(trace: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The trace run as `replicas` data-parallel copies of itself: copy k's rank r is rank k*n + r (n: the
    recorded world size); its sub-groups and point-to-point calls stay inside the copy, and collectives on the
    world communicator span every copy with the same bytes per rank (a data-parallel gradient all-reduce)."""
    if replicas < 1:
        raise InvalidArgument(f"--grow {replicas}", "give the number of data-parallel copies, >= 1")
    if replicas == 1:
        return trace
    world = trace.get("world")
    n = int(trace.get("world_size") or len(trace["ranks"]))
    groups: dict[str, list[Any]] = {}
    for ns, members in trace["groups"].items():
        if ns == world:
            groups[ns] = list(range(n * replicas))
        else:
            for k in range(replicas):
                groups[f"{ns}@{k}"] = [None if m is None else m + k * n for m in members]

    def copies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every copy's rows: ranks and peers shifted into the copy, sub-groups renamed per copy."""
        out = []
        for k in range(replicas):
            for c in rows:
                d = dict(c, rank=int(c["rank"]) + k * n)
                if c["comm"] != world:
                    d["comm"] = f"{c['comm']}@{k}"
                if c.get("peer_rank") is not None:
                    d["peer_rank"] = int(c["peer_rank"]) + k * n
                    if c["comm"] == world:
                        d["peer"] = d["peer_rank"]
                out.append(d)
        return out
    return dict(trace, groups=groups, world_size=n * replicas, calls=copies(trace["calls"]),
                waits=copies(trace.get("waits") or []),
                ranks={str(int(r) + k * n): v for k in range(replicas) for r, v in trace["ranks"].items()})


def replay_on(trace: dict[str, Any], topo: Any, *, mapping: str = "block", hosts: int = 1,
              compute_scale: float = 1.0, engine: str = "flow", step_site: str | None = None,
              contention: bool = True, gaps: dict[int, list[float]] | None = None) -> dict[str, Any]:
    """Replay `trace` on `topo` (see the module doc): per-step rows, totals and the busiest links; `gaps`
    replaces the recorded compute gaps (`replay_compute.model_gaps`)."""
    from ..sim.api import endpoints_of
    nranks = nranks_of(trace)
    where = placement(nranks, endpoints_of(topo), mapping, hosts)
    dur = SimDurations(topo, trace, where, engine)
    rep = replay(trace, dur, gaps=gaps, compute_scale=compute_scale)
    factors: dict[Key, float] = {}
    if contention:
        members: dict[Key, list[Call]] = defaultdict(list)
        for c in trace["calls"]:
            if c.get("enq_ns") is not None:
                members[instance_key(c)].append(c)
        factors = contention_factors(topo, rep, dur, members)
        if any(f > 1.0 for f in factors.values()):
            dur.link_bytes.clear()
            rep = replay(trace, lambda k, cs: dur(k, cs) * factors.get(k, 1.0), gaps=gaps,
                         compute_scale=compute_scale)
    rows = step_rows(trace, rep, step_site)
    slowed = [f for f in factors.values() if f > 1.0]
    # row 0 warms up (allocation, first-call setup); the last row runs from the last step mark to the end of the
    # recording, not a whole step: the steady-state step is the mean of the rows between
    steady = rows[1:-1] if len(rows) >= 3 else rows[1:] if len(rows) == 2 else rows
    return {"ranks": nranks, "placement": where, "makespan_s": rep.makespan_s, "steps": rows,
            "contention": {"operations_slowed": len(slowed), "max_factor": max(slowed, default=1.0)},
            "step_s": (sum(r["time_s"] for r in steady) / len(steady)) if steady else rep.makespan_s,
            "steady_steps": [r["step"] for r in steady], "warmup_step_s": rows[0]["time_s"] if len(rows) > 1 else None,
            "warnings": [w for w in (unscaled_compute_warning(trace, topo, compute_scale, gaps),) if w],
            "compute_s": rep.compute_s, "blocked_s": rep.comm_s, "busiest_links": dur.busiest(rep.makespan_s),
            "replay": rep}


def unscaled_compute_warning(trace: dict[str, Any], topo: Any, compute_scale: float,
                             gaps: dict[int, list[float]] | None) -> str | None:
    """A warning when compute recorded by CPU processes is replayed as it is on a topology's GPUs."""
    if gaps is not None or compute_scale != 1.0 or not topo.gpus():
        return None
    hosts = sorted({str(v.get("hostname")) for v in trace["ranks"].values() if v.get("hostname")})
    where = f" on {', '.join(hosts[:3])}{' ...' if len(hosts) > 3 else ''}" if hosts else ""
    return (f"the compute between calls was recorded by CPU processes{where} and is replayed unscaled on the "
            f"modelled GPUs: give --compute-model MODEL (the model's compute on this GPU) or --compute-scale F")


def chrome_trace(rep: Replay) -> dict[str, Any]:
    """The replay as a Chrome / Perfetto trace: per rank, its operations (blocking ones and async ones)."""
    ev: list[dict[str, Any]] = []
    for r, iss in rep.issues.items():
        for k, t, blocking in iss:
            s, e = rep.ops[k]
            name = f"{k[0]} {k[1]} #{k[-1]}" if k[0] == "coll" else f"p2p {k[2]}->{k[3]} #{k[-1]}"
            ev.append({"name": name, "ph": "X", "pid": 0, "tid": r, "ts": s * 1e6, "dur": (e - s) * 1e6,
                       "cat": "blocking" if blocking else "async", "args": {"issued_us": t * 1e6}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}
