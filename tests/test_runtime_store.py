"""The rendezvous store over real sockets: operations, namespaces, timeouts, authentication."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from ringflow.errors import InvalidArgument, ProtocolError, RingflowSystemError, Timeout
from ringflow.runtime import auth
from ringflow.runtime.store import PrefixStore, Store, StoreServer, decode, encode, parse_addr


@pytest.fixture()
def server():
    s = StoreServer("127.0.0.1", 0, "s3cret")
    yield s
    s.close()


def _client(server: StoreServer, secret: str = "s3cret") -> Store:
    return Store(*server.address, secret, timeout=5.0, connect_timeout=3.0)


def test_set_get_add_cas_delete(server: StoreServer) -> None:
    st = _client(server)
    st.set("a", b"1")
    assert st.get("a") == b"1"
    assert st.add("n", 5) == 5 and st.add("n", -2) == 3
    assert st.compare_set("c", None, b"x") == (True, b"x")
    swapped, cur = st.compare_set("c", b"wrong", b"y")
    assert not swapped and cur == b"x"
    assert st.compare_set("c", b"x", b"y") == (True, b"y")
    assert st.check(["a", "c"]) and not st.check(["a", "zz"])
    assert st.delete("a") and not st.delete("a")
    assert not st.check(["a"])
    st.close()


def test_get_waits_for_a_later_set_and_times_out(server: StoreServer) -> None:
    st, other = _client(server), _client(server)
    threading.Timer(0.2, lambda: other.set("late", b"v")).start()
    t0 = time.monotonic()
    assert st.get("late", timeout=5.0) == b"v"
    assert time.monotonic() - t0 >= 0.15
    with pytest.raises(Timeout, match="never"):
        st.get("never", timeout=0.3)
    with pytest.raises(Timeout):
        st.wait(["late", "never2"], timeout=0.2)
    st.close()
    other.close()


def test_prefix_namespaces_are_separate(server: StoreServer) -> None:
    st = _client(server)
    a, b = PrefixStore("g1", st), PrefixStore("g2", st)
    a.set("k", b"A")
    b.set("k", b"B")
    assert a.get("k") == b"A" and b.get("k") == b"B"
    assert st.get("g1/k") == b"A"
    PrefixStore("x", a).set("k", b"N")
    assert st.get("g1/x/k") == b"N"
    st.close()


def test_wrong_secret_is_refused_and_logged(server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="ringflow.runtime"):
        with pytest.raises(RingflowSystemError, match="secret"):
            _client(server, secret="not-the-secret")
    deadline = time.monotonic() + 5
    while server.refused == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.refused == 1
    assert any("refused connection from" in r.getMessage() for r in caplog.records)
    st = _client(server)  # the server is still fine
    st.set("ok", b"1")
    st.close()


def test_unauthenticated_raw_client_cannot_use_the_store(server: StoreServer) -> None:
    s = socket.create_connection(server.address, timeout=5)
    hello = s.recv(64)
    assert hello.startswith(b"RFAU")
    msg = encode(1, [b"k", b"v"])  # a SET instead of an answer to the challenge
    s.sendall(msg + b"\0" * (64 - len(msg)))
    s.settimeout(5)
    data = b""
    try:
        while True:
            chunk = s.recv(64)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    s.close()
    assert data[:1] in (b"\x00", b"")
    st = _client(server)
    assert not st.check(["k"])
    st.close()


def test_message_codec_rejects_malformed_input() -> None:
    code, args = decode(encode(3, [b"a", b"bc"])[4:])
    assert (code, args) == (3, [b"a", b"bc"])
    with pytest.raises(ProtocolError):
        decode(b"\x01\x05\x00\x00\x00")  # claims 5 args, has none
    with pytest.raises(ProtocolError):
        decode(b"\x01" + struct.pack("<I", 1) + struct.pack("<I", 99) + b"ab")
    with pytest.raises(ProtocolError):
        decode(encode(1, [b"x"])[4:] + b"junk")


def test_handshake_needs_secret_on_both_sides() -> None:
    a, b = socket.socketpair()
    ok = []
    t = threading.Thread(target=lambda: ok.append(auth.server_handshake(a, b"one", b"ctx")))
    t.start()
    with pytest.raises(RingflowSystemError):
        auth.client_handshake(b, b"two", b"ctx")
    t.join()
    assert ok == [False]
    a.close()
    b.close()


def test_parse_addr() -> None:
    assert parse_addr("10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert parse_addr("localhost:1") == ("127.0.0.1", 1)
    with pytest.raises(InvalidArgument):
        parse_addr("nohostport")
