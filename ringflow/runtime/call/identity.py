"""This process's place in its job: `ringflow.get_rank()`, `get_world_size()`, `local_rank()`.

The world communicator `ringflow.init()` made last answers first; before (or without) one, the
launcher's environment does (`ringflow run`, torchrun, Slurm, Open MPI, MPICH: see `env.LAUNCHERS`).
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgument
from ..job.env import from_launcher

_default: weakref.ref[Any] | None = None   # the world communicator init() returned last


def set_default(comm: Any) -> None:
    """Record comm as the world communicator the module-level functions report on."""
    global _default
    _default = weakref.ref(comm)


def _comm() -> Any:
    c = _default() if _default is not None else None
    return None if c is None or getattr(c, "_destroyed", False) else c


def _launcher(env: Mapping[str, str]) -> tuple[int | None, int | None, int | None]:
    """(rank, world size, local rank) from the launcher's environment (`env.from_launcher`: typed errors)."""
    _, rank, size, local = from_launcher(env)
    return rank, size, local


def _unknown(what: str) -> InvalidArgument:
    return InvalidArgument(f"this process's {what} is unknown: no ringflow.init() communicator and no launcher "
                           "environment", "launch with `ringflow run -n N`, torchrun, srun or mpirun, or call "
                           "ringflow.init(rank=, world_size=) first")


def _job_field(attr: str, index: int, what: str, env: Mapping[str, str] | None) -> int:
    """comm.<attr> of the default communicator, else field `index` of the launcher's (rank, size, local)."""
    c = _comm()
    if c is not None:
        return int(getattr(c, attr))
    v = _launcher(os.environ if env is None else env)[index]
    if v is None:
        raise _unknown(what)
    return v


def get_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank in its job."""
    return _job_field("rank", 0, "rank", env)


def get_world_size(env: Mapping[str, str] | None = None) -> int:
    """The number of ranks in the job."""
    return _job_field("size", 1, "world size", env)


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank among the ranks on its host (the launcher's LOCAL_RANK; 0 in a one-process job)."""
    rank, size, local = _launcher(os.environ if env is None else env)
    if local is not None:
        return local
    if rank is not None and size is not None and size > 1:
        raise InvalidArgument("the launcher sets no local rank", "set LOCAL_RANK (or RINGFLOW_LOCAL_RANK)")
    c = _comm()
    if c is not None and c.size > 1:
        raise _unknown("local rank")
    return 0
