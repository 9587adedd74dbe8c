"""Replay a trace: each rank's compute gaps and its calls, played again with a model of each call's duration.

A rank issues its calls in the recorded order, each after its recorded compute gap (the time between the
end of its previous blocking call, or the issue of its previous asynchronous one, and this call's issue;
scaled by `compute_scale`). A collective starts once every member has issued it and each member's lane is
free; a send/recv pair once both sides have. Its duration comes from `duration(instance)`: by default the
recorded one (the time from the last arrival to the end), or a simulator's (`ringflow.workload.replay_sim`).
A rank's recorded wait on an asynchronous call's Work (`trace["waits"]`) blocks it until that operation ends
in the replay.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

Call = dict[str, Any]
Key = tuple


def instance_key(c: Call) -> Key:
    """Which calls of different ranks form one operation: a collective's group and sequence number, or a
    point-to-point pair's (sender, receiver, tag, sequence number); a wait: ("wait", the waited operation's)."""
    if c["lane"] == "wait":
        return ("wait", *waited_key(c))
    if c["lane"] == "coll":
        return ("coll", c["comm"], c["seq"])
    src, dst = (c["rank"], c.get("peer_rank")) if c["lane"] == "send" else (c.get("peer_rank"), c["rank"])
    return ("p2p", c["comm"], src, dst, c.get("tag"), c["seq"])


def waited_key(w: Call) -> Key:
    """The operation a wait waits on (`instance_key` of the call it names)."""
    return instance_key(dict(w, lane=w["of"]))


def per_rank(trace: dict[str, Any]) -> dict[int, list[Call]]:
    """Each rank's calls in issue order (calls that never ended are left out)."""
    out: dict[int, list[Call]] = defaultdict(list)
    for c in trace["calls"]:
        if c.get("enq_ns") is not None:
            out[int(c["rank"])].append(c)
    for calls in out.values():
        calls.sort(key=lambda c: c["enq_ns"])
    return dict(out)


def timeline(trace: dict[str, Any]) -> dict[int, list[Call]]:
    """Each rank's calls and its waits on asynchronous calls' Works (`trace["waits"]`), in issue order."""
    out = per_rank(trace)
    for w in trace.get("waits") or []:
        if w.get("enq_ns") is not None and int(w["rank"]) in out:
            out[int(w["rank"])].append(w)
    for calls in out.values():
        calls.sort(key=lambda c: c["enq_ns"])
    return out


def nranks_of(trace: dict[str, Any]) -> int:
    """The ranks a replay places: the world size, or one past the highest rank that left calls."""
    return max(int(trace.get("world_size") or 0), max((int(r) for r in trace["ranks"]), default=-1) + 1)


def origin_ns(trace: dict[str, Any]) -> int:
    """The trace's origin: its earliest call issue of any rank."""
    return min((c["enq_ns"] for c in trace["calls"] if c.get("enq_ns") is not None), default=0)


def compute_gaps(calls: list[Call], origin: int = 0) -> list[float]:
    """Seconds of compute before each call: from the previous call's end (blocking) or issue (async); the
    first from `origin` (ns)."""
    gaps, ready = [], origin
    for c in calls:
        gaps.append(max(0.0, (c["enq_ns"] - ready) / 1e9))
        ready = c["enq_ns"] if c.get("async") or not c.get("end_ns") else c["end_ns"]
    return gaps


def measured_durations(trace: dict[str, Any]) -> dict[Key, float]:
    """Each complete operation's recorded duration: from its last member's start to its members' median end."""
    by: dict[Key, list[Call]] = defaultdict(list)
    for c in trace["calls"]:
        if c.get("start_ns") is not None and c.get("end_ns") is not None and c.get("status") == "ok":
            by[instance_key(c)].append(c)
    return {k: max(0.0, (statistics.median(c["end_ns"] for c in cs) - max(c["start_ns"] for c in cs)) / 1e9)
            for k, cs in by.items()}


@dataclass
class Replay:
    """A replay's outcome: per-rank end times, and every operation's start and end (s)."""

    makespan_s: float
    rank_end_s: dict[int, float]
    ops: dict[Key, tuple[float, float]] = field(default_factory=dict)
    comm_s: dict[int, float] = field(default_factory=dict)      # per rank: time blocked in calls
    compute_s: dict[int, float] = field(default_factory=dict)   # per rank: compute gaps played
    # per rank, each call: (operation, issue time, blocking) in issue order
    issues: dict[int, list[tuple[Key, float, bool]]] = field(default_factory=dict)


