"""Recorded runs: read a record directory (rank files, flight records) and merge it into one trace.

A trace is a dict (JSON): ``groups`` (communicator namespace -> its members' global ranks, in group-rank
order), ``ranks`` (global rank -> host and pid), ``calls`` (every call of every rank, times in ns on one
clock) and ``flight`` (global rank -> why and when its flight record was written, and what its peers said).
Clocks: ranks of one host share its monotonic clock; when every rank recorded the barrier at the world
communicator's creation, hosts are aligned by the moment their ranks left it ("barrier"); otherwise
(flight records only) each rank's monotonic clock is converted to the wall clock it noted at start ("wall").
"""
from __future__ import annotations

import base64
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidArgument

TRACE_FORMAT = "ringflow-trace/1"
TIME_KEYS = ("enq_ns", "start_ns", "end_ns")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n < len(lines):  # only the last line may be torn (the rank was killed while writing)
                raise InvalidArgument(f"{path}:{n} is not JSON", "the record file is damaged; record again") from None
    return rows


def call_rows(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """The call rows of a record file: each ``calls`` line's packed (seq, enq_ns, start_ns, end_ns, desc) rows
    expanded with their description line's fields (runtime/recording/record.py writes them)."""
    descs: dict[int, dict[str, Any]] = {}
    out = []
    for r in rows:
        kind = r.get("kind")
        if kind == "desc":
            descs[int(r["id"])] = {k: v for k, v in r.items() if k not in ("kind", "id")}
        elif kind == "calls":
            packed = np.frombuffer(base64.b64decode(r["rows"]), dtype="<i8").reshape(-1, 5)
            for seq, enq, start, end, desc in packed.tolist():
                d = descs.get(desc)
                if d is None:
                    raise InvalidArgument(f"{path}: a call refers to description {desc}, which no line defines",
                                          "the record file is damaged; record again")
                out.append({"kind": "call", "seq": seq, "enq_ns": enq, "start_ns": start, "end_ns": end, **d})
        elif kind == "call":
            out.append(r)
    return out


class _Rank:
    """What one rank left behind: its process header, its communicators and its calls (its own clock)."""

    def __init__(self, grank: int) -> None:
        self.grank = grank
        self.process: dict[str, Any] = {}
        self.comms: dict[str, dict[str, Any]] = {}
        self.calls: dict[tuple, dict[str, Any]] = {}
        self.flight: dict[str, Any] | None = None
        self.recorded: int | None = None   # calls its record file holds (None: no record file)
        self.rings: list[dict[str, Any]] = []   # its flight rings (runtime/recording/flightring.py), calls left out

    def add_calls(self, rows: Iterable[dict[str, Any]]) -> None:
        for c in rows:
            key = (c["comm"], c["lane"], c.get("of"), c.get("peer"), c.get("tag"), c["seq"])
            old = self.calls.get(key)
            if old is None or (not old.get("end_ns") and c.get("end_ns")):
                self.calls[key] = c


def read_dir(directory: str | Path) -> dict[int, _Rank]:
    """Every rank's files in a record (or dump) directory, by global rank."""
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgument(f"{d} is not a directory",
                              "give the directory RINGFLOW_RECORD or RINGFLOW_DUMP_DIR named")
    ranks: dict[int, _Rank] = {}
    for p in sorted(d.glob("rank*.jsonl")):
        rows = _jsonl(p)
        head = next((r for r in rows if r.get("kind") == "process"), None)
        if head is None:
            continue
        rk = ranks.setdefault(int(head["rank"]), _Rank(int(head["rank"])))
        rk.process = head
        rk.comms.update({r["comm"]: r for r in rows if r.get("kind") == "comm"})
        recorded = call_rows(rows, p)
        rk.recorded = (rk.recorded or 0) + len(recorded)
        rk.add_calls(recorded)
    for p in sorted(d.glob("flight-rank*.json")):
        doc = json.loads(p.read_text(encoding="utf-8"))
        if doc.get("rank") is None:
            continue
        rk = ranks.setdefault(int(doc["rank"]), _Rank(int(doc["rank"])))
        rk.flight = doc
        if not rk.process:
            rk.process = {k: doc[k] for k in ("rank", "pid", "hostname", "mono0_ns", "wall0_ns")}
        for c in doc.get("comms", []):
            info = {k: v for k, v in c.items() if k not in ("calls", "peers", "dead", "runtime_last_call")}
            rk.comms.setdefault(c["comm"], info)
            rk.add_calls(c.get("calls", []))
    _read_rings(d, ranks)
    if not ranks:
        raise InvalidArgument(f"{d} holds no rank*.jsonl, flight-rank*.json or ring-rank*.bin files",
                              "record with RINGFLOW_RECORD=DIR (or `ringflow record`), or set RINGFLOW_DUMP_DIR")
    return ranks


def _read_rings(d: Path, ranks: dict[int, _Rank]) -> None:
    """Add each rank's flight rings (those of its latest process, when a directory holds older ones too)."""
    from ..runtime.recording.flightring import read_ring
    rings = []
    for p in sorted(d.glob("ring-rank*.bin")):
        try:
            rings.append(read_ring(p))
        except InvalidArgument:   # a ring its rank was still making (or died making): it holds no call
            continue
    latest: dict[int, int] = {}
    for rg in rings:
        g = int(rg["info"]["global_rank"])
        latest[g] = max(latest.get(g, 0), int(rg["info"].get("wall0_ns", 0)))
    for rg in rings:
        info = rg["info"]
        g = int(info["global_rank"])
        if int(info.get("wall0_ns", 0)) != latest[g]:
            continue
        rk = ranks.setdefault(g, _Rank(g))
        if not rk.process:
            rk.process = {"rank": g, **{k: info[k] for k in ("pid", "hostname", "mono0_ns", "wall0_ns")}}
        rk.comms.setdefault(info["comm"], {k: info[k] for k in ("comm", "rank", "size", "global_rank")})
        rk.add_calls(rg.pop("calls"))
        rk.rings.append(rg)


def _world(ranks: dict[int, _Rank]) -> str | None:
    names = {ns for r in ranks.values() for ns, c in r.comms.items() if "/" not in ns}
    return max(names, key=lambda ns: sum(ns in r.comms for r in ranks.values())) if names else None


def _offsets(ranks: dict[int, _Rank]) -> tuple[str, dict[int, int]]:
    """Per rank: what to subtract from its monotonic times to put it on the common clock."""
    world = _world(ranks)
    if world is not None and all(r.comms.get(world, {}).get("barrier_ns") for r in ranks.values()):
        # ranks of one host share its monotonic clock (exact); hosts are aligned by when their ranks left the
        # barrier (the median of each host's ranks)
        hosts: dict[str, list[int]] = {}
        for r in ranks.values():
            hosts.setdefault(str(r.process.get("hostname")), []).append(int(r.comms[world]["barrier_ns"]))
        return "barrier", {g: int(statistics.median(hosts[str(r.process.get("hostname"))]))
                           for g, r in ranks.items()}
    off = {g: int(r.process.get("mono0_ns", 0)) - int(r.process.get("wall0_ns", 0)) for g, r in ranks.items()}
    return "wall", off


def merge(directory: str | Path) -> dict[str, Any]:
    """One trace from a record directory: groups in global ranks, calls of every rank on one clock."""
    ranks = read_dir(directory)
    clock, off = _offsets(ranks)
    groups: dict[str, dict[int, int]] = {}
    sizes: dict[str, int] = {}
    for g, r in ranks.items():
        for ns, c in r.comms.items():
            groups.setdefault(ns, {})[int(c["rank"])] = g
            sizes[ns] = int(c["size"])
    world = _world(ranks)
    for ns, size in sizes.items():   # a member that left no file: in the world, its group rank is its global rank
        for gr in range(size):
            if gr not in groups[ns] and ns == world:
                groups[ns][gr] = gr
    calls: list[dict[str, Any]] = []
    for g, r in ranks.items():
        for c in r.calls.values():
            c = dict(c, rank=g)
            for k in TIME_KEYS:
                c[k] = int(c[k]) - off[g] if c.get(k) else None
            if "peer" in c:
                c["peer_rank"] = groups.get(c["comm"], {}).get(int(c["peer"]))
            calls.append(c)
    t0 = min((c["enq_ns"] for c in calls if c["enq_ns"] is not None), default=0)
    for c in calls:
        for k in TIME_KEYS:
            if c[k] is not None:
                c[k] -= t0
    calls.sort(key=lambda c: (c["enq_ns"] if c["enq_ns"] is not None else 0, c["rank"]))
    waits = [c for c in calls if c["lane"] == "wait"]
    calls = [c for c in calls if c["lane"] != "wait"]
    flight = {}
    for g, r in ranks.items():
        if r.flight is not None:
            f = r.flight
            flight[str(g)] = {"reason": f.get("reason"), "wall_ns": f.get("wall_ns"),
                              "mono_ns": int(f["mono_ns"]) - off[g] - t0 if f.get("mono_ns") else None,
                              "peers": {c["comm"]: c.get("peers", {}) for c in f.get("comms", [])},
                              "dead": {c["comm"]: c.get("dead", []) for c in f.get("comms", [])}}
    return {"format": TRACE_FORMAT, "clock": clock, "world": world, "waits": waits,
            "world_size": sizes.get(world, len(ranks)) if world else len(ranks),
            "groups": {ns: [m.get(i) for i in range(sizes[ns])] for ns, m in sorted(groups.items())
                       for m in [groups[ns]]},
            "ranks": {str(g): {"hostname": r.process.get("hostname"), "pid": r.process.get("pid"),
                               "recorded": r.recorded, "rings": r.rings}
                      for g, r in sorted(ranks.items())},
            "calls": calls, "flight": flight}


def load(path: str | Path) -> dict[str, Any]:
    """A trace: a merged trace file, a record/dump directory (merged on the fly), or Chakra files (a `.et`
    file or a directory of them)."""
    p = Path(path)
    if (p.is_dir() and not any(p.glob("rank*.jsonl")) and not any(p.glob("flight-rank*.json"))
            and any(p.glob("*.et"))) or p.suffix == ".et":
        from .chakra import import_files
        return import_files(p)
    if p.is_dir():
        return merge(p)
    if not p.exists():
        raise InvalidArgument(f"{p} does not exist", "give a record directory or a trace written by "
                              "`ringflow record merge`")
    doc = json.loads(p.read_text(encoding="utf-8"))
    if doc.get("format") != TRACE_FORMAT:
        raise InvalidArgument(f"{p} is not a ringflow trace (format {doc.get('format')!r})",
                              "merge a record directory with `ringflow record merge DIR`")
    return doc
