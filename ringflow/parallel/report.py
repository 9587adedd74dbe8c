"""Output helpers for the parallel examples: print on rank 0, optionally write the result as JSON."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def print0(comm: Any, *args: Any) -> None:
    """print() on rank 0 only."""
    if comm.rank == 0:
        print(*args, flush=True)


def emit(comm: Any, payload: dict[str, Any], json_out: str | None) -> None:
    """Write `payload` as JSON to `json_out` from rank 0 (tests read it)."""
    if json_out and comm.rank == 0:
        Path(json_out).write_text(json.dumps(payload, indent=1, default=float))
