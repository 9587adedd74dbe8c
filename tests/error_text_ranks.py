"""Rank side of tests/test_error_texts.py (under `ringflow run -n 2`): rank 1 disagrees with rank 0 on one argument
per case, then rank 0 times out waiting for rank 1. Writes OUT/rank<R>.json: per case the error's type, text and
detail.

    ringflow run -n 2 tests/error_text_ranks.py OUT
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

SMALL, LARGE = 8, 1 << 16   # a one-shot (self-checking) size, and one preceded by the argument check


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What fn raised: type, text, hint, detail (None when it did not raise)."""
    try:
        fn()
    except RingflowError as exc:
        return {"type": type(exc).__name__, "text": str(exc), "message": exc.message, "hint": exc.hint,
                "detail": exc.detail}
    return {"type": None}


def main() -> None:
    """Run the cases; rank 1 is the odd one out."""
    out = sys.argv[1]
    comm = ringflow.init(timeout=30)
    odd = comm.rank == 1
    cases: dict[str, Callable[[], Any]] = {}
    for n in (SMALL, LARGE):
        cases[f"count {n}"] = lambda n=n: comm.all_reduce(np.ones(n - 2 if odd else n, np.float32))
        cases[f"dtype {n}"] = lambda n=n: comm.all_reduce(np.ones(n, np.float64 if odd else np.float32))
        cases[f"op {n}"] = lambda n=n: comm.all_reduce(np.ones(n, np.float32), "max" if odd else "sum")
        cases[f"root {n}"] = lambda n=n: comm.broadcast(np.ones(n, np.int32), root=1 if odd else 0)
    res: dict[str, Any] = {"rank": comm.rank}
    for name, fn in cases.items():
        res[name] = outcome(fn)
    comm.barrier()
    if odd:
        time.sleep(4)   # alive and answering, but not in rank 0's next call
    else:
        res["timeout"] = outcome(lambda: comm.all_reduce(np.ones(SMALL, np.float32), timeout=1.0))
    with open(f"{out}/rank{comm.rank}.json", "w") as fh:
        json.dump(res, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
