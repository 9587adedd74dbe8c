"""The door of every listening socket: accept, authenticate without a thread per stranger, then hand over.

One thread per listener accepts connections and runs every pending challenge-response handshake
(`auth`'s protocol, server side) on non-blocking sockets with a selector. A connection that has not
proved the job secret within HANDSHAKE_BUDGET_S is closed; at most MAX_PENDING wait at once (past
that the oldest is dropped), so a flood of silent connections holds a bounded number of descriptors
for a bounded time. Replies are read before new connections are accepted, and a client whose
handshake is dropped sees the connection close without a verdict (`auth.Dropped`) and dials again,
so a flood delays nobody who has the secret. Accepting never stops on transient errors (out of
descriptors, aborted connections, no buffers): it sheds the oldest pending handshakes, pauses
accepting for 10 ms (doubling to 100 ms while the errors last) and goes on; only `close()` ends it.
Refusals are logged through a token bucket (a burst of five, then one a second), and the count of
those not logged is reported once a second while there are any. Only authenticated connections
reach `on_ready`, each on its own thread; an owner that bounds them (the store) passes `admit`, which the
gate thread asks before answering a proof: it makes room or names why there is none, and the client is
told so (`auth.Busy`) without a thread ever starting for it.
"""
from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from . import auth

log = logging.getLogger("ringflow.runtime")

HANDSHAKE_BUDGET_S = 3.0   # a stranger gets this long to prove the secret
MAX_PENDING = 128          # handshakes in progress at once; past it the oldest is dropped
LISTEN_BACKLOG = 4096      # connections the kernel queues for the gate (capped by net.core.somaxconn)
ACCEPT_BATCH = 64          # connections accepted per wake-up before pending replies are read again
TRANSIENT_ACCEPT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                              errno.EPROTO, errno.EINTR, errno.EPERM, errno.ENETDOWN, errno.ENETUNREACH,
                              errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENONET, errno.EOPNOTSUPP,
                              errno.ETIMEDOUT})
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.01, 0.1
LOG_EVERY_S = 1.0
_ACCEPT, _WAKE, _PEER = "accept", "wake", "peer"


@dataclass
class _Pending:
    sock: socket.socket
    nonce: bytes
    deadline: float
    got: bytearray = field(default_factory=bytearray)


class RateLimitedLog:
    """Warnings through a token bucket: BURST lines at once, then one every `every_s`; the count held back
    goes with the next line, or on its own (`flush`) once `every_s` has passed."""

    BURST = 5

    def __init__(self, what: str, every_s: float = LOG_EVERY_S) -> None:
        self.what, self.every_s = what, every_s
        self.tokens, self.last, self.last_line, self.held = float(self.BURST), time.monotonic(), 0.0, 0

    def _take(self, now: float) -> bool:
        self.tokens = min(float(self.BURST), self.tokens + (now - self.last) / self.every_s)
        self.last = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        self.last_line = now
        return True

    def warn(self, msg: str, *args: object) -> None:
        """Log `msg % args` if the bucket allows, else count it."""
        if not self._take(time.monotonic()):
            self.held += 1
            return
        extra = f" ({self.held} more {self.what} not logged)" if self.held else ""
        self.held = 0
        log.warning(msg + extra, *args)

    def flush(self) -> None:
        """Report the count held back, at most once every `every_s`."""
        now = time.monotonic()
        if self.held and now - self.last_line >= self.every_s and self._take(now):
            log.warning("ringflow: %d more %s not logged", self.held, self.what)
            self.held = 0


