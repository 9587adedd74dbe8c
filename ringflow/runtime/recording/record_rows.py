"""The entries of the call recorder (record.py) and the rows they become: a flight record's call dicts, the
record file's description lines and packed int64 call rows (docs/record.md)."""
from __future__ import annotations

import base64
from collections.abc import Callable
from types import CodeType
from typing import Any

import numpy as np

LANES = ("coll", "send", "recv", "wait")   # "wait": a wait on an asynchronous call's Work
WAIT = 3

# one entry per call, a list (filled in as the call progresses):
LANE, SEQ, META, DESC, T_ENQ, T_START, T_END, CODE, LINE, STATUS, ALGO, ASYNC = range(12)


def site_text(code: CodeType | None, line: int) -> str:
    """file:line (function) of a call site."""
    if code is None:
        return "?"
    return f"{code.co_filename}:{line} ({code.co_name})"


def algo_name(e: list[Any]) -> str | None:
    """The algorithm a collective ran (None for barriers, one-rank calls and calls that did not finish)."""
    s, m = e[ALGO], e[META]
    return None if s is None or (m and m[0] == "barrier") else str(s.algorithm)


def op_name(e: list[Any]) -> str:
    m = e[META]
    return str(getattr(m[0], "value", m[0])) if m else str(e[DESC])


def row(ns: str, e: list[Any]) -> dict[str, Any]:
    """One call as a JSON-able dict (times in ns of this host's monotonic clock; 0: not reached)."""
    m = e[META]
    op = op_name(e)
    r: dict[str, Any] = {"kind": "call", "comm": ns, "lane": LANES[e[LANE]], "seq": e[SEQ], "op": op,
                         "enq_ns": e[T_ENQ], "start_ns": e[T_START], "end_ns": e[T_END],
                         "site": site_text(e[CODE], e[LINE]), "status": e[STATUS] or ("ok" if e[T_END] else
                                                                                      "in_flight"),
                         "async": e[ASYNC]}
    if e[LANE] == WAIT:   # the waited call: its lane (in DESC), sequence number and, point-to-point, peer and tag
        r.update({"op": "wait", "of": e[DESC]})
        if e[DESC] != "coll" and m:
            r.update({"peer": int(m[3]), "tag": int(m[4])})
        return r
    if m:
        dt = np.dtype(m[1]) if m[1] is not None else None
        r.update({"dtype": None if dt is None else dt.name, "count": int(m[2]),
                  "nbytes": 0 if dt is None else int(m[2]) * dt.itemsize})
        if e[LANE] == 0:
            r.update({"root": m[3], "redop": m[4], "algo": algo_name(e)})
        else:
            r.update({"peer": int(m[3]), "tag": int(m[4])})
    return r


def pack_rows(entries: list[list[Any]], desc_id: Callable[[list[Any]], int]) -> str:
    """The base64 text of the little-endian int64 rows (seq, enq_ns, start_ns, end_ns, description id) of
    entries: a record file's ``calls`` line."""
    flat: list[int] = []
    put = flat.append   # five appends and one conversion cost less than building a tuple per call
    for e in entries:
        d = desc_id(e)
        put(e[SEQ])
        put(e[T_ENQ])
        put(e[T_START])
        put(e[T_END])
        put(d)
    return base64.b64encode(np.array(flat, dtype="<i8").tobytes()).decode("ascii")


def desc_key(ns: str, e: list[Any]) -> tuple:
    """What a call shares with other calls of the same description: everything but its sequence number and times.

    Object ids, not the objects, go in (hashing enums and dtypes costs more than the rest of the call); the
    description table keeps the objects alive, so their ids stay theirs."""
    lane, _, m, desc, _, _, end, code, line, status, algo, async_ = e
    if m:
        return (ns, lane, desc, line, status, id(algo), async_, end != 0, id(code), id(m[0]), id(m[1]), m[2], m[3],
                m[4])
    return (ns, lane, desc, line, status, id(algo), async_, end != 0, id(code))


def desc_row(ns: str, e: list[Any]) -> dict[str, Any]:
    """row() without the sequence number and times: the fields a description line carries."""
    r = row(ns, e)
    for k in ("kind", "seq", "enq_ns", "start_ns", "end_ns"):
        del r[k]
    return r
