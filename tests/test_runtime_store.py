"""The rendezvous store over real sockets: operations, namespaces, timeouts, authentication."""
from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest

from ringflow import config
from ringflow.errors import InvalidArgument, ProtocolError, RingflowSystemError, Timeout
from ringflow.runtime.job import auth, storeclient
from ringflow.runtime.job.store import PrefixStore, Store, StoreFull, StoreServer, decode, encode, parse_addr


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


def _peer_closed(st: Store) -> bool:
    return st._sock is None or storeclient._closed_by_peer(st._sock)


def test_an_idle_connection_is_closed_and_its_client_dials_again_unnoticed() -> None:
    server = StoreServer("127.0.0.1", 0, "s3cret", idle_timeout_s=0.3)
    try:
        st = _client(server)
        st.set("a", b"1")
        assert st.add("n") == 1 and server.clients == 1
        time.sleep(0.8)
        assert server.clients == 0 and server.idle_closed == 1   # thread and descriptor freed
        assert st.get("a") == b"1" and st.add("n") == 2            # a new connection, each request served once
        assert server.clients == 1
        st.close()
    finally:
        server.close()


def test_a_wait_longer_than_the_idle_timeout_is_not_idle() -> None:
    server = StoreServer("127.0.0.1", 0, "s3cret", idle_timeout_s=0.3)
    try:
        st = _client(server)
        threading.Timer(1.2, lambda: _client(server).set("late", b"v")).start()
        t0 = time.monotonic()
        st.wait(["late"], timeout=5.0)
        assert st.get("late", timeout=5.0) == b"v" and time.monotonic() - t0 >= 1.1
        assert server.idle_closed == 0   # the waiting connection was kept the whole 1.2 s
        st.close()
    finally:
        server.close()


def test_adds_racing_the_idle_timeout_are_applied_exactly_once() -> None:
    """Requests sent just as the store closes the idle connection are resent, never served twice."""
    server = StoreServer("127.0.0.1", 0, "s3cret", idle_timeout_s=0.02)
    try:
        st = _client(server)
        rng = random.Random(5)
        for i in range(150):
            time.sleep(rng.uniform(0.0, 0.035))
            assert st.add("n") == i + 1
        assert server.idle_closed > 20, server.idle_closed   # the races did happen
        st.close()
    finally:
        server.close()


def test_past_the_cap_the_connection_idle_longest_makes_room() -> None:
    server = StoreServer("127.0.0.1", 0, "s3cret", max_clients=3)
    try:
        clients = [_client(server) for _ in range(3)]
        for c in clients:   # clients[0] is then idle the longest
            c.set("k", b"v")
            time.sleep(0.01)
        fourth = _client(server)
        time.sleep(0.05)
        assert server.evicted == 1 and server.clients == 3
        assert [_peer_closed(c) for c in clients] == [True, False, False]
        assert clients[0].get("k") == b"v"   # dials again, taking the place of the next idlest
        assert server.evicted == 2 and server.clients == 3
        fourth.set("k2", b"w")
        for c in [*clients, fourth]:
            c.close()
    finally:
        server.close()


def test_a_store_full_of_busy_connections_refuses_with_store_full_naming_the_cap_and_knob() -> None:
    server = StoreServer("127.0.0.1", 0, "s3cret", max_clients=2)
    try:
        waiters = [_client(server) for _ in range(2)]
        threads = [threading.Thread(target=lambda c=c: pytest.raises(Timeout, c.wait, ["never"], 1.5))
                   for c in waiters]
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        with pytest.raises(StoreFull, match="cap of 2 connections") as err:
            _client(server)
        assert "RINGFLOW_STORE_MAX_CLIENTS" in str(err.value) and time.monotonic() - t0 < 1.0
        assert server.full_refused == 1
        for t in threads:
            t.join()
        late = _client(server)   # the waits ended: their connections are idle and make room
        late.set("k", b"v")
        assert server.evicted == 1
        for c in [*waiters, late]:
            c.close()
    finally:
        server.close()


def test_the_store_limits_come_from_knobs_and_are_checked() -> None:
    with config.override(STORE_IDLE_TIMEOUT=7.5, STORE_MAX_CLIENTS=9):
        server = StoreServer("127.0.0.1", 0, "s3cret")
    assert (server.idle_timeout_s, server.max_clients) == (7.5, 9)
    server.close()
    with pytest.raises(InvalidArgument, match="RINGFLOW_STORE_MAX_CLIENTS"):
        StoreServer("127.0.0.1", 0, "s3cret", max_clients=0)
    with pytest.raises(InvalidArgument, match="RINGFLOW_STORE_IDLE_TIMEOUT"):
        StoreServer("127.0.0.1", 0, "s3cret", idle_timeout_s=-1)
