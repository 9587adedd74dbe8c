"""Multi-host validation on emulated hosts: network namespaces joined by tbf-limited veth links.

`run(nhosts, per_host, rate_mbit)` starts `nhosts x per_host` real ranks (shm inside a namespace,
TCP between namespaces), times flat ring and hierarchical all-reduce like `ringflow bench`, and
predicts both on a cluster of the calibrated host topology whose NIC links run at `rate_mbit`.
Skips (returns the reason) where namespaces cannot be made.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

SIZES = (2**18, 2**20, 2**22, 2**24)


def measure(nhosts: int, per_host: int, rate_mbit: float, sizes: Sequence[int] = SIZES,
            timeout_s: float = 300.0) -> list[dict]:
    """Run the worker on emulated hosts; the measured rows (ring and hierarchical)."""
    from ..errors import RingflowSystemError as RfSystemError
    from ..runtime.job import auth
    from ..testing import netns
    n = nhosts * per_host
    with netns.NetnsCluster(nhosts, rate_mbit=rate_mbit) as cl, tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        port = random.randint(20000, 40000)
        secret, job = auth.new_secret(), "mh" + os.urandom(4).hex()
        procs = []
        for r in range(n):
            h = r // per_host
            env = dict(os.environ, RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE=str(n),
                       RINGFLOW_LOCAL_RANK=str(r % per_host), RINGFLOW_STORE_ADDR=f"{cl.address(0)}:{port}",
                       RINGFLOW_SECRET=secret, RINGFLOW_JOB_ID=job, RINGFLOW_SOCKET_IFNAME="eth0",
                       PYTHONUNBUFFERED="1")
            argv = [sys.executable, "-m", "ringflow.hostmodel._mh_worker", out, str(per_host), *map(str, sizes)]
            procs.append(subprocess.Popen(cl.command(h, argv), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
        try:
            codes = [p.wait(timeout=timeout_s) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RfSystemError(f"multi-host validation timed out after {timeout_s}s", "try smaller sizes") from None
        if any(codes) or not os.path.exists(out):
            logs = b"".join(p.stdout.read() for p in procs if p.stdout)[-2000:].decode(errors="replace")
            raise RfSystemError(f"multi-host ranks failed (exit codes {codes})", f"rank output: {logs}")
        with open(out) as fh:
            return json.load(fh)


def cluster_for(host_topo: Any, nhosts: int, rate_mbit: float) -> Any:
    """The calibrated host topology replicated over `nhosts` emulated hosts on one switch."""
    from ..topology import build_cluster
    return build_cluster(host_topo, nhosts, fabric="fat-tree", nic_gbps=rate_mbit / 1000.0)


def predict(topo: Any, rows: Sequence[dict], per_host: int) -> list[dict]:
    """Predicted time for each measured row, with the same schedule."""
    from ..algorithms import registry
    from ..sim.api import simulate_schedule
    out = []
    for r in rows:
        n = int(r["nranks"])
        groups = [list(range(h * per_host, (h + 1) * per_host)) for h in range(n // per_host)]
        sched = (registry.get_schedule("all_reduce", "hierarchical", n, host_groups=groups)
                 if r["algorithm"] == "hierarchical" else registry.get_schedule("all_reduce", "ring", n))
        eps = [e for h in range(n // per_host)
               for e in [x for x in topo.endpoints() if topo.host_of(x) == h][:per_host]]
        res = simulate_schedule(topo, sched, int(r["size_bytes"]), params={"host_transport": "shm"}, endpoints=eps)
        meas = float(r["time_us"])
        out.append({**r, "measured_us": meas, "predicted_us": res.time_us,
                    "error": (res.time_us - meas) / meas if meas > 0 else 0.0})
    return out


def run(host_topo: Any, nhosts: int = 2, per_host: int = 2, rate_mbit: float = 1000.0,
        sizes: Sequence[int] = SIZES) -> tuple[list[dict] | None, str | None]:
    """(rows, None), or (None, reason) when network namespaces are not available."""
    from ..testing import netns
    why = netns.available()
    if why:
        return None, why
    rows = measure(nhosts, per_host, rate_mbit, sizes)
    return predict(cluster_for(host_topo, nhosts, rate_mbit), rows, per_host), None
