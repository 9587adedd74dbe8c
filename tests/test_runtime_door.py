"""Collectives called again on the same arrays run through their door (`_hotpath.Door`, one C call):
exact results with several arrays in turn, no Python remembered path on a repeat, and every check still made on
every call: another thread raises InvalidUsage, a bad timeout the full path's error, ranks that disagree raise the
typed mismatch on every rank (the communicator stays usable), a changed array is not taken for the remembered one,
and an aborted or destroyed communicator raises; flight recorder on or off."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringflow.runtime import native

RANK = """
import json, threading, numpy as np, ringflow
from ringflow.errors import Aborted, InvalidArgument, InvalidUsage, RingflowError
comm = ringflow.init(timeout=60.0)
r, n, res = comm.rank, comm.size, {}
total = n * (n - 1) // 2
xs = [np.zeros(k, np.float64) for k in (1, 2, 3, 5)]
outs = [np.zeros(k, np.float64) for k in (1, 2, 3, 5)]
b = np.zeros(4, np.int32)
g, gout = np.zeros(3, np.int64), np.zeros(6, np.int64)
rs, rsout = np.array([1.0, 1.0, 2.0, 2.0], np.float32), np.zeros(2, np.float32)
a2a, a2aout = np.zeros(4, np.int16), np.zeros(4, np.int16)

def round_(i):
    ok = True
    for x, o in zip(xs, outs):
        x[:] = r + i
        comm.all_reduce(x, op="sum")
        ok &= bool((x == total + n * i).all())
        x[:] = r * i
        comm.all_reduce(x, op="max", out=o)
        ok &= bool((o == (n - 1) * i).all())
    b[:] = 10 * r + i
    comm.broadcast(b, 1)
    ok &= bool((b == 10 + i).all())
    g[:] = r + 2 * i
    comm.all_gather(g, out=gout)
    ok &= gout.tolist() == [2 * i] * 3 + [1 + 2 * i] * 3
    comm.reduce_scatter(rs, "sum", out=rsout)
    ok &= rsout.tolist() == [2.0 * (r + 1)] * 2
    a2a[:] = np.arange(4) + 10 * r + i
    comm.all_to_all(a2a, out=a2aout)
    return ok and a2aout.tolist() == [2 * r + i, 2 * r + 1 + i, 10 + 2 * r + i, 11 + 2 * r + i]

exact = sum(round_(i) for i in range(3))
slow = []
python_path = comm._fast_again
comm._fast_again = lambda *a: (slow.append(a[0][0]), python_path(*a))[1]
exact += sum(round_(i) for i in range(3, 10))
comm._fast_again = python_path
res["exact"], res["python_path"] = exact, slow
doors = (comm._door_all_reduce, comm._door_broadcast, comm._door_all_gather, comm._door_reduce_scatter,
         comm._door_all_to_all)
res["held"], res["shapes"] = [d.held() for d in doors], [d.shapes() for d in doors]

x = xs[0]
def other_thread():
    try:
        comm.all_reduce(x, op="sum")
        res["thread"] = "no error"
    except InvalidUsage:
        res["thread"] = "InvalidUsage"
t = threading.Thread(target=other_thread)
t.start()
t.join()
try:
    comm.all_reduce(x, op="sum", timeout=0.0)
    res["timeout"] = "no error"
except RingflowError as exc:
    res["timeout"] = type(exc).__name__
try:   # rank 1 reduces with another op: both ranks raise the typed mismatch
    comm.all_reduce(x, op="sum" if r == 0 else "max")
    res["mismatch"] = "no error"
except InvalidArgument:
    res["mismatch"] = "InvalidArgument"
x[:] = r + 1
comm.all_reduce(x, op="sum")
res["after"] = x.tolist() == [total + n]
y = xs[1].view(np.int64)   # the same memory seen as another dtype is another call
y[:] = r + 1
comm.all_reduce(y, op="sum")
res["retyped"] = y.tolist() == [total + n] * 2
comm.barrier()
comm.abort()
try:
    comm.all_reduce(x, op="sum")
    res["aborted"] = "no error"
except Aborted:
    res["aborted"] = "Aborted"
comm.destroy()
try:
    comm.broadcast(b, 1)
    res["destroyed"] = "no error"
except RingflowError as exc:
    res["destroyed"] = type(exc).__name__
print(json.dumps(res), flush=True)
"""


@pytest.mark.long
@pytest.mark.skipif(not native.hot_available(), reason="the native executor is not built")
@pytest.mark.parametrize("recorder", ["on", "off"])
def test_a_repeated_call_through_its_door_is_exact_and_checked_on_every_call(recorder: str) -> None:
    env = {**os.environ, "RINGFLOW_FLIGHT_RECORDER": "0"} if recorder == "off" else dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--timeout", "100",
                        "--", sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line.split("] ", 1)[1]) for line in p.stdout.splitlines() if "{" in line]
    assert len(rows) == 2, p.stdout
    for res in rows:
        assert res["exact"] == 10, res
        assert res["python_path"] == [], res   # every repeat went through the door
        assert res["held"] == [8, 1, 1, 1, 1] and res["shapes"] == [8, 1, 1, 1, 1], res
        assert res["thread"] == "InvalidUsage", res
        assert res["timeout"] == "InvalidArgument", res
        assert res["mismatch"] == "InvalidArgument", res
        assert res["after"] and res["retyped"], res
        assert res["aborted"] == "Aborted", res
        assert res["destroyed"] in ("InvalidUsage", "Aborted"), res
