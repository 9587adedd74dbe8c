"""A remembered call on NumPy arrays runs as one C call (hotpath.call_runner), flight recorder on or off: exact
results call after call, the argument check still on every call (a rank that changes its call makes every rank
raise the typed mismatch, and the communicator stays usable), and a changed array takes the full path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringflow.runtime import native

RANK = """
import json, numpy as np, ringflow
from ringflow.errors import InvalidArgument
from ringflow.runtime import native
comm = ringflow.init(timeout=60.0)
r, n, res = comm.rank, comm.size, {}
total = n * (n - 1) // 2   # the sum of the ranks
x = np.zeros(3, np.float32)
b = np.zeros(5, np.int64)
exact = 0
for i in range(40):
    x[:] = [r + i, 2 * r, -r]
    comm.all_reduce(x, op="sum")
    b[:] = 100 * r + i
    comm.broadcast(b, 1)
    exact += bool((x == [total + n * i, 2 * total, -total]).all() and (b == 100 + i).all())
res["exact"] = exact
res["runners"] = sorted(name for name, d in comm._mem.doors.items() if d.held() + d.shapes())   # in C
runs = native.hot_stats()["runs"]
comm.all_reduce(x)
res["native"] = native.hot_stats()["runs"] > runs
# rank 1 broadcasts another array (its own call shape): both ranks raise the typed mismatch
other = np.zeros(7, np.int64)
try:
    comm.broadcast(b if r == 0 else other, 1)
    res["mismatch"] = "no error"
except InvalidArgument as exc:
    res["mismatch"] = "InvalidArgument"
# the communicator stays usable, and the remembered calls stay exact
x[:] = [r, r, r]
comm.all_reduce(x, op="max")
b[:] = 7 * r
comm.broadcast(b, 1)
res["after"] = bool((x == n - 1).all() and (b == 7).all())
# a changed array (now float64 through a new dtype view) is not taken for the remembered one
x = x.view(np.int32)
x[:] = r + 1
comm.all_reduce(x, op="sum")
res["retyped"] = x.tolist() == [total + n] * 3
print(json.dumps(res), flush=True)
comm.destroy()
"""


@pytest.mark.long
@pytest.mark.skipif(not native.hot_available(), reason="the native executor is not built")
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("recorder", ["on", "off"])
def test_remembered_calls_in_one_c_call_are_exact_and_still_checked_on_every_call(nranks: int, recorder: str) -> None:
    env = {**os.environ, "RINGFLOW_FLIGHT_RECORDER": "0"} if recorder == "off" else dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", str(nranks), "--no-bind", "--timeout", "100",
                        "--", sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line.split("] ", 1)[1]) for line in p.stdout.splitlines() if "{" in line]
    assert len(rows) == nranks, p.stdout
    for res in rows:
        assert res["exact"] == 40, res
        assert res["runners"] == ["all_reduce", "broadcast"], res
        assert res["native"], res
        assert res["mismatch"] == "InvalidArgument", res
        assert res["after"], res
        assert res["retyped"], res
