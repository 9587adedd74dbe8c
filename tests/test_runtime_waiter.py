"""The executor's Waiter on real sockets: it polls before sleeping only where ranks have a core each,
returns once a socket is ready, and never waits past its deadline."""
from __future__ import annotations

import os
import select
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from ringflow.errors import RemoteError, Timeout
from ringflow.runtime.call import executor
from ringflow.runtime.transport import doorbell


@dataclass
class _SocketWait:
    """What `Waiter.wait` reads of a pending socket transfer: its fds and peer."""
    fds: list
    peer: int = 1
    is_shm: bool = False


@pytest.fixture()
def bell():  # noqa: ANN201
    b = doorbell.Doorbell(f"\0ringflow-test-waiter-{os.getpid()}".encode())
    yield b
    b.sock.close()


def test_socket_waits_poll_first_only_where_every_rank_has_a_core(bell: doorbell.Doorbell) -> None:
    """A core per rank: poll SOCKET_SPIN_S before sleeping (a sleeping peer pays a wake-up that grows with
    the sleep); more ranks than cores: sleep at once (polling would take the peer's core)."""
    assert executor.SOCKET_SPIN_S > executor.SOCKET_HOT_S
    assert executor.Waiter(bell, 1, lambda: None).socket_s == executor.SOCKET_SPIN_S
    crowded = executor.Waiter(bell, 10 * (os.cpu_count() or 1), lambda: None)
    assert crowded.socket_s == 0.0 and crowded.hot_s == 0.0


@pytest.mark.parametrize("local_ranks", [1, 4096])
def test_a_socket_wait_returns_once_its_peer_writes(bell: doorbell.Doorbell, local_ranks: int) -> None:
    a, b = socket.socketpair()
    try:
        waiter = executor.Waiter(bell, local_ranks, lambda: None)
        op = _SocketWait([(a.fileno(), select.POLLIN)])
        writer = threading.Timer(0.002, lambda: b.send(b"x"))
        writer.start()
        deadline = time.monotonic() + 10.0
        while not select.select([a], [], [], 0)[0]:
            waiter.wait([op], deadline, "test")
        writer.join()
        assert a.recv(1) == b"x"
    finally:
        a.close()
        b.close()


def test_a_socket_wait_past_its_deadline_is_a_timeout_naming_the_peer(bell: doorbell.Doorbell) -> None:
    a, b = socket.socketpair()
    try:
        waiter = executor.Waiter(bell, 1, lambda: None)
        op = _SocketWait([(a.fileno(), select.POLLIN)], peer=3)
        deadline = time.monotonic() + 0.02
        with pytest.raises(Timeout, match=r"waiting for rank 3\b"):
            for _ in range(1000):   # each wait sleeps until the deadline at most; then the next one raises
                waiter.wait([op], deadline, "test")
        assert time.monotonic() - deadline < 5.0
    finally:
        a.close()
        b.close()


def _peer_aborted() -> None:
    raise RemoteError("rank 1 failed: it aborted its communicator", rank=1)


def test_a_message_sent_before_the_peer_failed_is_still_taken_then_the_failure_raises(
        bell: doorbell.Doorbell) -> None:
    """A peer that finished its call (its last message sent) and then aborted: the waiting rank takes that
    message and completes too; with nothing of the peer's left to take, the wait raises the peer's failure."""
    a, b = socket.socketpair()
    try:
        waiter = executor.Waiter(bell, 1, _peer_aborted)
        op = _SocketWait([(a.fileno(), select.POLLIN)])
        b.send(b"x")   # the peer's last message, already there
        waiter.wait([op], time.monotonic() + 10.0, "test")   # returns: the op can progress
        assert a.recv(1) == b"x"
        with pytest.raises(RemoteError, match="aborted"):
            waiter.wait([op], time.monotonic() + 10.0, "test")
    finally:
        a.close()
        b.close()
