"""Mutual HMAC challenge-response: every store and transport connection proves the job secret.

Server -> client: ``RFAU`` + version + 32-byte nonce_s.
Client -> server: 32-byte nonce_c + HMAC-SHA256(secret, "c" | context | nonce_s | nonce_c).
Server -> client: 1 status byte (1 = accepted) + HMAC-SHA256(secret, "s" | context | nonce_c | nonce_s).
A server that has proved the client but has no room for it (the store's connection cap) answers status 2, the
same proof, then ``u16 length`` + a detail it names; the client raises `Busy`.
The secret never crosses the wire; `context` separates the store from the transport so a proof
for one cannot be replayed on the other. A server that refuses a proof says so (status 0); one that
closes the connection without a status shed the handshake under load, and the client may retry.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import time

from ...errors import InvalidArgument, ProtocolError, RemoteError, RingflowSystemError, Timeout

log = logging.getLogger("ringflow.runtime")

_HELLO = b"RFAU\x00\x01"
_NONCE = 32
_MAC = 32


def new_secret() -> str:
    """A fresh random job secret (hex)."""
    return secrets.token_hex(32)


def secret_bytes(secret: str | bytes) -> bytes:
    """The secret as bytes; an empty secret is refused."""
    if not secret:
        raise InvalidArgument("empty job secret",
                              "set RINGFLOW_SECRET (ringflow run sets it for you) or pass secret=")
    return secret if isinstance(secret, bytes) else secret.encode()


def recv_exact(sock: socket.socket, nbytes: int, deadline: float, what: str) -> bytes:
    """Read exactly nbytes from a blocking socket before `deadline` (time.monotonic())."""
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"timed out reading {what}", "the peer is slow or gone; raise the timeout")
        sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:], nbytes - got)
        except TimeoutError:
            continue
        except OSError as exc:
            raise RingflowSystemError(f"reading {what} failed: {exc}", "the peer closed the connection") from None
        if n == 0:
            raise RemoteError(f"connection closed while reading {what}", hint="the peer exited or refused us")
        got += n
    return bytes(buf)


def _mac(secret: bytes, label: bytes, context: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + b"|" + context + b"|" + a + b, hashlib.sha256).digest()


class Dropped(RingflowSystemError):
    """The server closed the connection before answering the proof: it shed the handshake (a flood of
    strangers, no descriptors left) or is shutting down. Unlike a refusal, worth retrying."""


class Busy(RingflowSystemError):
    """The server proved the secret but has no room for another connection; `detail["reason"]` is what it said."""


CHALLENGE_BYTES = len(_HELLO) + _NONCE
REPLY_BYTES = _NONCE + _MAC
REFUSED = b"\x00"
MAX_DETAIL_BYTES = 1024


def challenge() -> tuple[bytes, bytes]:
    """(the server's nonce, the challenge message to send): step one of the server side."""
    nonce_s = os.urandom(_NONCE)
    return nonce_s, _HELLO + nonce_s


def answer(secret: bytes, context: bytes, nonce_s: bytes, reply: bytes) -> bytes | None:
    """The acceptance message (status + the server's proof) for a client's REPLY_BYTES reply to `nonce_s`,
    or None if the reply does not prove the secret: step two of the server side."""
    if len(reply) != REPLY_BYTES:
        return None
    nonce_c, mac = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"c", context, nonce_s, nonce_c)):
        return None
    return b"\x01" + _mac(secret, b"s", context, nonce_c, nonce_s)


def busy_answer(accept: bytes, detail: bytes) -> bytes:
    """The answer to a client that proved the secret but finds the server full: status 2, the server's proof
    (from `answer`'s acceptance), then `detail` (at most MAX_DETAIL_BYTES)."""
    detail = detail[:MAX_DETAIL_BYTES]
    return b"\x02" + accept[1:] + len(detail).to_bytes(2, "little") + detail


def server_handshake(sock: socket.socket, secret: bytes, context: bytes, timeout_s: float = 5.0) -> bool:
    """Challenge a connecting client on a blocking socket; False (after logging the address) if it cannot
    prove the secret. Listeners use `gate.Gate`, which runs the same steps for many clients on one thread."""
    deadline = time.monotonic() + timeout_s
    nonce_s, hello = challenge()
    try:
        sock.settimeout(timeout_s)
        sock.sendall(hello)
        accept = answer(secret, context, nonce_s, recv_exact(sock, REPLY_BYTES, deadline, "auth reply"))
        if accept is None:
            _refuse(sock, "wrong HMAC (not the job secret)")
            return False
        sock.sendall(accept)
        return True
    except (OSError, Timeout, RemoteError, ProtocolError) as exc:
        _refuse(sock, f"handshake failed: {exc}")
        return False


def _refuse(sock: socket.socket, why: str) -> None:
    try:
        addr = sock.getpeername()  # numeric address only: never resolve names
    except OSError:
        addr = "?"
    log.warning("ringflow: refused connection from %s: %s", addr, why)
    try:
        sock.sendall(REFUSED)
    except OSError:
        pass


def client_handshake(sock: socket.socket, secret: bytes, context: bytes, timeout_s: float = 5.0,
                     what: str = "peer") -> None:
    """Answer the server's challenge and check its proof. RingflowSystemError if refused (wrong secret),
    `Busy` if the server is full, `Dropped` if it closed the connection first (retry), Timeout past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    try:
        hello = recv_exact(sock, CHALLENGE_BYTES, deadline, f"auth challenge from {what}")
    except (RemoteError, RingflowSystemError) as exc:
        raise Dropped(f"{what} closed the connection before its challenge ({exc})",
                      "it is shedding connections or shutting down; retry") from None
    if hello[:len(_HELLO)] != _HELLO:
        raise ProtocolError(f"{what} did not send a ringflow auth challenge", "check the address and port")
    nonce_s = hello[len(_HELLO):]
    nonce_c = os.urandom(_NONCE)
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(nonce_c + _mac(secret, b"c", context, nonce_s, nonce_c))
        status = recv_exact(sock, 1, deadline, f"auth status from {what}")
    except (RemoteError, RingflowSystemError, ConnectionError) as exc:
        # closed without a verdict: a server that refuses says so with REFUSED first
        raise Dropped(f"{what} closed the connection during the handshake ({exc})",
                      "it is shedding connections (a flood of strangers?) or shutting down; retry") from None
    except TimeoutError as exc:
        if isinstance(exc, Timeout):
            raise
        raise Timeout(f"sending the auth reply to {what} timed out", "the peer is slow or gone") from None
    if status not in (b"\x01", b"\x02"):
        raise RingflowSystemError(f"{what} refused the connection: job secret does not match",
                                  "use the same RINGFLOW_SECRET on every rank and the store")
    mac = recv_exact(sock, _MAC, deadline, f"auth proof from {what}")
    if not hmac.compare_digest(mac, _mac(secret, b"s", context, nonce_c, nonce_s)):
        raise RingflowSystemError(f"{what} could not prove the job secret", "you may be talking to an impostor")
    if status == b"\x02":
        n = int.from_bytes(recv_exact(sock, 2, deadline, f"busy reason from {what}"), "little")
        reason = recv_exact(sock, min(n, MAX_DETAIL_BYTES), deadline, f"busy reason from {what}").decode(
            errors="replace")
        raise Busy(f"{what} has no room for another connection ({reason})",
                   "close idle clients or raise the server's connection cap", detail={"reason": reason})
