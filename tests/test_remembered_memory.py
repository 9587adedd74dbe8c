"""Remembered calls do not keep arrays alive: temporaries reduced twice are freed when the program drops them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

RANK = """
import gc, json, numpy as np, ringflow
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
comm = ringflow.init(timeout=120.0)
n = 16 * 1024 * 1024   # 64 MiB of float32
comm.all_reduce(np.ones(n, np.float32))   # the communicator's own buffers for this size exist from here on
gc.collect()
start = rss_mib()
exact = 0
for i in range(20):
    x = np.full(n, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    x[:] = comm.rank + 1
    comm.all_reduce(x)   # the second call with the same array: it is remembered
    exact += bool(x[0] == 3 and x[-1] == 3)
    del x
gc.collect()
print(json.dumps({"start_mib": start, "end_mib": rss_mib(), "exact": exact,
                  "entries": comm._mem.entries()}), flush=True)
comm.destroy()
"""


@pytest.mark.long
def test_twenty_remembered_temporaries_of_64_mib_are_freed_when_dropped() -> None:
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--timeout", "280", "--",
                        sys.executable, "-c", RANK], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line.split("] ", 1)[1]) for line in p.stdout.splitlines() if "{" in line]
    assert len(rows) == 2, p.stdout
    for r in rows:
        assert r["exact"] == 20, r
        assert r["entries"] >= 1, r   # the calls were remembered, and still nothing is held
        assert r["end_mib"] - r["start_mib"] < 64, r
