"""Listeners under attack, with real processes and sockets on 127.0.0.1 only.

- a flood of silent connections against a rank's listener and the store, the job's descriptor limit lowered
  to 1,024: collectives keep completing correctly during and after it, new authenticated connections and
  store clients keep working while it arrives, and a new communicator can be created;
- a store whose descriptor limit is far below the flood keeps accepting (out of descriptors, it sheds and
  backs off) and logs refusals at a bounded rate;
- a client declaring a huge store message costs the server nothing and gets a typed error;
- a store port already in use fails at once; store requests and shrink end by the caller's deadline.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402

from ringflow.errors import InvalidArgument, RingflowSystemError, Timeout
from ringflow.runtime.job import auth, storeclient, storewire
from ringflow.runtime.job import store as store_mod
from ringflow.runtime.job.store import Store, StoreFull, StoreServer

FLOOD = 2000      # silent connections per target over the test
WAVES = 4         # in waves, each opened as fast as possible, 0.4 s apart, so the flood overlaps the probes
HELD = 1100       # held open at once per target: more than the job's whole descriptor limit
FD_LIMIT = 1024   # the job's processes

ENV = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")} | {"PYTHONPATH": str(ROOT)}


def _limit(n: int) -> str:
    return f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n}))\n"


STORE = '''
import sys, time
from ringflow.runtime.job.store import StoreServer
server = StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.address[1], flush=True)
time.sleep(600)
'''

RANK = _limit(FD_LIMIT) + '''
import json, os, statistics, sys, time
import numpy as np
import ringflow
from ringflow.runtime.job.store import Store
from ringflow.runtime.transport.tcp import dial
out = sys.argv[1]
secret, (st_host, st_port) = os.environ["RINGFLOW_SECRET"], os.environ["RINGFLOW_STORE_ADDR"].split(":")


def flag(comm, name):
    f = np.array([float(os.path.exists(f"{out}/{name}"))])
    comm.all_reduce(f, op="max")   # every rank sees the same answer
    return bool(f[0])


def probe(comm, peer_addr):
    """A new authenticated connection to the peer's listener and a new store client: seconds taken."""
    t0 = time.monotonic()
    s = dial(tuple(peer_addr), comm._sh.secret, {"uid": comm.uid, "rank": comm.rank, "key": "probe"}, None,
             time.monotonic() + 30, "the peer")
    s.close()
    st = Store(st_host, int(st_port), secret, timeout=30)
    st.set(f"probe{comm.rank}", b"ok")
    assert st.get(f"probe{comm.rank}", 30) == b"ok"
    st.close()
    return time.monotonic() - t0


def split(comm):
    """A new communicator and an all-reduce on it: seconds taken, result right."""
    t0 = time.monotonic()
    sub = comm.split(0)
    y = np.ones(1000)
    sub.all_reduce(y)
    sub.destroy()
    return time.monotonic() - t0, bool(np.all(y == comm.size))


with ringflow.init(timeout=60) as comm:
    json.dump(list(comm._listener.address), open(f"{out}/listener{comm.rank}.json.tmp", "w"))
    os.rename(f"{out}/listener{comm.rank}.json.tmp", f"{out}/listener{comm.rank}.json")
    while not os.path.exists(f"{out}/listener{1 - comm.rank}.json"):
        time.sleep(0.01)
    peer_addr = json.load(open(f"{out}/listener{1 - comm.rank}.json"))
    x = np.empty(1 << 14, np.float64)
    lat = {"before": [], "during": [], "after": []}
    probes, splits, wrong, i = [], [], 0, 0
    while True:
        phase = "after" if flag(comm, "flooded") else "during" if flag(comm, "flood") else "before"
        if phase == "after" and flag(comm, "stop"):
            break
        x[:] = comm.rank + 1
        t0 = time.monotonic()
        comm.all_reduce(x)
        lat[phase].append(time.monotonic() - t0)
        wrong += int(not np.all(x == comm.size * (comm.size + 1) / 2))
        i += 1
        if phase == "during" and i % 10 == 0:
            probes.append(probe(comm, peer_addr))
            if len(splits) == 0:
                splits.append(split(comm))
    probes.append(probe(comm, peer_addr))
    splits.append(split(comm))
    pct = lambda v, q: sorted(v)[min(len(v) - 1, int(q * len(v)))] * 1e3 if v else None
    json.dump({"wrong": wrong, "calls": {k: len(v) for k, v in lat.items()},
               "p50_ms": {k: pct(v, 0.5) for k, v in lat.items()}, "p99_ms": {k: pct(v, 0.99) for k, v in lat.items()},
               "max_ms": {k: pct(v, 1.0) for k, v in lat.items()}, "probes_s": probes,
               "splits": splits}, open(f"{out}/r{comm.rank}.json", "w"))
