"""`ringflow diagnose`: who holds everyone up, from flight records or a recording.

First what is on record: per rank its record file, flight rings (runtime/recording/flightring.py) and flight record, or
that it left none, and how the job and each rank ended (the launcher's job.json). Then the findings: ranks that
never entered the collective others wait in (a hang); ranks that entered it only after the others had given up
(late, by how much, against the others' timeout); ranks whose sequence of collectives differs from their
group's (a skipped, extra or different call); and, for a run that completed, a straggler ranking: per rank, how
often it arrived last at a collective and how long the others waited for it, with the replay's estimate of the
step time had it computed like the median of the others.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from .recorded import load
from .replay import compute_gaps, instance_key, origin_ns, per_rank, replay, steps_of, timeline

Call = dict[str, Any]
ESTIMATED_RANKS = 8   # ranks (the worst by measured wait caused) whose step time without them is replayed


def _sig(c: Call) -> tuple:
    """What every member of a collective must agree on."""
    count = None if c["op"] in ("all_to_allv", "barrier") else c.get("count")
    return (c["op"], c.get("dtype"), c.get("root"), c.get("redop"), count)


def _describe(c: Call) -> str:
    extra = f", root {c['root']}" if c.get("root") is not None else ""
    size = f" of {c['count']} x {c['dtype']}" if c.get("dtype") else ""
    return f"{c['op']}{size}{extra}"


def _coll_calls(trace: dict[str, Any]) -> dict[str, dict[int, dict[int, Call]]]:
    """group -> global rank -> sequence number -> call (collectives only)."""
    out: dict[str, dict[int, dict[int, Call]]] = defaultdict(lambda: defaultdict(dict))
    for c in trace["calls"]:
        if c["lane"] == "coll":
            out[c["comm"]][int(c["rank"])][int(c["seq"])] = c
    return out


def _group_name(trace: dict[str, Any], ns: str) -> str:
    members = trace["groups"].get(ns, [])
    return f"{'world' if ns == trace.get('world') else ns} (ranks {_ranges(members)})"


def _ranges(ranks: list[Any]) -> str:
    rs = sorted(int(r) for r in ranks if r is not None)
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def hangs(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group with ranks stuck in a collective: the call they wait in and the members that never entered it."""
    found = []
    colls = _coll_calls(trace)
    for ns, by_rank in colls.items():
        stuck = {r: min((c for c in calls.values() if c.get("status") != "ok"), key=lambda c: c["seq"])
                 for r, calls in by_rank.items() if any(c.get("status") != "ok" for c in calls.values())}
        if not stuck:
            continue
        seq = statistics.mode(c["seq"] for c in stuck.values())
        waiting = {r: c for r, c in stuck.items() if c["seq"] == seq}
        first = next(iter(waiting.values()))
        if any(_sig(c) != _sig(first) for c in waiting.values()):
            continue   # the waiting ranks disagree: a sequence mismatch, reported by mismatches()
        late = _late({r: calls[seq] for r, calls in by_rank.items() if seq in calls})
        for e in late:
            waiting.pop(e["rank"], None)
        missing = []
        for m in trace["groups"].get(ns, []):
            if m is None or m in waiting:
                continue
            own = by_rank.get(m, {})
            if seq in own:
                continue
            last = own[max(own)] if own else None
            entry: dict[str, Any] = {"rank": m}
            if last is not None:
                entry.update({"last_seq": last["seq"], "last_op": _describe(last), "last_site": last["site"],
                              "last_status": last.get("status")})
            else:
                entry.update(_peer_view(trace, ns, m, waiting))
            missing.append(entry)
        found.append({"group": ns, "group_name": _group_name(trace, ns), "seq": seq, "op": _describe(first),
                      "waiting": sorted(waiting), "waiting_sites": sorted({c["site"] for c in waiting.values()}),
                      "waiting_status": sorted({str(c.get("status")) for c in waiting.values()}),
                      "waiting_since_ns": min(_entered(c) or 0 for c in waiting.values()),
                      "gave_up_after_s": _gave_up_s(waiting), "late": late, "missing": missing})
    return found


