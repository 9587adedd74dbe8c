"""Backend "ringflow" started by real launchers: torchrun (2 and 4 ranks), `ringflow run`, two emulated hosts
(network namespaces: shared memory inside a host, TCP between), and a rank dying under DDP.

torchrun runs with `--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT` and `--local-addr 127.0.0.1` (not
`--standalone`, whose endpoint is the name "localhost"), so no DNS server is needed. No timing is asserted
except the dead-rank bound (timeout + 1 s).
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import outputs_of  # noqa: E402

from ringflow.testing import netns

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch (optional extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
RANKS = str(ROOT / "tests" / "torch_launch_ranks.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _results(text: str) -> list[dict]:
    """Every JSON object starting '{"rank"' in text (ranks' lines may share a line of a launcher's output)."""
    dec, out, i = json.JSONDecoder(), [], text.find('{"rank"')
    while i >= 0:
        obj, end = dec.raw_decode(text, i)
        out.append(obj)
        i = text.find('{"rank"', end)
    return sorted(out, key=lambda d: d["rank"])


def _check_basic(res: list[dict], n: int) -> None:
    assert [d["rank"] for d in res] == list(range(n)), res
    for d in res:
        assert d["world"] == n and d["backend"] == "ringflow"
        assert d["sum"] == [float(n * (n + 1) // 2)] * 5
        assert d["gathered"] == [v for r in range(n) for v in (float(r), r * 10.0)]
        assert d["bcast"] == [0.0, 1.0, 2.0]


@pytest.mark.long
@pytest.mark.parametrize("n", [2, 4])
def test_torchrun(n: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--local-addr", "127.0.0.1",
           "--max-restarts", "0", RANKS, "basic"]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    res = _results(proc.stdout)
    _check_basic(res, n)
    assert all(d["shm_peers"] == [p for p in range(n) if p != d["rank"]] for d in res)   # one host: shared memory


@pytest.mark.long
@pytest.mark.parametrize("init", ["env", "file"])
def test_ringflow_run(tmp_path: Path, init: str) -> None:
    """`ringflow run` exports torchrun's variables: init_process_group("ringflow") needs no arguments; an explicit
    file:// rendezvous works too."""
    how = "env://" if init == "env" else f"file://{tmp_path / 'init'}"
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", "2", RANKS, "basic", how]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    _check_basic(_results(proc.stdout), 2)


@pytest.mark.long
def test_recorded_torch_calls_name_the_user_line_and_keep_async_ops_async(tmp_path: Path) -> None:
    """`ringflow record` around a torch job: a queued (async_op=True) all_reduce is recorded as asynchronous,
    issued when the user's line queued it; every call carries the user's line in the rank script."""
    from ringflow.workload.recorded import merge
    cmd = [sys.executable, "-m", "ringflow", "record", "-o", str(tmp_path / "rec"), "--", sys.executable, "-m",
           "ringflow", "run", "-n", "2", RANKS, "basic", "env://"]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert all(d["async_sum"] == [2.0] * 4 for d in _results(proc.stdout))
    trace = merge(tmp_path / "rec")
    calls = [c for c in trace["calls"] if c["lane"] == "coll" and c["op"] != "barrier"]
    assert {c["rank"] for c in calls} == {0, 1}
    for r in (0, 1):
        mine = sorted((c for c in calls if c["rank"] == r), key=lambda c: c["seq"])
        assert [c["op"] for c in mine[-4:]] == ["all_reduce", "all_gather", "broadcast", "all_reduce"]
        assert [c["async"] for c in mine[-4:]] == [False, False, False, True]
        assert all(c["site"].startswith(RANKS) for c in mine[-4:]), [c["site"] for c in mine]
        queued = mine[-1]
        assert queued["enq_ns"] <= queued["start_ns"] <= queued["end_ns"]
        (w,) = [w for w in trace["waits"] if w["rank"] == r and w["seq"] == queued["seq"]]   # work.wait() on it
        assert (w["of"], w["site"].startswith(RANKS)) == ("coll", True)
        assert queued["enq_ns"] <= w["enq_ns"] <= w["end_ns"]


@pytest.mark.long
def test_two_hosts_shared_memory_inside_tcp_between() -> None:
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"multi-host emulation unavailable: {reason}")
    hosts = [0, 0, 1]   # ranks 0 and 1 on host 0, rank 2 on host 1
    with netns.NetnsCluster(2) as cl:
        init = f"tcp://{cl.address(0)}:29631"
        procs = [subprocess.Popen(cl.command(h, [sys.executable, RANKS, "basic", init]), cwd=ROOT,
                                  env={**ENV, "RANK": str(r), "WORLD_SIZE": str(len(hosts))},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r, h in enumerate(hosts)]
        outs = outputs_of(procs, 120)
    res = _results("\n".join(outs))
    _check_basic(res, 3)
    assert [d["shm_peers"] for d in res] == [[1], [0], []]


@pytest.mark.long
def test_dead_rank_under_ddp_is_a_backend_error_naming_it() -> None:
    timeout_s, n = 4.0, 3
    env = {**ENV, "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [subprocess.Popen([sys.executable, RANKS, "dead", str(timeout_s)], cwd=ROOT, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)   # a hang fails here
            outs.append(out + err[-2000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[-1].returncode == 1
    res = _results("\n".join(outs))
    assert [d["rank"] for d in res] == [0, 1], outs
    for d in res:
        # DDP's reducer re-raises its future's error as RuntimeError carrying the DistBackendError's text (a
        # Python process group can fail a C++ future only through a callback); the next call raises it as is
        assert d["type"] in ("DistBackendError", "RuntimeError"), d
        assert "DistBackendError: ringflow allreduce: RemoteError: rank 2 failed" in d["message"], d
        assert d["after_s"] <= timeout_s + 1.0, d
        assert d["next_type"] == "DistBackendError" and "rank 2" in d["next_message"], d
