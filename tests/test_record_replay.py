"""`ringflow replay`: a synthetic trace replayed on a modelled cluster takes exactly the compute it records plus
the simulator's time for each of its operations; placement and the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringflow.errors import InvalidArgument
from ringflow.sim.api import endpoints_of, simulate
from ringflow.workload.recorded import TRACE_FORMAT
from ringflow.workload.replay_sim import placement, replay_on
from ringflow.workload.validation import cluster_for

N = 8
GAP_S = 1e-3
STEPS = 3
OPS = [("all_reduce", 1 << 20), ("all_gather", 1 << 14)]


def synthetic(n: int = N, steps: int = STEPS, p2p_bytes: int = 0) -> dict:
    """n ranks that compute GAP_S before each call; per step the OPS, then (optionally) rank 0 sends to rank n-1."""
    calls = []
    for r in range(n):
        t, seq = 0, 0
        for s in range(steps):
            for op, nbytes in OPS:
                t += int(GAP_S * 1e9)
                calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": seq, "op": op, "dtype": "float32",
                              "count": nbytes // 4, "nbytes": nbytes, "root": None, "async": False, "status": "ok",
                              "site": "train.py:10" if op == "all_reduce" else "train.py:11",
                              "enq_ns": t, "start_ns": t, "end_ns": t + 1})
                t += 1
                seq += 1
            if p2p_bytes and r in (0, n - 1):
                t += int(GAP_S * 1e9)
                snd = r == 0
                calls.append({"rank": r, "comm": "w", "lane": "send" if snd else "recv", "seq": s, "op":
                              "send" if snd else "recv", "dtype": "uint8", "count": p2p_bytes, "nbytes": p2p_bytes,
                              "peer": n - 1 if snd else 0, "peer_rank": n - 1 if snd else 0, "tag": 0,
                              "async": False, "status": "ok", "site": "train.py:12", "enq_ns": t, "start_ns": t,
                              "end_ns": t + 1})
                t += 1
    return {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": n, "groups": {"w": list(range(n))},
            "ranks": {str(r): {} for r in range(n)}, "calls": calls, "flight": {}}


@pytest.mark.parametrize("nodes,mapping", [(1, "block"), (2, "round-robin")])
def test_replay_of_a_synthetic_trace_equals_the_simulators_answer(nodes: int, mapping: str) -> None:
    topo = cluster_for("dgx-h100", nodes)
    res = replay_on(synthetic(), topo, mapping=mapping, hosts=nodes)
    eps = placement(N, endpoints_of(topo), mapping, nodes)
    per_step = sum(GAP_S + simulate(topo, op, nbytes * (N if op == "all_gather" else 1), engine="flow",
                                    endpoints=eps).time_us / 1e6 for op, nbytes in OPS)
    # the trace starts at its first call: the compute before it is not part of the replay
    assert res["makespan_s"] == pytest.approx(STEPS * per_step - GAP_S, rel=1e-9)
    assert [r["step"] for r in res["steps"]] == list(range(STEPS))
    for row in res["steps"][:-1]:   # from one all-reduce to the next
        assert row["time_s"] == pytest.approx(per_step, rel=1e-9)
        assert row["exposed_comm_s"] == pytest.approx(per_step - 2 * GAP_S, rel=1e-9)
    assert res["busiest_links"] and res["busiest_links"][0]["bytes"] > 0
    if mapping == "round-robin":   # ranks alternate between the two servers
        assert [e.split("/")[0] for e in eps[:4]] == ["h0", "h1", "h0", "h1"]


def test_a_send_recv_pair_takes_the_simulated_message_time() -> None:
    topo = cluster_for("dgx-h100", 2)
    res = replay_on(synthetic(p2p_bytes=1 << 20), topo, mapping="round-robin", hosts=2)
    eps = placement(N, endpoints_of(topo), "round-robin", 2)
    base = replay_on(synthetic(), topo, mapping="round-robin", hosts=2)["makespan_s"]
    msg = simulate(topo, "sendrecv", 1 << 20, algorithm="p2p", engine="flow", endpoints=[eps[0], eps[N - 1]],
                   root=0).time_us / 1e6
    # ranks 0 and n-1 compute GAP_S more and then exchange one message, every step; the others wait for them
    assert res["makespan_s"] == pytest.approx(base + STEPS * (GAP_S + msg), rel=1e-9)


def test_placement_errors_and_the_cli(tmp_path: Path) -> None:
    eps = [f"h0/gpu{i}" for i in range(8)]
    with pytest.raises(InvalidArgument, match="only 8 GPUs"):
        placement(9, eps, "block", 1)
    with pytest.raises(InvalidArgument, match="neither"):
        placement(2, eps, "nope", 1)
    f = tmp_path / "map.json"
    f.write_text(json.dumps(["h0/gpu3", "h0/gpu1"]))
    assert placement(2, eps, str(f), 1) == ["h0/gpu3", "h0/gpu1"]
    tr = tmp_path / "trace.json"
    tr.write_text(json.dumps(synthetic(n=4, steps=2)))
    chrome = tmp_path / "chrome.json"
    p = subprocess.run([sys.executable, "-m", "ringflow", "replay", str(tr), "--topo", "dgx-h100", "--nodes", "2",
                        "--json", "--trace", str(chrome)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["steps"]) == 2 and out["placement"] == ["h0/gpu0", "h0/gpu1", "h0/gpu2", "h0/gpu3"]
    ev = json.loads(chrome.read_text())["traceEvents"]
    assert len(ev) == 4 * 2 * len(OPS) and {e["tid"] for e in ev} == {0, 1, 2, 3}


def test_same_host_replay_prices_each_collective_with_the_host_model() -> None:
    from ringflow.workload.replay_host import HostDurations, communication_time, exposed_time

    class Stub:
        """A cost model that charges 100 us per call and notes what it was asked."""
        margin = 0.0
        seen: list = []

        def supports(self, nranks: int) -> bool:
            return True

        def predict_us(self, schedule, shape, inplace: bool) -> float:
            self.seen.append((schedule.collective.value, schedule.algorithm, shape.count, shape.itemsize, inplace))
            return 100.0

    trace = synthetic(n=4, steps=2)
    for c in trace["calls"]:
        if c["op"] == "all_reduce":
            c["algo"] = "ring"
    stub = Stub()
    dur = HostDurations(stub, trace)
    assert communication_time(trace, dur) == pytest.approx(2 * len(OPS) * 100e-6)
    assert ("all_reduce", "ring", (1 << 20) // 4, 4, True) in stub.seen
    assert any(s[0] == "all_gather" and s[2] == (1 << 14) // 4 and not s[4] for s in stub.seen)
    # exposed communication: the synthetic calls are blocking and take 1 ns from issue to end
    assert exposed_time(trace) == pytest.approx(2 * len(OPS) * 1e-9)


def test_grow_replicates_the_job_as_data_parallel_copies() -> None:
    from ringflow.workload.replay_sim import grow
    t = synthetic(n=4, steps=2, p2p_bytes=1 << 10)
    g = grow(t, 3)
    assert g["world_size"] == 12 and g["groups"]["w"] == list(range(12)) and len(g["calls"]) == 3 * len(t["calls"])
    sends = [c for c in g["calls"] if c["lane"] == "send"]
    assert sorted((c["rank"], c["peer_rank"]) for c in sends) == sorted([(0, 3), (4, 7), (8, 11)] * 2)
    topo = cluster_for("dgx-h100", 2)
    small, big = replay_on(t, topo, mapping="block", hosts=2), replay_on(g, topo, mapping="block", hosts=2)
    # the world all-reduce now spans 12 GPUs on two servers: it cannot be faster than on 4 GPUs of one
    assert big["makespan_s"] >= small["makespan_s"] and len(big["placement"]) == 12
    with pytest.raises(InvalidArgument):
        grow(t, 0)


def test_grow_gives_every_copy_its_waits() -> None:
    """A wait of the recorded job is a wait of each copy, on that copy's operation."""
    from ringflow.workload.replay import instance_key, waited_key
    from ringflow.workload.replay_sim import grow
    t = synthetic(n=4, steps=1, p2p_bytes=1 << 10)
    recv = next(c for c in t["calls"] if c["lane"] == "recv")
    t["waits"] = [{"rank": recv["rank"], "comm": "w", "lane": "wait", "of": "recv", "seq": recv["seq"],
                   "peer": recv["peer"], "peer_rank": recv["peer_rank"], "tag": recv["tag"], "op": "wait",
                   "status": "ok", "site": "t.py:9", "async": False, "enq_ns": recv["end_ns"],
                   "start_ns": recv["end_ns"], "end_ns": recv["end_ns"] + 1}]
    g = grow(t, 3)
    assert sorted(w["rank"] for w in g["waits"]) == [3, 7, 11]
    ops = {instance_key(c) for c in g["calls"]}
    assert all(waited_key(w) in ops for w in g["waits"])


