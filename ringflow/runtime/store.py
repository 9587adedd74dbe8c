"""The rendezvous store: a small TCP key-value server with authenticated connections.

Operations: set, get (waits for the key, with a timeout), wait, add, compare-and-set,
delete, check. `PrefixStore` gives each communicator (and each group) its own namespace.
The server runs in a thread of rank 0, of the `ringflow run` launcher, or of a standalone
`ringflow store --port P` process. Every connection proves the job secret first
(`auth.server_handshake`); outsiders are refused and logged.

Wire format (after the handshake): a message is ``u32 length`` then ``u8 code`` then a list of
byte strings (``u32 count`` then ``u32 len + bytes`` each). Messages above 64 MiB are refused.
"""
from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator

from ..errors import InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout
from . import auth
from .gate import Gate

log = logging.getLogger("ringflow.runtime")

MAX_MSG_BYTES = 64 * 2**20
READ_SLICE_BYTES = 2**20
REPLY_TIMEOUT_S = 30.0   # a request's reply, on top of what it asks the store to wait for
_CTX = b"ringflow-store-v1"

SET, GET, ADD, CAS, DELETE, WAIT, CHECK, NKEYS = range(1, 9)
OK, TIMEOUT, ERR = 0, 1, 2
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


def _read_msg(sock: socket.socket, deadline: float, what: str) -> tuple[int, list[bytes]]:
    (n,) = _U32.unpack(auth.recv_exact(sock, 4, deadline, what))
    if n > MAX_MSG_BYTES:
        raise ProtocolError(f"{what}: message of {n} bytes exceeds {MAX_MSG_BYTES}")
    # read in slices: memory grows with the bytes that arrive, not with the size a client declares
    parts = [auth.recv_exact(sock, min(READ_SLICE_BYTES, n - got), deadline, what) for got in
             range(0, n, READ_SLICE_BYTES)]
    return decode(b"".join(parts))


class StoreServer:
    """A threaded key-value server; `address` is (host, port) once started."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: str | bytes = "") -> None:
        self._secret = auth.secret_bytes(secret)
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise RingflowSystemError(f"store cannot listen on {host}:{port}: {exc}",
                              "pick another port or stop the process using it") from None
        self._sock.listen(512)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        # strangers are challenged by the gate's one thread; an authenticated client gets a serving thread
        self._gate = Gate(self._sock, self._secret, _CTX, self._serve, "ringflow-store")

    @property
    def refused(self) -> int:
        """Connections refused so far (wrong secret, silent, or shed under a flood)."""
        return self._gate.refused

    def _serve(self, conn: socket.socket) -> None:
        with self._cond:
            self._conns.add(conn)
        try:
            while not self._stop.is_set():
                try:
                    code, args = _read_msg(conn, time.monotonic() + 86400.0 * 365, "store request")
                except (RemoteError, RingflowSystemError, Timeout):
                    return
                status, out = self._handle(code, args)
                conn.settimeout(30.0)
                conn.sendall(encode(status, out))
        except ProtocolError as exc:
            log.warning("ringflow store: dropping client after bad request: %s", exc)
        except OSError:
            pass
        finally:
            with self._cond:
                self._conns.discard(conn)
            conn.close()

    def _handle(self, code: int, args: list[bytes]) -> tuple[int, list[bytes]]:
        try:
            if code == SET and len(args) == 2:
                with self._cond:
                    self._data[args[0]] = args[1]
                    self._cond.notify_all()
                return OK, []
            if code == GET and len(args) == 2:
                if not self._wait_for([args[0]], float(args[1].decode()) if args[1] else 0.0):
                    return TIMEOUT, []
                with self._cond:
                    return OK, [self._data[args[0]]]
            if code == WAIT and len(args) >= 1:
                ok = self._wait_for(args[1:], float(args[0].decode()))
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

    def _wait_for(self, keys: list[bytes], timeout_s: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while not all(k in self._data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._cond.wait(min(left, 1.0))
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
            for c in list(self._conns):
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
        self._sock: socket.socket | None = self._connect(connect_timeout if connect_timeout is not None
                                                         else self.timeout)

    def _connect(self, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        last: OSError | None = None
        while True:
            try:
                s = socket.create_connection((self.host, self.port), timeout=max(0.1, deadline - time.monotonic()))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    auth.client_handshake(s, self._secret, _CTX, min(10.0, max(0.5, deadline - time.monotonic())),
                                          what=f"store {self.host}:{self.port}")
                except BaseException:
                    s.close()
                    raise
                return s
            except (TimeoutError, ConnectionRefusedError, ConnectionResetError) as exc:
                last = exc
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

    def _call(self, code: int, args: list[bytes], wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        limit = time.monotonic() + REPLY_TIMEOUT_S + wait_s
        bound = getattr(self._bound, "deadline", None)
        if bound is not None and bound < limit:
            limit = bound
        with self._lock:
            if self._sock is None:
                raise RingflowSystemError(f"store client for {self.host}:{self.port} is closed (closed, or an earlier "
                                          "request went unanswered)", "create a new Store; check the store process")
            try:
                self._sock.settimeout(max(0.01, limit - time.monotonic()))
                self._sock.sendall(encode(code, args))
                status, out = _read_msg(self._sock, limit, "store reply")
            except (TimeoutError, Timeout):
                self._sock.close()   # a reply may still come: this connection can no longer be trusted
                self._sock = None
                raise Timeout(f"the store {self.host}:{self.port} did not answer in time",
                              "the store process is stopped, overloaded or unreachable; raise the timeout") from None
            except (OSError, RemoteError) as exc:
                raise RingflowSystemError(f"store {self.host}:{self.port} connection failed: {exc}",
                                  "the store process (rank 0 or `ringflow store`) exited") from None
        if status == ERR:
            raise ProtocolError(f"store error: {out[0].decode(errors='replace') if out else '?'}")
        return status, out

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
            if self._sock is not None:
                self._sock.close()
                self._sock = None


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


def parse_addr(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port); the host must be a numeric address or 'localhost'."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"store address {addr!r} is not host:port", "e.g. 127.0.0.1:29400")
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    return host, int(port)
