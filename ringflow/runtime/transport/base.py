"""What both transports share: where received bytes go (`Sink`) and the transfer-op interface.

A transfer op is one message in flight on one connection. The executor calls `progress()`
(move as much as possible without blocking; True if anything moved) until `done`; while
nothing moves it waits using `ready()` / `set_waiting()` (shared memory) or `fds` (sockets).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import InvalidArgument
from ..call.calltext import mismatch_error
from ..native import copy_into


class Sink:
    """Where one received message lands: copied into `dst`, or reduced: dst := src (op) incoming."""

    __slots__ = ("dst_u8", "dst_t", "src_t", "ufunc", "dtype", "itemsize")

    def __init__(self, dst_u8: np.ndarray, *, ufunc: Callable | None = None, src_t: np.ndarray | None = None,
                 dst_t: np.ndarray | None = None, dtype: np.dtype | None = None) -> None:
        self.dst_u8, self.ufunc, self.src_t, self.dst_t = dst_u8, ufunc, src_t, dst_t
        self.dtype = dtype
        self.itemsize = dtype.itemsize if dtype is not None else 1

    @property
    def nbytes(self) -> int:
        return int(self.dst_u8.nbytes)

    def consume(self, off: int, data_u8: np.ndarray) -> None:
        """Apply incoming bytes [off, off + len(data)) of the message."""
        n = data_u8.shape[0]
        if n == 0:
            return
        if self.ufunc is None:
            copy_into(self.dst_u8[off:off + n], data_u8)
        else:
            assert self.src_t is not None and self.dst_t is not None  # a reducing sink is built with both
            isz = self.itemsize
            a, b = off // isz, (off + n) // isz
            self.ufunc(self.src_t[a:b], data_u8.view(self.dtype), out=self.dst_t[a:b])


class Mismatch:
    """What a receiver found when a peer's message did not match this rank's call."""

    __slots__ = ("peer", "got_nbytes", "want_nbytes", "got_sig", "want_sig", "detail")

    def __init__(self, peer: int, got_nbytes: int, want_nbytes: int, got_sig: int, want_sig: int,
                 detail: bytes = b"") -> None:
        self.peer, self.got_nbytes, self.want_nbytes = peer, got_nbytes, want_nbytes
        self.got_sig, self.want_sig, self.detail = got_sig, want_sig, detail

    def error(self, what: str) -> InvalidArgument:
        """The typed error for this mismatch."""
        return mismatch_error(self.peer, self.detail, self.got_nbytes, self.want_nbytes, what)


class XferOp:
    """Base of one message in flight.

    Messages on one connection complete in the order they were posted: a connection keeps a FIFO
    `queue` of its ops and only the head may move bytes (two sends to the same peer in one step
    must not interleave their slices or frames).
    """

    conn: object = None

    def _post(self, conn: object) -> None:
        self.conn = conn
        conn.queue.append(self)  # type: ignore[attr-defined]

    def is_head(self) -> bool:
        """True if this op owns its connection now."""
        q = self.conn.queue  # type: ignore[attr-defined]
        return bool(q) and q[0] is self

    def _finish(self) -> None:
        q = self.conn.queue  # type: ignore[attr-defined]
        if q and q[0] is self:
            q.popleft()

    def cancel(self) -> None:
        """Withdraw an unfinished op (after an error) so later ops on the connection can run."""
        try:
            self.conn.queue.remove(self)  # type: ignore[attr-defined]
        except (ValueError, AttributeError):
            pass

    done: bool = False
    is_shm: bool = False
    peer: int = -1
    mismatch: Mismatch | None = None
    fds: tuple[tuple[int, int], ...] = ()
    moved: bool = False  # anything transferred yet (for deciding whether a timeout broke the channel)

    def progress(self) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def ready(self) -> bool:
        return True

    def set_waiting(self, flag: int) -> None:
        pass
