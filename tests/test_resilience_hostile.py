"""Hostile and broken input: crafted frames against a live rank's TCP transport, fuzzing of the frame
parser, of the TCP receiver and of the store protocol (hypothesis, bounded), unauthenticated
connections to the transport's listener, and listeners bound only to the selected interface."""
from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resilience_ranks import EXPECT_FRAMES, Job  # noqa: E402

from ringflow.errors import ProtocolError, RemoteError, RingflowSystemError
from ringflow.runtime.job import auth, store
from ringflow.runtime.job.store import Store, StoreServer, decode, encode
from ringflow.runtime.transport import frames
from ringflow.runtime.transport.base import Sink
from ringflow.runtime.transport.frames import HEADER_BYTES, Kind
from ringflow.runtime.transport.tcp import TcpIn, interface_addresses

pytestmark = [pytest.mark.usefixtures("no_leaked_shared_memory")]


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REFUSED = re.compile(r"\[0\] WARN ringflow: refused connection from \('([\d.]+)', (\d+)\)")


# ---------------------------------------------------------------- crafted frames against a live rank
def test_hostile_frames_get_typed_errors_naming_the_peer_and_never_touch_the_buffer(tmp_path: Path) -> None:
    with Job(2, "frames", tmp_path, ["--timeout", "30"],
             env={"RINGFLOW_SHM_DISABLE": "1", "RINGFLOW_DEBUG": "WARN"}) as job:
        assert job.wait(60) == [0, 0], job.logs()
        r0, r1 = job.result(0), job.result(1)
        for tag, (kind, text) in EXPECT_FRAMES.items():
            case = r0["cases"][str(tag)]
            assert case["type"] == kind and text in case["message"] and "rank 1" in case["message"], (tag, case)
            assert case["elapsed_s"] < 5.0, (tag, case)
            if tag != 8:  # 8: the peer's payload was cut by EOF; the destination is undefined after an error
                assert case["unchanged"], f"case {tag} wrote into the user buffer"
        # the receiver stayed alive and correct: an honest message and a collective after the attacks
        assert r0["honest_recv_ok"] and r0["after_ok"] and r1["after_ok"]
        assert r1["wrong_secret"]["type"] == "RingflowSystemError" and "secret" in r1["wrong_secret"]["message"]
        log0 = (tmp_path / "log0.txt").read_text()
        assert REFUSED.search(log0), log0
        assert "is for communicator 'not-this-communicator'" in log0


# ---------------------------------------------------------------- fuzzing: frame parser
def _valid_header() -> bytes:
    return frames.pack(Kind.DATA, 1, 64, channel=3, op_seq=11, sig=0xDEADBEEF, tag=5)


@FUZZ
@given(st.binary(min_size=0, max_size=96))
def test_fuzz_frame_parser_accepts_only_canonical_headers(data: bytes) -> None:
    try:
        f = frames.parse(data, peer="rank 7", max_nbytes=1 << 20)
    except ProtocolError as exc:
        assert "rank 7" in str(exc)
        return
    assert len(data) == HEADER_BYTES
    assert frames.pack(f.kind, f.seq, f.nbytes, channel=f.channel, op_seq=f.op_seq, sig=f.sig, tag=f.tag) == data


@FUZZ
@given(st.integers(0, HEADER_BYTES - 1), st.integers(1, 255))
def test_fuzz_any_corrupted_header_byte_is_rejected(pos: int, xor: int) -> None:
    bad = bytearray(_valid_header())
    bad[pos] ^= xor
    with pytest.raises(ProtocolError, match="rank 2"):
        frames.parse(bytes(bad), peer="rank 2", expect_seq=1, max_nbytes=64)


# ---------------------------------------------------------------- fuzzing: the real TCP receiver
class _Accepted:
    """Hands the receiver an already-accepted socket, as the Listener does after authentication."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def take(self, peer: int, key: str) -> socket.socket | None:
        s, self.sock = self.sock, None
        return s


def _receive(stream: bytes, reduce: bool) -> tuple[str, np.ndarray]:
    """Feed `stream` (then EOF) to a TcpRecv of a 64-byte message; (outcome, destination)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    dst = np.full(16, 3.0, np.float32)
    src = np.ones(16, np.float32)
    sink = Sink(dst.view(np.uint8), ufunc=np.add, src_t=src, dst_t=dst, dtype=dst.dtype) if reduce else \
        Sink(dst.view(np.uint8))
    tin = TcpIn(_Accepted(a), 1, "c0")
    op = tin.recv(sink, 64, 0, check=False, op_seq=0, tag=0)
    b.sendall(stream)
    b.shutdown(socket.SHUT_WR)
    end = time.monotonic() + 5
    try:
        while not op.done:
            if not op.progress():
                if time.monotonic() > end:
                    return "hang", dst
                time.sleep(0.0005)
        return ("mismatch" if op.mismatch is not None else "ok"), dst
    except (ProtocolError, RemoteError) as exc:
        assert "rank 1" in str(exc)
        return type(exc).__name__, dst
    finally:
        tin.close()
        b.close()


