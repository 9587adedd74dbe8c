"""Async handles (`Work`) and lanes: ordered queues that run a communicator's operations.

A communicator has three lanes (collectives, p2p sends, p2p receives). Operations on one lane run
in issue order; different lanes run concurrently, so an `isend` and an `irecv` between the same
ranks never deadlock. A synchronous call runs in the caller's thread once its lane is idle (no
thread hand-off on the latency path); `async_op=True` queues it on the lane's worker thread.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ...errors import InvalidUsage, Timeout


class Work:
    """Handle of an asynchronous operation: `wait(timeout)`, `is_completed()`, `exception()`."""

    def __init__(self, description: str, result: Any = None) -> None:
        self.description = description
        self._result = result
        self._exc: BaseException | None = None
        self._done = threading.Event()
        self.on_wait: Callable[[int, int], None] | None = None   # the recorder's note of the first wait (ns)

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        self._done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done (Timeout after `timeout` s); re-raises the operation's error; returns its result."""
        note, self.on_wait = self.on_wait, None
        t0 = time.perf_counter_ns() if note is not None else 0
        done = self._done.wait(timeout)
        if note is not None:
            note(t0, time.perf_counter_ns())
        if not done:
            raise Timeout(f"{self.description} not completed within {timeout}s",
                          "the operation is still running; wait longer or abort the communicator")
        if self._exc is not None:
            raise self._exc
        return self._result

    def is_completed(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return self._done.is_set()

    def is_success(self) -> bool:
        """True if it finished without error."""
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        """The error the operation raised, or None (also None while it is still running)."""
        return self._exc

    def result(self) -> Any:
        """The output (the output array), after wait()."""
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"<Work {self.description} {state}>"


class Finishes(Protocol):
    """What a lane delivers an operation's outcome to: a `Work`, or the torch backend's."""

    def _finish(self, exc: BaseException | None = None) -> None: ...


W = TypeVar("W", bound=Finishes)


LANE_THREADS: set[int] = set()   # idents of the lanes' worker threads, which run a communicator's queued calls


class Lane:
    """An ordered execution queue with a lazily started worker thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._q: queue.Queue[tuple[Callable[[], Any], Finishes] | None] = queue.Queue()
        self._cond = threading.Condition()
        self._outstanding = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[[], Any], work: W) -> W:
        """Queue fn; its outcome lands in `work`."""
        with self._cond:
            if self._closed:
                raise InvalidUsage("communicator is destroyed", "create a new communicator")
            self._outstanding += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"ringflow-{self.name}", daemon=True)
                self._thread.start()
        self._q.put((fn, work))
        return work

    def _loop(self) -> None:
        me = threading.get_ident()
        LANE_THREADS.add(me)
        try:
            self._serve()
        finally:
            LANE_THREADS.discard(me)

    def _serve(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, work = item
            try:
                fn()
                work._finish()
            except BaseException as exc:  # noqa: BLE001 - delivered through Work.wait()
                work._finish(exc)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

    def quiesce(self, deadline: float | None) -> None:
        """Wait until every queued operation finished."""
        if self._outstanding == 0:
            return
        with self._cond:
            while self._outstanding:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"earlier asynchronous operations on the {self.name} lane did not finish",
                                  "wait() on their handles, or raise the timeout")
                self._cond.wait(left if left is None else min(left, 0.5))

    @property
    def busy(self) -> bool:
        return self._outstanding > 0

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the worker after queued work, waiting up to wait_s seconds for it (0: do not wait)."""
        with self._cond:
            self._closed = True
        th = self._thread
        if th is not None:
            self._q.put(None)
            if wait_s > 0 and th is not threading.current_thread():
                th.join(wait_s)
