"""`ringflow diagnose` on injected faults between real ranks (launched with `ringflow run`; the rank side is
tests/record_ranks.py): a rank that sleeps before one all-reduce, a rank that skips one, a rank 20 % slower."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from record_ranks import slow_ranks

from ringflow.workload.diagnose import diagnose, render, stragglers
from ringflow.workload.recorded import merge

HERE = Path(__file__).resolve().parent
RANKS = HERE / "record_ranks.py"
TIMEOUT_S = 2.0


def site_line(tag: str) -> str:
    """`record_ranks.py:<line>` of the line marked `# site: <tag>`."""
    lines = RANKS.read_text().splitlines()
    return f"record_ranks.py:{next(i for i, ln in enumerate(lines, 1) if ln.endswith(f'# site: {tag}'))}"


def launch(n: int, args: list[str], env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    for k in ("RINGFLOW_RECORD", "RINGFLOW_DUMP_DIR", "RINGFLOW_FLIGHT_RECORDER", "RINGFLOW_SHM_DISABLE"):
        e.pop(k, None)
    e.update(env)
    e["PYTHONPATH"] = str(HERE.parent) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", str(n), "--no-bind", "--",
                           sys.executable, str(RANKS), *args], env=e, capture_output=True, text=True,
                          timeout=timeout_s)


def test_a_rank_that_sleeps_before_an_all_reduce_is_named_with_its_sequence_number_and_call_site(
        tmp_path: Path) -> None:
    at = 3
    env = {"RINGFLOW_DUMP_DIR": str(tmp_path), "RINGFLOW_SHM_DISABLE": "1"}
    p = launch(3, ["sleep", "--steps", "6", "--at", str(at), "--timeout", str(TIMEOUT_S)], env)
    assert p.returncode != 0, p.stdout + p.stderr
    report = diagnose(tmp_path)
    assert len(report["hangs"]) == 1, render(report)
    h = report["hangs"][0]
    assert (h["seq"], h["waiting"], [m["rank"] for m in h["missing"]]) == (at, [0, 1], [2]), render(report)
    assert h["op"].startswith("all_reduce")
    assert [s.split("/")[-1].split(" ")[0] for s in h["waiting_sites"]] == [site_line("sleep")]
    missing = h["missing"][0]
    assert missing["last_seq"] == at - 1 and site_line("sleep") in missing["last_site"]
    # the waiting ranks wrote their flight records within the timeout + 1 s of entering the call
    trace = merge(tmp_path)
    for r in (0, 1):
        written = trace["flight"][str(r)]["mono_ns"]
        assert written - h["waiting_since_ns"] <= (TIMEOUT_S + 1.0) * 1e9, (written, h)
    assert "never entered: rank 2" in render(report)

    # without the sleeping rank's own records, the waiting ranks' status query still names its last call
    (tmp_path / "flight-rank2.json").unlink(missing_ok=True)
    for ring in tmp_path.glob("ring-rank2-*.bin"):
        ring.unlink()
    m2 = diagnose(tmp_path)["hangs"][0]["missing"]
    assert [m["rank"] for m in m2] == [2] and m2[0]["last_seq"] == at - 1, m2
    assert site_line("sleep") in m2[0]["last_site"] and "query" in m2[0]["source"]


def test_a_rank_that_skips_an_all_reduce_is_a_sequence_mismatch(tmp_path: Path) -> None:
    at = 2
    p = launch(3, ["skip", "--steps", "5", "--at", str(at), "--timeout", str(TIMEOUT_S)],
               {"RINGFLOW_DUMP_DIR": str(tmp_path)})
    assert p.returncode != 0, p.stdout + p.stderr
    report = diagnose(tmp_path)
    assert report["hangs"] == [] and len(report["mismatches"]) == 1, render(report)
    mm = report["mismatches"][0]
    assert mm["seq"] == 2 * at and mm["expected_by"] == [0, 1] and mm["expected"].startswith("all_reduce")
    (o,) = mm["outliers"]
    assert o["rank"] == 2 and o["op"].startswith("all_gather") and o["how"].startswith("skipped all_reduce")
    assert site_line("skip") in mm["expected_site"]
    assert "SEQUENCE MISMATCH" in render(report)
    # the flight rings alone (what a SIGKILL leaves) name it too
    for f in tmp_path.glob("flight-rank*.json"):
        f.unlink()
    again = diagnose(tmp_path)["mismatches"]
    assert [(m["seq"], [o["rank"] for o in m["outliers"]]) for m in again] == [(2 * at, [2])], again
    assert again[0]["outliers"][0]["how"].startswith("skipped all_reduce")


@pytest.mark.long
def test_a_rank_twenty_percent_slower_is_ranked_first_within_twenty_steps(tmp_path: Path) -> None:
    trials, steps, seed = 20, 20, 7
    p = launch(4, ["straggler", "--trials", str(trials), "--steps", str(steps), "--step-ms", "10", "--slow", "1.2",
                   "--seed", str(seed)], {"RINGFLOW_RECORD": str(tmp_path)}, timeout_s=120)
    assert p.returncode == 0, p.stdout + p.stderr
    trace = merge(tmp_path)
    slow = slow_ranks(trials, 4, seed)
    hits = 0
    for t in range(trials):
        part = dict(trace, calls=[c for c in trace["calls"] if t * steps <= c["seq"] < (t + 1) * steps])
        st = stragglers(part)
        assert st["collectives"] == steps and st["steps"] == steps
        top = st["ranking"][0]
        hits += top["rank"] == slow[t]
        # the replay's estimate: the step is shorter without the straggler's extra compute
        assert top["step_s_without"] < st["replayed_step_s"], st
    assert hits >= 0.95 * trials, f"{hits}/{trials}"
    report = json.loads(subprocess.run([sys.executable, "-m", "ringflow", "diagnose", str(tmp_path), "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert report["stragglers"]["collectives"] == trials * steps and report["hangs"] == []


def test_the_straggler_estimate_replays_traces_with_waits_on_async_calls() -> None:
    """Each step every rank computes, issues an asynchronous all-reduce, computes again and waits on it; rank 2
    computes twice as long before it. The estimate replays the waits too, and without rank 2's extra compute the
    step is shorter."""
    from ringflow.workload.recorded import TRACE_FORMAT
    n, steps, gap_ns, op_ns = 3, 4, 1_000_000, 200_000
    calls, waits = [], []
    for r in range(n):
        t = 0
        for s in range(steps):
            t += gap_ns * (2 if r == 2 else 1)
            calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": s, "op": "all_reduce", "dtype": "float32",
                          "count": 4, "nbytes": 16, "root": None, "async": True, "status": "ok", "site": "t.py:1",
                          "enq_ns": t, "start_ns": t, "end_ns": t + op_ns})
            t += gap_ns // 10
            waits.append({"rank": r, "comm": "w", "lane": "wait", "of": "coll", "seq": s, "op": "wait",
                          "status": "ok", "site": "t.py:2", "async": False, "enq_ns": t, "start_ns": t,
                          "end_ns": t + op_ns})
            t += op_ns
    trace = {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": n, "groups": {"w": [0, 1, 2]},
             "ranks": {str(r): {} for r in range(n)}, "calls": calls, "waits": waits, "flight": {}}
    st = stragglers(trace)
    top = st["ranking"][0]
    assert top["rank"] == 2 and st["steps"] == steps
    assert top["step_s_without"] < st["replayed_step_s"]