'''

FLOODER = '''
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
total, waves, held = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
targets = [("127.0.0.1", int(p)) for p in sys.argv[4:]]
opened, live, t0 = 0, [], time.monotonic()
for w in range(waves):
    for _ in range(total // waves):
        for t in targets:
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(t)
            live.append(s)
        opened += 1
        while len(live) > held * len(targets):
            live.pop(0).close()
    time.sleep(0.4)
took = time.monotonic() - t0
for s in live:
    s.close()
print(opened, round(took, 2), flush=True)
'''


@contextmanager
def _process(code: str, *args: str, env: dict[str, str] | None = None,
             stderr: int | None = None) -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env or ENV, stdout=subprocess.PIPE, stderr=stderr,
                         text=True)
    try:
        yield p
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()


def _stop(pid: int) -> None:
    """SIGSTOP `pid` and wait until it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    end = time.monotonic() + 5
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < end
        time.sleep(0.005)


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.long
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_flood_of_silent_connections_delays_nobody_who_has_the_secret(tmp_path: Path, transport: str) -> None:
    secret = auth.new_secret()
    with _process(_limit(FD_LIMIT) + STORE, secret, stderr=subprocess.PIPE) as store:
        port = int(store.stdout.readline())   # type: ignore[union-attr]
        (tmp_path / "rank.py").write_text(RANK)
        ranks: list[subprocess.Popen] = []
        try:
            for r in range(2):
                renv = dict(ENV, RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE="2",
                            RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}", RINGFLOW_SECRET=secret,
                            RINGFLOW_JOB_ID=f"flood{os.getpid()}{transport}", RINGFLOW_DEBUG="WARN",
                            RINGFLOW_SOCKET_IFNAME="=lo",   # listeners on 127.0.0.1, where the flood goes
                            **({"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}))
                ranks.append(subprocess.Popen([sys.executable, str(tmp_path / "rank.py"), str(tmp_path)], env=renv,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            end = time.monotonic() + 60
            while not (tmp_path / "listener0.json").exists():
                assert time.monotonic() < end and all(p.poll() is None for p in ranks), [p.poll() for p in ranks]
                time.sleep(0.05)
            lhost, lport = json.loads((tmp_path / "listener0.json").read_text())
            assert lhost == "127.0.0.1", lhost
            time.sleep(0.5)                            # collectives before the flood
            (tmp_path / "flood").write_text("1")
            t0 = time.monotonic()
            flood = subprocess.run([sys.executable, "-c", FLOODER, str(FLOOD), str(WAVES), str(HELD), str(lport),
                                    str(port)], capture_output=True, text=True, timeout=120)
            flood_s = time.monotonic() - t0
            assert flood.returncode == 0 and int(flood.stdout.split()[0]) == FLOOD, flood.stderr[-2000:]
            (tmp_path / "flooded").write_text("1")
            time.sleep(0.5)                            # collectives after the flood too
            (tmp_path / "stop").write_text("1")
            outs = [p.communicate(timeout=120)[0] for p in ranks]
            assert [p.returncode for p in ranks] == [0, 0], outs
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
        store.kill()
        store_log = store.communicate()[1]
    res = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    print(f"\n{transport}: {FLOOD} silent connections each to rank 0's listener and the store in {flood_s:.2f} s; "
          + "; ".join(f"rank {r}: all_reduce p50/p99/max ms " + ", ".join(
              f"{k} {x['p50_ms'][k]:.2f}/{x['p99_ms'][k]:.2f}/{x['max_ms'][k]:.1f} ({x['calls'][k]} calls)"
              for k in ("before", "during", "after")) + f"; probes {len(x['probes_s'])}, slowest "
              f"{max(x['probes_s']) * 1e3:.0f} ms; splits {[round(s[0] * 1e3) for s in x['splits']]} ms"
              for r, x in enumerate(res)))
    for x in res:
        assert x["wrong"] == 0 and all(ok for _, ok in x["splits"]), x
        assert min(x["calls"].values()) > 5 and len(x["probes_s"]) >= 2 and len(x["splits"]) == 2, x
        assert max(x["probes_s"]) < 3.0, x   # a peer with the secret is never held for a handshake budget
    for log in (store_log, outs[0]):   # the store's and the flooded rank's logs
        refusals = [line for line in log.splitlines() if "refused connection" in line or "not logged" in line]
        assert len(refusals) <= 5 + 2 * (flood_s + 5), refusals[:20]   # a burst, then about one a second
        assert any("not logged" in line for line in refusals), refusals


DESCRIPTOR_STARVED_STORE = _limit(48) + '''
import logging, sys, time
from ringflow.runtime.job.store import StoreServer
server = StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.address[1], flush=True)
time.sleep(600)
'''


@pytest.mark.long
def test_a_store_out_of_descriptors_sheds_strangers_and_keeps_serving(tmp_path: Path) -> None:
    """48 descriptors, 1,000 silent connections (400 at once): accept hits EMFILE again and again; the gate sheds
    pending handshakes, backs off and goes on, and clients with the secret keep connecting during and after."""
    secret = auth.new_secret()
    with _process(DESCRIPTOR_STARVED_STORE, secret, stderr=subprocess.PIPE) as server:
        port = int(server.stdout.readline())   # type: ignore[union-attr]
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, "1000", "2", "400", str(port)], env=ENV,
                                   stdout=subprocess.PIPE, text=True)
        took, failures = [], []
        while flooder.poll() is None or len(took) < 5:
            t0 = time.monotonic()
            try:
                st = Store("127.0.0.1", port, secret, timeout=10)
                st.set("k", b"v")
                assert st.get("k", 5) == b"v"
                st.close()
                took.append(time.monotonic() - t0)
            except (RingflowSystemError, Timeout) as exc:
                failures.append(repr(exc))
            time.sleep(0.02)
        assert flooder.wait(60) == 0
        st = Store("127.0.0.1", port, secret, timeout=10)   # after the flood
        st.set("after", b"1")
        st.close()
        server.kill()
        log = server.communicate()[1]
    assert not failures, failures[:3]
    assert max(took) < 3.0, sorted(took)[-5:]
    assert "no descriptors" in log, log[-2000:]        # it did run out, and shed rather than stop
    assert "Traceback" not in log, log[-2000:]


def test_a_declared_huge_store_message_allocates_nothing_and_gets_a_typed_error() -> None:
    secret = auth.new_secret()
    with _process(STORE, secret) as server:
        port = int(server.stdout.readline())   # type: ignore[union-attr]
        Store("127.0.0.1", port, secret, timeout=10).set("warm", b"1")
        time.sleep(0.2)
        rss0 = _rss_kib(server.pid)
        liars = []
        for _ in range(16):   # each declares 60 MiB (under the limit) and sends 10 bytes of it
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            auth.client_handshake(s, auth.secret_bytes(secret), store_mod._CTX, 5.0, what="store")
            s.sendall(storewire.U32.pack(60 * 2**20) + b"\x01" * 10)
            liars.append(s)
        time.sleep(0.5)
        grown = (_rss_kib(server.pid) - rss0) / 1024
        assert grown < 64, f"the store grew by {grown:.0f} MiB for 16 declared 60 MiB messages"
        # past the limit: an error reply naming it, then the connection closes
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        auth.client_handshake(s, auth.secret_bytes(secret), store_mod._CTX, 5.0, what="store")
        s.sendall(storewire.U32.pack(2**32 - 1))
        status, out = store_mod._read_msg(s, time.monotonic() + 5, "reply")
        assert status == store_mod.ERR and b"exceeds" in out[0], out
        assert s.recv(1) == b""
        # an honest client is stopped before it sends anything
        st = Store("127.0.0.1", port, secret, timeout=10)
        with pytest.raises(InvalidArgument, match="exceeds"):
            st.set("big", b"\0" * (store_mod.MAX_MSG_BYTES + 1))
        st.set("still", b"fine")
        assert st.get("still") == b"fine"
        s.close()
        for liar in liars:
            liar.close()


def test_a_store_port_in_use_fails_at_once_with_the_fix() -> None:
    secret = auth.new_secret()
    first = StoreServer("127.0.0.1", 0, secret)
    try:
        t0 = time.monotonic()
        with pytest.raises(RingflowSystemError, match="already in use") as err:
            StoreServer("127.0.0.1", first.address[1], secret)
        assert time.monotonic() - t0 < 1.0
        assert "RINGFLOW_STORE_ADDR" in str(err.value) and "another port" in str(err.value)
    finally:
        first.close()


@pytest.mark.long
def test_store_requests_end_by_the_callers_deadline_and_reconnect_after() -> None:
    """A stopped store (its connections stay open, nothing answers): every request ends by its deadline with a
    typed error; a store nobody listens on ends the connect by its timeout; once it answers again, the client
    dials again and works."""
    secret = auth.new_secret()
    with _process(STORE, secret) as server:
        port = int(server.stdout.readline())   # type: ignore[union-attr]
        st = Store("127.0.0.1", port, secret, timeout=2)
        st.set("a", b"1")
        _stop(server.pid)
        for call, most in [(lambda: st.set("b", b"2"), 2.8), (lambda: st.get("a"), 3.0),   # 2.0 and 2.5 unloaded
                           (lambda: st.wait(["a"], 1.0), 2.0)]:
            t0 = time.monotonic()
            with pytest.raises(Timeout):
                call()
            assert time.monotonic() - t0 < most
        t0 = time.monotonic()
        with pytest.raises(Timeout), st.bounded(time.monotonic() + 1.0):
            st.get("a", 30)
        assert time.monotonic() - t0 < 1.5
        os.kill(server.pid, signal.SIGCONT)
        assert st.get("a") == b"1"                     # a fresh connection
        st.close()
        with pytest.raises(RingflowSystemError, match="closed"):
            st.set("c", b"3")
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead_port = free.getsockname()[1]
    free.close()
    t0 = time.monotonic()
    with pytest.raises(Timeout, match="could not reach the store"):
        Store("127.0.0.1", dead_port, secret, timeout=2)
    assert time.monotonic() - t0 < 2.5


SHRINKER = '''
import json, os, sys, time
import numpy as np
import ringflow
out = sys.argv[1]
with ringflow.init(timeout=30) as comm:
    x = np.ones(4)
    comm.all_reduce(x)
    open(f"{out}/ready{comm.rank}", "w").close()
    while not os.path.exists(f"{out}/stopped"):
        time.sleep(0.01)
    t0 = time.monotonic()
    try:
        comm.shrink(timeout=3)
        err = None
    except Exception as exc:
        err = type(exc).__name__ + ": " + str(exc)
    json.dump({"s": time.monotonic() - t0, "err": err}, open(f"{out}/s{comm.rank}.json", "w"))
    os._exit(0)
