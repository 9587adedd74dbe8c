"""The rendezvous store: a small TCP key-value server with authenticated connections.

Operations: set, get (waits for the key, with a timeout), wait, add, compare-and-set,
delete, check. `PrefixStore` gives each communicator (and each group) its own namespace.
The server runs in a thread of rank 0, of the `ringflow run` launcher, or of a standalone
`ringflow store --port P` process. Every connection proves the job secret first (the server's
`gate.Gate`); outsiders are refused and logged.

Wire format (after the handshake): a message is ``u32 length`` then ``u8 code`` then a list of
byte strings (``u32 count`` then ``u32 len + bytes`` each). A message above MAX_MSG_BYTES (64 MiB)
is refused: the client raises InvalidArgument before sending it, the server answers a declared
length above it with an error and closes the connection. The server reads a message in slices
(64 KiB doubling to 1 MiB), so its memory grows with the bytes that arrive, not with the length a
client declares.

Every client request ends by the caller's deadline: a waiting request (`get`, `wait`) after its
wait plus a grace (10% of it, 0.5 s to 30 s), any other after the client's `timeout` (30 s at
most), and inside `Store.bounded(deadline)` by that deadline. A request that ends unanswered
raises Timeout and drops the connection (a late reply must not answer the next request); the
next request dials again.

Authenticated connections are bounded (`RINGFLOW_STORE_MAX_CLIENTS`, `RINGFLOW_STORE_IDLE_TIMEOUT`): one that
sends nothing for the idle timeout is closed (one waiting in `get`/`wait` is busy, not idle), and a new one past
the cap takes the place of the one idle longest, or is refused (`StoreFull`) when all are busy. The server
says GONE before closing an idle connection and never serves a request that arrives on a connection it has
chosen to close, so the client dials again and resends: a closed idle connection costs a job nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator

from .. import config
from ..errors import InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout
from . import auth
from .gate import LISTEN_BACKLOG, Gate, RateLimitedLog

log = logging.getLogger("ringflow.runtime")

MAX_MSG_BYTES = 64 * 2**20
READ_SLICE_BYTES = 2**20
FIRST_SLICE_BYTES = 64 * 2**10
REPLY_TIMEOUT_S = 30.0   # the longest a request waits for its reply beyond what it asks the store to wait for
REPLY_GRACE_MIN_S = 0.5  # the least a waiting request (get, wait) allows for its reply beyond its wait
_CTX = b"ringflow-store-v1"

SET, GET, ADD, CAS, DELETE, WAIT, CHECK, NKEYS = range(1, 9)
OK, TIMEOUT, ERR, GONE = 0, 1, 2, 3   # GONE: unasked, before the server closes an idle connection
_U32 = struct.Struct("<I")


def encode(code: int, args: Iterable[bytes]) -> bytes:
    """One message: length, code, byte-string arguments."""
    args = list(args)
    parts = [bytes([code]), _U32.pack(len(args))]
    for a in args:
        parts.append(_U32.pack(len(a)))
        parts.append(a)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def decode(body: bytes) -> tuple[int, list[bytes]]:
    """Parse a message body (without its length prefix); ProtocolError on anything malformed."""
    if len(body) < 5:
        raise ProtocolError(f"store message too short ({len(body)} bytes)")
    code = body[0]
    (count,) = _U32.unpack_from(body, 1)
    off, args = 5, []
    if count > len(body):
        raise ProtocolError(f"store message claims {count} arguments in {len(body)} bytes")
    for _ in range(count):
        if off + 4 > len(body):
            raise ProtocolError("store message truncated in an argument length")
        (n,) = _U32.unpack_from(body, off)
        off += 4
        if off + n > len(body):
            raise ProtocolError(f"store message argument of {n} bytes overruns the message")
        args.append(body[off:off + n])
        off += n
    if off != len(body):
        raise ProtocolError(f"{len(body) - off} trailing bytes in a store message")
    return code, args


class PortInUse(RingflowSystemError):
    """The store's port is already taken (by a running store, or by another program)."""


class StoreFull(RingflowSystemError):
    """The store serves its cap of authenticated connections and none of them is idle."""


