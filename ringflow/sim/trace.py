"""Chrome trace (chrome://tracing, Perfetto) of a simulated call: one track per rank."""
from __future__ import annotations

import json
from typing import Any

from .results import SimResult


def chrome_trace(res: SimResult) -> dict[str, Any]:
    """Trace events: each transfer appears on its sender's and receiver's tracks (process = host)."""
    fab = res.fabric
    host = (lambda r: fab.host(r)) if fab is not None else (lambda r: 0)
    events: list[dict[str, Any]] = []
    for r in range(res.nranks):
        events.append({"name": "thread_name", "ph": "M", "pid": host(r), "tid": r, "args": {"name": f"rank {r}"}})
    for k, node in enumerate(res.switches):   # in-network reduction (nvls_tree, collnet): the switches' tracks
        r = res.nranks + k
        events.append({"name": "thread_name", "ph": "M", "pid": host(r), "tid": r, "args": {"name": f"switch {node}"}})
    for step, src, dst, ch, t0, t1 in res.timeline:
        dur = max(0.0, t1 - t0)
        args = {"step": step, "channel": ch, "src": src, "dst": dst}
        events.append({"name": f"send s{step} ->r{dst}", "cat": "send", "ph": "X", "ts": t0, "dur": dur,
                       "pid": host(src), "tid": src, "args": args})
        events.append({"name": f"recv s{step} <-r{src}", "cat": "recv", "ph": "X", "ts": t0, "dur": dur,
                       "pid": host(dst), "tid": dst, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"collective": res.collective.value, "algorithm": res.algorithm, "engine": res.engine,
                          "size_bytes": res.size_bytes, "time_us": res.time_us, "protocol": res.protocol}}


def write_chrome_trace(res: SimResult, path: str) -> int:
    """Write the trace JSON; returns the number of events."""
    data = chrome_trace(res)
    with open(path, "w") as fh:
        json.dump(data, fh)
    return len(data["traceEvents"])