'''


@pytest.mark.long
def test_shrink_with_a_stopped_store_ends_by_its_timeout(tmp_path: Path) -> None:
    secret = auth.new_secret()
    with _process(STORE, secret) as server:
        port = int(server.stdout.readline())   # type: ignore[union-attr]
        ranks = [subprocess.Popen([sys.executable, "-c", SHRINKER, str(tmp_path)], env=dict(
            ENV, RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE="2", RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}",
            RINGFLOW_SECRET=secret, RINGFLOW_JOB_ID=f"shrink{os.getpid()}"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for r in range(2)]
        try:
            end = time.monotonic() + 60
            while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
                assert time.monotonic() < end and all(p.poll() is None for p in ranks), [p.poll() for p in ranks]
                time.sleep(0.02)
            _stop(server.pid)
            (tmp_path / "stopped").write_text("1")
            outs = [p.communicate(timeout=60)[0] for p in ranks]
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
    res = [json.loads((tmp_path / f"s{r}.json").read_text()) for r in range(2)]
    for x in res:
        assert x["err"] and x["err"].startswith("Timeout") and "store" in x["err"], (x, outs)
        assert 2.5 < x["s"] < 5.0, (x, outs)   # its own 3 s (and the store grace), not a fixed 30 s


def test_gate_survives_closing_and_leaks_no_descriptors() -> None:
    """Listeners come and go with communicators: each gate frees its selector, pipe and pending handshakes."""
    secret = auth.new_secret()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        server = StoreServer("127.0.0.1", 0, secret)
        silent = socket.create_connection(server.address, timeout=5)
        st = Store(*server.address, secret, timeout=5)
        st.set("k", b"v")
        st.close()
        server.close()
        silent.close()
    time.sleep(0.1)
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_a_wrong_secret_is_refused_outright_not_retried() -> None:
    secret = auth.new_secret()
    server = StoreServer("127.0.0.1", 0, secret)
    try:
        t0 = time.monotonic()
        with pytest.raises(RingflowSystemError, match="secret") as err:
            Store(*server.address, auth.new_secret(), timeout=10)
        assert not isinstance(err.value, auth.Dropped) and time.monotonic() - t0 < 1.0
        s = socket.create_connection(server.address, timeout=5)   # garbage for a reply: refused, then closed
        try:
            s.sendall(b"x" * auth.REPLY_BYTES)
            assert s.recv(auth.CHALLENGE_BYTES, socket.MSG_WAITALL).startswith(b"RFAU")
            assert s.recv(1) == auth.REFUSED and s.recv(1) == b""
        finally:
            s.close()
    finally:
        server.close()


RANK0_ON_A_TAKEN_PORT = '''
import socket, sys, time
import ringflow
from ringflow.errors import RingflowSystemError
foreign = socket.create_server(("127.0.0.1", 0))   # another program on the store's port: it never speaks
port = foreign.getsockname()[1]
t0 = time.monotonic()
try:
    ringflow.init(rank=0, world_size=1, store_addr=f"127.0.0.1:{port}", secret="s" * 64, timeout=60)
    print("joined")
