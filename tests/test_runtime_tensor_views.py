"""Collectives on CPU torch tensors made fresh for each call run as NumPy views of them: the remembered call shapes
in the doors take them as they take fresh arrays, the tensor holds the exact result and is what the call returns;
tensors NumPy cannot alias as they are (bfloat16, requiring grad) still take the full path, and a non-contiguous
one its typed error."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ringflow.runtime import native

RANK = """
import json, torch, ringflow, ringflow.errors
comm = ringflow.init(timeout=60.0)
r, n, res = comm.rank, comm.size, {"exact": 0, "same": 0, "calls": 0}
total = n * (n - 1) // 2
slow = []
python_path = comm._fast_again
comm._fast_again = lambda *a: (slow.append(a[0][0]), python_path(*a))[1]

def check(call, want, expect):
    got = call()
    res["calls"] += 1
    res["exact"] += bool(torch.equal(want, expect))
    res["same"] += got is want

for i in range(12):
    x = torch.full((5,), float(r + i))
    check(lambda: comm.all_reduce(x), x, torch.full((5,), float(total + n * i)))
    x, o = torch.full((3,), r * i, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    check(lambda: comm.all_reduce(x, op="max", out=o), o, torch.full((3,), (n - 1) * i))
    b = torch.full((4,), 10 * r + i, dtype=torch.int32)
    check(lambda: comm.broadcast(b, 1), b, torch.full((4,), 10 + i, dtype=torch.int32))
    g, go = torch.full((2,), r + i, dtype=torch.int16), torch.zeros(2 * n, dtype=torch.int16)
    check(lambda: comm.all_gather(g, out=go), go,
          torch.tensor([q + i for q in range(n) for _ in range(2)], dtype=torch.int16))
    s, so = torch.arange(2 * n, dtype=torch.float64) + i, torch.zeros(2, dtype=torch.float64)
    check(lambda: comm.reduce_scatter(s, "sum", out=so), so,
          n * (torch.arange(2 * r, 2 * r + 2, dtype=torch.float64) + i))
    a, ao = torch.arange(n, dtype=torch.int32) + 10 * r + i, torch.zeros(n, dtype=torch.int32)
    check(lambda: comm.all_to_all(a, out=ao), ao, torch.tensor([10 * q + r + i for q in range(n)], dtype=torch.int32))
res["python_path"] = len(slow)
doors = (comm._door_all_reduce, comm._door_broadcast, comm._door_all_gather, comm._door_reduce_scatter,
         comm._door_all_to_all)
res["shapes"] = [d.shapes() for d in doors]
others = [torch.full((4,), float(r + 1), dtype=torch.bfloat16), torch.full((4,), float(r + 1), requires_grad=True)]
res["others"] = [comm.all_reduce(t).tolist() == [float(total + n)] * 4 for t in others]
try:
    comm.all_reduce(torch.full((4, 2), float(r + 1))[:, 0])
    res["strided"] = "no error"
except ringflow.errors.InvalidArgument:
    res["strided"] = "InvalidArgument"
print(json.dumps(res), flush=True)
comm.destroy()
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch (optional extra) is not installed")
@pytest.mark.skipif(not native.hot_available(), reason="the native executor is not built")
def test_fresh_tensors_take_the_remembered_call_shapes_and_hold_the_exact_result() -> None:
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--timeout", "100",
                        "--", sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line.split("] ", 1)[1]) for line in p.stdout.splitlines() if "{" in line]
    assert len(rows) == 2, p.stdout
    for res in rows:
        assert res["exact"] == res["same"] == res["calls"] == 72, res
        assert res["shapes"] == [2, 1, 1, 1, 1], res   # every call shape held by its door
        assert res["python_path"] < 12, res   # fresh tensors do not take the Python remembered path call after call
        assert res["others"] == [True, True] and res["strided"] == "InvalidArgument", res