PAYLOAD = np.arange(16, dtype=np.float32).tobytes()


@FUZZ
@given(st.data())
def test_fuzz_tcp_receiver_never_writes_bad_data_and_never_hangs(data: st.DataObject) -> None:
    good = frames.pack(Kind.DATA, 1, 64) + PAYLOAD
    how = data.draw(st.sampled_from(["flip", "truncate", "random", "extra", "intact"]))
    if how == "flip":
        s = bytearray(good)
        s[data.draw(st.integers(0, HEADER_BYTES - 1))] ^= data.draw(st.integers(1, 255))
        stream = bytes(s)
    elif how == "truncate":
        stream = good[:data.draw(st.integers(0, len(good) - 1))]
    elif how == "random":
        stream = data.draw(st.binary(max_size=200))
    elif how == "extra":
        stream = good + data.draw(st.binary(min_size=1, max_size=64))
    else:
        stream = good
    reduce = data.draw(st.booleans())
    outcome, dst = _receive(stream, reduce)
    assert outcome != "hang"
    if stream[:len(good)] == good:
        assert outcome == "ok"
        want = np.frombuffer(PAYLOAD, np.float32) + (1.0 if reduce else 0.0)
        assert np.array_equal(dst, want)
    elif how == "truncate" and len(stream) > HEADER_BYTES and not reduce:
        assert outcome == "RemoteError"  # cut mid-payload: typed, names the peer; destination undefined
    else:
        assert outcome in ("ProtocolError", "RemoteError"), outcome
        assert (dst == 3.0).all(), "a rejected frame wrote into the destination"


# ---------------------------------------------------------------- fuzzing: the store protocol
@FUZZ
@given(st.binary(max_size=128))
def test_fuzz_store_decoder(body: bytes) -> None:
    try:
        code, args = decode(body)
    except ProtocolError:
        return
    assert encode(code, args)[4:] == body


@pytest.fixture(scope="module")
def store_server():
    s = StoreServer("127.0.0.1", 0, "fuzz-secret")
    yield s
    s.close()


def _codes(stream: bytes) -> list[int]:
    """The request codes the server would decode from `stream`, in order (as far as they parse)."""
    codes, off = [], 0
    while off + 4 <= len(stream):
        (n,) = struct.unpack_from("<I", stream, off)
        if n > store.MAX_MSG_BYTES or off + 4 + n > len(stream):
            break
        try:
            codes.append(decode(stream[off + 4:off + 4 + n])[0])
        except ProtocolError:
            break
        off += 4 + n
    return codes


def _raw_store_client(server: StoreServer) -> socket.socket:
    s = socket.create_connection(server.address, timeout=5)
    auth.client_handshake(s, b"fuzz-secret", store._CTX, 5.0, what="store")
    return s


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=64).map(lambda b: struct.pack("<I", len(b)) + b),
                 st.binary(max_size=64),
                 st.tuples(st.integers(0, 12), st.lists(st.binary(max_size=12), max_size=4))
                 .filter(lambda t: t[0] not in (store.GET, store.WAIT)).map(lambda t: encode(*t))))
def test_fuzz_authenticated_store_requests_never_kill_the_server(store_server: StoreServer, msg: bytes) -> None:
    if any(code in (store.GET, store.WAIT) for code in _codes(msg)):
        return  # those legitimately block for the timeout they carry
    s = _raw_store_client(store_server)
    reply = b""
    try:
        s.sendall(msg)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    except (ConnectionResetError, BrokenPipeError, OSError) as exc:
        assert not isinstance(exc, socket.timeout), "the store neither answered nor closed"
    finally:
        s.close()
    while len(reply) >= 4:  # whatever came back is well-formed replies
        (n,) = struct.unpack_from("<I", reply)
        status, _ = decode(reply[4:4 + n])
        assert status in (store.OK, store.ERR, store.TIMEOUT)
        reply = reply[4 + n:]
    ok = Store(*store_server.address, "fuzz-secret", timeout=5.0, connect_timeout=5.0)
    ok.set("alive", b"1")  # the server still serves an honest client
    assert ok.get("alive") == b"1"
    ok.close()


