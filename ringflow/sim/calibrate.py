"""`ringflow calibrate`: measure this machine with ringflow's own runtime, write a host-cpu topology.

One job per transport (shm, and TCP with RINGFLOW_SHM_DISABLE=1) and rank count (2 and 4 by
default) times tiny hand-built schedules on the real runtime (``_calib_worker``, the timing loop of
`ringflow bench`), with every rank busy (pairs 0-1, 2-3, ... at once, as in a collective's step):

- ``steps1`` / ``steps8``: 1 and 8 steps of a 4-byte message -> per-step latency
  alpha = (t8 - t1) / 7 and per-call overhead t1 - alpha;
- ``oneway`` / ``oneway_reduce`` / ``exchange`` / ``exchange_reduce`` / ``copy`` at 4 KiB .. 16 MiB;
- ``exchange_reduce_split``: the exchange with reduction where each rank sends one block of a two-block
  buffer and reduces into the other, as a collective's reducing step does (``exchange_reduce`` reduces
  into the block it sends, which its own send just brought into cache); every rank reducing is read from it;
- ``oneway_reduce_inplace``: ``oneway_reduce`` with IN and OUT one array (written before, as the
  bench's), as in-place all-reduce and reduce call it: a reduction into its own operand streams one
  buffer fewer; its rate is taken with every pair's receiver reducing, so no busy slowdown on top;
  it runs into the lower rank of each pair (1 -> 0), a rooted reduce's side: over TCP the first
  core receives and reduces up to 1.25x slower than the second (plain transfers are symmetric);
- ``exchange_fresh``: a copy into scratch, then the exchange of the scratch: what sending bytes the
  rank just wrote (a tree forwarding, the all-gather half of an all-reduce) costs beyond the copy
  and the plain exchange (on this VM 2x the plain exchange at 512 KiB: such sources go through the
  slots up to 1 MiB, untouched ones by single copy from 256 KiB); at other sizes, and on hosts with
  fewer cores than ranks, what sending bytes a copy wrote (a Bruck all-gather's own block) costs;
- ``exchange_copy``: the exchange and a copy of as many bytes in one step, as an all-gather's or a
  gather's root's step runs them: what the copy costs beside a transfer beyond the two apart (on this
  VM +40-60 us at 512 KiB-1 MiB on 2 shm ranks: together they overflow the core's 2 MiB L2);
- ``oneway_copy``: the one-way of one block of a two-block buffer and the sender's copy of the other
  block in one step, as a scatter's root runs them: what the copy costs beside a send alone (over TCP
  the sender's core copies the message into the socket; the exchange's figure has every rank receiving
  too, and copies the block it sends, which the send left in the cache);
- ``alltoall`` (more than 2 ranks): one step in which every rank sends 1/n of its buffer to each
  peer: a rank with several peers in a step pays per message, which the one-peer exchange cannot
  show (the simulator prices steps with several peers per rank from it). Timed twice more after every
  other schedule, the fastest kept: 4 ranks on 2 cores meet a slow mode (1.7-1.8x at 4-64 KiB) that is
  gone seconds later and that the bench's sharded all-reduces never show;
- ``fanin`` / ``fanout`` (more than 2 ranks): one step in which rank 0 receives 1/n of the buffer
  from every peer (a direct gather) or sends one to each (a direct scatter).  Only the root has
  several peers, its peers idle after one message, and over TCP receiving costs the root less than
  sending: the simulator prices a step of that shape from its own curve, not the all-to-all's;
- ``oneway_solo`` (more than 2 ranks): one transfer while the other ranks idle.  A rank's engine
  runs at the rate of a lone transfer (its receiver has a core and the memory bus to itself: the
  one-way curve, or oneway_solo), the host's total at the rate of the exchange with every rank
  busy; the simulator gives each rank the first and the host the second (a shared pool);
- ``steps1_checked`` - ``steps1``: the cross-rank argument check (a CHECK exchange), which the
  simulator adds to schedules that cannot check themselves (`algorithms.schedule.is_self_checking`);
  ``check_rooted``: the same difference on the fan-out step at 64 KiB-4 MiB, the check's visible
  cost before a rooted collective (4 ranks at 64 KiB: 0.85-1.0 of the 1-step one on this VM; less
  before larger fan-outs, whose root's messages overlap its peers' check: 4 TCP ranks 500 us at
  64 KiB, 270-370 us at 1-4 MiB; 2 ranks: more than before the 4-byte step, docs/simulator.md).
  Everything else is timed with the check off.

A CPU's rates are not one line: the single-copy threshold, the caches (a slice still dirty in the
sender's cache crosses cores slowly), DRAM beyond the last-level cache, and 4 ranks sharing 2
cores each bend them.  So `fit` keeps the measured curves (``meta["sim"]["host_curves"]``) and
the simulator reads them at each call's largest message, local copies at the call's working set
(`SimParams.for_call`);
`tests/test_sim_calibrate.py` checks the round trip.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np

from ..errors import SystemError as RFSystemError
from ._calib_worker import CHECK_BUSY_BYTES, CURVE_STEPS, MANY_RANK_STEPS


# A calibration point this far (natural log: 1.49x) above the line through its neighbours is one delayed
# sample (4 shm ranks on 2 cores: an exchange with reduction of 2 MiB at 1,612 us between 620 at 1 MiB and
# 1,663 at 4 MiB, where other jobs measured 984-1,088). Replays of 19 recordings: 4,590 -> 4,605 rows within
# 15 % with it; dips are not touched (real regime changes look like them: 4,606 with both at 0.4, 4,559 at 0.25).
SPIKE_TOL = 0.4


def busy_warning(window_s: float = 1.0) -> str | None:
    """A warning when other processes use this machine now (timings then only bound the truth).

    Their share of the cores over `window_s` from /proc/stat (`runtime.hostload`); the 1-minute load
    average, used where /proc/stat is missing, lags by a minute and still counts work that has just ended
    (a test run before a validation warned of a host that was idle)."""
    import time

    from ..runtime.hostload import HostLoadMeter
    with HostLoadMeter() as meter:
        time.sleep(window_s)
    load = meter.result
    if load is not None:
        if not load.busy:
            return None
        what = f"other processes are using {load.foreign_fraction:.0%} of its {load.cores} cores"
    else:
        try:
            avg = os.getloadavg()[0]
        except OSError:
            return None
        cores = os.cpu_count() or 1
        if avg <= 0.5 * cores:
            return None
        what = f"1-minute load {avg:.1f} on {cores} cores"
    return (f"this machine is busy ({what}): measured times include other processes' work; repeat when it "
            f"is idle for trustworthy figures")


def measure(nranks: int, transport: str, quick: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the calibration worker on `nranks` local ranks over `transport` ('shm' or 'tcp')."""
    from ..runtime import launcher
    with tempfile.TemporaryDirectory(prefix="ringflow-cal-") as d:
        out = os.path.join(d, "cal.json")
        argv = [sys.executable, "-m", "ringflow.sim._calib_worker", out] + (["quick"] if quick else [])
        env = {"RINGFLOW_SHM_DISABLE": "1" if transport == "tcp" else "0"}
        code = launcher.run(nranks, argv, timeout_s=timeout_s, prefix=True, extra_env=env)
        if code != 0 or not os.path.exists(out):
            raise RFSystemError(f"calibration job ({nranks} ranks, {transport}) failed with exit code {code}",
                                "run `ringflow run -n 2 ...` to check the runtime works on this machine")
        with open(out) as fh:
            return json.load(fh)


