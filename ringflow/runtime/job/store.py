"""The rendezvous store: a small TCP key-value server with authenticated connections.

Operations: set, get (waits for the key, with a timeout), wait, add, compare-and-set,
delete, check. `PrefixStore` gives each communicator (and each group) its own namespace.
The server runs in a thread of rank 0, of the `ringflow run` launcher, or of a standalone
`ringflow store --port P` process. Every connection proves the job secret first (the server's
`gate.Gate`); outsiders are refused and logged.

The wire format is `storewire`'s, the client (`Store`, `PrefixStore`) `storeclient`'s.

Authenticated connections are bounded (`RINGFLOW_STORE_MAX_CLIENTS`, `RINGFLOW_STORE_IDLE_TIMEOUT`): one that
sends nothing for the idle timeout is closed (one waiting in `get`/`wait` is busy, not idle), and a new one past
the cap takes the place of the one idle longest, or is refused (`StoreFull`) when all are busy. The server
says GONE before closing an idle connection and never serves a request that arrives on a connection it has
chosen to close, so the client dials again and resends: a closed idle connection costs a job nothing.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import threading
import time

from ... import config
from ...errors import InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout
from . import auth
from .gate import LISTEN_BACKLOG, Gate, RateLimitedLog
from .storeclient import PrefixStore as PrefixStore
from .storeclient import Store as Store
from .storeclient import StoreFull as StoreFull
from .storeclient import parse_addr as parse_addr
from .storewire import ADD, CAS, CHECK, DELETE, ERR, GET, GONE, NKEYS, OK, REPLY_TIMEOUT_S, SET, TIMEOUT, WAIT, encode
from .storewire import CONTEXT as _CTX
from .storewire import MAX_MSG_BYTES as MAX_MSG_BYTES
from .storewire import decode as decode
from .storewire import read_msg as _read_msg

log = logging.getLogger("ringflow.runtime")


class PortInUse(RingflowSystemError):
    """The store's port is already taken (by a running store, or by another program)."""


@dataclasses.dataclass
class _Client:
    idle_since: float
    busy: bool = False    # serving a request (a waiting get/wait included)
    gone: bool = False    # chosen to close: a request that still arrives is not served


def _hung_up(sock: socket.socket) -> bool:
    """True if the client closed `sock` (its EOF is next to read) or the connection failed."""
    try:
        sock.settimeout(0.0)   # with a timeout, Python would wait for data before trying
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


