"""TCP transport: authenticated, persistent, one-directional connections per (peer, key).

The sender of a connection dials the receiver's listener, proves the job secret (`auth`),
and sends a HELLO frame naming the communicator, its rank and the connection key. Data frames
are a validated 48-byte header (`frames`) followed by the payload, which the receiver reads with
``recv_into`` straight into the destination (or into a staging buffer it reduces from, in
slices, so reduction overlaps the transfer). Sockets are non-blocking, TCP_NODELAY, with large
buffers, the communicator's IP_TOS and, to same-host peers, a congestion control that does not
pace (RINGFLOW_TCP_CONGESTION). Peer addresses are numeric: no name is ever resolved.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import logging
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ... import config
from ...errors import ConfigError, InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout
from ..job import auth
from ..job.gate import LISTEN_BACKLOG, Gate
from . import frames
from .base import Mismatch, Sink, XferOp
from .frames import HEADER_BYTES, Kind

log = logging.getLogger("ringflow.runtime")

TRANSPORT_CTX = b"ringflow-transport-v1"
SOCK_BUF_BYTES = 4 * 2**20
REDUCE_STAGE_BYTES = 1 * 2**20
MAX_CHECK_BYTES = 64 * 1024
_SIOCGIFADDR = 0x8915


def interface_addresses() -> list[tuple[str, str]]:
    """(interface name, IPv4 address) for every interface with an IPv4 address."""
    out = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            out.append((name, socket.inet_ntoa(res[20:24])))
    finally:
        s.close()
    return out


def select_interface(spec: str = "", available: list[tuple[str, str]] | None = None) -> tuple[str, str]:
    """Pick (ifname, address) with NCCL_SOCKET_IFNAME syntax.

    ``eth`` prefix match, ``^docker,lo`` excludes prefixes, ``=eth0`` exact names (comma lists allowed).
    Without a spec: the first interface that is not loopback or docker; loopback only when named, or
    when nothing else exists (a warning says so).
    """
    avail = interface_addresses() if available is None else available
    spec = spec.strip()
    if spec:
        exclude = spec.startswith("^")
        body = spec[1:] if exclude else spec
        exact = body.startswith("=")
        body = body[1:] if exact else body
        pats = [p for p in body.split(",") if p]

        def hit(name: str) -> bool:
            return any(name == p if exact else name.startswith(p) for p in pats)

        chosen = [(n, a) for n, a in avail if (not hit(n) if exclude else hit(n))]
        if exclude:
            chosen = [(n, a) for n, a in chosen if not n.startswith("lo")] or \
                     [(n, a) for n, a in chosen]
        if not chosen:
            raise InvalidArgument(f"RINGFLOW_SOCKET_IFNAME={spec!r} matches no interface with an IPv4 address",
                                  f"available: {', '.join(f'{n} ({a})' for n, a in avail) or 'none'}")
        return chosen[0]
    chosen = [(n, a) for n, a in avail if not n.startswith(("lo", "docker"))]
    if chosen:
        return chosen[0]
    lo = [(n, a) for n, a in avail if n.startswith("lo")]
    if lo:
        log.info("ringflow: no non-loopback interface; using %s", lo[0][0])
        return lo[0]
    raise RingflowSystemError("no network interface with an IPv4 address", "bring one up or set RINGFLOW_SOCKET_IFNAME")


AVAILABLE_CC_PATH = "/proc/sys/net/ipv4/tcp_available_congestion_control"
# congestion controls without pacing, tried in order for same-host peers (reno is always built in)
SAME_HOST_CC = ("cubic", "reno")


def congestion_for(peer_ip: str, setting: str | None = None) -> tuple[tuple[str, ...], bool]:
    """(the congestion controls to try in order on a socket to `peer_ip`, whether the user named one)
    from RINGFLOW_TCP_CONGESTION (or `setting`).

    `auto`: a same-host peer (loopback or one of this host's addresses) gets a non-pacing algorithm,
    since BBR paces loopback too: after a bulk transfer each 64 KiB message waits ~40 us for its
    pacing slot. Any other peer, and `system`, keep the kernel's default (nothing to try)."""
    name = (config.get("TCP_CONGESTION") if setting is None else setting).strip().lower()
    if name == "system":
        return (), False
    if name == "auto":
        return (SAME_HOST_CC if _same_host(peer_ip) else ()), False
    return (name,), True


def _same_host(ip: str) -> bool:
    try:
        if ipaddress.ip_address(ip).is_loopback:
            return True
    except ValueError:
        return False
    return ip in {a for _, a in interface_addresses()}


def set_congestion(sock: socket.socket, names: tuple[str, ...], strict: bool) -> str | None:
    """Set the first of `names` the kernel accepts on `sock`; which one (None: none tried or accepted).
    `strict` (a name the user chose): one the kernel refuses is a ConfigError."""
    for name in names:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
            return name
        except OSError as exc:
            if strict:
                try:
                    with open(AVAILABLE_CC_PATH) as fh:
                        avail = fh.read().split()
                except OSError:
                    avail = []
                raise ConfigError(f"RINGFLOW_TCP_CONGESTION={name!r} is refused by the kernel ({exc.strerror})",
                                  f"use auto, system or one of: {', '.join(avail) or 'see ' + AVAILABLE_CC_PATH}"
                                  " (modprobe tcp_<name> to add one)") from None
    return None


def tune_socket(sock: socket.socket, tos: int | None, peer_ip: str | None = None) -> None:
    """TCP_NODELAY, big buffers, keepalive, the traffic class (IP_TOS) if given, and the congestion
    control RINGFLOW_TCP_CONGESTION picks for `peer_ip`."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF_BYTES)
        except OSError:
            pass
    if tos is not None and tos >= 0:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(tos))
    if peer_ip is not None:
        set_congestion(sock, *congestion_for(peer_ip))


def send_frame(sock: socket.socket, lock: threading.Lock, kind: Kind, seq: int, payload: bytes = b"",
               timeout_s: float = 5.0, **fields: int) -> None:
    """Send one small frame on a blocking-with-timeout socket (control traffic)."""
    with lock:
        sock.settimeout(timeout_s)
        sock.sendall(frames.pack(kind, seq, len(payload), **fields) + payload)


def read_frame(sock: socket.socket, deadline: float, peer: object, expect_seq: int | None,
               max_nbytes: int = frames.MAX_CTRL_BYTES) -> tuple[frames.Frame, bytes]:
    """Read one small frame (header + payload) from a blocking socket."""
    hdr = auth.recv_exact(sock, HEADER_BYTES, deadline, f"frame header from {peer}")
    f = frames.parse(hdr, peer=peer, expect_seq=expect_seq, max_nbytes=max_nbytes)
    body = auth.recv_exact(sock, f.nbytes, deadline, f"frame payload from {peer}") if f.nbytes else b""
    return f, body


def dial(addr: tuple[str, int], secret: bytes, hello: dict, tos: int | None, deadline: float,
         what: str) -> socket.socket:
    """Connect to a peer's listener, authenticate, send HELLO; retries until the deadline."""
    delay, last = 0.002, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"could not connect to {what} at {addr[0]}:{addr[1]} ({last})",
                          "the peer did not start or the interface is wrong (RINGFLOW_SOCKET_IFNAME)")
        payload = json.dumps(hello).encode()
        if len(payload) > frames.MAX_HELLO_BYTES:
            raise InvalidArgument(f"HELLO of {len(payload)} bytes exceeds {frames.MAX_HELLO_BYTES}",
                                  "keep communicator ids and connection keys short")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tune_socket(s, tos, addr[0])
            s.settimeout(min(left, 5.0))
            s.connect(addr)
            # the listener sheds handshakes under a flood of strangers (auth.Dropped): dial again until the deadline
            auth.client_handshake(s, secret, TRANSPORT_CTX, max(0.05, min(deadline - time.monotonic(), 10.0)),
                                  what=what)
            s.settimeout(max(0.05, min(deadline - time.monotonic(), 5.0)))
            s.sendall(frames.pack(Kind.HELLO, 0, len(payload)) + payload)
            return s
        except (TimeoutError, ConnectionRefusedError, ConnectionResetError, auth.Dropped) as exc:
            s.close()
            last = exc
        except BaseException:
            s.close()
            raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


