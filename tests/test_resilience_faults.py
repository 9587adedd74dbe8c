"""Faults between real ranks on one host: a rank killed mid-all-reduce (detect, shrink, continue),
mismatched arguments, abort from another thread, per-call timeouts, and no shared-memory leaks
after every rank is killed. The rank side lives in benchmarks/resilience_ranks.py."""
from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402
from resilience_ranks import Job  # noqa: E402

from ringflow.runtime import native

pytestmark = [pytest.mark.usefixtures("no_leaked_shared_memory")]


DETECT_BOUND_S = 5.0  # the bound: survivors raise RemoteError naming the dead rank within 5 s
SLACK_S = 1.5  # scheduling slack on a loaded 2-core machine for "within tolerance" checks


def _segments(job_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/ringflow-{job_id}-*")


@pytest.mark.parametrize("transport,n,victims", [("shm", 3, [1]), pytest.param("tcp", 3, [1], marks=pytest.mark.long),
                                                  pytest.param("shm", 4, [0, 2], marks=pytest.mark.long),
                                                  pytest.param("shm-log", 4, [2], marks=pytest.mark.long)])
def test_killed_ranks_are_named_by_every_survivor_who_then_shrink_and_continue(tmp_path: Path, transport: str,
                                                                               n: int, victims: list[int]) -> None:
    # shm-log: every call checks its arguments in log-depth rounds (RINGFLOW_CHECK_ROUNDS=log), the shrunk
    # communicator too
    env = {"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else \
        {"RINGFLOW_CHECK_ROUNDS": "log"} if transport == "shm-log" else {}
    transport = transport.removesuffix("-log")
    survivors = [r for r in range(n) if r not in victims]
    orphan = transport == "shm" and victims == [1]  # rank 1 leaves a segment rank 0 never maps
    alloc = len(victims) > 1  # buffers from comm.alloc: zero-copy sends, and named regions the victims leave
    with Job(n, "loop", tmp_path, ["--shrink", "--count", str(1 << 18), "--timeout", "30", "--max-s", "60"]
             + (["--orphan"] if orphan else []) + (["--alloc"] if alloc else []), env=env) as job:
        job.wait_ready()
        if orphan:
            assert glob.glob(f"/dev/shm/ringflow-{job.job_id}-*-1-0-p77"), "the orphaned segment should exist"
        time.sleep(0.05)
        t_kill = min(job.kill(v) for v in victims)
        codes = job.wait(90)
        assert all(codes[r] == 0 for r in survivors), job.logs()
        for r in survivors:
            res = job.result(r)
            assert res is not None, job.logs()
            err = res["error"]
            assert err is not None and err["in_call"] == "all_reduce", res
            assert err["type"] == "RemoteError" and err["rank"] in victims, err
            assert f"rank {err['rank']}" in err["message"], err
            assert err["t"] - t_kill < DETECT_BOUND_S, f"rank {r} took {err['t'] - t_kill:.2f}s to notice"
            assert res["wrong"] == 0 and res["iterations"] >= 3
            if transport == "shm" and native.hot_available():  # the victim died while this rank waited natively
                assert res["native_runs"] >= 3, res
            assert "shrink_error" not in res, res.get("shrink_error")
            assert (res["new_size"], res["parent_ranks"]) == (len(survivors), survivors)
            assert res["new_rank"] == survivors.index(r)
            assert res["after_shrink_ok"] is True
        assert _segments(job.job_id) == []


@pytest.mark.long
@pytest.mark.parametrize("mode", ["exclude", "absent"])
def test_shrink_leaves_out_an_excluded_or_silent_rank(tmp_path: Path, mode: str) -> None:
    deadline_s = 1.5
    with Job(3, "shrinkvote", tmp_path, ["--timeout", "30", "--mode", mode, "--call-timeout", str(deadline_s),
                                         "--delay-s", "4"]) as job:
        assert job.wait(60) == [0, 0, 0], job.logs()
        for r in (0, 1):
            res = job.result(r)
            assert (res["new_size"], res["parent_ranks"], res["after_ok"]) == (2, [0, 1], True), res
            if mode == "exclude":
                assert res["shrink_s"] < deadline_s  # nobody waits for a rank excluded by name
            else:
                assert deadline_s - 0.05 <= res["shrink_s"] <= deadline_s + SLACK_S, res


@pytest.mark.parametrize("transport", ["shm", pytest.param("tcp", marks=pytest.mark.long)])
def test_mismatched_counts_dtypes_and_roots_raise_invalid_argument_on_every_rank(tmp_path: Path,
                                                                                 transport: str) -> None:
    env = {"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}
    with Job(3, "mismatch", tmp_path, ["--timeout", "30"], env=env) as job:
        assert job.wait(90) == [0, 0, 0], job.logs()
        for r in range(3):
            res = job.result(r)
            assert len(res["cases"]) == 9
            for case in res["cases"]:
                assert case["type"] == "InvalidArgument", (r, case)
                assert case["elapsed_s"] < 5.0, (r, case)  # no hang: far below the 30 s timeout
                assert case["unchanged"], f"rank {r} buffer written in {case['case']}"
                other = "rank 2" if r != 2 else "rank 0"
                assert other in case["message"], case
            assert res["all_gather_out_unchanged"]
            assert res["usable_after"] is True


@pytest.mark.long
def test_abort_from_another_thread_unblocks_the_waiting_call(tmp_path: Path) -> None:
    with Job(2, "abort", tmp_path, ["--timeout", "30", "--delay-s", "0.5"]) as job:
        assert job.wait(90) == [0, 0], job.logs()
        r0, r1 = job.result(0), job.result(1)
        if native.hot_available():  # the aborted call repeats one that ran natively: it waited in the native loop
            assert r0["native_runs"] >= 1 and r1["native_runs"] >= 1
        assert r0["sync"]["type"] == "Aborted" and r0["sync"]["after_abort_s"] < SLACK_S, r0["sync"]
        assert r0["unchanged"] and r0["next_call"]["type"] == "Aborted"
        assert r0["async"]["type"] == "Aborted" and r0["async"]["elapsed_s"] < SLACK_S, r0["async"]
        assert r1["late_call"]["type"] == "RemoteError" and r1["late_call"]["rank"] == 0
        assert "aborted" in r1["late_call"]["message"]
        assert r1["async_peer"]["type"] == "RemoteError"
        assert r0["new_size"] == r1["new_size"] == 2  # an aborting rank is not voted out
        assert r0["after_ok"] and r1["after_ok"]


@pytest.mark.long
def test_per_call_timeouts_fire_within_tolerance(tmp_path: Path) -> None:
    lim = 1.0
    with Job(2, "timeout", tmp_path, ["--timeout", "30", "--call-timeout", str(lim)]) as job:
        assert job.wait(90) == [0, 0], job.logs()
        r0 = job.result(0)
        for key, want in (("recv", lim), ("all_reduce", lim), ("work_wait", lim / 2), ("work_op", 2 * lim)):
            info = r0[key]
            assert info["type"] == "Timeout", (key, info)
            assert want - 0.05 <= info["elapsed_s"] <= want + SLACK_S, (key, info)
        assert "rank 1" in r0["recv"]["message"] or "[1]" in r0["recv"]["message"]
        assert r0["next_call"]["type"] == "Aborted"  # a collective that timed out leaves the channels untrusted
        assert r0["after_ok"] and job.result(1)["after_ok"]


@pytest.mark.long
def test_no_shared_memory_left_after_every_rank_is_killed_mid_collective(tmp_path: Path) -> None:
    with Job(4, "loop", tmp_path, ["--count", str(1 << 20), "--timeout", "30", "--max-s", "60"]) as job:
        job.wait_ready()
        mapped = []
        for p in job.procs:
            with open(f"/proc/{p.pid}/maps") as fh:
                mapped += [ln for ln in fh if f"/dev/shm/ringflow-{job.job_id}-" in ln]
        # the ranks really work through shared memory, and the names are already gone while they run
        assert mapped and all("(deleted)" in ln for ln in mapped), mapped[:4]
        for r in range(4):
            job.kill(r)
        assert job.wait(30) == [-9] * 4
        assert _segments(job.job_id) == []


@pytest.mark.long
def test_launcher_removes_every_name_after_a_rank_is_killed(tmp_path: Path) -> None:
    """`ringflow run`: a SIGKILLed rank stops the job and the launcher removes the job's names, including the
    comm.alloc regions (named, and mapped by peers on demand, so they live as long as the communicator)."""
    import json
    import os
    import signal
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", "2", "--timeout", "60", str(ROOT / "benchmarks" /
           "resilience_ranks.py"), "loop", "--alloc", "--count", str(1 << 18), "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 60
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0][-3000:]
            time.sleep(0.02)
        ready = [json.loads((tmp_path / f"ready{r}").read_text()) for r in range(2)]
        job_id = ready[0]["job"]
        assert _segments(job_id), "comm.alloc regions should be named while the job runs"
        os.kill(ready[1]["pid"], signal.SIGKILL)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:]
    assert "rank 1 exited" in out
    assert _segments(job_id) == []


@pytest.mark.long
def test_alloc_regions_after_every_rank_is_killed_without_the_launcher(tmp_path: Path) -> None:
    with Job(2, "loop", tmp_path, ["--alloc", "--count", str(1 << 18), "--timeout", "30", "--max-s", "60"]) as job:
        job.wait_ready()
        for r in range(2):
            job.kill(r)
        job.wait(30)
        deadline = time.monotonic() + 5  # each rank's reaper unlinks its regions once the kernel closes its pipe
        while (leaked := _segments(job.job_id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        from ringflow.runtime.job.launcher import cleanup_shm
        cleanup_shm(job.job_id)  # what `ringflow run` does at exit; do not leave them on the machine
        assert leaked == []
