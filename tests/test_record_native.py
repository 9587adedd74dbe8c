"""The call recorder's per-call path in C (runtime/native/_record.c via runtime/record_native.py) against the
Python recorder, which stays the reference: the same entries (sites, sequence numbers, async, status on an error,
the remembered-depth cases), the same record file, the same packed rows, and RINGFLOW_NATIVE=0 picking Python."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_record_files import _one_rank_script

from ringflow.runtime.native import _record
from ringflow.runtime.recording import record
from ringflow.runtime.recording.flightring import read_ring
from ringflow.runtime.recording.record_native import NativeRecorder, recorder_class
from ringflow.workload.recorded import call_rows

needs_c = pytest.mark.skipif(_record is None, reason="the C recorder was not built (no compiler at install)")

# One program, run once per recorder: calls from a wrapper, from module level and with a new array each time (the
# remembered-depth cases), a broadcast, an asynchronous call and its wait, point-to-point entries of two keys and
# one without metadata, a job a lane's worker thread runs for this thread (with_site), and a guarded call that raises.
SCENARIO = """
import functools, json
from ringflow.runtime.call.work import Lane, Work
import numpy as np, ringflow
from ringflow.runtime.recording import record
record.FLUSH_EVERY = 3
def wrapper(comm, x):
    return comm.all_reduce(x)
def enter(rec, lane, desc, meta):
    return rec.enter(lane, desc, meta, False)
record._internal[enter.__code__] = True   # stands for a ringflow function between the user's line and the recorder
def boom(fn, deadline, lane):
    raise RuntimeError("guarded call failed")
comm = ringflow.init(rank=0, world_size=1, store_addr='127.0.0.1:0')
rec = comm._rec
x = np.ones(4)
for i in range(3):
    wrapper(comm, x)
    comm.all_reduce(x)
    comm.all_reduce(np.ones(2))
comm.broadcast(x, root=0)
comm.all_reduce(x, async_op=True).wait()
for key in ((1, 7), (1, 7), (2, 7), (1, 7)):
    enter(rec, 1, "send", ("send", np.dtype("float32"), 4, key[0], key[1]))
enter(rec, 2, "recv", None)
enter(rec, 2, "recv", None)
miss = object()   # a collective that runs itself (the remembered-call path): one that ran, one that ran nothing
rec.run("all_reduce", ("all_reduce", np.dtype("float64"), 4, None, "sum"), miss, lambda v: v, 5)
rec.run("all_reduce", ("all_reduce", np.dtype("float64"), 4, None, "sum"), miss, lambda v: v, miss)
sink = []
job = record.with_site(functools.partial(comm.all_reduce, x), sink)
lane = Lane("worker")   # a lane's worker thread, as the torch backend runs queued calls
lane.submit(job, Work("all_reduce", None)).wait()
lane.close()
try:
    rec.call(0, "boom", None, boom, None, 0.0)
except RuntimeError as exc:
    raised = str(exc)
def show(e):
    return [e[record.LANE], e[record.SEQ], record.op_name(e), e[record.DESC],
            record.site_text(e[record.CODE], e[record.LINE]), e[record.STATUS], e[record.ASYNC],
            e[record.T_ENQ] > 0, e[record.T_START] > 0, e[record.T_END] > 0,
            0 < e[record.T_ENQ] <= (e[record.T_START] or e[record.T_ENQ]) <= (e[record.T_END] or 1 << 62)]
print(json.dumps({"cls": type(rec).__name__, "ring": [show(e) for e in rec.ring], "raised": raised,
                  "sink": [show(e) for r, e in sink if r is rec], "last": show(rec.last),
                  "seqs": sorted([list(k[:1]) + [str(v) for v in k[1:]], n] for k, n in rec.seqs.items())}))
