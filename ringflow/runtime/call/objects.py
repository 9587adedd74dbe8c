"""Object collectives of a Communicator: any picklable Python object, through a byte all-gather / broadcast.

Only use them between trusted ranks: unpickling runs code the sender chose (as torch.distributed's do).
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np


class ObjectCalls:
    """`all_gather_object` and `broadcast_object` (a mixin of Communicator)."""

    if TYPE_CHECKING:
        rank: int
        size: int
        all_gather: Callable[..., Any]
        broadcast: Callable[..., Any]

    def all_gather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """Every rank's obj, in rank order, on every rank."""
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = self.all_gather(np.array([data.size], dtype=np.int64), timeout=timeout)
        width = int(sizes.max())
        buf = np.zeros(width, dtype=np.uint8)
        buf[:data.size] = data
        got = self.all_gather(buf, timeout=timeout).reshape(self.size, width)
        return [pickle.loads(got[r, :int(sizes[r])].tobytes()) for r in range(self.size)]

    def broadcast_object(self, obj: Any, root: int = 0, *, timeout: float | None = None) -> Any:
        """root's obj on every rank (other ranks' obj is ignored; pass None)."""
        data = (np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
                if self.rank == root else np.empty(0, dtype=np.uint8))
        size = np.array([data.size], dtype=np.int64)
        self.broadcast(size, root, timeout=timeout)
        buf = data.copy() if self.rank == root else np.empty(int(size[0]), dtype=np.uint8)
        if buf.size:
            self.broadcast(buf, root, timeout=timeout)
        return obj if self.rank == root else pickle.loads(buf.tobytes())
