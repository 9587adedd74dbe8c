"""The runtime: a real collective library over shared memory and TCP (see docs/runtime.md).

    comm = ringflow.init()            # from `ringflow run`, torchrun, Slurm or Open MPI env
    comm.all_reduce(x, op="sum")      # in place on a NumPy array or CPU torch tensor
"""
from __future__ import annotations

from .communicator import Communicator, init
from .work import Work

__all__ = ["init", "Communicator", "Work"]