comm.destroy()
"""


def _run(native: str, **env: str) -> dict:
    out = _one_rank_script(SCENARIO, RINGFLOW_NATIVE=native, RINGFLOW_FLIGHT_RECORDER="64", **env)
    return json.loads(out.strip().splitlines()[-1])


@needs_c
def test_c_and_python_recorders_make_the_same_entries(tmp_path: Path) -> None:
    c, py = _run("1", RINGFLOW_DUMP_DIR=str(tmp_path / "c")), _run("0", RINGFLOW_DUMP_DIR=str(tmp_path / "py"))
    assert (c["cls"], py["cls"]) == ("NativeRecorder", "Recorder")
    assert c["ring"] == py["ring"] and c["sink"] == py["sink"] and c["last"] == py["last"]
    assert c["seqs"] == py["seqs"] and c["raised"] == py["raised"] == "guarded call failed"
    ring = c["ring"]
    # the remembered-depth cases: the wrapper's line, then the module's own two lines, each time
    src = SCENARIO.splitlines()
    want = [src.index(t) + 1 for t in ("    return comm.all_reduce(x)", "    comm.all_reduce(x)",
                                       "    comm.all_reduce(np.ones(2))")]
    assert [int(e[4].split(":")[1].split(" ")[0]) for e in ring[:9]] == want * 3
    # the call run by `run` is the 12th collective; the one that ran nothing is taken back, number and all
    assert [e[1] for e in ring if e[0] == 0 and e[2] == "all_reduce"] == list(range(9)) + [10, 11, 12]
    assert ring[9][2] == "broadcast" and ring[10][6] is True   # the asynchronous all_reduce
    ran = next(e for e in ring if e[1] == 11 and e[0] == 0)
    run_line = next(i + 1 for i, t in enumerate(src) if t.startswith("rec.run(") and t.endswith(", 5)"))
    assert ran[4].endswith(f":{run_line} (<module>)") and ran[5] == "" and ran[9], ran
    sends = [e[1] for e in ring if e[3] == "send"]
    assert sends == [0, 1, 0, 2]   # per (lane, peer, tag)
    assert [e[1] for e in ring if e[3] == "recv"] == [0, 1]   # no metadata: per (lane, description)
    queued = ring[-2]
    assert queued[6] is True and c["sink"] == [queued] and queued[4].endswith("(<module>)")
    failed = ring[-1]
    assert failed[3] == "boom" and failed[5] == "RuntimeError" and failed[9] and failed == c["last"]
    assert all(e[10] for e in ring)   # enq <= start <= end wherever set
    # the failed call wrote the flight record, as the Python recorder's `failed` does
    assert json.loads((tmp_path / "c" / "flight-rank0.json").read_text())["reason"].startswith("RuntimeError")


@needs_c
def test_record_files_of_both_recorders_hold_the_same_calls(tmp_path: Path) -> None:
    def calls(native: str) -> list[dict]:
        d = tmp_path / native
        _run(native, RINGFLOW_RECORD=str(d))
        path = d / "rank0.jsonl"
        rows = [json.loads(ln) for ln in path.read_text().splitlines()]
        assert sum(r["kind"] == "calls" for r in rows) > 3   # FLUSH_EVERY = 3: several batches
        return [{k: v for k, v in r.items() if not k.endswith("_ns") and k != "comm"}   # the job id is new
                for r in call_rows(rows, path)]
    c, py = calls("1"), calls("0")
    assert len(c) == 21 and c == py


def _desc_ids() -> tuple[list[list], object]:
    """Entries of a few descriptions (equal metadata in different tuples, a new line, a status, one not ended)
    and the id function write_calls uses."""
    op, dt = "all_reduce", np.dtype("float32")
    code = _desc_ids.__code__
    base = [0, 0, (op, dt, 4, None, "sum"), "all_reduce", 10, 20, 30, code, 5, "", None, False]
    entries = []
    for i in range(12):
        e = list(base)
        e[record.SEQ], e[record.T_ENQ], e[record.T_START], e[record.T_END] = i, 100 + i, 200 + i, 300 + i
        e[record.META] = (op, dt, 4, None, "sum") if i % 2 else base[record.META]   # equal, not the same tuple
        if i in (3, 4):
            e[record.LINE] = 6
        if i == 7:
            e[record.STATUS] = "Timeout"
        if i == 9:
            e[record.T_END] = 0
        if i == 10:
            e[record.META] = (op, dt, 8, None, "sum")
        entries.append(e)
    entries[11][record.T_ENQ] = (1 << 62) + 5
    descs: dict[tuple, int] = {}

    def desc_id(e: list) -> int:
        return descs.setdefault(record.desc_key("w", e), len(descs))
    return entries, desc_id


@needs_c
def test_packed_rows_are_the_python_rows() -> None:
    for k in (0, 1, 2, 5):   # each base64 padding
        entries, desc_id = _desc_ids()
        entries2, desc_id2 = _desc_ids()
        assert _record.pack(entries[:k], desc_id) == record.pack_rows(entries2[:k], desc_id2)
    entries, desc_id = _desc_ids()
    c = _record.pack(entries, desc_id)
    entries2, desc_id2 = _desc_ids()
    assert c == record.pack_rows(entries2, desc_id2)
    rows = np.frombuffer(base64.b64decode(c), "<i8").reshape(-1, 5)
    assert rows[:, 4].tolist() == [0, 0, 0, 1, 1, 0, 0, 2, 0, 3, 4, 0]
    entries[0][record.T_END] = 1 << 64
    with pytest.raises(OverflowError):
        _record.pack(entries, desc_id)


def test_native_off_picks_the_python_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFLOW_NATIVE", "0")
    assert recorder_class() is record.Recorder
    monkeypatch.setenv("RINGFLOW_NATIVE", "1")
    assert recorder_class() is (record.Recorder if _record is None else NativeRecorder)


@needs_c
def test_entry_times_are_on_the_perf_counter_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ringflow
    monkeypatch.setenv("RINGFLOW_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("RINGFLOW_NATIVE", "1")
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    try:
        assert isinstance(comm._rec, NativeRecorder)
        t0 = time.perf_counter_ns()
        comm.all_reduce(np.ones(3))
        t1 = time.perf_counter_ns()
        e = comm._rec.ring[-1]
        assert t0 <= e[record.T_ENQ] <= e[record.T_START] <= e[record.T_END] <= t1
        assert t0 <= _record.clock_ns() and e[record.CODE] is test_entry_times_are_on_the_perf_counter_clock.__code__
    finally:
        comm.destroy()


# Every frame of the calls is ringflow's own, as a benchmark module run as __main__ has them: a repeated all-reduce,
# a job a lane's worker thread runs for this thread (with_site), the all-reduce again, once from a user's function
# and once more with no user frame.
NO_USER_FRAME = """
import functools, json, sys
import numpy as np, ringflow
from ringflow.runtime.call.work import Lane, Work
from ringflow.runtime.recording import record
f = sys._getframe()
while f is not None:
    record._internal[f.f_code] = True
    f = f.f_back