def test_concurrent_operations_of_the_data_parallel_copies_contend_for_the_fabric(tmp_path: Path) -> None:
    from ringflow.topology import build_cluster
    from ringflow.workload.contention import dimension_factor
    from ringflow.workload.replay_sim import grow
    nbytes, steps, copies = 1 << 24, 2, 8
    calls = []
    for r in (0, 1):   # rank 0 sends to rank 1 after GAP_S of compute, every step
        for s in range(steps):
            t = int((s + 1) * GAP_S * 1e9)
            calls.append({"rank": r, "comm": "w", "lane": "send" if r == 0 else "recv", "seq": s,
                          "op": "send" if r == 0 else "recv", "dtype": "uint8", "count": nbytes, "nbytes": nbytes,
                          "peer": 1 - r, "peer_rank": 1 - r, "tag": 0, "async": False, "status": "ok",
                          "site": "pp.py:3", "enq_ns": t, "start_ns": t, "end_ns": t + 1})
    trace = grow({"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": 2,
                  "groups": {"w": [0, 1]}, "ranks": {"0": {}, "1": {}}, "calls": calls, "flight": {}}, copies)
    topo = build_cluster("dgx-h100", 8, fabric="fat-tree", oversubscription=4.0, radix=16)
    eps = endpoints_of(topo)
    where = [eps[k] if r == 0 else eps[7 * 8 + k] for k in range(copies) for r in (0, 1)]   # server 0 -> 7
    f = tmp_path / "map.json"
    f.write_text(json.dumps(where))
    alone = replay_on(trace, topo, mapping=str(f), contention=False)
    together = replay_on(trace, topo, mapping=str(f))
    pairs = [[where[2 * k], where[2 * k + 1]] for k in range(copies)]
    factor = dimension_factor(topo, "sendrecv", nbytes, pairs)["factor"]
    msg = simulate(topo, "sendrecv", nbytes, algorithm="p2p", engine="flow", endpoints=pairs[0], root=0).time_us / 1e6
    assert factor > 1.5   # eight messages through a 4:1 oversubscribed spine
    assert together["contention"]["operations_slowed"] == copies * steps
    assert together["makespan_s"] == pytest.approx(alone["makespan_s"] + steps * msg * (factor - 1), rel=1e-6)


