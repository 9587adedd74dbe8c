"""torch Work objects for ringflow operations, and the ordered lanes that run them.

A process group has three lanes (collectives, sends, receives), as ringflow's communicator does:
operations on one lane run in issue order on its worker thread, so `async_op=True` returns at once;
a synchronous call (`opts.asyncOp` false) runs in the caller's thread when its lane is idle. A
Work's future is completed by the lane when the operation ends, with the output tensors or with a
`DistBackendError` carrying ringflow's typed error.
"""
from __future__ import annotations

import datetime
import threading
import time
import weakref
from collections.abc import Callable
from sys import getrefcount
from typing import Any

import torch
import torch.distributed as dist

from ..errors import InvalidUsage, RingflowError
from ..runtime.call.calltext import TORCH, in_dialect
from ..runtime.call.work import Lane as RuntimeLane
from ..runtime.recording.record import with_site


def backend_error(exc: BaseException, what: str) -> dist.DistBackendError:
    """torch's DistBackendError with ringflow's message (type, what failed, and the fix hint in torch's terms:
    destroy_process_group, new_group, the group's timeout); `detail` is the ringflow error's structured detail."""
    if isinstance(exc, RingflowError):
        err = dist.DistBackendError(f"ringflow {what}: {type(exc).__name__}: {in_dialect(exc, TORCH)}")
    else:
        err = dist.DistBackendError(f"ringflow {what}: {type(exc).__name__} (unexpected): {exc}")
    try:
        err.detail = getattr(exc, "detail", None)   # type: ignore[attr-defined]
    except AttributeError:   # an exception type without instance attributes
        pass
    return err