def loop(comm, x, n):
    for _ in range(n):
        comm.all_reduce(x)
record._internal[loop.__code__] = True
comm = ringflow.init(rank=0, world_size=1, store_addr='127.0.0.1:0')
rec = comm._rec
x = np.ones(4)
loop(comm, x, 3)
lane = Lane("worker")
lane.submit(record.with_site(functools.partial(comm.all_reduce, x)), Work("all_reduce", None)).wait()
lane.close()
loop(comm, x, 2)
def user(comm, x):
    comm.all_reduce(x)
user(comm, x)
loop(comm, x, 1)
ring, again = rec.ring, rec.ring
print(json.dumps([[e[record.SEQ], e[record.CODE] is None, e[record.LINE], e[record.STATUS], e[record.ASYNC],
                   0 < e[record.T_ENQ] <= e[record.T_START] <= e[record.T_END], e is e2]
                  for e, e2 in zip(ring, again) if e[record.DESC] == "all_reduce"]))
comm.destroy()
"""


@needs_c
def test_a_collective_with_no_user_frame_is_kept_as_fields_with_no_site(tmp_path: Path) -> None:
    """No frame is the user's: the site is none, as the Python recorder has it, and the call is kept as fields in
    the ring (its entry list made only when read), as a user's repeated call is; a queued job keeps its entry; a
    user's frame below the same ringflow frames is found again, and then none again."""
    out = _one_rank_script(NO_USER_FRAME, RINGFLOW_NATIVE="1", RINGFLOW_FLIGHT_RECORDER="64",
                           RINGFLOW_DUMP_DIR=str(tmp_path))
    calls = json.loads(out.strip().splitlines()[-1])
    # (no site, line 0, status, async, times in order, the same list at each read)
    as_fields = [True, 0, "", False, True, False]
    queued = [True, 0, "", True, True, True]   # asynchronous, issued when queued
    user_line = NO_USER_FRAME.splitlines().index("    comm.all_reduce(x)") + 1   # in user()
    assert calls == [[seq, *(queued if seq == 3 else as_fields)] for seq in range(6)] + \
        [[6, False, user_line, "", False, True, False], [7, *as_fields]]