except RingflowSystemError as exc:
    print(f"{time.monotonic() - t0:.2f}", exc)
'''


def test_rank0_whose_store_port_another_program_holds_fails_in_seconds_not_its_timeout() -> None:
    out = subprocess.run([sys.executable, "-c", RANK0_ON_A_TAKEN_PORT], env=ENV, capture_output=True, text=True,
                         timeout=60)
    took, _, msg = out.stdout.partition(" ")
    assert out.returncode == 0 and msg, out
    assert float(took) < 5.0 and "already in use" in msg and "not this job's store" in msg, out.stdout


CAP = 16   # the store's connection cap in the next test

JOB = '''
import json, sys, time
import numpy as np
import ringflow
with ringflow.init(timeout=60) as comm:
    store, wrong, redials = comm._sh.store, 0, 0
    for i in range(20):
        sock = store._sock
        time.sleep(0.6 if i % 10 == 5 else 0.02)   # idle long enough for the insider's newcomers to take its place
        x = np.full(1000, comm.rank + 1.0)
        comm.all_reduce(x)
        wrong += int(not np.all(x == 3.0))
        wrong += int(store.add(f"n{comm.rank}") != i + 1)
        if i % 10 == 0:
            sub = comm.split(0)
            y = np.ones(8)
            sub.all_reduce(y)
            wrong += int(not np.all(y == 2.0))
            sub.destroy()
        redials += store._sock is not sock
    json.dump({"wrong": wrong, "redials": redials}, open(sys.argv[1] + f"/job{comm.rank}.json", "w"))
