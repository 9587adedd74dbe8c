"""Non-blocking message exchange for servers and asynchronous workers, built from isend/irecv.

The runtime has no probe, so a rank that must serve whoever talks first keeps
one posted `irecv` per (source, tag) and polls `Work.is_completed()`; a message
to itself goes through a local queue instead of the transport. Every wait in
`poll_until` has a deadline and raises `Timeout` naming what it waited for.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

import numpy as np

from .. import config
from ..errors import Timeout

IDLE_SLEEP_S = 200e-6  # back-off when nothing progressed, so polling ranks leave the CPU to the others


class Mailbox:
    """Tagged float64 messages to/from any rank, without blocking."""

    def __init__(self, comm: Any, timeout: float | None = None) -> None:
        self.comm, self.rank = comm, comm.rank
        self.timeout = float(config.get("TIMEOUT")) if timeout is None else float(timeout)
        self._local: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._posted: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}
        self._sends: list[Any] = []
        self.messages_sent = 0

    def send(self, dst: int, tag: int, data: np.ndarray) -> None:
        """Queue `data` (copied) for `dst` without waiting for delivery."""
        buf = np.array(data, dtype=np.float64, copy=True)
        self.messages_sent += 1
        if dst == self.rank:
            self._local[tag].append(buf)
            return
        self._sends.append(self.comm.isend(buf, dst, tag=tag, timeout=self.timeout))
        if len(self._sends) > 64:
            self._sends = [w for w in self._sends if not w.is_completed()]

    def try_recv(self, src: int, tag: int, nelem: int) -> np.ndarray | None:
        """The next message from `src` with `tag` if it has arrived, else None (posts a receive for it)."""
        if src == self.rank:
            q = self._local[tag]
            return q.popleft() if q else None
        key = (src, tag)
        slot = self._posted.get(key)
        if slot is None:
            buf = np.empty(nelem, dtype=np.float64)
            slot = (buf, self.comm.irecv(buf, src, tag=tag, timeout=self.timeout))
            self._posted[key] = slot
        buf, work = slot
        if not work.is_completed():
            return None
        del self._posted[key]
        exc = work.exception()
        if exc is not None:
            raise exc
        return buf

    def flush(self) -> None:
        """Wait until every sent message has left (bounded by the timeout)."""
        for w in self._sends:
            w.wait(timeout=self.timeout)
        self._sends = []


def poll_until(done: Callable[[], bool], step: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Call `step()` (True = progress) until `done()`; sleep briefly when idle; raise Timeout after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if not step():
            if time.monotonic() > deadline:
                raise Timeout(f"{what} did not finish within {timeout_s:g} s",
                              "a peer may be stuck or dead; raise RINGFLOW_TIMEOUT if the job is just slow")
            time.sleep(IDLE_SLEEP_S)
        else:
            deadline = time.monotonic() + timeout_s