# Two ranks under `ringflow run` (the flight ring on, as it puts it) repeat an all-reduce on one array, which the
# remembered-call paths run natively (the recorder's `run` records them); then the array's shape changes, so those
# paths run nothing (their record taken back) and the full path runs the call.
TWO_RANKS = """
import json
import numpy as np, ringflow
comm = ringflow.init()
x = np.ones(4, np.float32)
for i in range(6):
    comm.all_reduce(x)
x.shape = (2, 2)
comm.all_reduce(x)
e = comm._rec.ring
if comm.rank == 0:
    print(json.dumps({"calls": [[c[1], c[8], c[9], c[10] is not None, 0 < c[4] <= c[5] < c[6]] for c in e]}))
comm.destroy()
"""


@needs_c
@pytest.mark.long
def test_the_remembered_call_path_is_recorded_and_a_call_it_did_not_run_is_recorded_once(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")},
           "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "RINGFLOW_DUMP_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--", sys.executable, "-c",
                        TWO_RANKS], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(next(ln for ln in p.stdout.splitlines() if '"calls"' in ln).split(" ", 1)[-1])
    src = TWO_RANKS.splitlines()
    lines = [src.index("    comm.all_reduce(x)") + 1] * 6 + [src.index("comm.all_reduce(x)") + 1]
    assert out["calls"] == [[seq, line, "", True, True] for seq, line in enumerate(lines)]
    for path in tmp_path.glob("ring-rank*.bin"):   # each rank's ring file: the same seven calls, once each
        ring = read_ring(path)
        assert ring["head"] == ring["kept"] == len(ring["calls"])   # the call taken back is not counted
        calls = [c for c in ring["calls"] if c["op"] == "all_reduce"]
        assert [(c["seq"], int(c["site"].split(":")[-1].split(" ")[0]), c["status"]) for c in calls] == \
            [(seq, line, "ok") for seq, line in enumerate(lines)]


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_latest_collective_outlives_its_slot_in_a_small_ring(tmp_path: Path, native: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring of 4 calls: a collective, then 5 point-to-point entries take every slot; the latest collective (what
    a peer's status query reads) is still that collective, and the ring holds the 4 latest calls."""
    import ringflow
    monkeypatch.setenv("RINGFLOW_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("RINGFLOW_FLIGHT_RECORDER", "4")
    monkeypatch.setenv("RINGFLOW_NATIVE", native)
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    try:
        rec = comm._rec
        comm.all_reduce(np.ones(3))
        for tag in range(5):
            rec.enter(1, "send", ("send", np.dtype("float32"), 4, 0, tag), False)
        last = rec.last
        assert last is not None and (last[record.SEQ], record.op_name(last), last[record.T_END] > 0) == \
            (0, "all_reduce", True)
        assert rec.status()["rec_seq"] == 0 and rec.status()["rec_done"] is True
        assert [(e[record.LANE], e[record.META][4]) for e in rec.ring] == [(1, 1), (1, 2), (1, 3), (1, 4)]
    finally:
        comm.destroy()