class Listener:
    """Accepts authenticated connections for one communicator and hands them out by (peer, key)."""

    def __init__(self, address: str, secret: bytes, uid: str, tos: int | None,
                 on_ctrl: Callable[[int, socket.socket], None], on_data: Callable[[int, str], None]) -> None:
        self.secret, self.uid, self.tos = secret, uid, tos
        self.on_ctrl, self.on_data = on_ctrl, on_data
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(LISTEN_BACKLOG)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self._cond = threading.Condition()
        self._conns: dict[tuple[int, str], socket.socket] = {}
        self._closed = False
        # strangers are challenged by the gate's one thread; only authenticated connections reach _admit
        self._gate = Gate(self.sock, secret, TRANSPORT_CTX, self._admit, "ringflow-listen")

    def _admit(self, conn: socket.socket) -> None:
        """An authenticated connection: read its HELLO and hand it to the control or data side."""
        try:
            peer_addr = conn.getpeername()
        except OSError:
            peer_addr = "?"
        f, body = read_frame(conn, time.monotonic() + 5.0, f"connection from {peer_addr}", 0,
                             max_nbytes=frames.MAX_HELLO_BYTES)
        if f.kind != Kind.HELLO:
            raise ProtocolError(f"first frame from {peer_addr} is {f.kind.name}, not HELLO")
        hello = json.loads(body)
        if not isinstance(hello, dict) or not {"uid", "rank", "key"} <= hello.keys():
            raise ProtocolError(f"malformed HELLO from {peer_addr}", "run the same ringflow version on every rank")
        if hello.get("uid") != self.uid:
            raise ProtocolError(f"connection from {peer_addr} is for communicator {hello.get('uid')!r}, "
                                f"not {self.uid!r}")
        peer, key = int(hello["rank"]), str(hello["key"])
        tune_socket(conn, self.tos, peer_addr[0] if isinstance(peer_addr, tuple) else None)
        if self._closed:  # the communicator went away while this connection was being admitted
            conn.close()
            return
        if key == "ctrl":
            self.on_ctrl(peer, conn)
            return
        conn.setblocking(False)
        with self._cond:
            if self._closed:
                conn.close()
                return
            old = self._conns.pop((peer, key), None)
            self._conns[(peer, key)] = conn
            self._cond.notify_all()
        if old is not None:
            old.close()
        self.on_data(peer, key)

    def take(self, peer: int, key: str) -> socket.socket | None:
        """The accepted connection from `peer` for `key`, if it has arrived."""
        with self._cond:
            return self._conns.pop((peer, key), None)

    def close(self) -> None:
        """Stop accepting and close unclaimed connections."""
        self._closed = True
        self._gate.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._cond:
            for c in self._conns.values():
                c.close()
            self._conns.clear()