@pytest.mark.parametrize("op_s,gap_s", [(5e-3, 1e-3), (1e-3, 5e-3)])
def test_a_wait_on_an_async_call_blocks_until_its_operation_ends(op_s: float, gap_s: float) -> None:
    """Each rank issues an async all-reduce, computes gap_s, waits on its Work, computes 1 ms: the wait holds
    the rank until the operation ends, and not at all if it ended during the compute."""
    from ringflow.workload.replay import replay
    calls, waits = [], []
    for r in range(2):
        calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": 0, "op": "all_reduce", "dtype": "float32",
                      "count": 4, "nbytes": 16, "root": None, "async": True, "status": "ok", "site": "t.py:1",
                      "enq_ns": 0, "start_ns": 0, "end_ns": 1})
        waits.append({"rank": r, "comm": "w", "lane": "wait", "of": "coll", "seq": 0, "op": "wait", "status": "ok",
                      "site": "t.py:2", "async": False, "enq_ns": int(gap_s * 1e9), "start_ns": int(gap_s * 1e9),
                      "end_ns": int(gap_s * 1e9) + 1})
        calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": 1, "op": "barrier", "dtype": None,
                      "count": 0, "nbytes": 0, "root": None, "async": False, "status": "ok", "site": "t.py:3",
                      "enq_ns": int(gap_s * 1e9) + 1 + 1_000_000, "start_ns": 0, "end_ns": 0})
        calls[-1]["start_ns"] = calls[-1]["end_ns"] = calls[-1]["enq_ns"]
    trace = {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": 2, "groups": {"w": [0, 1]},
             "ranks": {"0": {}, "1": {}}, "calls": calls, "waits": waits, "flight": {}}
    rep = replay(trace, lambda k, cs: op_s if cs[0]["op"] == "all_reduce" else 0.0)
    blocked = max(0.0, op_s - gap_s)
    assert rep.comm_s[0] == pytest.approx(blocked, abs=1e-8)
    assert rep.makespan_s == pytest.approx(max(op_s, gap_s) + 1e-3, abs=1e-8)
    # without the waits only the barrier, queued behind the all-reduce on the collective lane, holds the rank
    no_waits = replay(dict(trace, waits=[]), lambda k, cs: op_s if cs[0]["op"] == "all_reduce" else 0.0)
    assert no_waits.comm_s[0] == pytest.approx(max(0.0, op_s - gap_s - 1e-3), abs=1e-8)