class Gate:
    """Accepts on `sock`, authenticates with `secret` in `context`, and calls `on_ready(conn)` (blocking socket)
    for every client that proved the secret; `on_ready` runs on its own thread. `admit(conn)`, if given, runs on
    the gate thread first: None admits the client, bytes refuse it as busy (the bytes say why)."""

    def __init__(self, sock: socket.socket, secret: bytes, context: bytes, on_ready: Callable[[socket.socket], None],
                 name: str, admit: Callable[[socket.socket], bytes | None] | None = None) -> None:
        self.sock, self.secret, self.context, self.on_ready, self.admit = sock, secret, context, on_ready, admit
        try:
            host, port = sock.getsockname()[:2]
            self.where = f"{name} {host}:{port}"
        except OSError:
            self.where = name
        self.refused = 0     # wrong secret, silent past the budget, closed early, or shed
        self.shed = 0        # of those: dropped to make room (the cap, or no descriptors left)
        self.accepted = 0    # proved the secret
        self.busy = 0        # proved the secret, but `admit` had no room
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._sel = selectors.DefaultSelector()
        self._closed = False
        self._log = RateLimitedLog(f"refused connections [{self.where}]")
        self._accept_log = RateLimitedLog(f"accept errors [{self.where}]")
        self._backoff = 0.0
        self._resume = 0.0   # accepting paused until then (after a transient error)
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, _ACCEPT)
        self._sel.register(self._r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Handshakes in progress."""
        return len(self._pending)

    def close(self) -> None:
        """Stop accepting; close pending handshakes (the listening socket is the owner's to close)."""
        if self._closed:
            return
        self._closed = True
        try:
            os.write(self._w, b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for p in list(self._pending.values()):
            p.sock.close()
        self._pending.clear()
        self._sel.close()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _loop(self) -> None:
        while not self._closed:
            now = time.monotonic()
            wake = next(iter(self._pending.values())).deadline if self._pending else now + 1.0   # oldest first
            if self._resume:
                wake = min(wake, self._resume)
            try:
                events = self._sel.select(max(0.0, min(wake - now, 1.0)))
            except (OSError, ValueError):
                if self._closed:
                    return
                time.sleep(BACKOFF_MIN_S)
                continue
            accept = False
            for key, _ in events:
                if key.data == _WAKE:
                    return
                if key.data == _ACCEPT:
                    accept = True
                else:
                    self._progress(key.fd)   # replies first: one who answered is never shed for a newcomer
            now = time.monotonic()
            if self._resume and now >= self._resume:
                self._resume = 0.0
                self._sel.register(self.sock, selectors.EVENT_READ, _ACCEPT)
                accept = True
            if accept:
                self._accept()
            self._expire(time.monotonic())
            self._log.flush()
            self._accept_log.flush()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                self._backoff = 0.0
                return
            except OSError as exc:
                if self._closed:
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._drop_oldest(max(1, len(self._pending) // 4), "no descriptors or memory left")
                if exc.errno not in TRANSIENT_ACCEPT:
                    self._accept_log.warn("ringflow: accept failed on %s: %s", self.where, exc)
                self._pause()
                return
            self._backoff = 0.0
            self._start(conn)

    def _pause(self) -> None:
        """Stop accepting for a moment (the listening socket stays readable while the error lasts)."""
        self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff * 2))
        self._resume = time.monotonic() + self._backoff
        try:
            self._sel.unregister(self.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _start(self, conn: socket.socket) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._drop_oldest(1, "too many connections waiting to authenticate")
        nonce, hello = auth.challenge()
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if conn.send(hello) != len(hello):   # a fresh socket's buffer takes a few dozen bytes whole
                raise BlockingIOError
            self._sel.register(conn, selectors.EVENT_READ, _PEER)
        except (OSError, ValueError):
            conn.close()
            self.refused += 1
            return
        self._pending[conn.fileno()] = _Pending(conn, nonce, time.monotonic() + HANDSHAKE_BUDGET_S)

    def _progress(self, fd: int) -> None:
        p = self._pending.get(fd)
        if p is None:
            return
        try:
            chunk = p.sock.recv(auth.REPLY_BYTES - len(p.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._refuse(fd, f"handshake failed: {exc}")
            return
        if not chunk:
            self._refuse(fd, "closed during the handshake")
            return
        p.got += chunk
        if len(p.got) < auth.REPLY_BYTES:
            return
        accept = auth.answer(self.secret, self.context, p.nonce, bytes(p.got))
        if accept is None:
            self._refuse(fd, "wrong HMAC (not the job secret)", tell=True)
            return
        self._forget(fd)
        try:
            full = self.admit(p.sock) if self.admit is not None else None
        except Exception as exc:  # noqa: BLE001 - one bad client must never stop the gate
            log.warning("ringflow: admission failed [%s]: %s", self.where, exc)
            p.sock.close()
            return
        if full is not None:
            self.busy += 1
            try:
                p.sock.send(auth.busy_answer(accept, full))
            except OSError:
                pass
            p.sock.close()
            return
        try:
            if p.sock.send(accept) != len(accept):
                raise BlockingIOError
            p.sock.setblocking(True)
        except OSError:
            p.sock.close()
            return
        self.accepted += 1
        threading.Thread(target=self._ready, args=(p.sock,), name="ringflow-admit", daemon=True).start()

    def _ready(self, conn: socket.socket) -> None:
        try:
            self.on_ready(conn)
        except Exception as exc:  # noqa: BLE001 - one bad client must never stop the gate
            log.warning("ringflow: dropped an authenticated connection during setup [%s]: %s", self.where, exc)
            conn.close()

    def _forget(self, fd: int) -> _Pending | None:
        p = self._pending.pop(fd, None)
        if p is not None:
            try:
                self._sel.unregister(p.sock)
            except (KeyError, ValueError, OSError):
                pass
        return p

    def _refuse(self, fd: int, why: str, tell: bool = False) -> None:
        p = self._forget(fd)
        if p is None:
            return
        self.refused += 1
        try:
            addr = p.sock.getpeername()   # numeric: never resolve names
        except OSError:
            addr = "?"
        self._log.warn("ringflow: refused connection from %s: %s [%s]", addr, why, self.where)
        if tell:
            try:
                p.sock.send(auth.REFUSED)
            except OSError:
                pass
        p.sock.close()

    def _drop_oldest(self, k: int, why: str) -> None:
        for fd in list(self._pending)[:k]:
            self.shed += 1
            self._refuse(fd, f"dropped: {why}")

    def _expire(self, now: float) -> None:
        for fd, p in list(self._pending.items()):
            if p.deadline > now:
                break   # in arrival order, so deadlines ascend
            self._refuse(fd, f"did not authenticate within {HANDSHAKE_BUDGET_S:g} s")