# ---------------------------------------------------------------- listeners: interface and authentication
def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the process holds (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    with open(f"/proc/{pid}/net/tcp") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                hexip, hexport = f[1].split(":")
                out.append((socket.inet_ntoa(struct.pack("<I", int(hexip, 16))), int(hexport, 16)))
    return out


def _interfaces() -> list[tuple[str, str]]:
    avail = interface_addresses()
    picks = [p for p in avail if p[0] == "lo"][:1] + [p for p in avail if not p[0].startswith(("lo", "docker"))][:1]
    return picks


@pytest.mark.parametrize("pick", [0, pytest.param(1, marks=pytest.mark.long)])
def test_listeners_bind_only_the_selected_interface_and_refuse_outsiders(tmp_path: Path, pick: int) -> None:
    ifaces = _interfaces()
    if pick >= len(ifaces):
        pytest.skip("no second (non-loopback) IPv4 interface on this machine")
    name, addr = ifaces[pick]
    with Job(2, "ifbind", tmp_path, ["--timeout", "30", "--max-s", "30"],
             env={"RINGFLOW_SOCKET_IFNAME": f"={name}", "RINGFLOW_DEBUG": "WARN"}) as job:
        job.wait_ready()
        for r in range(2):
            res = job.result(r)
            listening = _listening(res["pid"])
            assert listening and all(a == addr for a, _ in listening), (name, listening)
            assert tuple(res["card"]) in listening
        host, port = job.result(0)["card"]
        # no handshake at all: garbage
        raw = socket.create_connection((host, port), timeout=5)
        raw_local = raw.getsockname()
        assert raw.recv(64).startswith(b"RFAU")
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * 64)
        raw.settimeout(5)
        assert raw.recv(64)[:1] in (b"\x00", b"")
        raw.close()
        # the wrong secret
        bad = socket.create_connection((host, port), timeout=5)
        bad_local = bad.getsockname()
        with pytest.raises(RingflowSystemError, match="secret"):
            auth.client_handshake(bad, b"guess", b"ringflow-transport-v1", 5.0, what="rank 0")
        bad.close()
        (tmp_path / "done").write_text("1")
        assert job.wait(30) == [0, 0], job.logs()
        refused = {(a, int(p)) for a, p in REFUSED.findall((tmp_path / "log0.txt").read_text())}
        assert (raw_local[0], raw_local[1]) in refused and (bad_local[0], bad_local[1]) in refused, refused


@pytest.mark.long
def test_silent_clients_do_not_stall_a_ranks_transport_listener(tmp_path: Path) -> None:
    """Clients that connect and never answer the challenge are handled beside honest peers, not before them:
    a serial listener would hold the ranks' first connections for 5 s per silent client."""
    import json
    with Job(2, "ifbind", tmp_path, ["--timeout", "30", "--max-s", "30"], env={"RINGFLOW_SHM_DISABLE": "1"}) as job:
        job.wait_ready()
        silent = [socket.create_connection(tuple(job.result(r)["card"]), timeout=5) for r in (0, 1, 0, 1)]
        time.sleep(0.2)
        (tmp_path / "done").write_text("1")
        assert job.wait(60) == [0, 0], job.logs()
        for s in silent:
            s.close()
        for r in range(2):
            final = json.loads((tmp_path / f"final{r}.json").read_text())
            assert final["after_ok"]
            assert final["first_barrier_s"] < 5.0, final  # not stuck behind the silent clients' handshake timeouts


def test_store_refuses_unauthenticated_clients_and_logs_their_address(caplog: pytest.LogCaptureFixture) -> None:
    server = StoreServer("127.0.0.1", 0, "the-secret")
    try:
        with caplog.at_level("WARNING", logger="ringflow.runtime"):
            raw = socket.create_connection(server.address, timeout=5)
            raw_local = raw.getsockname()
            assert raw.recv(64).startswith(b"RFAU")
            raw.sendall(encode(store.SET, [b"k", b"v"]).ljust(64, b"\0"))  # a request instead of the proof
            raw.settimeout(5)
            assert raw.recv(64)[:1] in (b"\x00", b"")
            raw.close()
            with pytest.raises(RingflowSystemError, match="secret"):
                Store(*server.address, "a-guess", timeout=5.0, connect_timeout=5.0)
            end = time.monotonic() + 5
            while server.refused < 2 and time.monotonic() < end:
                time.sleep(0.01)
        assert server.refused == 2
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert f"refused connection from {raw_local}" in logged, logged
        honest = Store(*server.address, "the-secret", timeout=5.0)
        assert not honest.check(["k"])  # the unauthenticated SET never happened
        honest.close()
    finally:
        server.close()


def test_refusal_does_not_block_the_store() -> None:
    """A client that connects and says nothing must not stop honest clients (handshakes time out per client)."""
    server = StoreServer("127.0.0.1", 0, "s")
    try:
        silent = socket.create_connection(server.address, timeout=5)
        t = threading.Thread(target=lambda: Store(*server.address, "s", timeout=5.0).close())
        t0 = time.monotonic()
        t.start()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 5.0
        silent.close()
    finally:
        server.close()