class TcpOut:
    """The sending side of one data connection."""

    def __init__(self, sock: socket.socket, peer: int, channel: int) -> None:
        sock.setblocking(False)
        self.sock, self.peer, self.channel = sock, peer, channel
        self.fd = sock.fileno()
        self.seq = 1  # frame 0 was HELLO
        self.queue: deque = deque()

    def send(self, src_u8: np.ndarray, kind: Kind, sig: int, op_seq: int, tag: int, lone: bool = False,
             copied: bool = True) -> TcpSend:
        """Start sending one message (`lone` and `copied` are shared-memory hints; sockets ignore them)."""
        hdr = frames.pack(kind, self.seq, int(src_u8.shape[0]), channel=self.channel, op_seq=op_seq,
                          sig=sig, tag=tag)
        self.seq += 1
        op = TcpSend(self, hdr, src_u8)
        op._post(self)
        return op

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class TcpSend(XferOp):
    """One outgoing message on TCP."""

    def __init__(self, o: TcpOut, hdr: bytes, src_u8: np.ndarray) -> None:
        self.o, self.hdr, self.payload = o, memoryview(hdr), src_u8.data if src_u8.shape[0] else memoryview(b"")
        self.hoff, self.off, self.total = 0, 0, int(src_u8.shape[0])
        self.done, self.peer, self.moved = False, o.peer, False
        self.fds = ((o.fd, select.POLLOUT),)

    def progress(self) -> bool:
        if self.o.queue[0] is not self:
            return False
        moved = False
        sock = self.o.sock
        try:
            while not self.done:
                if self.hoff < HEADER_BYTES:
                    n = sock.sendmsg([self.hdr[self.hoff:], self.payload[self.off:]])
                    h = min(n, HEADER_BYTES - self.hoff)
                    self.hoff += h
                    self.off += n - h
                else:
                    n = sock.send(self.payload[self.off:])
                    self.off += n
                moved = self.moved = True
                if self.hoff >= HEADER_BYTES and self.off >= self.total:
                    self.done = True
                    self.o.queue.popleft()
        except (BlockingIOError, InterruptedError):
            return moved
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise RemoteError(f"rank {self.peer} closed its connection while we were sending ({exc})",
                              rank=self.peer, hint="the peer died or aborted") from None
        except OSError as exc:
            raise RingflowSystemError(f"sending to rank {self.peer} failed: {exc}", "check the network") from None
        return moved


