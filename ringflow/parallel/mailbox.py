"""Non-blocking message exchange for servers and asynchronous workers, built from isend/irecv.

A server must serve whichever worker talks first, but the runtime has no
probe and runs a communicator's receives in issue order on one lane: a
receive posted for a quiet peer would hold up everyone behind it. So the
mailbox gives every (tag, pair of ranks) its own two-rank communicator
(`new_group`): each one carries a single FIFO stream per direction, one
receive is posted per stream, and `Work.is_completed()` is polled. A message
to oneself goes through a local queue. Every wait has a deadline and raises
`Timeout` naming what it waited for. (A runtime-level any-source probe would
make the extra communicators unnecessary.)
"""
from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import config
from ..errors import InvalidArgument, Timeout

IDLE_SLEEP_S = 200e-6  # back-off when nothing progressed, so polling ranks leave the CPU to the others


class Mailbox:
    """Tagged float64 messages to/from any rank, without blocking; collective to create (all ranks of comm)."""

    def __init__(self, comm: Any, tags: Sequence[int], timeout: float | None = None) -> None:
        self.comm, self.rank = comm, comm.rank
        self.timeout = float(config.get("TIMEOUT")) if timeout is None else float(timeout)
        self.tags = list(tags)
        self._links: dict[tuple[int, int], Any] = {}
        for tag in self.tags:
            for a in range(comm.size):
                for b in range(a + 1, comm.size):
                    g = comm.new_group([a, b], timeout=self.timeout)
                    if g is not None:
                        self._links[(tag, b if comm.rank == a else a)] = g
        self._local: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._posted: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}
        self._sends: list[Any] = []
        self.messages_sent = 0

    def _link(self, tag: int, peer: int) -> Any:
        link = self._links.get((tag, peer))
        if link is None:
            raise InvalidArgument(f"no stream for tag {tag} to rank {peer}", f"create the Mailbox with tags={tag}")
        return link

    def send(self, dst: int, tag: int, data: np.ndarray) -> None:
        """Queue `data` (copied) for `dst` without waiting for delivery."""
        buf = np.array(data, dtype=np.float64, copy=True)
        self.messages_sent += 1
        if dst == self.rank:
            self._local[tag].append(buf)
            return
        link = self._link(tag, dst)
        self._sends.append(link.isend(buf, 1 - link.rank, tag=tag, timeout=self.timeout))
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
            link = self._link(tag, src)
            buf = np.empty(nelem, dtype=np.float64)
            slot = (buf, link.irecv(buf, 1 - link.rank, tag=tag, timeout=self.timeout))
            self._posted[key] = slot
        buf, work = slot
        if not work.is_completed():
            return None
        del self._posted[key]
        exc = work.exception()
        if exc is not None:
            raise exc
        return buf

    def close(self) -> None:
        """Wait until every sent message has left (bounded by the timeout), then free the streams."""
        for w in self._sends:
            w.wait(timeout=self.timeout)
        self._sends = []
        for w in [w for _, w in self._posted.values()]:
            w.wait(timeout=self.timeout)
        for link in self._links.values():
            link.destroy()
        self._links = {}


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