def despike(values: list[float], sizes: list[int], tol: float = SPIKE_TOL) -> list[float]:
    """`values` (times at `sizes`) with every interior point more than `tol` (natural log) above the log-log
    line through its two neighbours put on that line: one sample the scheduler delayed, not a regime."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 3 or np.any(v <= 0):
        return [float(x) for x in v]
    lx, ly = np.log(np.asarray(sizes, dtype=np.float64)), np.log(v)
    w = (lx[1:-1] - lx[:-2]) / (lx[2:] - lx[:-2])
    line = (1.0 - w) * ly[:-2] + w * ly[2:]
    out = ly.copy()
    spike = ly[1:-1] - line > tol
    out[1:-1][spike] = line[spike]
    return np.exp(out).tolist()


def step_costs(results: dict[str, Any]) -> tuple[float, float]:
    """(t1, alpha): a 1-step call of 4 bytes and the per-step latency, from the 1- and 8-step schedules."""
    t1, t8 = float(results["steps1"]["4"]), float(results["steps8"]["4"])
    return t1, max(0.0, (t8 - t1) / 7.0)


def copy_bound(exchange_copy: Any, copy: Any, base_us: float) -> np.ndarray:
    """What the plain exchange cannot exceed: the same exchange with a copy after it in its step, less the
    copy's own work (a copy step's time beyond the call overhead `base_us`)."""
    return np.asarray(exchange_copy, dtype=np.float64) - np.maximum(np.asarray(copy, dtype=np.float64) - base_us, 0.0)


def monotone(values: list[float]) -> np.ndarray:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []   # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return np.concatenate([np.full(int(c), s / c) for s, c in blocks]) if blocks else np.zeros(0)


def _rooted_checks(r: dict[str, Any]) -> dict[str, Any]:
    """The check's visible cost before the fan-out step: at the smallest size measured
    (`check_rooted_us`), and per size where measured at several (`check_rooted_sizes`, `check_rooted_fanout_us`)."""
    if "check_rooted" not in r:
        return {}
    sizes = sorted(int(k) for k in r["check_rooted"])
    vals = [max(0.0, float(r["check_rooted"][str(b)])) for b in sizes]
    return {"check_rooted_us": vals[0],
            **({"check_rooted_sizes": sizes, "check_rooted_fanout_us": vals} if len(sizes) > 1 else {})}


def curves(result: dict[str, Any]) -> dict[str, Any]:
    """One calibration job's times -> the curve set `SimParams.host_curves` holds for its rank count."""
    r = result["results"]
    t1, alpha = step_costs(r)
    sizes = sorted(int(k) for k in r["oneway"])
    series = {name: despike([float(r[name][str(b)]) for b in sizes], sizes)
              for name in CURVE_STEPS + MANY_RANK_STEPS if name in r}
    # timings only grow with size and a reduction only adds work: clean what noise inverted
    # slow modes the collectives do not see (loopback TCP, one job in three) are cleaned by what each
    # step contains: an exchange slower than the same exchange with a reduction ran in one (2 TCP
    # ranks, 512 KiB-1 MiB: 490 us, then 153 us in the next job, against 220 us with the reduction):
    # the reduction's time bounds it
    # the same exchange with a copy of as many bytes after it in its step bounds it too, less the copy's own
    # work: the first 2-rank TCP job of a validation run measures the plain exchange 2-3x slow from 512 KiB
    # (680 us at 1 MiB against 300; 9 of 10 recordings; not its bench nor the next schedules), which the
    # reduction bounds only to 430 (that job's rows within 15 %, 7 recordings: 354 -> 446 of 504)
    xr = monotone(series["exchange_reduce"])
    bound = np.asarray(xr)
    if "exchange_copy" in series:
        bound = np.minimum(bound, copy_bound(series["exchange_copy"], series["copy"], t1 - alpha))
    ex = monotone(np.minimum(series["exchange"], bound).tolist())
    xr = np.maximum(xr, ex)
    xrs = np.maximum(monotone(series["exchange_reduce_split"]), ex) if "exchange_reduce_split" in series else None
    # likewise a one-way slower than the exchange (which is that one-way and its reverse at once):
    # 2 TCP ranks, 128 KiB, 73 us against 62 us in one job, 33 us in the next
    ow = monotone(np.minimum(series["oneway"], ex).tolist())
    cp = monotone(series["copy"])
    solo = monotone(series["oneway_solo"]) if "oneway_solo" in series else ow
    owr = np.maximum(monotone(series["oneway_reduce"]), ow) if "oneway_reduce" in series else None
    # the in-place one may lie below the plain one-way where the two take different paths: over shm
    # reductions keep the slot path up to 1 MiB, which with ranks sharing cores is faster than the plain
    # message's single copy (4 shm ranks, 256 KiB: 0.77-0.88 of it; SimParams.slot_reduce_factor)
    owri = None
    if "oneway_reduce_inplace" in series:
        owri = monotone(series["oneway_reduce_inplace"])
        if not result.get("single_copy_min_bytes"):
            owri = np.maximum(owri, ow)
    oneway_GBps = [b / max(t - t1, 1e-3) * 1e-3 for b, t in zip(sizes, ow)]
    check = max(0.0, float(r["steps1_checked"]["4"]) - t1) if "steps1_checked" in r else 0.0
    return {"nranks": int(result["nranks"]), "sizes": sizes, "alpha_us": alpha, "base_us": t1 - alpha,
            "t1_us": t1, "check_us": check, "single_copy_min_bytes": result.get("single_copy_min_bytes"),
            "single_copy_fresh_min_bytes": result.get("single_copy_fresh_min_bytes"),
            **_rooted_checks(r),
            **({"check_busy_us": max(0.0, float(r["check_busy"][str(CHECK_BUSY_BYTES)]))} if "check_busy" in r else {}),
            "oneway_us": ow.tolist(), "exchange_us": ex.tolist(), "exchange_reduce_us": xr.tolist(),
            "copy_us": cp.tolist(), "oneway_solo_us": solo.tolist(),
            **({"oneway_reduce_us": owr.tolist()} if owr is not None else {}),
            **({"exchange_reduce_split_us": xrs.tolist()} if xrs is not None else {}),
            **({"oneway_reduce_inplace_us": owri.tolist()} if owri is not None else {}),
            **{f"{k}_us": monotone(series[k]).tolist()
               for k in ("alltoall", "fanin", "fanout", "exchange_fresh", "exchange_copy", "oneway_copy", "shift",
                         "exchange3")
               if k in series},
            "busy_ranks": 2 * (int(result["nranks"]) // 2), "peak_oneway_GBps": float(max(oneway_GBps))}


def fit(measured: dict[str, dict[int, dict[str, Any]]], nprocs: int = 4,
        cores: int | None = None) -> tuple[Any, dict[str, dict[str, Any]]]:
    """measured[transport][nranks] = worker output -> (host-cpu Topology, report of fitted parameters).

    The topology's SHM / LOOPBACK edges carry the highest one-way rate measured on that transport;
    ``meta["sim"]["host_curves"]`` carries every job's curves (`SimParams.for_call` reads them at
    each call's largest message, local copies at its working set).  The report lists, per transport and
    rank count, the per-step latency, the per-call overhead and the rates at 64 KiB, 1 MiB and 16 MiB
    messages."""
    from ..runtime.transport.doorbell import host_cores
    from ..topology import Topology
    from ..topology.presets import build_host_cpu
    from .params import SimParams
    report: dict[str, dict[str, Any]] = {}
    host_curves: dict[str, dict[str, Any]] = {}
    link: dict[str, float] = {}
    for tr, by_n in measured.items():
        sets = {str(n): curves(res) for n, res in sorted(by_n.items())}
        link[tr] = max(c["peak_oneway_GBps"] for c in sets.values())
        for c in sets.values():
            c["link_GBps"] = link[tr]
        host_curves[tr] = sets
    shm, tcp = link.get("shm"), link.get("tcp")
    ref = shm or tcp
    assert ref is not None
    topo = Topology("host-cpu-calibrated", meta={"preset": "host-cpu", "calibrated": True})
    build_host_cpu(topo, 0, nprocs, shm_GBps=shm or ref, loopback_GBps=tcp or ref,
                   shm_latency_us=0.0, loopback_latency_us=0.0)
    topo.meta["sim"] = {"host_curves": host_curves,
                        "host_cores": int(cores or host_cores()),
                        "calibration": {"raw": measured}}
    base = SimParams(host_curves=host_curves)
    for tr, sets in host_curves.items():
        for n, c in sets.items():
            p = f"{tr}.{n}ranks"
            report[f"{p}.alpha_us"] = {"value": c["alpha_us"], "from": _source("alpha_us")}
            report[f"{p}.base_us"] = {"value": c["base_us"], "from": _source("base_us")}
            report[f"{p}.check_us"] = {"value": c["check_us"], "from": _source("check_us")}
            for key in ("check_rooted_us", "check_busy_us"):
                if key in c:
                    report[f"{p}.{key}"] = {"value": c[key], "from": _source(key)}
            for label, m in (("64KiB", 2**16), ("1MiB", 2**20), ("16MiB", 2**24)):
                q = dataclasses.replace(base, host_transport=tr).for_call(m, int(n), m)
                tier = "loopback" if tr == "tcp" else "shm"
                report[f"{p}.{label}.oneway_GBps"] = {"value": q.link_efficiency[tier] * link[tr],
                                                      "from": _source("oneway_GBps")}
                report[f"{p}.{label}.endpoint_GBps"] = {"value": (q.endpoint_GBps or {})[tr],
                                                        "from": _source("endpoint_GBps")}
                report[f"{p}.{label}.reduce_GBps"] = {"value": q.reduce_GBps, "from": _source("reduce_GBps")}
                report[f"{p}.{label}.reduce_inplace_GBps"] = {"value": q.reduce_inplace_GBps,
                                                              "from": _source("reduce_inplace_GBps")}
                report[f"{p}.{label}.copy_GBps"] = {"value": q.copy_GBps, "from": _source("copy_GBps")}
                report[f"{p}.{label}.fresh_send_GBps"] = {"value": q.fresh_send_GBps,
                                                          "from": _source("fresh_send_GBps")}
                report[f"{p}.{label}.copy_beside_transfer_GBps"] = {
                    "value": q.copy_beside_transfer_GBps, "from": _source("copy_beside_transfer_GBps")}
                report[f"{p}.{label}.beside_receive_share"] = {"value": q.beside_receive_share,
                                                               "from": _source("beside_receive_share")}
                report[f"{p}.{label}.relay_step_slowdown"] = {"value": q.relay_step_slowdown,
                                                              "from": _source("relay_step_slowdown")}
                report[f"{p}.{label}.shift_step_slowdown"] = {"value": q.shift_step_slowdown,
                                                              "from": _source("shift_step_slowdown")}
                report[f"{p}.{label}.chained_step_factor"] = {"value": q.chained_step_factor,
                                                              "from": _source("chained_step_factor")}
    report["host_cores"] = {"value": topo.meta["sim"]["host_cores"],
                            "from": "runtime.transport.doorbell.host_cores (cgroup cpuset, else online CPUs)"}
    return topo, report


def _source(key: str) -> str:
    return {"alpha_us": "(t 8 steps - t 1 step) / 7, 4-byte messages, every rank busy",
            "base_us": "t 1 step - alpha: the call overhead (Python, bookkeeping)",
            "check_us": "a 1-step call with the cross-rank argument check - one without (RINGFLOW_CHECKS_DISABLE)",
            "check_rooted_us": "the same on the fan-out step at 64 KiB (rooted collectives; a direct scatter reads "
                               "it per size, at its messages, where the calibration measured several)",
            "check_busy_us": "the same on the exchange step at 64 KiB (calls whose first step has every rank "
                             "sending and receiving; more than 2 ranks)",
            "oneway_GBps": "bytes / (one-way time - t 1 step) at this message size",
            "endpoint_GBps": "2 x bytes / (two-way exchange time - t 1 step): a rank's engine carries both",
            "reduce_GBps": "1 / slope of (one-way-with-reduction time - one-way time) over the sizes within "
                           "m/2..2m: one rank reducing alone (every rank at once: the exchange's, as "
                           "reduce_busy_slowdown; over TCP with ranks sharing cores at most the ranks reducing; over shm with a core per "
                           "rank at the message size itself)",
            "reduce_inplace_GBps": "1 / slope of (one-way-with-reduction time, IN = OUT - one-way time) over "
                                   "the sizes within m/2..2m: a rank reducing into its own operand "
                                   "(in-place all-reduce, reduce)",
            "copy_GBps": "bytes / (local copy call - call overhead) (COPY ops: Bruck's rotations, ...)",
            "fresh_send_GBps": "bytes / (exchange of just-copied bytes - their copy - the plain exchange): "
                               "the extra cost of sending what the rank wrote earlier in the call, every such "
                               "byte on single-copy..fresh single-copy messages with a core per rank, else "
                               "only bytes its copies wrote (None: none, or below the single-copy size)",
            "copy_beside_transfer_GBps": "1 / mean per byte of (exchange and copy in one step - the exchange - the "
                                         "copy's work) over the sizes within m/2..2m: a copy beside a receive "
                                         "(None: none, below a tenth of the exchange, or more ranks than "
                                         "cores)",
            "beside_receive_share": "over TCP with a core per rank: one rank's reduction beside a one-way over "
                                    "every rank's beside the exchange (reduce_GBps's two), the share of "
                                    "copy_beside_transfer a rank pays where it receives without sending; else 1",
            "chained_step_factor": "((three exchange steps - one) / 2 - alpha) / (one exchange - t 1 step), "
                                   "within 0.25..1: a transfer step right after another, no local work between, "
                                   "over the first (slot-copied messages where ranks outnumber cores; else 1)",
            "relay_step_slowdown": "(shift step - t 1 step) / (exchange - t 1 step), summed over the sizes within "
                                   "m/2..2m, at least 1: what a ring step's transfers take over a pair exchange's "
                                   "(1 below 1 MiB messages, or without a shift step: 2 ranks; over TCP with "
                                   "ranks sharing cores not in the call's opening step)",
            "shift_step_slowdown": "the same ratio below 1 MiB messages, on shift steps alone (every rank sends "
                                   "one message and receives one, not in pairs) after the call's opening step, "
                                   "over TCP with ranks sharing cores; else 1",
            }.get(key, "")


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several calibration jobs of one transport and rank count as one: every measured time the median
    of the jobs' (one job's outlier curve no longer decides a fitted rate)."""
    if not runs:
        raise ValueError("no calibration runs")
    out = json.loads(json.dumps(runs[0]))
    for key, series in out["results"].items():
        for size in series:
            vals = [float(r["results"][key][size]) for r in runs if size in r["results"].get(key, {})]
            series[size] = float(np.median(vals))
    return out


def calibrate(nprocs: int = 4, quick: bool = False, transports: tuple[str, ...] = ("shm", "tcp"),
              rank_counts: tuple[int, ...] = (2, 4), repeats: int = 1) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Measure (real runtime jobs, `repeats` per transport and rank count, merged by `median_of`) and
    fit; returns (topology, report)."""
    measured = {tr: {n: median_of([measure(n, tr, quick) for _ in range(max(1, repeats))]) for n in rank_counts}
                for tr in transports}
    return fit(measured, nprocs)