@dataclasses.dataclass
class _Client:
    idle_since: float
    busy: bool = False    # serving a request (a waiting get/wait included)
    gone: bool = False    # chosen to close: a request that still arrives is not served


def _read_msg(sock: socket.socket, deadline: float, what: str,
              body_s: float | None = None) -> tuple[int, list[bytes]]:
    """One message, its length by `deadline` and the rest by then (or within `body_s` of the length)."""
    (n,) = _U32.unpack(auth.recv_exact(sock, 4, deadline, what))
    deadline = deadline if body_s is None else time.monotonic() + body_s
    if n > MAX_MSG_BYTES:
        raise ProtocolError(f"{what}: message of {n} bytes exceeds the store's limit of {MAX_MSG_BYTES} bytes",
                            "the store holds small metadata; send bulk data through a communicator")
    # read in slices of 64 KiB doubling to 1 MiB: memory grows with the bytes that arrive, not with the length
    # a client declares
    parts: list[bytes] = []
    got, step = 0, FIRST_SLICE_BYTES
    while got < n:
        parts.append(auth.recv_exact(sock, min(step, n - got), deadline, what))
        got += len(parts[-1])
        step = min(2 * step, READ_SLICE_BYTES)
    return decode(b"".join(parts))


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
                self._close_locked(victim, f"closed to make room: the store serves at most {self.max_clients}")
                self.evicted += 1
            self._clients[conn] = _Client(now)
        return None

    def _close_locked(self, conn: socket.socket, why: str) -> None:
        """Say GONE and shut `conn` down (its thread then closes it); the caller holds the lock."""
        c = self._clients.pop(conn, None)
        if c is not None:
            c.gone = True
        try:
            conn.send(encode(GONE, [why.encode()]), socket.MSG_DONTWAIT)
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