def _entered(c: Call) -> int | None:
    """When a rank entered a call (its start; its issue for a call queued behind others), on the trace's clock."""
    return c.get("start_ns") or c.get("enq_ns")


def _gave_up_s(waiting: dict[int, Call]) -> float | None:
    """How long the waiting ranks waited before their call failed (the median), None while they still waited."""
    spans = [(c["end_ns"] - _entered(c)) / 1e9 for c in waiting.values()
             if c.get("end_ns") and _entered(c) is not None and c.get("status") not in ("ok", "in_flight")]
    return statistics.median(spans) if spans else None


def _late(members: dict[int, Call]) -> list[dict[str, Any]]:
    """Members that entered the collective only after other members had given up on it (their call failed
    before): by how much after the others entered, and after how long the others gave up."""
    gave_up = [c["end_ns"] for c in members.values()
               if c.get("end_ns") and c.get("status") not in ("ok", "in_flight")]
    if not gave_up:
        return []
    first_end = min(gave_up)
    late = sorted(r for r, c in members.items() if (_entered(c) or 0) > first_end)
    early = {r: c for r, c in members.items() if r not in late}
    if not late or not early:
        return []
    ref = statistics.median(_entered(c) or 0 for c in early.values())
    statuses = sorted({str(c.get("status")) for c in early.values()})
    return [{"rank": r, "late_s": ((_entered(members[r]) or 0) - ref) / 1e9, "after": sorted(early),
             "others_gave_up_after_s": _gave_up_s(early), "others_status": statuses,
             "status": members[r].get("status"), "site": members[r].get("site")} for r in late]


def _peer_view(trace: dict[str, Any], ns: str, m: int, waiting: dict[int, Call]) -> dict[str, Any]:
    """What a waiting rank's status query learnt about a member that left no record of its own."""
    members = trace["groups"].get(ns, [])
    local = members.index(m) if m in members else None
    for w in waiting:
        st = trace.get("flight", {}).get(str(w), {}).get("peers", {}).get(ns, {}).get(str(local))
        if st:
            return {"last_seq": st.get("rec_seq"), "last_op": st.get("rec_op"), "last_site": st.get("site"),
                    "last_status": "ok" if st.get("rec_done") else "in_flight", "source": f"rank {w}'s query"}
        dead = trace.get("flight", {}).get(str(w), {}).get("dead", {}).get(ns, [])
        if local in dead:
            return {"last_status": "dead", "source": f"rank {w}'s watchdog"}
    return {"last_status": "unknown (no record, did not answer)"}


