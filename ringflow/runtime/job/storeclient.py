"""The client of the rendezvous store (`store.StoreServer`): `Store`, and `PrefixStore` for a namespace.

Every client request ends by the caller's deadline: a waiting request (`get`, `wait`) after its
wait plus a grace (10% of it, 0.5 s to 30 s), any other after the client's `timeout` (30 s at
most), and inside `Store.bounded(deadline)` by that deadline. A request that ends unanswered
raises Timeout and drops the connection (a late reply must not answer the next request); the
next request dials again.

A connection the server closed while it was idle (its idle timeout, or to make room under its cap) is
replaced before the next request; a request that meets a connection closing under it is sent again on a
new one, which is safe because the server never serves a request on a connection it has chosen to close.
A server whose connections are all busy refuses a new one: `StoreFull`.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator

from ...errors import InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout
from . import auth
from .storewire import (
    ADD,
    CAS,
    CHECK,
    CONTEXT,
    DELETE,
    ERR,
    GET,
    GONE,
    MAX_MSG_BYTES,
    NKEYS,
    REPLY_TIMEOUT_S,
    SET,
    TIMEOUT,
    WAIT,
    encode,
    read_msg,
)

REPLY_GRACE_MIN_S = 0.5  # the least a waiting request (get, wait) allows for its reply beyond its wait


class StoreFull(RingflowSystemError):
    """The store serves its cap of authenticated connections and none of them is idle."""


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
                    auth.client_handshake(s, self._secret, CONTEXT, max(0.05, min(10.0, deadline - time.monotonic())),
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
            return read_msg(sock, limit, "store reply")
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
