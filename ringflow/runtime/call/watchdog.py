"""Control connections between every pair of ranks, watched by one thread per communicator.

A killed peer's control socket reaches EOF at once (the kernel closes it with the process), so
survivors learn of the death immediately (RemoteError naming the rank), even while they wait on
shared memory. A peer whose host stops answering (a link down, a host hung or powered off) is found
by the kernel's TCP keepalive on the control socket: probes every RINGFLOW_HEARTBEAT_INTERVAL seconds,
and the socket fails once RINGFLOW_HEARTBEAT_TIMEOUT seconds pass without an answer. The kernel
answers probes for a process that computes (or holds the GIL, or is stopped), so a busy rank is never
declared dead: it is alive, and a collective that waits on it ends with Timeout after the call's
timeout instead. ABORT, BYE (clean destroy) and MISMATCH travel on the same sockets; a BYE marks the peer
departed (`departed`, with the time it said so). A MISMATCH carries either a rank's verdict that the
communicator's channels are out of step ("message") or, when a call found a message of another call, that
rank's own description of the call ("call", kept in `peer_calls`), so each side can name the other's.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from ... import config
from ...errors import ProtocolError, RemoteError, RingflowError, Timeout
from ..transport import frames
from ..transport.frames import Kind
from ..transport.tcp import read_frame
from .calltext import hint

log = logging.getLogger("ringflow.runtime")

PEER_CALLS_KEPT = 8   # call descriptions kept per peer (the latest calls it reported in a mismatch)


def keep_alive(sock: socket.socket, interval_s: float, timeout_s: float) -> None:
    """Let the kernel probe the peer every `interval_s` and fail the socket after `timeout_s` of silence
    (unanswered probes, or sent data left unacknowledged)."""
    every = max(1, round(interval_s))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, every)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, every)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, math.ceil(timeout_s / every)))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, int(timeout_s * 1000)))


class Watchdog:
    """Owns the control sockets of one rank of one communicator."""

    def __init__(self, rank: int, on_failure: Callable[[RingflowError], None],
                 on_mismatch: Callable[[int, str], None], on_departed: Callable[[int], None] | None = None,
                 status: Callable[[], dict[str, object]] | None = None) -> None:
        self.rank = rank
        self.status = status            # what this rank answers a STATUS_QUERY with
        self.statuses: dict[int, dict[str, object]] = {}   # peers' answers to our last query
        self.on_failure, self.on_mismatch, self.on_departed = on_failure, on_mismatch, on_departed
        self.interval_s = float(config.get("HEARTBEAT_INTERVAL"))
        self.timeout_s = float(config.get("HEARTBEAT_TIMEOUT"))
        self._socks: dict[int, socket.socket] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._out_seq: dict[int, int] = {}
        self._in_seq: dict[int, int] = {}
        self._last: dict[int, float] = {}
        self.departed: dict[int, float] = {}   # peer -> monotonic time of its BYE
        self.dead: dict[int, str] = {}
        self.peer_calls: dict[int, dict[int, str]] = {}   # peer -> {op_seq: its call's description}
        self._cond = threading.Condition()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._stop = False
        self._thread: threading.Thread | None = None

    def add(self, peer: int, sock: socket.socket, dialed: bool) -> None:
        """Register the control socket to `peer` (dialed: this rank connected and sent HELLO)."""
        try:
            keep_alive(sock, self.interval_s, self.timeout_s)
        except OSError as exc:
            log.warning("ringflow: cannot set TCP keepalive on the control socket to rank %d: %s", peer, exc)
        with self._cond:
            old = self._socks.get(peer)
            self._socks[peer] = sock
            self._locks[peer] = threading.Lock()
            self._out_seq[peer] = 1 if dialed else 0
            self._in_seq[peer] = 0 if dialed else 1
            self._last[peer] = time.monotonic()
            self._cond.notify_all()
        if old is not None:
            old.close()
        self._poke()

    def wait_connected(self, peers: list[int], deadline: float) -> None:
        """Block until a control socket to every peer exists."""
        with self._cond:
            while not all(p in self._socks for p in peers):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [p for p in peers if p not in self._socks]
                    raise Timeout(f"ranks {missing} did not connect within the timeout",
                                  "those ranks did not start, or a firewall/interface blocks them "
                                  "(RINGFLOW_SOCKET_IFNAME)")
                self._cond.wait(min(left, 0.5))

    def start(self) -> None:
        """Start watching."""
        self._thread = threading.Thread(target=self._loop, name="ringflow-watchdog", daemon=True)
        self._thread.start()

    def _poke(self) -> None:
        try:
            os.write(self._w, b"x")
        except OSError:
            pass

    def send(self, peer: int, kind: Kind, payload: bytes = b"", **fields: int) -> bool:
        """Send a control frame to one peer; False if it could not be sent."""
        with self._cond:
            sock, lock = self._socks.get(peer), self._locks.get(peer)
        if sock is None or lock is None:
            return False
        try:
            with lock:
                seq = self._out_seq[peer]
                self._out_seq[peer] = seq + 1
                sock.settimeout(2.0)
                sock.sendall(frames.pack(kind, seq, len(payload), **fields) + payload)
            return True
        except OSError:
            return False

    def broadcast(self, kind: Kind, payload: bytes = b"", **fields: int) -> None:
        """Send a control frame to every connected peer (best effort)."""
        with self._cond:
            peers = list(self._socks)
        for p in peers:
            self.send(p, kind, payload, **fields)

    def _loop(self) -> None:
        while not self._stop:
            with self._cond:
                socks = dict(self._socks)
            fd_peer = {s.fileno(): p for p, s in socks.items() if s.fileno() >= 0}
            try:
                ready, _, _ = select.select([self._r, *fd_peer], [], [], 1.0)
            except (OSError, ValueError):
                if self._stop:
                    return
                time.sleep(0.01)
                continue
            if self._stop:
                return
            for fd in ready:
                if fd == self._r:
                    try:
                        os.read(self._r, 4096)
                    except OSError:
                        pass
                    continue
                peer = fd_peer[fd]
                self._read(peer, socks[peer])

    def _read(self, peer: int, sock: socket.socket) -> None:
        try:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except OSError:
            err = 0
        if err == errno.ETIMEDOUT and peer not in self.departed:
            self._dead(peer, f"its host stopped answering (no TCP keepalive reply for {self.timeout_s:g} s; "
                             "link down or host hung)")
            return
        # any other pending error (a reset, a broken pipe after the peer closed) is for the read below to meet
        # once the frames the peer sent before it (its BYE) have been read
        try:
            f, body = read_frame(sock, time.monotonic() + 2.0, f"rank {peer} (control)", self._in_seq[peer])
        except (RemoteError, OSError, Timeout) as exc:
            if peer in self.departed:
                self._drop(peer)
            else:
                self._dead(peer, f"its process exited or its connection closed ({type(exc).__name__})")
            return
        except ProtocolError as exc:
            log.warning("ringflow: rank %d sent a bad control frame: %s", peer, exc)
            self._dead(peer, f"it sent a malformed control frame: {exc.message}")
            return
        self._in_seq[peer] += 1
        self._last[peer] = time.monotonic()
        if f.kind == Kind.ABORT:
            self._dead(peer, "it aborted its communicator", aborted=True)
        elif f.kind == Kind.BYE:
            self.departed[peer] = time.monotonic()
            if self.on_departed is not None:
                self.on_departed(peer)
        elif f.kind == Kind.STATUS_QUERY and self.status is not None:
            self.send(peer, Kind.STATUS, json.dumps(self.status()).encode())
        elif f.kind == Kind.STATUS:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            with self._cond:
                self.statuses[peer] = answer if isinstance(answer, dict) else {}
                self._cond.notify_all()
        elif f.kind == Kind.MISMATCH:
            self._mismatch(peer, f.op_seq, body)

    def _mismatch(self, peer: int, op_seq: int, body: bytes) -> None:
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {}
        call = payload.get("call")
        if isinstance(call, str):
            with self._cond:
                calls = self.peer_calls.setdefault(peer, {})
                calls[op_seq] = call
                while len(calls) > PEER_CALLS_KEPT:
                    del calls[min(calls)]
                self._cond.notify_all()
        if call is None or payload.get("message"):
            self.on_mismatch(op_seq, str(payload.get("message") or f"rank {peer} found mismatched arguments"))

    def tell_call(self, op_seq: int, description: str) -> None:
        """Tell every peer this rank's call #op_seq (it found a message of another call in it), so a peer that
        found the same disagreement can name both calls."""
        self.broadcast(Kind.MISMATCH, json.dumps({"call": description}).encode(), op_seq=op_seq)

    def peer_call(self, peer: int, op_seq: int, wait_s: float) -> tuple[int, str] | None:
        """(op_seq, description) of `peer`'s call #op_seq as it told it (`tell_call`), waiting up to `wait_s` for it;
        else its latest told call, if any; None if it told none."""
        end = time.monotonic() + wait_s
        with self._cond:
            while op_seq not in self.peer_calls.get(peer, {}) and peer not in self.dead:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            calls = self.peer_calls.get(peer, {})
            if op_seq in calls:
                return op_seq, calls[op_seq]
            return (max(calls), calls[max(calls)]) if calls else None

    def _drop(self, peer: int) -> None:
        with self._cond:
            s = self._socks.pop(peer, None)
        if s is not None:
            s.close()

    def _dead(self, peer: int, why: str, aborted: bool = False) -> None:
        if peer in self.dead:
            self._drop(peer)
            return
        self.dead[peer] = why
        if not aborted:  # an aborted peer keeps its socket: closing it would look like our death to it
            self._drop(peer)
        log.warning("ringflow: rank %d: peer rank %d failed: %s", self.rank, peer, why)
        self.on_failure(RemoteError(f"rank {peer} failed: {why}", rank=peer, hint=hint("failed")))

    def ask_status(self, peers: list[int], wait_s: float) -> dict[int, dict[str, object]]:
        """Ask `peers` what they are doing; the answers that came within `wait_s` (a stopped or hung peer's
        kernel keeps its connection, but nobody answers)."""
        with self._cond:
            self.statuses.clear()
        for p in peers:
            self.send(p, Kind.STATUS_QUERY)
        end = time.monotonic() + wait_s
        with self._cond:
            while not all(p in self.statuses for p in peers) and time.monotonic() < end:
                self._cond.wait(max(0.0, end - time.monotonic()))
            return {p: self.statuses[p] for p in peers if p in self.statuses}

    def close(self) -> None:
        """Stop the thread and close every control socket."""
        self._stop = True
        self._poke()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._cond:
            socks = list(self._socks.values())
            self._socks.clear()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
