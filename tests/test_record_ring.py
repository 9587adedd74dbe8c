"""The flight recorder's file-backed ring (runtime/recording/flightring.py, native/_record.c's Ring): what it
keeps, that the C and Python writers write the same bytes, that a SIGTERM marks it ended and still kills the
rank, and the job directory `ringflow run` makes for it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringflow.runtime.native import _record
from ringflow.runtime.recording import flightring
from ringflow.runtime.recording.record_rows import WAIT
from ringflow.workload.diagnose import diagnose, render

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


ONE_RANK = """
import sys, time
import numpy as np
import ringflow
comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
x = np.ones(4, np.float32)
for _ in range(int(sys.argv[1])):
    comm.all_reduce(x)
comm.broadcast(x[:2], root=0)
print("ready", flush=True)
if sys.argv[2] == "sleep":
    time.sleep(60)
comm.destroy()
"""


def _one_rank(tmp_path: Path, calls: int, then: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ONE_RANK, str(calls), then], stdout=subprocess.PIPE, text=True,
                            env=_env(RINGFLOW_DUMP_DIR=str(tmp_path), **env))


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_ring_keeps_the_last_calls_and_says_how_many_it_left_out(tmp_path: Path, native: str) -> None:
    p = _one_rank(tmp_path, 300, "exit", RINGFLOW_NATIVE=native, RINGFLOW_FLIGHT_RECORDER="64")
    assert p.wait(timeout=60) == 0
    (path,) = tmp_path.glob("ring-rank0-*.bin")
    ring = flightring.read_ring(path)
    assert (ring["head"], ring["nslots"], len(ring["calls"])) == (301, 64, 64)
    assert ring["state"] == flightring.STATES[flightring.DESTROYED]
    seqs = [c["seq"] for c in ring["calls"]]
    assert seqs == list(range(237, 301))
    last = ring["calls"][-1]
    assert (last["op"], last["dtype"], last["count"], last["nbytes"], last["root"], last["status"]) == \
        ("broadcast", "float32", 2, 8, 0, "ok")
    assert last["start_ns"] >= last["enq_ns"] > 0 and last["end_ns"] >= last["start_ns"]
    assert last["site"].endswith(":9 (<module>)"), last["site"]
    assert ring["calls"][0]["redop"] == "sum"
    text = render(diagnose(tmp_path))
    assert "rank 0: ring only of world, the last 64 of 301 calls (communicator destroyed)" in text, text


def _entries() -> list[list]:
    code = _entries.__code__
    coll = ["all_reduce", np.dtype(np.float32), 1024, None, "sum"]
    return [
        [0, 0, tuple(coll), "all_reduce", 100, 110, 190, code, 7, "", None, False],
        [1, 0, ("send", np.dtype(np.int32), 32, 2, 5), "send to 2", 200, 210, 0, code, 8, "", None, True],
        [0, 1, ("broadcast", np.dtype(np.float64), 8, 1, None), "broadcast", 300, 0, 0, None, 0, "Timeout", None,
         False],
        [WAIT, 0, ("send", np.dtype(np.int32), 32, 2, 5), "send", 400, 400, 450, code, 9, "", None, False],
        [0, 2, ("barrier", None, 0, None, None), "barrier", 500, 510, 520, code, 10, "", None, False],
    ]


@pytest.mark.skipif(_record is None, reason="the C recorder was not built")
def test_the_c_and_python_ring_writers_write_the_same_bytes(tmp_path: Path) -> None:
    files = []
    for name, cls in (("c", _record.Ring if _record is not None else None), ("py", flightring.PyRing)):
        path = tmp_path / f"{name}.bin"
        mm, at = flightring.create(path, 4, {"comm": "w", "rank": 0, "size": 1, "global_rank": 0})
        ring = cls(mm, at, 4, flightring.Names(mm))
        for e in _entries():
            pos = ring.enter(e)
            if e[2][0] == "send" and e[0] == 1:   # an asynchronous send, run (and ended) later
                e[6] = 260
                assert ring.find(e) == pos
                ring.exit(pos, e)
        ring.release()
        flightring.mark_ended(mm, flightring.EXITED, 999)
        mm.close()
        files.append(path.read_bytes())
    assert files[0] == files[1]
    ring = flightring.read_ring(tmp_path / "c.bin")
    assert [(c["lane"], c["seq"]) for c in ring["calls"]] == [("send", 0), ("coll", 1), ("wait", 0), ("coll", 2)]
    send, bcast, wait, _ = ring["calls"]
    assert (send["peer"], send["tag"], send["end_ns"], send["async"]) == (2, 5, 260, True)
    assert (bcast["status"], bcast["root"], bcast["site"]) == ("Timeout", 1, "?")
    assert (wait["op"], wait["of"], wait["peer"]) == ("wait", "send", 2)
    assert ring["state"] == flightring.STATES[flightring.EXITED] and ring["end_ns"] == 999


@pytest.mark.skipif(_record is None, reason="the C recorder was not built")
def test_sigterm_marks_the_ring_ended_and_still_kills_the_process(tmp_path: Path) -> None:
    p = _one_rank(tmp_path, 3, "sleep")
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == -signal.SIGTERM
    (path,) = tmp_path.glob("ring-rank0-*.bin")
    ring = flightring.read_ring(path)
    assert (ring["state_code"], ring["signal"], ring["head"]) == (flightring.SIGNALLED, signal.SIGTERM, 4)
    assert ring["end_ns"] > ring["calls"][-1]["end_ns"] > 0


def test_a_completed_job_leaves_no_directory_and_a_failed_one_names_its_directory(tmp_path: Path) -> None:
    prog = ("import ringflow, numpy as np, sys; c = ringflow.init(); c.all_reduce(np.ones(4)); "
            "sys.exit(int(sys.argv[1]))")
    runs = tmp_path / "ringflow-runs"
    for code in (0, 3):
        p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--", sys.executable,
                            "-c", prog, str(code)], env=_env(TMPDIR=str(tmp_path)), capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == code, p.stderr
        jobs = sorted(runs.glob("*"))
        if code == 0:
            assert jobs == [], jobs
            continue
        (job,) = jobs
        assert f"flight records are in {job}" in p.stderr
        assert sorted(f.name for f in job.iterdir()) == ["job.json", "ring-rank0-0.bin", "ring-rank1-0.bin"]
        report = diagnose(job)
        assert report["records"]["job"]["ended"].startswith("rank ") and report["hangs"] == []
        assert [r["records"].startswith("ring only of world, all 1 calls (process exited)")
                for r in report["records"]["ranks"]] == [True, True], report["records"]


def test_a_rank_with_no_record_is_named_and_the_straggler_table_says_so(tmp_path: Path) -> None:
    p = _one_rank(tmp_path, 5, "exit")
    assert p.wait(timeout=60) == 0
    (tmp_path / "job.json").write_text('{"nprocs": 2, "ended": "rank 1 killed by SIGKILL", "exit_code": 137, '
                                       '"ranks": [{"rank": 1, "end": "killed by SIGKILL"}]}')
    (tmp_path / "ring-rank1-0.bin").write_bytes(bytes(8192))   # rank 1 died while making its ring
    report = diagnose(tmp_path)
    assert report["records"]["without_record"] == [1]
    text = render(report)
    assert "rank 1: no record at all; killed by SIGKILL" in text, text
    assert "STRAGGLERS over 0 collectives" not in text