class Store:
    """A client of StoreServer. Thread-safe (one request at a time)."""

    def __init__(self, host: str, port: int, secret: str | bytes, *, timeout: float = 300.0,
                 connect_timeout: float | None = None) -> None:
        self.host, self.port, self.timeout = host, int(port), float(timeout)
        self._secret = auth.secret_bytes(secret)
        self._lock = threading.Lock()
        self._bound = threading.local()   # a caller's deadline (`bounded`) caps every request it makes
        self._closed = False
        self._failed = ""   # why the connection broke (the store exited): later requests fail at once
        self._sock: socket.socket | None = self._connect(connect_timeout if connect_timeout is not None
                                                         else self.timeout)

    def _connect(self, timeout_s: float, refused_fails: bool = False) -> socket.socket:
        """A new authenticated connection; with `refused_fails`, a refused dial is not retried (the store exited)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        last: OSError | None = None
        while True:
            try:
                s = socket.create_connection((self.host, self.port),
                                             timeout=max(0.05, min(deadline - time.monotonic(), 10.0)))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    auth.client_handshake(s, self._secret, _CTX, max(0.05, min(10.0, deadline - time.monotonic())),
                                          what=f"store {self.host}:{self.port}")
                except BaseException:
                    s.close()
                    raise
                return s
            except auth.Busy as exc:
                cap = (exc.detail or {}).get("reason", "?")
                raise StoreFull(f"the store at {self.host}:{self.port} refused the connection: it serves its cap of "
                                f"{cap} connections (RINGFLOW_STORE_MAX_CLIENTS) and none is idle",
                                "raise RINGFLOW_STORE_MAX_CLIENTS where the store runs (rank 0, `ringflow run` or "
                                "`ringflow store`) above the ranks and clients of the job, or close idle clients"
                                ) from None
            except ConnectionRefusedError as exc:
                if refused_fails:
                    raise
                last = exc
            except (TimeoutError, ConnectionResetError, auth.Dropped) as exc:
                last = exc   # auth.Dropped: the server shed this handshake (a flood of strangers); dial again
            except OSError as exc:
                if isinstance(exc, (RingflowSystemError, Timeout)):
                    raise
                last = exc
            if time.monotonic() + delay > deadline:
                raise Timeout(f"could not reach the store at {self.host}:{self.port} within {timeout_s:.1f}s "
                              f"({last})", "start rank 0 / `ringflow store`, or check RINGFLOW_STORE_ADDR")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    @contextlib.contextmanager
    def bounded(self, deadline: float) -> Iterator[None]:
        """Every request this thread makes inside the block ends by `deadline` (time.monotonic()), answered or
        with Timeout: the store's fixed reply timeout never outlives a caller's."""
        old = getattr(self._bound, "deadline", None)
        self._bound.deadline = deadline if old is None else min(old, deadline)
        try:
            yield
        finally:
            self._bound.deadline = old

    def reply_limit(self, wait_s: float = 0.0) -> float:
        """When (time.monotonic()) a request asking the server to wait `wait_s` gives up on its reply."""
        if wait_s > 0:
            grace = min(REPLY_TIMEOUT_S, max(REPLY_GRACE_MIN_S, 0.1 * wait_s))
        else:
            grace = min(REPLY_TIMEOUT_S, max(REPLY_GRACE_MIN_S, self.timeout))
        limit = time.monotonic() + wait_s + grace
        bound = getattr(self._bound, "deadline", None)
        return limit if bound is None else min(limit, bound)

    def _call(self, code: int, args: list[bytes], wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        msg = encode(code, args)
        if len(msg) - 4 > MAX_MSG_BYTES:
            raise InvalidArgument(f"store request of {len(msg) - 4} bytes exceeds the limit of {MAX_MSG_BYTES}",
                                  "the store holds small metadata; send bulk data through a communicator")
        limit = self.reply_limit(wait_s)
        where = f"store {self.host}:{self.port}"
        with self._lock:
            if self._closed:
                raise RingflowSystemError(f"the client of {where} is closed", "create a new Store")
            if self._failed:
                raise RingflowSystemError(f"{where} connection failed earlier: {self._failed}",
                                          "the store process (rank 0 or `ringflow store`) exited")
            for again in (False, True):
                status, out = self._exchange(msg, limit, where, again)
                if status != GONE:
                    break
                self._drop()   # closed while idle, unserved: dial again and resend
            else:
                raise RingflowSystemError(f"{where} closed two connections in a row before serving a request",
                                          "the store is full of busy clients or restarting; retry later")
        if status == ERR:
            raise ProtocolError(f"store error: {out[0].decode(errors='replace') if out else '?'}")
        return status, out

    def _exchange(self, msg: bytes, limit: float, where: str, again: bool) -> tuple[int, list[bytes]]:
        """Send `msg` and read its reply (GONE: the server closed the connection, unserved); the caller holds
        the lock. A connection the server closed while it was idle is replaced before sending, and a request
        that meets a closed connection is sent again on a new one, unless `again` says it already was."""
        if self._sock is not None and not again and _closed_by_peer(self._sock):
            self._drop()
        if self._sock is None:   # new, after an unanswered request, or closed by the store while idle
            left = limit - time.monotonic()
            if left <= 0:
                raise Timeout(f"no time left to reconnect to {where}", "raise the timeout")
            try:
                self._sock = self._connect(left, refused_fails=True)
            except ConnectionRefusedError as exc:
                self._failed = f"it refuses new connections ({exc})"
                raise RingflowSystemError(f"{where} connection failed: {self._failed}",
                                          "the store process (rank 0 or `ringflow store`) exited") from None
        sock = self._sock
        try:
            sock.settimeout(max(0.001, limit - time.monotonic()))
            sock.sendall(msg)
            return _read_msg(sock, limit, "store reply")
        except (TimeoutError, Timeout):
            self._drop()   # a late reply must not answer the next request
            raise Timeout(f"the {where} did not answer within the caller's deadline",
                          "the store process is stopped, overloaded or unreachable; check it, or raise the "
                          "timeout") from None
        except ProtocolError as exc:
            self._drop()
            raise ProtocolError(f"{where} sent a malformed reply: {exc}", "run the same ringflow version") from None
        except (OSError, RemoteError) as exc:
            self._drop()
            if not again:   # the store never serves a request on a connection it closes: resend it
                return GONE, [str(exc).encode()]
            self._failed = str(exc)
            raise RingflowSystemError(f"{where} connection failed: {exc}",
                                      "the store process (rank 0 or `ringflow store`) exited") from None

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @staticmethod
    def _key(key: str | bytes) -> bytes:
        return key if isinstance(key, bytes) else key.encode()

    def set(self, key: str, value: bytes | str) -> None:
        """Set key to value (waking waiters)."""
        self._call(SET, [self._key(key), value if isinstance(value, bytes) else value.encode()])

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of key, waiting until it is set (Timeout after `timeout` seconds)."""
        t = self.timeout if timeout is None else float(timeout)
        status, out = self._call(GET, [self._key(key), repr(t).encode()], t)
        if status == TIMEOUT:
            raise Timeout(f"store key {key!r} not set within {t:.1f}s",
                          "a rank did not arrive; check that every rank started and called the same function")
        return out[0]

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Wait until every key is set."""
        bkeys = [self._key(k) for k in keys]
        t = self.timeout if timeout is None else float(timeout)
        status, _ = self._call(WAIT, [repr(t).encode(), *bkeys], t)
        if status == TIMEOUT:
            raise Timeout(f"store keys not all set within {t:.1f}s: {[k.decode() for k in bkeys][:8]}",
                          "a rank did not arrive; check that every rank started")

    def check(self, keys: Iterable[str]) -> bool:
        """True if every key is set (no waiting)."""
        _, out = self._call(CHECK, [self._key(k) for k in keys])
        return out[0] == b"1"

    def add(self, key: str, delta: int = 1) -> int:
        """Atomically add delta to an integer key (missing = 0); the new value."""
        _, out = self._call(ADD, [self._key(key), str(int(delta)).encode()])
        return int(out[0])

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bool, bytes | None]:
        """Set key to desired if it equals expected (None: if absent); (swapped, current value)."""
        _, out = self._call(CAS, [self._key(key), b"0" if expected is None else b"1", expected or b"", desired])
        swapped = out[0] == b"1"
        return swapped, (out[1] if (swapped or out[1]) else None)

    def delete(self, key: str) -> bool:
        """Remove key; True if it existed."""
        _, out = self._call(DELETE, [self._key(key)])
        return out[0] == b"1"

    def num_keys(self) -> int:
        """How many keys the server holds."""
        _, out = self._call(NKEYS, [])
        return int(out[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._closed = True
            self._drop()


class PrefixStore:
    """A namespace inside a store: every key gets `prefix/`."""

    def __init__(self, prefix: str, store: Store | PrefixStore) -> None:
        if not prefix:
            raise InvalidArgument("empty store prefix")
        self.prefix, self.base = prefix, store

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def bounded(self, deadline: float) -> contextlib.AbstractContextManager[None]:
        """`Store.bounded` of the store below."""
        return self.base.bounded(deadline)

    def set(self, key: str, value: bytes | str) -> None:
        """Set key in this namespace."""
        self.base.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Get (waiting) key in this namespace."""
        return self.base.get(self._k(key), timeout)

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Wait for keys in this namespace."""
        self.base.wait([self._k(k) for k in keys], timeout)

    def check(self, keys: Iterable[str]) -> bool:
        """True if all keys exist in this namespace."""
        return self.base.check([self._k(k) for k in keys])

    def add(self, key: str, delta: int = 1) -> int:
        """Atomic add in this namespace."""
        return self.base.add(self._k(key), delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bool, bytes | None]:
        """Compare-and-set in this namespace."""
        return self.base.compare_set(self._k(key), expected, desired)

    def delete(self, key: str) -> bool:
        """Delete in this namespace."""
        return self.base.delete(self._k(key))

    @property
    def timeout(self) -> float:
        return self.base.timeout


def _closed_by_peer(sock: socket.socket) -> bool:
    """True if the server closed `sock` (EOF, or its unasked GONE waiting to be read): it cannot carry a request."""
    try:
        sock.settimeout(0.0)   # with a timeout, Python would wait for data before trying
        return sock.recv(1, socket.MSG_PEEK) is not None
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def parse_addr(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port); the host must be a numeric address or 'localhost'."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"store address {addr!r} is not host:port", "e.g. 127.0.0.1:29400")
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    return host, int(port)