def _seconds(timeout: Any) -> float | None:
    """A wait timeout in seconds; None for no limit (torch's default timedelta(0) means none)."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


def _outcome(src: torch.futures.Future) -> list[torch.Tensor]:
    v = src.value()
    if isinstance(v, BaseException):
        raise v
    return v


def _futures() -> tuple[torch.futures.Future, torch._C.Future]:
    """(source, user future): the lane completes the source with the outputs or the error; the user future is
    its `then`, so an error is a real error of the C++ future (torch.futures.Future.set_exception only stores
    the exception as the value, which C++ consumers such as DDP's reducer then read as outputs and crash on)."""
    src: torch.futures.Future = torch.futures.Future()
    return src, src.then(_outcome)


class RingflowWork(dist.Work):
    """A torch Work for one ringflow operation: wait(timeout), is_completed(), get_future()."""

    # a Work made already finished (a synchronous call run inline) keeps these class defaults: no event, no
    # recorder entries, and a future made on request
    _exc: BaseException | None = None
    _done: threading.Event | None = None
    _src: torch.futures.Future | None = None
    _future: torch._C.Future | None = None
    recorded: Any = ()   # queued Works: a list of the (recorder, entry) of the call it ran, when recording

    def __init__(self, description: str, result: list[torch.Tensor] | None = None, *, done: bool = False,
                 exc: BaseException | None = None) -> None:
        super().__init__()
        self.description = description
        self._result = result if result is not None else []
        if exc is not None:
            self._exc = exc
        if not done:
            self._done = threading.Event()
            self.recorded = []
            self._src, self._future = _futures()

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        assert self._done is not None and self._src is not None, "finished twice"
        self._done.set()
        self._src.set_result(self._result if exc is None else backend_error(exc, self.description))

    def wait(self, timeout: Any = None) -> bool:
        """Block until done; DistBackendError if it failed or did not finish within `timeout`."""
        if self._done is None:   # finished when made
            if self._exc is not None:
                raise backend_error(self._exc, self.description) from self._exc
            return True
        t0 = time.perf_counter_ns()
        if not self._done.is_set():
            t = _seconds(timeout)
            if not self._done.wait(t):
                raise dist.DistBackendError(f"ringflow {self.description}: Timeout: not completed within {t}s "
                                            "(fix: the operation is still running; wait longer or abort the group)")
        if self.recorded:   # the recorder notes where the program waited on the queued call (the first wait)
            rec, e = self.recorded.pop()
            rec.waited(e, t0, time.perf_counter_ns())
        if self._exc is not None:
            raise backend_error(self._exc, self.description) from self._exc
        return True

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not."""
        return self._done is None or self._done.is_set()

    def is_success(self) -> bool:
        """True if it finished without error."""
        return self.is_completed() and self._exc is None

    def exception(self) -> BaseException | None:
        """The error it raised, or None."""
        return self._exc

    def get_future(self) -> torch._C.Future:  # type: ignore[override]  # the _C base: its error is a real one
        """A future completed with the output tensors when the operation ends (torch.futures.Future's base)."""
        if self._future is None:   # finished at creation: nothing else touches it
            self._src, self._future = _futures()
            self._src.set_result(self._result if self._exc is None else backend_error(self._exc, self.description))
        assert self._future is not None
        return self._future

    def result(self) -> list[torch.Tensor]:
        """The output tensors."""
        return self._result

    def synchronize(self) -> None:
        """Nothing to do on CPU."""

    def __repr__(self) -> str:
        return f"<RingflowWork {self.description} {'done' if self.is_completed() else 'pending'}>"


class _Finished(RingflowWork):
    __init__ = dist.Work.__init__   # torch's own constructor alone: `finished` sets what a finished Work holds


def finished(description: str, outputs: list[torch.Tensor], exc: BaseException | None = None) -> RingflowWork:
    """A Work for an operation that already ended (a synchronous call run inline), with its outputs or error."""
    w = _Finished()
    w.description, w._result = description, outputs
    if exc is not None:
        w._exc = exc
    return w


class Succeeded:
    """Works for synchronous calls that succeeded. A call on the same tensors as the call before it (a loop's) gets
    one finished Work again, while nothing else refers to it (torch's dist.all_reduce waits on it and drops it) and
    its future was never asked for; any other call gets a new Work, of which nothing is kept, so a tensor called once
    is never held past its call. A Work someone holds is never changed."""

    __slots__ = ("_w", "_free", "_prev")

    def __init__(self) -> None:
        self._w: RingflowWork | None = _Finished()
        w = self._w
        self._free = getrefcount(w)   # this holder, the local name and the argument: no one else's
        self._w = None
        self._prev: weakref.ref | None = None   # the previous call's first output

    def __call__(self, description: str, outputs: list[torch.Tensor]) -> RingflowWork:
        """A finished Work for this call's outputs."""
        w = self._w
        if w is not None and outputs and w._result[0] is outputs[0] and getrefcount(w) == self._free \
                and w._future is None:
            w.description, w._result = description, outputs
            return w
        w = finished(description, outputs)
        prev, self._prev = self._prev, (weakref.ref(outputs[0]) if outputs else None)
        self._w = w if prev is not None and outputs and prev() is outputs[0] else None
        return w


Job = Callable[[], object]


def _shut_down(description: str) -> dist.DistBackendError:
    return backend_error(InvalidUsage("the process group is shut down",
                                      "create a new one with init_process_group / new_group"), description)


class Lane:
    """Runs jobs in issue order: inline when idle and synchronous, else on the runtime lane's worker thread
    (`runtime.work.Lane`). One lock keeps an inline job from overlapping a queued one (torch may call from
    autograd's threads and the caller's at once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lane = RuntimeLane(f"torch-{name}")
        self._exec = threading.Lock()
        self.succeeded = Succeeded()

    @property
    def runtime(self) -> RuntimeLane:
        """The runtime lane that runs queued jobs: while it is neither `busy` nor `closed`, a synchronous call may
        run in the caller's thread (under `lock`, its finished Work from `succeeded` or `finished`)."""
        return self._lane

    @property
    def lock(self) -> threading.Lock:
        """Held while a job runs, inline or queued."""
        return self._exec

    def _inline(self, job: Job, description: str, outputs: list[torch.Tensor]) -> RingflowWork:
        """Run job in this thread, under the lane's execution lock; its finished Work."""
        with self._exec:
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                return finished(description, outputs, exc)
        return self.succeeded(description, outputs)

    def submit(self, job: Job, description: str, outputs: list[torch.Tensor], inline: bool) -> RingflowWork:
        """Run job (inline if allowed and nothing is queued); its Work."""
        if self._lane.closed:
            raise _shut_down(description)
        if inline and not self._lane.busy:
            # nothing this thread issued earlier is still queued (the worker counts down only when a job ended)
            return self._inline(job, description, outputs)
        work = RingflowWork(description, outputs)
        queued = with_site(job, work.recorded)   # the recorder notes the caller's line, not the worker's

        def locked() -> None:
            with self._exec:
                queued()
        try:
            self._lane.submit(locked, work)
        except InvalidUsage as exc:   # closed meanwhile
            raise _shut_down(description) from exc
        return work

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the worker after the queued jobs, waiting up to wait_s seconds for them."""
        self._lane.close(wait_s)