'''


def _counts(pid: int) -> tuple[int, int]:
    """(threads, open descriptors) of process `pid`."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def _insider(port: int, secret: str) -> socket.socket | None:
    """An authenticated raw store connection (None: the store was full of busy connections)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        auth.client_handshake(s, auth.secret_bytes(secret), store_mod._CTX, 5.0, what="store")
    except auth.Busy:
        s.close()
        return None
    return s


@pytest.mark.long
def test_a_client_with_the_secret_cannot_exhaust_the_stores_threads_or_descriptors(tmp_path: Path) -> None:
    """An insider holds twice the cap of idle connections and keeps opening more while a 2-rank job runs against
    the store (each newcomer takes the place of the connection idle longest, the job's included: its client dials
    again unnoticed); then it makes every connection wait on a key nobody sets: a new client gets StoreFull naming
    the cap and the knob. The store's threads and descriptors stay within the cap plus a constant throughout."""
    secret = auth.new_secret()
    env = dict(ENV, RINGFLOW_STORE_MAX_CLIENTS=str(CAP), RINGFLOW_STORE_IDLE_TIMEOUT="60")
    with _process(STORE, secret, env=env) as server:
        port = int(server.stdout.readline())   # type: ignore[union-attr]
        time.sleep(0.2)
        base = _counts(server.pid)
        peak = list(base)

        def sample() -> None:
            for i, n in enumerate(_counts(server.pid)):
                peak[i] = max(peak[i], n)

        held = [_insider(port, secret) for _ in range(2 * CAP)]
        assert all(s is not None for s in held)
        time.sleep(0.2)
        sample()
        assert sum(storeclient._closed_by_peer(s) for s in held if s) == CAP   # the oldest half made room
        ranks = [subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path)], env=dict(
            ENV, RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE="2", RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}",
            RINGFLOW_SECRET=secret, RINGFLOW_JOB_ID=f"insider{os.getpid()}"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for r in range(2)]
        t_job = time.monotonic()
        try:
            churned = 0
            while any(p.poll() is None for p in ranks):   # the insider keeps dialling while the job runs
                s = _insider(port, secret)
                if s is not None:
                    held.append(s)
                    held.pop(0).close()  # type: ignore[union-attr]
                    churned += 1
                sample()
                time.sleep(0.02)
            outs = [p.communicate(timeout=60)[0] for p in ranks]
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
        assert [p.returncode for p in ranks] == [0, 0], outs
        assert churned > 20
        jobs = [json.loads((tmp_path / f"job{r}.json").read_text()) for r in range(2)]
        assert all(j["wrong"] == 0 and j["redials"] >= 1 for j in jobs), jobs   # evicted, dialled again, exact
        t_job = time.monotonic() - t_job
        # every connection the insider holds starts a wait that never ends: the store is full of busy clients
        for s in held:
            s.close()  # type: ignore[union-attr]
        busy = []
        while (s := _insider(port, secret)) is not None:
            s.sendall(store_mod.encode(store_mod.WAIT, [b"600", b"never"]))
            busy.append(s)
            assert len(busy) <= CAP
            time.sleep(0.01)   # the wait begins before the next newcomer looks for an idle connection
        assert len(busy) == CAP
        sample()
        t0 = time.monotonic()
        with pytest.raises(StoreFull, match=f"cap of {CAP} connections") as err:
            Store("127.0.0.1", port, secret, timeout=10)
        assert "RINGFLOW_STORE_MAX_CLIENTS" in str(err.value) and time.monotonic() - t0 < 1.0
        for s in busy:   # a client gone mid-wait frees its thread and descriptor within a second or so
            s.close()
        time.sleep(1.5)
        st = Store("127.0.0.1", port, secret, timeout=10)
        assert st.add("n0") == 21   # the job's counts are intact
        st.close()
        time.sleep(0.2)
        after = _counts(server.pid)
    print(f"\nstore threads/descriptors: {base} idle, at most {tuple(peak)} under the insider (cap {CAP}), "
          f"{after} after; the insider opened {2 * CAP + churned + CAP} connections; the job took {t_job:.1f} s, "
          f"its store clients dialled again {[j['redials'] for j in jobs]} times")
    assert peak[0] <= base[0] + CAP + 4 and peak[1] <= base[1] + CAP + 4, (base, peak)
    assert after[0] <= base[0] + 2 and after[1] <= base[1] + 2, (base, after)