class StoreServer:
    """A threaded key-value server; `address` is (host, port) once started."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: str | bytes = "", *,
                 idle_timeout_s: float | None = None, max_clients: int | None = None) -> None:
        self._secret = auth.secret_bytes(secret)
        self.idle_timeout_s = float(config.get("STORE_IDLE_TIMEOUT") if idle_timeout_s is None else idle_timeout_s)
        self.max_clients = int(config.get("STORE_MAX_CLIENTS") if max_clients is None else max_clients)
        if not self.idle_timeout_s >= 0:
            raise InvalidArgument(f"store idle timeout {self.idle_timeout_s} s",
                                  "RINGFLOW_STORE_IDLE_TIMEOUT: seconds >= 0 (0: never close idle connections)")
        if self.max_clients < 1:
            raise InvalidArgument(f"store connection cap {self.max_clients}",
                                  "RINGFLOW_STORE_MAX_CLIENTS: at least 1, above the ranks of the largest job")
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._clients: dict[socket.socket, _Client] = {}   # admitted, oldest first
        self.idle_closed = 0    # connections closed after the idle timeout
        self.evicted = 0        # idle connections closed to make room under the cap
        self._full_log = RateLimitedLog("store-full refusals")
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"store cannot listen on {host}:{port}: the port is already in use",
                    f"pick another port (0: any free one), stop the process using it (`ss -ltnp 'sport = :{port}'`),"
                    f" or, if a ringflow store already runs there, set RINGFLOW_STORE_ADDR={host}:{port} and "
                    "connect to it instead of starting one") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise RingflowSystemError(f"store cannot listen on {host}:{port}: {host} is not an address of this "
                                          "host", "bind 127.0.0.1 (one host) or this host's own address") from None
            raise RingflowSystemError(f"store cannot listen on {host}:{port}: {exc}",
                                      "pick another port (ports below 1024 need privileges)") from None
        self._sock.listen(LISTEN_BACKLOG)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        # strangers are challenged by the gate's one thread; an authenticated client gets a serving thread
        self._gate = Gate(self._sock, self._secret, _CTX, self._serve, "ringflow-store", admit=self._admit)

    @property
    def refused(self) -> int:
        """Connections refused so far (wrong secret, silent, or shed under a flood)."""
        return self._gate.refused

    @property
    def full_refused(self) -> int:
        """Clients with the secret refused because the cap was reached and no connection was idle."""
        return self._gate.busy

    @property
    def clients(self) -> int:
        """Authenticated connections held now."""
        with self._cond:
            return len(self._clients)

    def _admit(self, conn: socket.socket) -> bytes | None:
        """On the gate thread: make room for `conn` (closing the connection idle longest) or say why not."""
        now = time.monotonic()
        with self._cond:
            for s in [s for s in self._clients if s.fileno() < 0]:   # the gate closed it before its thread ran
                del self._clients[s]
            if len(self._clients) >= self.max_clients:
                idle = [(c.idle_since, i, s) for i, (s, c) in enumerate(self._clients.items()) if not c.busy]
                if not idle:
                    self._full_log.warn("ringflow store: refused a client with the secret: all %d connections "
                                        "(RINGFLOW_STORE_MAX_CLIENTS) are busy", self.max_clients)
                    return str(self.max_clients).encode()
                victim = min(idle)[2]
                self._close_locked(victim)   # the client sees EOF and dials again
                self.evicted += 1
            self._clients[conn] = _Client(now)
        return None

    def _close_locked(self, conn: socket.socket, why: str = "") -> None:
        """Shut `conn` down, saying GONE first if `why` (its own thread only: a send could wait), so that its
        thread closes it and serves nothing more; the caller holds the lock."""
        c = self._clients.pop(conn, None)
        if c is not None:
            c.gone = True
        try:
            if why:
                conn.settimeout(0.0)
                conn.send(encode(GONE, [why.encode()]))
        except OSError:
            pass
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _serve(self, conn: socket.socket) -> None:
        with self._cond:
            c = self._clients.get(conn)
        idle_s = self.idle_timeout_s or 86400.0 * 365
        try:
            while c is not None and not self._stop.is_set():
                try:
                    code, args = _read_msg(conn, time.monotonic() + idle_s, "store request",
                                           max(idle_s, REPLY_TIMEOUT_S))
                except ProtocolError as exc:   # an oversized or malformed request: say why, then hang up
                    conn.settimeout(1.0)
                    conn.sendall(encode(ERR, [str(exc).encode()]))
                    raise
                except Timeout:
                    with self._cond:
                        if not c.gone:
                            self.idle_closed += 1
                            self._close_locked(conn, f"idle for {idle_s:g} s (RINGFLOW_STORE_IDLE_TIMEOUT)")
                    return
                except (RemoteError, RingflowSystemError):
                    return
                with self._cond:
                    if c.gone:   # chosen to close while this request arrived: the client resends it elsewhere
                        return
                    c.busy = True
                status, out = self._handle(code, args, conn)
                conn.settimeout(30.0)
                conn.sendall(encode(status, out))
                with self._cond:
                    c.busy, c.idle_since = False, time.monotonic()
        except ProtocolError as exc:
            log.warning("ringflow store: dropping client after bad request: %s", exc)
        except OSError:
            pass
        finally:
            with self._cond:
                if c is not None and self._clients.get(conn) is c:
                    del self._clients[conn]
            conn.close()

    def _handle(self, code: int, args: list[bytes], conn: socket.socket | None = None) -> tuple[int, list[bytes]]:
        try:
            if code == SET and len(args) == 2:
                with self._cond:
                    self._data[args[0]] = args[1]
                    self._cond.notify_all()
                return OK, []
            if code == GET and len(args) == 2:
                if not self._wait_for([args[0]], float(args[1].decode()) if args[1] else 0.0, conn):
                    return TIMEOUT, []
                with self._cond:
                    return OK, [self._data[args[0]]]
            if code == WAIT and len(args) >= 1:
                ok = self._wait_for(args[1:], float(args[0].decode()), conn)
                return (OK if ok else TIMEOUT), []
            if code == CHECK:
                with self._cond:
                    return OK, [b"1" if all(k in self._data for k in args) else b"0"]
            if code == ADD and len(args) == 2:
                with self._cond:
                    v = int(self._data.get(args[0], b"0")) + int(args[1])
                    self._data[args[0]] = str(v).encode()
                    self._cond.notify_all()
                return OK, [str(v).encode()]
            if code == CAS and len(args) == 4:
                # args: key, expect_present(b"0"/b"1"), expected, desired
                with self._cond:
                    cur = self._data.get(args[0])
                    matches = (cur is None) if args[1] == b"0" else (cur == args[2])
                    if matches:
                        self._data[args[0]] = args[3]
                        self._cond.notify_all()
                        return OK, [b"1", args[3]]
                    return OK, [b"0", cur if cur is not None else b""]
            if code == DELETE and len(args) == 1:
                with self._cond:
                    existed = self._data.pop(args[0], None) is not None
                return OK, [b"1" if existed else b"0"]
            if code == NKEYS:
                with self._cond:
                    return OK, [str(len(self._data)).encode()]
        except (ValueError, KeyError) as exc:
            return ERR, [f"bad arguments: {exc}".encode()]
        return ERR, [f"unknown store request {code} with {len(args)} arguments".encode()]

    def _wait_for(self, keys: list[bytes], timeout_s: float, conn: socket.socket | None) -> bool:
        now = time.monotonic()
        deadline, look = now + max(0.0, timeout_s), now + 1.0
        with self._cond:
            while not all(k in self._data for k in keys):
                now = time.monotonic()
                if now >= deadline or self._stop.is_set():
                    return False
                if conn is not None and now >= look:   # a client gone mid-wait frees its thread within a second
                    if _hung_up(conn):
                        return False
                    look = now + 1.0
                self._cond.wait(min(deadline - now, 1.0))
            return True

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._stop.set()
        self._gate.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._cond:
            for c in list(self._clients):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._cond.notify_all()
