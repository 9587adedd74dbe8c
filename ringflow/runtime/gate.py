"""The door of every listening socket: accept, authenticate without a thread per stranger, then hand over.

One thread per listener accepts connections and runs every pending challenge-response handshake
(`auth`'s protocol) on non-blocking sockets with a selector. A connection that has not proved the job
secret within HANDSHAKE_BUDGET_S is closed; at most MAX_PENDING wait at once (past that the oldest is
dropped), so a flood of silent connections holds a bounded number of descriptors for a bounded time and
delays nobody who has the secret. Accepting never stops on transient errors (out of descriptors, aborted
connections): it sheds the oldest pending handshakes, backs off briefly and goes on. Refusals are logged
through a token bucket (a burst of five, then one a second), with the count of those not logged. Only
authenticated connections reach `on_ready`.
"""
from __future__ import annotations

import errno
import hmac
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
TRANSIENT_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO,
                    errno.EINTR, errno.EAGAIN, errno.EPERM}
BACKOFF_S = 0.02
REPLY_BYTES = auth._NONCE + auth._MAC


@dataclass
class _Pending:
    sock: socket.socket
    nonce: bytes
    deadline: float
    got: bytearray = field(default_factory=bytearray)


class _RateLimitedLog:
    """Warnings through a token bucket: BURST lines at once, then one a second, with the count held back."""

    BURST = 5

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self.tokens, self.last, self.held = every_s, float(self.BURST), time.monotonic(), 0

    def warn(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        self.tokens = min(float(self.BURST), self.tokens + (now - self.last) / self.every_s)
        self.last = now
        if self.tokens < 1.0:
            self.held += 1
            return
        self.tokens -= 1.0
        extra = f" ({self.held} more refusals not logged)" if self.held else ""
        self.held = 0
        log.warning(msg + extra, *args)


class Gate:
    """Accepts on `sock`, authenticates with `secret` in `context`, and calls `on_ready(conn)` (blocking socket)
    for every client that proved the secret; `on_ready` runs on its own thread."""

    def __init__(self, sock: socket.socket, secret: bytes, context: bytes, on_ready: Callable[[socket.socket], None],
                 name: str) -> None:
        self.sock, self.secret, self.context, self.on_ready = sock, secret, context, on_ready
        self.refused = 0
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._sel = selectors.DefaultSelector()
        self._closed = False
        self._log = _RateLimitedLog()          # refusals: what a flood would otherwise fill the log with
        self._accept_log = _RateLimitedLog()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting; close pending handshakes (the listening socket is the owner's to close)."""
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
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _loop(self) -> None:
        while not self._closed:
            now = time.monotonic()
            wait = min([p.deadline for p in self._pending.values()], default=now + 1.0) - now
            try:
                events = self._sel.select(max(0.0, min(wait, 1.0)))
            except (OSError, ValueError):
                if self._closed:
                    return
                time.sleep(BACKOFF_S)
                continue
            for key, _ in events:
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    return
                else:
                    self._progress(key.fd)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):   # drain what is queued, fairly: then serve the pending ones
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if self._closed or exc.errno not in TRANSIENT_ACCEPT:
                    if not self._closed:
                        self._accept_log.warn("ringflow: accept failed: %s", exc)
                    time.sleep(BACKOFF_S)
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._drop_oldest(max(1, len(self._pending) // 4))
                time.sleep(BACKOFF_S)
                return
            self._start(conn)

    def _start(self, conn: socket.socket) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._drop_oldest(1)
        nonce = os.urandom(auth._NONCE)
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.send(auth._HELLO + nonce)   # a few dozen bytes: a fresh socket's buffer takes them whole
            self._sel.register(conn, selectors.EVENT_READ, "peer")
        except OSError:
            conn.close()
            return
        self._pending[conn.fileno()] = _Pending(conn, nonce, time.monotonic() + HANDSHAKE_BUDGET_S)

    def _progress(self, fd: int) -> None:
        p = self._pending.get(fd)
        if p is None:
            return
        try:
            chunk = p.sock.recv(REPLY_BYTES - len(p.got))
        except BlockingIOError:
            return
        except OSError as exc:
            self._refuse(fd, f"handshake failed: {exc}")
            return
        if not chunk:
            self._refuse(fd, "closed during the handshake")
            return
        p.got += chunk
        if len(p.got) < REPLY_BYTES:
            return
        nonce_c, mac = bytes(p.got[:auth._NONCE]), bytes(p.got[auth._NONCE:])
        if not hmac.compare_digest(mac, auth._mac(self.secret, b"c", self.context, p.nonce, nonce_c)):
            self._refuse(fd, "wrong HMAC (not the job secret)", tell=True)
            return
        self._forget(fd)
        try:
            p.sock.setblocking(True)
            p.sock.sendall(b"\x01" + auth._mac(self.secret, b"s", self.context, nonce_c, p.nonce))
        except OSError:
            p.sock.close()
            return
        threading.Thread(target=self._ready, args=(p.sock,), name="ringflow-admit", daemon=True).start()

    def _ready(self, conn: socket.socket) -> None:
        try:
            self.on_ready(conn)
        except Exception as exc:  # noqa: BLE001 - one bad client must never stop the gate
            log.warning("ringflow: dropped an authenticated connection during setup: %s", exc)
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
        self._log.warn("ringflow: refused connection from %s: %s", addr, why)
        if tell:
            try:
                p.sock.send(b"\x00")
            except OSError:
                pass
        p.sock.close()

    def _drop_oldest(self, k: int) -> None:
        for fd in list(self._pending)[:k]:
            self._refuse(fd, "dropped: too many connections waiting to authenticate")

    def _expire(self, now: float) -> None:
        for fd, p in list(self._pending.items()):
            if p.deadline <= now:
                self._refuse(fd, f"did not authenticate within {HANDSHAKE_BUDGET_S:g} s")