class TcpIn:
    """The receiving side of one data connection (its socket arrives through the Listener)."""

    def __init__(self, listener: Listener, peer: int, key: str) -> None:
        self.listener, self.peer, self.key = listener, peer, key
        self.sock: socket.socket | None = None
        self.fd = -1
        self.seq = 1
        self.stage = np.empty(REDUCE_STAGE_BYTES, dtype=np.uint8)
        self.stage_buf = self.stage.data  # the same bytes as a memoryview, for socket.recv_into
        self.queue: deque = deque()

    def try_open(self) -> bool:
        """Claim the accepted socket if the peer has connected."""
        if self.sock is None:
            s = self.listener.take(self.peer, self.key)
            if s is None:
                return False
            self.sock, self.fd = s, s.fileno()
        return True

    def recv(self, sink: Sink | None, nbytes: int, sig: int, *, check: bool, op_seq: int, tag: int) -> TcpRecv:
        """Start receiving one message of nbytes into sink (None: discard; nbytes < 0: a CHECK frame)."""
        op = TcpRecv(self, sink, nbytes, sig, check)
        op._post(self)
        return op

    def close(self) -> None:
        """Close the socket."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class TcpRecv(XferOp):
    """One incoming message on TCP: header, validation, then payload into the sink."""

    def __init__(self, i: TcpIn, sink: Sink | None, want: int, sig: int, check: bool) -> None:
        self.i, self.sink, self.want, self.sig, self.check = i, sink, want, sig & 0xFFFFFFFF, check
        self.hdr = bytearray(HEADER_BYTES)
        self.hview = memoryview(self.hdr)
        self.hgot, self.off, self.total = 0, 0, -1
        self.fill = 0
        self.drain = False
        self.detail = bytearray()
        self.done, self.peer, self.mismatch, self.moved = False, i.peer, None, False
        self.fds = ((i.fd, select.POLLIN),) if i.fd >= 0 else ()

    def _closed(self) -> RemoteError:
        cut = ""
        if 0 < self.hgot < HEADER_BYTES:
            cut = f" mid-frame: truncated after {self.hgot} of {HEADER_BYTES} header bytes"
        elif self.total > 0 and self.off + self.fill < self.total:
            cut = f" mid-frame: truncated after {self.off + self.fill} of {self.total} payload bytes"
        return RemoteError(f"rank {self.i.peer} closed its connection{cut} (it died or aborted)", rank=self.i.peer,
                           hint="see that rank's output; create a new communicator or shrink")

    def progress(self) -> bool:
        i = self.i
        if i.queue[0] is not self:
            return False
        if i.sock is None:
            if not i.try_open():
                return False
            self.fds = ((i.fd, select.POLLIN),)
        sock = i.sock
        assert sock is not None  # try_open claimed it
        moved = False
        try:
            while self.hgot < HEADER_BYTES:
                n = sock.recv_into(self.hview[self.hgot:], HEADER_BYTES - self.hgot)
                if n == 0:
                    raise self._closed()
                self.hgot += n
                moved = self.moved = True
                if self.hgot == HEADER_BYTES:
                    self._header()
            while not self.done:
                left = self.total - self.off
                if left == 0:
                    self.done = True
                    break
                self._recv_payload(sock, left)
                moved = self.moved = True
        except (BlockingIOError, InterruptedError):
            return moved
        except ConnectionResetError:
            raise self._closed() from None
        except OSError as exc:
            if exc.errno in (errno.ECONNRESET, errno.EPIPE):
                raise self._closed() from None
            raise
        if self.done:
            self._complete()
        return moved

    def _recv_payload(self, sock: socket.socket, left: int) -> None:
        """One read of payload (`left` bytes to go): drained (the start kept as a CHECK frame's detail),
        straight into the sink's destination, or staged and reduced into it a stage at a time."""
        i = self.i
        if self.drain:
            n = sock.recv_into(i.stage_buf, min(left, i.stage.shape[0]))
            if n and len(self.detail) < MAX_CHECK_BYTES:
                self.detail += i.stage[:n].tobytes()
            if n == 0:
                raise self._closed()
            self.off += n
            return
        sink = self.sink
        assert sink is not None  # _header drains when there is no sink
        if sink.ufunc is None:
            n = sock.recv_into(sink.dst_u8[self.off:].data, left)
            if n == 0:
                raise self._closed()
            self.off += n
        else:
            part = min(left, i.stage.shape[0])
            n = sock.recv_into(i.stage_buf[self.fill:part], part - self.fill)
            if n == 0:
                raise self._closed()
            self.fill += n
            if self.fill == part:
                sink.consume(self.off, i.stage[:part])
                self.off += part
                self.fill = 0

    def _complete(self) -> None:
        """The whole message is in: next frame sequence number, next op in the connection's queue."""
        i = self.i
        i.seq += 1
        i.queue.popleft()
        if self.mismatch is not None:
            self.mismatch.detail = bytes(self.detail)

    def _header(self) -> None:
        want_kind = Kind.CHECK if self.want < 0 else Kind.DATA
        cap = MAX_CHECK_BYTES if self.want < 0 else None
        f = frames.parse(self.hdr, peer=f"rank {self.i.peer}", expect_seq=self.i.seq, max_nbytes=cap)
        if f.kind == Kind.DATA and 0 <= self.want < f.nbytes and not (self.check and f.sig != self.sig):
            # more bytes than the destination holds, and no disagreement in the call signature explains it
            raise ProtocolError(f"oversized frame from rank {self.i.peer}: {f.nbytes} bytes for a {self.want}-byte "
                                "destination", "send and receive sizes must match; the connection is not trusted")
        self.total = f.nbytes
        bad = f.kind != want_kind or (self.check and f.sig != self.sig) or (self.want >= 0 and f.nbytes != self.want)
        if bad:
            self.mismatch = Mismatch(self.i.peer, f.nbytes, self.want, f.sig, self.sig)
        if bad or self.sink is None:
            self.drain = True
        if self.total == 0:
            self.done = True
