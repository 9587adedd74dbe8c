"""Rank side of tests/test_receiver_check.py (under `ringflow run -n N`): the last rank disagrees with the others
on one argument of a collective per case (broadcast, reduce, gather, scatter: the calls whose first step is
completed by verify messages; with more than 2 ranks also all-gather, all-to-all and all-reduce, whose first
step is staged in scratch), at sizes through the slots, by single copy and past the TCP striping size.
Writes OUT/rank<R>.json: per case the error type, whether this rank's arrays are unchanged, and the seconds it
took; then whether exact calls still work.

    ringflow run -n 2 tests/receiver_check_ranks.py OUT
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import ringflow
from ringflow.errors import RingflowError

COUNTS = (8, 1 << 14, 1 << 18, 1 << 21)   # 32 B, 64 KiB (slots), 1 MiB (single copy), 8 MiB (TCP stripes)


def outcome(fn: Callable[[], Any], arrays: list[np.ndarray]) -> dict[str, Any]:
    """What fn raised, whether `arrays` kept their contents, and how long it took."""
    before = [a.copy() for a in arrays]
    t0 = time.monotonic()
    try:
        fn()
        kind = None
    except RingflowError as exc:
        kind = type(exc).__name__
    return {"type": kind, "elapsed_s": time.monotonic() - t0,
            "unchanged": all(np.array_equal(a, b) for a, b in zip(arrays, before, strict=True))}


def sentinel(n: int, dtype: type = np.float32) -> np.ndarray:
    """An array whose contents a delivered message would change."""
    return (np.arange(n) % 97 + 11).astype(dtype)


def cases(comm: Any) -> dict[str, tuple[Callable[[], Any], list[np.ndarray]]]:
    """name -> (the call, the arrays it must leave alone)."""
    odd, size = comm.rank == comm.size - 1, comm.size
    out: dict[str, tuple[Callable[[], Any], list[np.ndarray]]] = {}
    for n in COUNTS:
        x = sentinel(n + int(odd))
        out[f"broadcast count {n}"] = (lambda x=x: comm.broadcast(x, root=0), [x])
        y = sentinel(n, np.int32 if odd else np.float32)
        out[f"broadcast dtype {n}"] = (lambda y=y: comm.broadcast(y, root=0), [y])
        z = sentinel(n)
        out[f"broadcast root {n}"] = (lambda z=z: comm.broadcast(z, root=int(odd)), [z])
    n = 1 << 14
    r_in, r_out = sentinel(n), sentinel(n)
    out["reduce root"] = (lambda: comm.reduce(r_in, root=int(odd), out=r_out), [r_in, r_out])
    g_in, g_out = sentinel(n + int(odd)), sentinel(size * (n + int(odd)))
    out["gather count"] = (lambda: comm.gather(g_in, root=0, out=g_out), [g_in, g_out])
    s_in, s_out = sentinel(size * (n + int(odd))), sentinel(n + int(odd))
    out["scatter count"] = (lambda: comm.scatter(s_in, root=0, out=s_out), [s_in, s_out])
    if size > 2:
        for m in (8, 1 << 12):
            a_in, a_out = sentinel(m + int(odd)), sentinel(size * (m + int(odd)))
            out[f"all_gather count {m}"] = (lambda a_in=a_in, a_out=a_out: comm.all_gather(a_in, out=a_out),
                                            [a_in, a_out])
            t_in, t_out = sentinel(size * (m + int(odd))), sentinel(size * (m + int(odd)))
            out[f"all_to_all count {m}"] = (lambda t_in=t_in, t_out=t_out: comm.all_to_all(t_in, out=t_out),
                                            [t_in, t_out])
            r = sentinel(m + int(odd))
            out[f"all_reduce count {m}"] = (lambda r=r: comm.all_reduce(r), [r])
    return out


def exact_after(comm: Any) -> bool:
    """A broadcast and an all-reduce after the mismatches give exact results."""
    ok = True
    for n in COUNTS:
        x = sentinel(n) if comm.rank == 0 else np.zeros(n, np.float32)
        comm.broadcast(x, root=0)
        ok = ok and bool(np.array_equal(x, sentinel(n)))
    y = np.full(1000, comm.rank + 1, np.float32)
    comm.all_reduce(y)
    g = comm.all_gather(np.full(8, comm.rank, np.float32))
    return ok and bool((y == comm.size * (comm.size + 1) / 2).all()) and \
        bool(np.array_equal(np.asarray(g).ravel(), np.repeat(np.arange(comm.size, dtype=np.float32), 8)))


def main() -> None:
    """Run every case, then the exact calls; write this rank's results."""
    out = sys.argv[1]
    comm = ringflow.init(timeout=30)
    res: dict[str, Any] = {"rank": comm.rank, "cases": {}}
    for name, (fn, arrays) in cases(comm).items():
        res["cases"][name] = outcome(fn, arrays)
    res["exact_after"] = exact_after(comm)
    res["pattern"] = comm._mem.pattern
    with open(f"{out}/rank{comm.rank}.json", "w") as fh:
        json.dump(res, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
