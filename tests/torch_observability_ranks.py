"""Rank side of tests/test_torch_observability.py: ringflow's errors and knobs through torch.distributed.

    python tests/torch_observability_ranks.py errors RANK WORLD_SIZE INIT_FILE   # mismatch, timeout, after-timeout
    python tests/torch_observability_ranks.py timeout RANK WORLD_SIZE INIT_FILE  # the group's timeout in seconds

Prints one JSON line.
"""
from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"

GROUP_TIMEOUT_S = 3.0


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What fn raised: type, text and the ringflow detail (None when it did not raise)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads what it was
        return {"type": type(exc).__name__, "text": str(exc), "detail": getattr(exc, "detail", None)}
    return {"type": None}


def errors(rank: int) -> dict[str, Any]:
    """Rank 1 passes 6 elements where rank 0 passes 8; then rank 0 waits for rank 1, which sleeps past the group's
    timeout; then rank 0 calls again on the timed-out group."""
    res: dict[str, Any] = {"rank": rank}
    res["count"] = outcome(lambda: dist.all_reduce(torch.ones(6 if rank == 1 else 8)))
    dist.barrier()
    if rank == 1:
        time.sleep(GROUP_TIMEOUT_S + 3)
    else:
        res["timeout"] = outcome(lambda: dist.all_reduce(torch.ones(8)))
        res["after_timeout"] = outcome(lambda: dist.all_reduce(torch.ones(8)))
    return res


def main() -> None:
    """Run one mode; print its JSON line."""
    mode, rank, n, init = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    kw: dict[str, Any] = {}
    if mode == "errors":
        kw["timeout"] = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    try:
        dist.init_process_group("ringflow", init_method=f"file://{init}", rank=rank, world_size=n, **kw)
    except Exception as exc:  # noqa: BLE001 - a knob's ConfigError arrives as torch's error
        print(json.dumps({"rank": rank, "init": {"type": type(exc).__name__, "text": str(exc)}}))
        return
    if mode == "errors":
        res = errors(rank)
    else:
        pg: Any = dist.group.WORLD   # the backend's own ProcessGroup
        res = {"rank": rank, "timeout_s": pg._timeout_s, "comm_timeout_s": pg.comm.timeout}
    print(json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
