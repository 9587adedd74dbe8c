"""The call recorder: `ringflow record` of a real run (collectives, point-to-point, async calls, a sub-group),
`ringflow record merge`, the flight recorder (comm.dump(), SIGUSR1), and the replay of a recording."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload.recorded import call_rows, load, merge
from ringflow.workload.replay import instance_key, replay, waited_key

HERE = Path(__file__).resolve().parent
RANKS = HERE / "record_ranks.py"
STEPS = 3


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-rank run of the `mixed` scenario, recorded by `ringflow record` around `ringflow run`."""
    d = tmp_path_factory.mktemp("rec")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_RECORD", "RINGFLOW_DUMP"))}
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "ringflow", "record", "-o", str(d), "--", sys.executable, "-m",
                        "ringflow", "run", "-n", "3", "--no-bind", "--", sys.executable, str(RANKS), "mixed",
                        "--steps", str(STEPS)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def test_every_rank_writes_its_calls_and_rank_zero_a_manifest(recording: Path) -> None:
    manifest = json.loads((recording / "manifest.json").read_text())
    assert manifest["world_size"] == 3 and manifest["files"] == ["rank0.jsonl", "rank1.jsonl", "rank2.jsonl"]
    for r in range(3):
        rows = [json.loads(ln) for ln in (recording / f"rank{r}.jsonl").read_text().splitlines()]
        assert rows[0]["kind"] == "process" and rows[0]["rank"] == r
        calls = call_rows(rows, recording / f"rank{r}.jsonl")   # packed call lines expanded by their descriptions
        colls = [c for c in calls if c["lane"] == "coll" and c["comm"] == manifest["world"]]
        # per step: all_reduce, broadcast, all_gather, async all_reduce; then the final barrier
        assert [c["op"] for c in colls] == ["all_reduce", "broadcast", "all_gather", "all_reduce"] * STEPS + \
            ["barrier"]
        assert [c["seq"] for c in colls] == list(range(len(colls)))
        for c in calls:
            assert c["status"] == "ok" and 0 < c["enq_ns"] <= c["start_ns"] <= c["end_ns"], c
            assert c["site"].startswith(str(RANKS)), c["site"]   # the user's line, not ringflow's
        first = colls[0]
        assert (first["dtype"], first["count"], first["nbytes"], first["redop"]) == ("float32", 1024, 4096, "sum")
        assert first["algo"] and colls[1]["root"] == 1 and colls[3]["async"] and colls[3]["dtype"] == "float64"
        sends = [c for c in calls if c["lane"] == "send"]
        recvs = [c for c in calls if c["lane"] == "recv"]
        assert [c["peer"] for c in sends] == [(r + 1) % 3] * STEPS and [c["tag"] for c in recvs] == [3] * STEPS
        assert [c["seq"] for c in recvs] == list(range(STEPS)) and all(c["async"] for c in recvs)
        sub = [c for c in calls if c["comm"] != manifest["world"]]
        assert len(sub) == (STEPS if r % 2 == 0 else 0)


