"""A flood of silent connections against a rank's listener and the store, with the descriptor limit lowered to
1,024 in the job's processes: collectives keep completing correctly during and after it, and a new communicator
can still be created. Real processes, real sockets, 127.0.0.1 only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402

FLOOD = 2000      # silent connections per target
HELD = 1100       # held open at once per target: more than the job's whole descriptor limit
FD_LIMIT = 1024   # the job's processes

LIMIT = f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}))\n"

STORE = LIMIT + '''
import sys, time
from ringflow.runtime.store import StoreServer
server = StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.address[1], flush=True)
time.sleep(600)
'''

RANK = LIMIT + '''
import json, sys, time
import numpy as np
import ringflow
out = sys.argv[1]
with ringflow.init(timeout=60) as comm:
    json.dump(list(comm._listener.address), open(f"{out}/listener{comm.rank}.json", "w"))
    x = np.empty(1 << 14, np.float64)
    t_end = time.monotonic() + 1e9
    calls, wrong, slowest = 0, 0, 0.0
    while True:
        x[:] = comm.rank + 1
        t0 = time.monotonic()
        comm.all_reduce(x)
        slowest = max(slowest, time.monotonic() - t0)
        wrong += int(not np.all(x == comm.size * (comm.size + 1) / 2))
        calls += 1
        flag = np.array([float(__import__("os").path.exists(f"{out}/stop"))])
        comm.all_reduce(flag, op="max")
        if flag[0]:
            break
    # new connections to the flooded listener and store: a peer's authenticated dial, a new store client
    import os
    from ringflow.runtime.store import Store
    from ringflow.runtime.transport.tcp import dial
    peer = 1 - comm.rank
    host, port = json.load(open(f"{out}/listener{peer}.json"))
    probe = dial((host, port), comm._sh.secret, {"uid": comm.uid, "rank": comm.rank, "key": "probe"}, None,
                 time.monotonic() + 30, f"rank {peer}")
    probe.close()
    st_host, st_port = os.environ["RINGFLOW_STORE_ADDR"].split(":")
    st = Store(st_host, int(st_port), os.environ["RINGFLOW_SECRET"], timeout=30)
    st.set(f"probe{comm.rank}", b"ok")
    store_ok = st.get(f"probe{comm.rank}", 30) == b"ok"
    st.close()
    sub = comm.split(0)                       # a new communicator: new listeners, new store keys, after the flood
    y = np.ones(1000)
    sub.all_reduce(y)
    json.dump({"calls": calls, "wrong": wrong, "slowest_s": slowest, "split_ok": bool(np.all(y == comm.size)),
               "store_ok": store_ok},
              open(f"{out}/r{comm.rank}.json", "w"))
    sub.destroy()
'''

FLOODER = '''
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
total, held = int(sys.argv[1]), int(sys.argv[2])
targets = [("127.0.0.1", int(p)) for p in sys.argv[3:]]
opened, live = 0, []
while opened < total:
    for t in targets:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex(t)
        except OSError:
            s.close()
            continue
        live.append(s)
    opened += 1
    while len(live) > held * len(targets):
        live.pop(0).close()
time.sleep(1.0)
for s in live:
    s.close()
print(opened, flush=True)
'''


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_flood_of_silent_connections_delays_nobody_who_has_the_secret(tmp_path: Path, transport: str) -> None:
    from ringflow.runtime import auth
    secret = auth.new_secret()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in [k for k in env if k.startswith("RINGFLOW_")]:
        env.pop(k)
    store = subprocess.Popen([sys.executable, "-c", STORE, secret], env=env, stdout=subprocess.PIPE, text=True)
    ranks: list[subprocess.Popen] = []
    try:
        port = int(store.stdout.readline())   # type: ignore[union-attr]
        (tmp_path / "rank.py").write_text(RANK)
        for r in range(2):
            renv = dict(env, RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE="2", RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}",
                        RINGFLOW_SECRET=secret, RINGFLOW_JOB_ID=f"flood{os.getpid()}{transport}",
                        **({"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}))
            ranks.append(subprocess.Popen([sys.executable, str(tmp_path / "rank.py"), str(tmp_path)], env=renv,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        end = time.monotonic() + 60
        while not (tmp_path / "listener0.json").exists():
            assert time.monotonic() < end and all(p.poll() is None for p in ranks), [p.poll() for p in ranks]
            time.sleep(0.05)
        lport = json.loads((tmp_path / "listener0.json").read_text())[1]
        time.sleep(0.5)
        flood = subprocess.run([sys.executable, "-c", FLOODER, str(FLOOD), str(HELD), str(lport), str(port)],
                               capture_output=True, text=True, timeout=120)
        assert flood.returncode == 0 and int(flood.stdout.split()[0]) == FLOOD, flood.stderr[-2000:]
        time.sleep(0.5)                        # collectives after the flood too
        (tmp_path / "stop").write_text("1")
        outs = [p.communicate(timeout=120)[0] for p in ranks]
        assert [p.returncode for p in ranks] == [0, 0], outs
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
        store.kill()
        store.wait()
    res = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert all(r["wrong"] == 0 and r["split_ok"] and r["store_ok"] for r in res), res
    assert min(r["calls"] for r in res) > 10, res


STOPPABLE_STORE = '''
import sys, time
from ringflow.runtime.store import StoreServer
server = StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.address[1], flush=True)
time.sleep(600)
'''


def test_a_store_that_stops_answering_costs_a_caller_its_own_deadline_not_a_fixed_one(tmp_path: Path) -> None:
    """A stopped store (SIGSTOP: its connections stay open, nothing answers) ends a bounded request at the caller's
    deadline with a typed error; a store port already in use fails at once."""
    import signal

    from ringflow.errors import RingflowSystemError, Timeout
    from ringflow.runtime import auth
    from ringflow.runtime.store import Store, StoreServer
    secret = auth.new_secret()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE_STORE, secret], env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())   # type: ignore[union-attr]
        st = Store("127.0.0.1", port, secret, timeout=10)
        st.set("a", b"1")
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(Timeout, match="did not answer"), st.bounded(time.monotonic() + 2.0):
            st.get("a", 30)
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(RingflowSystemError, match="closed"):
            st.set("b", b"2")
        t0 = time.monotonic()
        with pytest.raises(RingflowSystemError, match="cannot listen"):
            StoreServer("127.0.0.1", port, secret)
        assert time.monotonic() - t0 < 1.0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
