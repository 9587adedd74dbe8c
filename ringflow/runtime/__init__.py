"""The runtime: a real collective library over shared memory and TCP (see docs/runtime.md).

    comm = ringflow.init()            # from `ringflow run`, torchrun, Slurm or Open MPI env
    comm.all_reduce(x, op="sum")      # in place on a NumPy array or CPU torch tensor

`init`, `Communicator` and `Work` load on first use, so importing one module of the runtime (the store,
the launcher, the logs) does not load the communicator and the algorithms behind it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

if TYPE_CHECKING:
    from .call.communicator import Communicator, init
    from .call.work import Work

_WHERE = {"init": "call.communicator", "Communicator": "call.communicator", "Work": "call.work"}

__all__ = ["init", "Communicator", "Work"]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, __all__)
