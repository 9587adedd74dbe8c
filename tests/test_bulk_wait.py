"""A bulk wait on shared memory spins without giving its core away where every rank has a core (a yield on a
busy host hands the core to another process for a timeslice), and yields while spinning where ranks outnumber
cores (the peer may be waiting for this very core)."""
from __future__ import annotations

import os
import time

import pytest

from ringflow.runtime.call import executor
from ringflow.runtime.transport import doorbell


class _SlowPeer:
    """A pending shared-memory transfer that becomes ready after `polls` looks (what Waiter.wait reads)."""

    is_shm = True
    peer = 1
    fds = ()

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def ready(self) -> bool:
        self.polls -= 1
        return self.polls <= 0

    def set_waiting(self, flag: int) -> None:
        pass


@pytest.fixture()
def bell():  # noqa: ANN201
    b = doorbell.Doorbell(f"\0ringflow-test-bulk-wait-{os.getpid()}".encode())
    yield b
    b.close()


@pytest.mark.parametrize("crowded", [False, True])
def test_a_bulk_wait_yields_its_core_only_where_ranks_outnumber_cores(bell: doorbell.Doorbell, crowded: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    yields = []
    monkeypatch.setattr(executor.os, "sched_yield", lambda: yields.append(1))
    local_ranks = 10 * (os.cpu_count() or 1) if crowded else 1
    waiter = executor.Waiter(bell, local_ranks, lambda: None)
    assert waiter.yields is crowded
    op = _SlowPeer(50)
    deadline = time.monotonic() + 10.0
    while op.polls > 0:   # as executor.drive: wait again after a wake-up without progress
        waiter.wait([op], deadline, "test wait", hot=False)   # type: ignore[list-item]
    assert (len(yields) > 0) is crowded