def mismatches(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group, the first sequence number whose calls differ between ranks, and how the outliers differ."""
    found = []
    for ns, by_rank in _coll_calls(trace).items():
        seqs = sorted({s for calls in by_rank.values() for s in calls})
        for s in seqs:
            here = {r: calls[s] for r, calls in by_rank.items() if s in calls}
            if len(here) < 2:
                continue
            votes: dict[tuple, list[int]] = defaultdict(list)
            for r, c in here.items():
                votes[_sig(c)].append(r)
            if len(votes) == 1:
                continue
            major = max(votes.values(), key=lambda rs: (len(rs), -min(rs)))
            ref = by_rank[major[0]]
            outliers = []
            for r in sorted(here):
                if r in major:
                    continue
                own = by_rank[r]
                outliers.append({"rank": r, "op": _describe(own[s]), "site": own[s]["site"],
                                 "how": _how(ref, own, s)})
            found.append({"group": ns, "group_name": _group_name(trace, ns), "seq": s,
                          "expected": _describe(here[major[0]]), "expected_by": sorted(major),
                          "expected_site": here[major[0]]["site"], "outliers": outliers})
            break
    return found


def _how(ref: dict[int, Call], own: dict[int, Call], s: int) -> str:
    """'skipped' when the outlier's calls from s on are the majority's from s+1 on; 'extra' the other way."""
    def same(a: dict[int, Call], a0: int, b: dict[int, Call], b0: int) -> bool:
        n = 0
        while a0 + n in a and b0 + n in b and n < 4:
            if _sig(a[a0 + n]) != _sig(b[b0 + n]):
                return False
            n += 1
        return n > 0
    if same(own, s, ref, s + 1) or _follows(ref, s, own[s]):
        return f"skipped {_describe(ref[s])} (called at {ref[s]['site']} by the others)"
    if same(own, s + 1, ref, s):
        return "made an extra call"
    mine, theirs = own[s], ref[s]
    if mine["op"] == theirs["op"]:
        diffs = [f"{k} {mine.get(k)} where the others gave {theirs.get(k)}" for k in ("dtype", "count", "root", "redop")
                 if mine.get(k) != theirs.get(k)]
        return f"called {mine['op']} with {', '.join(diffs)}"
    return "called a different collective"


def _follows(ref: dict[int, Call], s: int, c: Call) -> bool:
    """True when c is what the others called right after their previous call from the site of ref[s]
    (the program order of a loop: the outlier went on past the call it skipped)."""
    prev = [j for j in ref if j < s and j + 1 in ref and ref[j]["site"] == ref[s]["site"]]
    if not prev:
        return False
    nxt = ref[max(prev) + 1]
    return _sig(nxt) == _sig(c) and nxt["site"] == c["site"]


def stragglers(trace: dict[str, Any], estimate: bool = True) -> dict[str, Any]:
    """Per rank over completed collectives: how often it arrived last, and the wait it caused the others: how
    much sooner each collective would have started, times the ranks waiting in it, had this rank computed as
    long as the other members' median before it (arrival order alone also reflects how late each rank was
    released from the previous call, which is not its fault). With `estimate`, the worst ranks' replayed step
    time had they computed like the others."""
    gap: dict[tuple, float] = {}
    t0 = origin_ns(trace)
    for r, cs in per_rank(trace).items():
        for c, g in zip(cs, compute_gaps(cs, t0), strict=True):
            gap[(r, c["comm"], c["lane"], c["seq"])] = g
    last: dict[int, int] = defaultdict(int)
    caused: dict[int, float] = defaultdict(float)
    n_ops = 0
    for ns, by_rank in _coll_calls(trace).items():
        members = [m for m in trace["groups"].get(ns, []) if m is not None]
        if len(members) < 2:
            continue
        seqs = set.intersection(*(set(by_rank.get(m, {})) for m in members))
        for s in seqs:
            cs = [by_rank[m][s] for m in members]
            if any(c.get("status") != "ok" or c.get("start_ns") is None for c in cs):
                continue
            n_ops += 1
            start = {int(c["rank"]): c["start_ns"] / 1e9 for c in cs}
            gs = {r: gap.get((r, ns, "coll", s), 0.0) for r in start}
            t_last = max(start.values())
            last[max(start, key=lambda r: start[r])] += 1
            for r in start:
                others = [start[o] for o in start if o != r]
                as_others = start[r] - gs[r] + statistics.median(gs[o] for o in start if o != r)
                caused[r] += max(0.0, t_last - max(max(others), as_others)) * len(others)
    ranks = sorted({int(c["rank"]) for c in trace["calls"]})
    table = sorted(({"rank": r, "arrived_last": last[r], "wait_caused_s": caused[r]} for r in ranks),
                   key=lambda e: (-e["wait_caused_s"], -e["arrived_last"], e["rank"]))
    out: dict[str, Any] = {"collectives": n_ops, "ranking": table}
    site, nsteps = steps_of(trace)
    out.update({"step_site": site, "steps": nsteps})
    if estimate and nsteps and n_ops:
        try:
            base = replay(trace)
        except InvalidArgument as exc:   # the ranking stands without the estimate
            out["estimate_error"] = str(exc)
            return out
        out["replayed_step_s"] = base.makespan_s / nsteps
        for e in table[:ESTIMATED_RANKS]:
            e["step_s_without"] = replay(trace, gaps=_as_others(trace, int(e["rank"]))).makespan_s / nsteps
        # the replay has no release skew (every member leaves a collective together), so it tells a rank
        # whose compute holds the step from one that was only released late: rank by what fixing it saves
        table.sort(key=lambda e: (-(out["replayed_step_s"] - e.get("step_s_without", out["replayed_step_s"])),
                                  -e["wait_caused_s"], e["rank"]))
    return out


def _as_others(trace: dict[str, Any], rank: int) -> dict[int, list[float]]:
    """Rank's compute gaps replaced, call by call, by the median gap of the other ranks before the same operation
    (calls and waits, as the replay plays them)."""
    calls = timeline(trace)
    t0 = origin_ns(trace)
    gap_of: dict[tuple, list[float]] = defaultdict(list)
    for r, cs in calls.items():
        if r != rank:
            for c, g in zip(cs, compute_gaps(cs, t0), strict=True):
                gap_of[instance_key(c)].append(g)
    own = calls[rank]
    keys = [instance_key(c) for c in own]
    return {rank: [statistics.median(gap_of[k]) if gap_of.get(k) else g
                   for k, g in zip(keys, compute_gaps(own, t0), strict=True)]}


def records(trace: dict[str, Any], job: dict[str, Any] | None = None) -> dict[str, Any]:
    """What each rank left on record (its record file, flight rings, flight record, or nothing) and how it ended;
    `job`: the launcher's job.json."""
    nranks = max([int(trace.get("world_size") or 0), len(trace["ranks"]), int((job or {}).get("nprocs") or 0)]
                 + [int(g) + 1 for g in trace["ranks"]])
    from_ring: dict[int, int] = defaultdict(int)
    total: dict[int, int] = defaultdict(int)
    for c in trace["calls"] + trace.get("waits", []):
        total[int(c["rank"])] += 1
        if c.get("source") == "ring":
            from_ring[int(c["rank"])] += 1
    ends = {int(e["rank"]): e.get("end") for e in (job or {}).get("ranks", [])}
    per_rank = []
    for g in range(nranks):
        info = trace["ranks"].get(str(g))
        parts = [] if info is None else _sources(info, from_ring[g], trace.get("flight", {}).get(str(g)),
                                                 trace.get("world"))
        if not parts and total[g]:   # a merged trace or Chakra files: only its calls
            parts = [f"{total[g]} calls in the trace"]
        per_rank.append({"rank": g, "records": "; ".join(parts) if parts else "no record at all",
                         "missing": not parts, "end": ends.get(g)})
    out: dict[str, Any] = {"ranks": per_rank, "without_record": [e["rank"] for e in per_rank if e["missing"]]}
    if job:
        out["job"] = {"ended": job.get("ended"), "exit_code": job.get("exit_code")}
    return out