def test_merge_puts_groups_in_global_ranks_and_every_rank_on_one_clock(recording: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "ringflow", "record", "merge", str(recording), "-o",
                        str(recording / "t.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    trace = load(recording / "t.json")
    assert trace == json.loads(json.dumps(merge(recording)))
    assert trace["clock"] == "barrier"
    world = trace["world"]
    assert trace["groups"][world] == [0, 1, 2]
    (sub,) = [ns for ns in trace["groups"] if ns != world]
    assert trace["groups"][sub] == [0, 2]
    # one clock: no member ends an all-reduce (all-gather, barrier) before every member started it, and no
    # receive ends before its send started
    by: dict[tuple, list[dict]] = {}
    for c in trace["calls"]:
        by.setdefault(instance_key(c), []).append(c)
    for k, cs in by.items():
        assert len(cs) == (2 if k[0] == "p2p" or k[1] == sub else 3), k
        if k[0] == "p2p":
            (snd,), (rcv,) = [c for c in cs if c["lane"] == "send"], [c for c in cs if c["lane"] == "recv"]
            assert snd["start_ns"] <= rcv["end_ns"], k
        elif cs[0]["op"] in ("all_reduce", "all_gather", "barrier"):
            assert max(c["start_ns"] for c in cs) <= min(c["end_ns"] for c in cs), k
    sends = [c for c in trace["calls"] if c["lane"] == "send"]
    assert all(c["peer_rank"] == (c["rank"] + 1) % 3 for c in sends)
    # every Work.wait() of the program: on its async all_reduce and on its irecv, at the user's line, each
    # after the call it waits on
    for r in range(3):
        waits = [w for w in trace["waits"] if w["rank"] == r]
        assert sorted(w["of"] for w in waits) == ["coll"] * STEPS + ["recv"] * STEPS, waits
        assert all(w["site"].startswith(str(RANKS)) and w["start_ns"] <= w["end_ns"] for w in waits)
        calls = {instance_key(c): c for c in trace["calls"] if c["rank"] == r}
        for w in waits:
            assert calls[waited_key(w)]["enq_ns"] <= w["enq_ns"]


def test_replaying_a_recording_with_its_measured_durations_gives_its_length(recording: Path) -> None:
    trace = merge(recording)
    rep = replay(trace)
    actual = (max(c["end_ns"] for c in trace["calls"]) - min(c["enq_ns"] for c in trace["calls"])) / 1e9
    assert 0.5 * actual < rep.makespan_s <= actual * 1.05, (rep.makespan_s, actual)
    assert len(rep.ops) == len({instance_key(c) for c in trace["calls"]})
    longer = replay(trace, compute_scale=2.0)
    assert longer.makespan_s > rep.makespan_s
    assert sum(longer.compute_s.values()) == pytest.approx(2 * sum(rep.compute_s.values()))


def test_flight_records_are_written_by_comm_dump_and_sigusr1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ringflow
    monkeypatch.setenv("RINGFLOW_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("RINGFLOW_FLIGHT_RECORDER", "4")
    comm = ringflow.init(rank=0, world_size=1, store_addr="127.0.0.1:0")
    try:
        x = np.ones(8, np.float32)
        for _ in range(6):
            comm.all_reduce(x)
        comm.broadcast(x, root=0)
        path = Path(comm.dump())
        doc = json.loads(path.read_text())
        (c,) = [c for c in doc["comms"] if c["comm"] == comm.ns]
        assert [k["op"] for k in c["calls"]] == ["all_reduce"] * 3 + ["broadcast"]   # the last 4 calls
        assert [k["seq"] for k in c["calls"]] == [3, 4, 5, 6] and doc["reason"] == "comm.dump()"
        path.unlink()
        os.kill(os.getpid(), signal.SIGUSR1)   # the recorder's handler (pytest runs tests in the main thread)
        assert json.loads(path.read_text())["reason"] == "SIGUSR1"
    finally:
        comm.destroy()


def test_bad_inputs_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no rank"):
        merge(tmp_path)
    with pytest.raises(InvalidArgument, match="not a directory"):
        merge(tmp_path / "nope")
    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(InvalidArgument, match="not a ringflow trace"):
        load(tmp_path / "x.json")
    p = subprocess.run([sys.executable, "-m", "ringflow", "record", "--", "true"], capture_output=True, text=True)
    assert p.returncode == 2 and "-o DIR" in p.stderr


def test_chakra_export_and_import_round_trip(recording: Path, tmp_path: Path) -> None:
    from ringflow.workload.chakra import convert, et_def_pb2, import_files
    trace = json.loads(json.dumps(merge(recording)))
    p = subprocess.run([sys.executable, "-m", "ringflow", "record", "chakra", str(recording), "-o",
                        str(tmp_path / "et")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    files = sorted((tmp_path / "et").glob("*.et"))
    assert [f.name for f in files] == ["ringflow.0.et", "ringflow.1.et", "ringflow.2.et"]
    assert json.loads(json.dumps(import_files(tmp_path / "et"))) == trace
    assert load(files[0])["calls"] and load(tmp_path / "et") == import_files(files)

    # the Chakra fields alone (what another tool writes) rebuild the same operations
    nodes_of = {}
    for f in files:
        msgs = list(convert._messages(f.read_bytes()))
        nodes = [et_def_pb2.Node.FromString(m) for m in msgs[1:]]
        nodes_of[f] = nodes
        meta = et_def_pb2.GlobalMetadata(version="0.0.4")
        bare = []
        for n in nodes:
            keep = [a for a in n.attr if not a.name.startswith("ringflow.")]
            del n.attr[:]
            n.attr.extend(keep)
            bare.append(n)
        (tmp_path / "bare").mkdir(exist_ok=True)
        (tmp_path / "bare" / f.name).write_bytes(b"".join(convert._varint(m.ByteSize()) + m.SerializeToString()
                                                          for m in [meta, *bare]))
    types = [n.type for n in nodes_of[files[0]]]
    assert et_def_pb2.COMP_NODE in types and et_def_pb2.COMM_COLL_NODE in types
    assert et_def_pb2.COMM_SEND_NODE in types and et_def_pb2.COMM_RECV_NODE in types
    coll = next(n for n in nodes_of[files[0]] if n.type == et_def_pb2.COMM_COLL_NODE)
    attrs = {a.name: a for a in coll.attr}
    assert attrs["comm_type"].int64_val == et_def_pb2.ALL_REDUCE and attrs["comm_size"].int64_val == 4096
    assert list(attrs["comm_group"].int64_list.values) == [0, 1, 2] and coll.data_deps
    # a wait on a Work: the node after it depends on the waited (asynchronous) call's node
    nodes = nodes_of[files[0]]
    irecvs = [n.id for n in nodes if n.type == et_def_pb2.COMM_RECV_NODE]
    assert len(irecvs) == STEPS
    assert all(any(i in n.data_deps for n in nodes if n.id > i) for i in irecvs)
    bare_trace = import_files(tmp_path / "bare")

    def shape(t: dict) -> list[tuple]:
        return sorted((c["rank"], c["comm"], c["lane"], c["seq"], c["op"], c["nbytes"], c.get("peer_rank"),
                       c["start_ns"] // 1000) for c in t["calls"])
    assert shape(bare_trace) == shape(trace)
    assert all(bare_trace["groups"][ns] == members for ns, members in trace["groups"].items())


def test_call_sites_stay_right_when_one_entry_point_is_reached_from_different_depths(tmp_path: Path) -> None:
    """The remembered depth of the user's frame (per code object) is checked before it is used: a call through
    a user wrapper, then straight from module level (a shallower stack), each get their own line."""
    code = ("import numpy as np, ringflow\n"
            "from ringflow.runtime.recording import record\n"
            "def wrapper(comm, x):\n"
            "    return comm.all_reduce(x)\n"
            "comm = ringflow.init(rank=0, world_size=1, store_addr='127.0.0.1:0')\n"
            "x, lines = np.ones(4), []\n"
            "for i in range(3):\n"
            "    wrapper(comm, x); lines.append(comm._rec.ring[-1][record.LINE])\n"
            "    comm.all_reduce(x); lines.append(comm._rec.ring[-1][record.LINE])\n"
            "    comm.all_reduce(np.ones(2)); lines.append(comm._rec.ring[-1][record.LINE])\n"
            "print(lines)\n"
            "comm.destroy()\n")
    out = _one_rank_script(code, RINGFLOW_DUMP_DIR=str(tmp_path))
    assert json.loads(out.strip().splitlines()[-1]) == [4, 9, 10] * 3


def test_descriptions_start_again_past_their_bound_and_read_back_right(tmp_path: Path) -> None:
    """Past MAX_DESCS a process numbers its call descriptions from 0 again (between written batches, here one
    call each); each call still reads back with the description written before it."""
    code = ("import numpy as np, ringflow\n"
            "from ringflow.runtime.recording import record\n"
            "record.MAX_DESCS = 2\n"
            "comm = ringflow.init(rank=0, world_size=1, store_addr='127.0.0.1:0')\n"
            "for n in (1, 2, 3, 4, 5, 1):\n"
            "    comm.all_reduce(np.ones(n, np.float32))\n"
            "    comm._rec.flush()\n"
            "comm.destroy()\n")
    _one_rank_script(code, RINGFLOW_RECORD=str(tmp_path))
    path = tmp_path / "rank0.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert max(r["id"] for r in rows if r["kind"] == "desc") <= 2   # ids reused past the bound of 2
    calls = [c for c in call_rows(rows, path) if c["op"] == "all_reduce"]
    assert [c["count"] for c in calls] == [1, 2, 3, 4, 5, 1]


def _one_rank_script(code: str, **env: str) -> str:
    """Run `python -c code` (a one-rank program) with these RINGFLOW_* settings; its stdout."""
    full = {**os.environ, **env, "PYTHONPATH": str(HERE.parent)}
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout
