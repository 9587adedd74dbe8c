"""Waiting without burning a core: spin briefly, then sleep on a per-thread doorbell.

A doorbell is an abstract-namespace Unix datagram socket (it vanishes with its process, so
nothing leaks). A writer that finds its peer's "waiting" flag set sends one byte to the peer's
doorbell; the sleeper polls the doorbell (and any TCP sockets it waits on) with a capped timeout,
so a wake-up lost to store/load reordering costs at most `SLEEP_CAP_S`. Spurious wake-ups are
harmless: the waiter always re-checks the shared state.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections.abc import Iterable

SLEEP_CAP_S = 0.005


def _parse_cpulist(text: str) -> int:
    """Number of CPUs in a Linux cpu list such as '0-3,8'."""
    n = 0
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return n


def host_cores() -> int:
    """Cores this host gives the job: the cgroup's cpuset when readable, else every online CPU.

    Not this process's affinity: the launcher pins each rank to one core, which says nothing about
    whether the host's ranks outnumber its cores.
    """
    try:
        with open("/sys/fs/cgroup/cpuset.cpus.effective") as fh:
            n = _parse_cpulist(fh.read())
        if n > 0:
            return n
    except (OSError, ValueError):
        pass
    return os.cpu_count() or 1


_ncpu = host_cores()

_tx_lock = threading.Lock()
_tx: socket.socket | None = None


def _sender() -> socket.socket:
    global _tx
    with _tx_lock:
        if _tx is None:
            _tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _tx.setblocking(False)
        return _tx


def ring(address: bytes) -> None:
    """Wake whoever sleeps on `address` (best effort: a gone or full doorbell is ignored)."""
    try:
        _sender().sendto(b"\x01", address)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT, errno.EWOULDBLOCK):
            raise


def address(job: str, uid: str, rank: int, lane: int) -> bytes:
    """The abstract socket name of one rank's lane doorbell in one communicator."""
    return f"\0ringflow-{job}-{uid}-r{rank}-l{lane}".encode()


class Doorbell:
    """The receiving end: one per (communicator, lane) in this process."""

    def __init__(self, addr: bytes) -> None:
        self.address = addr
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(addr)
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()

    def drain(self) -> None:
        """Swallow pending wake-ups."""
        try:
            while True:
                self.sock.recv(256)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def sleep(self, timeout_s: float, fds: Iterable[tuple[int, int]] = ()) -> None:
        """Block until rung, an fd is ready (fd, poll events), or timeout_s passes."""
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        for fd, ev in fds:
            p.register(fd, ev)
        p.poll(max(0, int(timeout_s * 1000) + 1) if timeout_s > 0 else 0)
        self.drain()

    def close(self) -> None:
        """Release the socket (and its name)."""
        self.sock.close()


def spin_budget_s(local_ranks: int) -> float:
    """How long to spin before sleeping (oversubscribed ranks spin yielding, which hands the core to a peer)."""
    return 1e-3


def oversubscribed(local_ranks: int) -> bool:
    """True when this host has more ranks than cores (spinning would steal the peer's core)."""
    return local_ranks > _ncpu


def now() -> float:
    """Monotonic seconds."""
    return time.monotonic()
