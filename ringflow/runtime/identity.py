"""This process's place in its job: `ringflow.get_rank()`, `get_world_size()`, `local_rank()`.

The world communicator `ringflow.init()` made last answers first; before (or without) one, the
launcher's environment does (`ringflow run`, torchrun, Slurm, Open MPI, MPICH: see `env.LAUNCHERS`).
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument
from .env import LAUNCHERS

_default: weakref.ref[Any] | None = None   # the world communicator init() returned last


def set_default(comm: Any) -> None:
    """Record comm as the world communicator the module-level functions report on."""
    global _default
    _default = weakref.ref(comm)


def _comm() -> Any:
    c = _default() if _default is not None else None
    return None if c is None or getattr(c, "_destroyed", False) else c


def _launcher(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    for _, rk, wk, lk in LAUNCHERS:
        if env.get(rk) and env.get(wk):
            return env[rk], env[wk], env.get(lk, "")
    return None


def _int(name: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument(f"{name}={v!r} is not an integer", "fix the launcher's environment") from None


def _unknown(what: str) -> InvalidArgument:
    return InvalidArgument(f"this process's {what} is unknown: no ringflow.init() communicator and no launcher "
                           "environment", "launch with `ringflow run -n N`, torchrun, srun or mpirun, or call "
                           "ringflow.init(rank=, world_size=) first")


def get_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank in its job."""
    c = _comm()
    if c is not None:
        return int(c.rank)
    got = _launcher(os.environ if env is None else env)
    if got is None:
        raise _unknown("rank")
    return _int("rank", got[0])


def get_world_size(env: Mapping[str, str] | None = None) -> int:
    """The number of ranks in the job."""
    c = _comm()
    if c is not None:
        return int(c.size)
    got = _launcher(os.environ if env is None else env)
    if got is None:
        raise _unknown("world size")
    return _int("world size", got[1])


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank among the ranks on its host (the launcher's LOCAL_RANK; 0 in a one-process job)."""
    got = _launcher(os.environ if env is None else env)
    if got is not None and got[2]:
        return _int("local rank", got[2])
    if got is not None and _int("world size", got[1]) > 1:
        raise InvalidArgument("the launcher sets no local rank", "set LOCAL_RANK (or RINGFLOW_LOCAL_RANK)")
    c = _comm()
    if c is not None and c.size > 1:
        raise _unknown("local rank")
    return 0