def _sources(info: dict[str, Any], ring_only: int, flight: dict[str, Any] | None, world: str | None) -> list[str]:
    """One rank's sources, in words."""
    parts = []
    recorded = int(info.get("recorded") or 0)
    rings = info.get("rings") or []
    if recorded:
        parts.append(f"recording of {recorded} calls" + (f" (+ {ring_only} later ones from its ring)"
                                                          if ring_only else ""))
    elif info.get("recorded") == 0:
        parts.append("record file without calls (they are written every 1,024 calls and at exit)")
    for rg in rings:
        head, n = int(rg["head"]), int(rg.get("kept", min(int(rg["head"]), int(rg["nslots"]))))
        kept = f"all {head} calls" if n >= head else f"the last {n} of {head} calls"
        what = "ring" if recorded else "ring only"
        ns = rg.get("info", {}).get("comm", "?")
        name = "world" if ns == world else ns
        ended = (f"ended by signal {rg['signal']}" if rg.get("state_code") == 3 else
                 "not marked ended: killed, or stopped while blocked in a call" if rg.get("state_code") == 0 else
                 str(rg.get("state")))
        parts.append(f"{what} of {name}, {kept} ({ended})")
    if flight is not None:
        parts.append(f"flight record ({str(flight.get('reason')).split(':')[0]})")
    return parts


def diagnose(path: str | Path) -> dict[str, Any]:
    """Every finding for a record or dump directory (or a merged trace)."""
    trace = load(path)
    job = None
    p = Path(path) / "job.json"
    if Path(path).is_dir() and p.exists():
        job = json.loads(p.read_text(encoding="utf-8"))
    found_hangs, found_mm = hangs(trace), mismatches(trace)
    out: dict[str, Any] = {"ranks": len(trace["ranks"]), "clock": trace["clock"], "records": records(trace, job),
                           "hangs": found_hangs, "mismatches": found_mm}
    if not found_hangs and not found_mm:
        out["stragglers"] = stragglers(trace)
    return out