def replay(trace: dict[str, Any], duration: Callable[[Key, list[Call]], float] | None = None, *,
           gaps: dict[int, list[float]] | None = None, compute_scale: float = 1.0) -> Replay:
    """Play the trace again (see the module doc); `gaps` replaces ranks' compute gaps (per rank, per call)."""
    if compute_scale < 0:
        raise InvalidArgument(f"compute_scale={compute_scale}", "give a factor >= 0")
    calls = timeline(trace)
    if not calls:
        raise InvalidArgument("the trace holds no calls", "record a run that makes collective calls")
    members: dict[Key, list[Call]] = defaultdict(list)
    for cs in calls.values():
        for c in cs:
            members[instance_key(c)].append(c)
    measured = measured_durations(trace) if duration is None else {}
    dur = duration or (lambda k, cs: measured.get(k, 0.0))
    t0 = origin_ns(trace)
    g = {r: (gaps or {}).get(r) or compute_gaps(cs, t0) for r, cs in calls.items()}
    pos = dict.fromkeys(calls, 0)
    clock = dict.fromkeys(calls, 0.0)
    lane_free: dict[tuple[int, str], float] = defaultdict(float)
    issued: dict[Key, dict[int, float]] = defaultdict(dict)
    blocked: dict[int, Key] = {}
    out = Replay(0.0, {}, comm_s=dict.fromkeys(calls, 0.0), compute_s=dict.fromkeys(calls, 0.0))
    progress = True
    while progress:
        progress = False
        for r, cs in calls.items():
            while r not in blocked and pos[r] < len(cs):
                c = cs[pos[r]]
                gap = g[r][pos[r]] * compute_scale
                clock[r] += gap
                out.compute_s[r] += gap
                if c["lane"] == "wait":   # blocks until the waited operation has ended (at once if it has)
                    k = waited_key(c)
                    if k in members:   # else the call never ended: nothing to wait for
                        blocked[r] = k
                    pos[r] += 1
                    progress = True
                    continue
                k = instance_key(c)
                issued[k][r] = clock[r]
                pos[r] += 1
                progress = True
                blocking = not (c.get("async") and c.get("end_ns"))
                out.issues.setdefault(r, []).append((k, clock[r], blocking))
                if blocking:
                    blocked[r] = k
                _complete(k, members[k], issued, lane_free, dur, out)
            if r in blocked and blocked[r] in out.ops:
                end = max(clock[r], out.ops[blocked.pop(r)][1])
                out.comm_s[r] += end - clock[r]
                clock[r] = end
                progress = True
    if blocked:
        stuck = sorted(blocked.items())[:3]
        raise InvalidArgument(f"the trace cannot be replayed: ranks wait in operations others never issue "
                              f"({stuck})", "replay a completed recording (`ringflow diagnose` explains hangs)")
    out.rank_end_s = dict(clock)
    out.makespan_s = max(max(clock.values()), max((e for _, e in out.ops.values()), default=0.0))
    return out


def _complete(k: Key, cs: list[Call], issued: dict[Key, dict[int, float]],
              lane_free: dict[tuple[int, str], float], dur: Callable[[Key, list[Call]], float], out: Replay) -> None:
    got = issued[k]
    if k in out.ops or len(got) < len({c["rank"] for c in cs}):
        return
    start = max(max(got[c["rank"]], lane_free[(c["rank"], c["lane"])]) for c in cs)
    end = start + dur(k, cs)
    for c in cs:
        lane_free[(c["rank"], c["lane"])] = end
    out.ops[k] = (start, end)


def step_key(c: Call) -> tuple[str, str, int]:
    """What marks a step: a collective's call site, operation and size (DDP's buckets from one line differ)."""
    return (str(c["site"]), str(c["op"]), int(c.get("nbytes") or 0))


def step_marks(trace: dict[str, Any], marker: str | None = None) -> tuple[tuple[str, str, int] | None, list[int]]:
    """The step marker and the indices (into the lowest rank's calls, `per_rank` order) where steps begin.

    A step begins at each call with the marker's (site, operation, size) among the lowest rank's world
    collectives. The marker is the key called most often (the earliest on ties: the first bucket of a DDP
    step), among those whose site contains `marker` when given."""
    world = trace.get("world")
    calls = per_rank(trace)
    if not calls:
        return None, []
    own = calls[min(calls)]
    seen: dict[tuple[str, str, int], list[int]] = {}
    for i, c in enumerate(own):
        if c["lane"] == "coll" and (world is None or c["comm"] == world):
            seen.setdefault(step_key(c), []).append(i)
    if marker is not None:
        seen = {k: v for k, v in seen.items() if marker in k[0]}
        if not seen:
            raise InvalidArgument(f"no world collective of the lowest rank was called from a site matching "
                                  f"{marker!r}", "give part of a file:line the trace records (see diagnose)")
    if not seen:
        return None, []
    best = max(seen, key=lambda k: len(seen[k]))   # dicts keep insertion order: the earliest wins ties
    return best, seen[best]


def steps_of(trace: dict[str, Any], marker: str | None = None) -> tuple[str | None, int]:
    """The step marker (as "site: operation") and the number of steps."""
    key, marks = step_marks(trace, marker)
    return (None if key is None else f"{key[0]}: {key[1]} of {key[2]} bytes"), len(marks)