def _render_records(rec: dict[str, Any]) -> list[str]:
    job = rec.get("job")
    lines = ["RECORDS" + (f" (the job ended: {job['ended']}, exit code {job['exit_code']})" if job else "")]
    groups: dict[str, list[int]] = defaultdict(list)
    for e in rec["ranks"]:
        groups[e["records"] + (f"; {e['end']}" if e.get("end") else "")].append(e["rank"])
    for text, ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}: {text}")
    return lines


def _render_hang(h: dict[str, Any]) -> list[str]:
    gave = h.get("gave_up_after_s")
    status = ", ".join(s.replace("in_flight", "still in it when their records end") for s in h["waiting_status"])
    lines = [f"{'LATE' if h.get('late') else 'HANG'} in {h['group_name']}: collective #{h['seq']} ({h['op']})"]
    if h["waiting"]:
        label = "gave up" if "in_flight" not in h["waiting_status"] else "waiting"
        lines.append(f"  {label}: ranks {_ranges(h['waiting'])} ({status}"
                     + (f" after {gave:.1f} s" if gave is not None else "") + f") at {'; '.join(h['waiting_sites'])}")
    for e in h.get("late", []):
        t = e.get("others_gave_up_after_s")
        why = ("their " + (f"{t:.1f} s " if t is not None else "") + "timeout" if e["others_status"] == ["Timeout"]
               else (f"{t:.1f} s" if t is not None else "a while") + f" ({', '.join(e['others_status'])})")
        lines.append(f"  rank {e['rank']} entered {h['op'].split(' ')[0]} #{h['seq']} {e['late_s']:.1f} s after "
                     f"ranks {_ranges(e['after'])}, which gave up after {why} (its call at {e['site']}: {e['status']})")
    for m in h["missing"]:
        where = (f"; last call #{m['last_seq']} {m.get('last_op')} at {m.get('last_site')} "
                 f"({m.get('last_status')})") if m.get("last_seq") is not None else f" ({m.get('last_status')})"
        src = f" [from {m['source']}]" if m.get("source") else ""
        lines.append(f"  never entered: rank {m['rank']}{where}{src}")
    if not h["missing"] and not h.get("late"):
        lines.append("  every member entered it: one of them is slow inside it")
    return lines


def render(report: dict[str, Any]) -> str:
    """The report as text."""
    rec = report.get("records")
    lines = _render_records(rec) if rec else []
    for h in report["hangs"]:
        lines += _render_hang(h)
    for mm in report["mismatches"]:
        lines.append(f"SEQUENCE MISMATCH in {mm['group_name']} at collective #{mm['seq']}: ranks "
                     f"{_ranges(mm['expected_by'])} called {mm['expected']} at {mm['expected_site']}")
        for o in mm["outliers"]:
            lines.append(f"  rank {o['rank']} called {o['op']} at {o['site']}: {o['how']}")
    st = report.get("stragglers")
    missing = (rec or {}).get("without_record") or []
    if st and not st["collectives"]:
        lines.append("STRAGGLERS: no collective that every member completed is on record"
                     + (f" (ranks {_ranges(missing)} left no record)" if missing else
                        " (the records above hold no completed collective of every member)"))
    elif st:
        lines.append(f"STRAGGLERS over {st['collectives']} collectives"
                     + (f", {st['steps']} steps (marker {st['step_site']})" if st.get("steps") else "")
                     + (f"; ranks {_ranges(missing)} left no record" if missing else ""))
        if "replayed_step_s" in st:
            lines.append(f"  replayed step time: {st['replayed_step_s'] * 1e3:.3f} ms")
        lines.append("  rank  arrived last  wait caused (ms)  step time without (ms)")
        for e in st["ranking"]:
            w = f"{e['step_s_without'] * 1e3:.3f}" if "step_s_without" in e else "-"
            lines.append(f"  {e['rank']:>4}  {e['arrived_last']:>12}  {e['wait_caused_s'] * 1e3:>16.3f}  {w:>22}")
    if len(lines) <= len(_render_records(rec) if rec else []):
        lines.append("no collectives found")
    return "\n".join(lines)
