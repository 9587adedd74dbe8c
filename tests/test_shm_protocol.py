"""The shared-memory protocol: one table of numbers for Python, C and the host model; ordered publishes; a native
plan that refuses rows it could not run safely."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from ringflow.errors import RingflowSystemError
from ringflow.runtime import native
from ringflow.runtime.call import hotpath
from ringflow.runtime.transport import protocol, shm
from ringflow.runtime.transport.frames import Kind

ROOT = Path(__file__).resolve().parent.parent
needs_hot = pytest.mark.skipif(native._hotpath is None, reason="native executor not built (no C compiler at install)")


@needs_hot
def test_the_c_module_was_built_with_the_python_protocol_table() -> None:
    assert native._hotpath.protocol() == protocol.constants()


def test_the_committed_c_header_is_the_one_the_table_generates() -> None:
    text = (ROOT / protocol.HEADER_PATH).read_text()
    assert text == protocol.c_header(), "native/_protocol.h is stale: run `python setup.py build_ext --inplace`"


def test_no_protocol_number_is_written_out_a_second_time() -> None:
    executor = sorted((ROOT / "ringflow/runtime/native").glob("_hotpath*.[ch]"))
    assert {p.name for p in executor} >= {"_hotpath.c", "_hotpath.h", "_hotpath_shm.c", "_hotpath_run.c"}
    for c_path in executor:
        c_src = c_path.read_text()
        for name in protocol.C_NAMES:
            literal = re.search(rf"^\s*(#define\s+{name}\s+\(?\s*\d|static[^;=]*\b{name}\s*=\s*\d)", c_src, re.M)
            assert literal is None, f"{c_path.name} defines {name} itself instead of taking RF_{name} from _protocol.h"
    for path in ("ringflow/runtime/transport/shm.py", "ringflow/hostmodel/features.py",
                 "ringflow/runtime/call/hotpath.py"):
        src = (ROOT / path).read_text()
        for name in protocol.C_NAMES:
            assert re.search(rf"^{name}\s*=", src, re.M) is None, f"{path} assigns {name}: protocol.py owns it"
    for name in protocol.C_NAMES:
        assert getattr(shm, name, getattr(protocol, name)) == getattr(protocol, name)
    assert shm.slice_bytes is protocol.slice_bytes


def test_the_layout_fits_its_header_area() -> None:
    top_word = protocol.SLOT_HDR_WORD + protocol.MAX_SLOTS * protocol.HDR_WORDS
    assert top_word * 8 <= protocol.DATA_OFF
    assert max(protocol.W_TAIL, protocol.W_SWAIT, protocol.W_RWAIT, protocol.W_CMA, protocol.W_SHEAD,
               protocol.W_SSEQ, protocol.W_RSEQ) < protocol.SLOT_HDR_WORD
    # words one side writes often live on their own 64-byte line: no false sharing between the two processes
    assert len({w // 8 for w in (protocol.W_TAIL, protocol.W_SWAIT, protocol.W_RWAIT, protocol.W_SHEAD)}) == 4
    assert (protocol.KIND_DATA, protocol.KIND_CHECK) == (int(Kind.DATA), int(Kind.CHECK))


@needs_hot
def test_flag_words_go_through_release_and_acquire_helpers() -> None:
    words = np.zeros(4, dtype=np.uint64)
    native._hotpath.store_release(words.ctypes.data + 8, 2**64 - 1)
    assert words[1] == 2**64 - 1 and native._hotpath.load_acquire(words.ctypes.data + 8) == 2**64 - 1
    with pytest.raises(ValueError, match="aligned"):
        native._hotpath.load_acquire(words.ctypes.data + 3)
    with pytest.raises(ValueError, match="aligned"):
        native._hotpath.store_release(0, 1)
    assert shm.ORDERING.startswith("release/acquire")


def test_a_weakly_ordered_cpu_without_the_native_module_refuses_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm.native, "_hotpath", None)
    monkeypatch.setattr(shm, "MACHINE", "aarch64")
    name = f"ringflow-test-{uuid.uuid4().hex[:8]}-0-1-c0"
    with pytest.raises(RingflowSystemError, match="aarch64") as info:
        shm.ShmOut(name, 4, 4096, 1, b"\0nobody")
    assert "RINGFLOW_SHM_DISABLE" in str(info.value) and "compiler" in str(info.value)
    assert not os.path.exists(os.path.join(shm.SHM_DIR, name))
    monkeypatch.setattr(shm, "MACHINE", "x86_64")
    shm.check_ordering()  # x86's total store order keeps plain stores in order


SIDE = '''
import hashlib, sys
import numpy as np
from ringflow.runtime.transport import shm
from ringflow.runtime.transport.base import Sink
from ringflow.runtime.transport.frames import Kind
role, name, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
h = hashlib.sha256()
if role == "send":
    rng = np.random.default_rng(5)
    out = shm.ShmOut(name, 4, 4096, 1, b"\\0ringflow-test-nobody")
    for n in sizes:
        src = rng.integers(0, 256, n, dtype=np.uint8)
        h.update(src.tobytes())
        op = out.send(src, Kind.DATA, 7, 0, 0, copied=False)
        while not op.done:
            op.progress()
    while out.head > out.m.load(shm.W_TAIL):   # the receiver has consumed every slot
        pass
    out.close()
else:
    i = shm.ShmIn(name, 0, b"\\0ringflow-test-nobody")
    for n in sizes:
        dst = np.zeros(n, dtype=np.uint8)
        op = i.recv(Sink(dst), n, 7, check=True, op_seq=0, tag=0)
        while not op.done:
            op.progress()
        assert op.mismatch is None, op.mismatch
        h.update(dst.tobytes())
    i.close()
print(shm.ORDERING, "|", h.hexdigest())
'''
# blocks the native module in a process, as an install without a compiler has it
NO_NATIVE = "import sys; sys.modules['ringflow.runtime.native._hotpath'] = None\n"


@pytest.mark.parametrize("path", ["native", "plain"])
def test_a_python_sender_and_receiver_in_two_processes_move_bytes_exactly(tmp_path: Path, path: str) -> None:
    """Many messages through a 4-slot ring: slices wrap the ring and every slot is reused while the other process
    reads it, so a flag published before its data (or a tail before the read) would show as a wrong byte. `plain`:
    without the native module (plain stores; correct under x86's total store order, which this machine has)."""
    if path == "native" and native._hotpath is None:
        pytest.skip("native module not built")
    if path == "plain" and shm.MACHINE not in ("x86_64", "amd64"):
        pytest.skip("plain stores are refused off x86")
    rng = np.random.default_rng(5)
    sizes = [int(s) for s in rng.integers(0, 3 * 4096 + 100, 60)] + [0, 1, 4096, 4097, 2**18 + 3]
    name = f"ringflow-test-{uuid.uuid4().hex[:8]}-0-1-c0"
    (tmp_path / "side.py").write_text((NO_NATIVE if path == "plain" else "") + SIDE)
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "side.py"), role, name, ",".join(map(str, sizes))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for role in ("recv", "send")]
    try:
        res = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shm.unlink_quiet(name)
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in res]
    (recv_order, recv_hash), (send_order, send_hash) = (out.strip().split(" | ") for out, _ in res)
    assert recv_hash == send_hash
    want = "plain stores" if path == "plain" else "release/acquire"
    assert recv_order.startswith(want) and send_order.startswith(want), (recv_order, send_order)


# ---------------------------------------------------------------- native plan validation
def _good_rows(ctl: int) -> tuple[list[list[int]], list[int]]:
    """A send and a receive on one connection, then a local reduction: a plan make_plan accepts."""
    d = protocol.KIND_DATA
    rows = [[hotpath.T_SEND, d, 1, -1, ctl, 4, 4096, 0, 0, 0, 0, 64, 0, 2**20, 0, 0, 0, 0],
            [hotpath.T_RECV_REDUCE, d, 1, 0, ctl, 4, 4096, 1, 0, 0, 0, 64, 64, 0, 0, 0, 0, 0],
            [hotpath.T_REDUCE, d, -1, -1, 0, 0, 0, 1, 0, 0, 0, 64, 0, 0, 0, -1, 0, 1]]
    return rows, [0, 3]


def _plan(rows: list[list[int]], starts: list[int], *, dtype: int = 12, op: int = 0, itemsize: int = 8,
          bells: list | None = None, own: int = 0) -> object:
    return native._hotpath.plan(np.asarray(rows, dtype=np.int64).tobytes(), np.asarray(starts, dtype=np.int32)
                                .tobytes(), [b"\0ringflow-test-bell"] if bells is None else bells, dtype, op,
                                itemsize, own, None)


ctl_words = np.zeros(protocol.DATA_OFF // 8, dtype=np.uint64)

BAD_CELLS = [  # (row, column, value, what the error names)
    (0, 0, 9, "unknown op type"), (0, 0, -1, "unknown op type"),
    (0, 1, 7, "unknown message kind"), (0, 2, -3, "negative peer"),
    (1, 3, 1, "prev"), (1, 3, 5, "prev"), (1, 3, -2, "prev"),
    (0, 4, 0, "control-word address"), (0, 4, 12, "control-word address"),
    (0, 5, 1, "slot count"), (0, 5, protocol.MAX_SLOTS + 1, "slot count"), (0, 6, 100, "slot size"),
    (0, 7, 4, "buffer index"), (0, 9, -1, "buffer index"), (2, 7, 3, "buffer 3"),
    (0, 8, -8, "negative byte"), (0, 10, -1, "negative byte"), (0, 11, -64, "negative byte"),
    (0, 8, 2**63 - 8, "overflows"),
    (1, 11, 60, "whole number of items"), (1, 12, 128, "want"), (0, 12, 5, "want"),
    (0, 13, -1, "single-copy"), (0, 14, 2, "pipelined"), (1, 16, 1, "snapshot"), (2, 17, 5, "early"),
    (0, 15, 1, "doorbell index"), (0, 15, -2, "doorbell index"),
]


@needs_hot
def test_make_plan_accepts_the_baseline_rows() -> None:
    rows, starts = _good_rows(ctl_words.ctypes.data)
    assert _plan(rows, starts) is not None


@needs_hot
@pytest.mark.parametrize("row,col,value,what", BAD_CELLS, ids=[f"r{r}c{c}={v}" for r, c, v, _ in BAD_CELLS])
def test_make_plan_refuses_a_row_it_would_run_out_of_bounds(row: int, col: int, value: int, what: str) -> None:
    rows, starts = _good_rows(ctl_words.ctypes.data)
    rows[row][col] = value
    with pytest.raises(ValueError, match=what):
        _plan(rows, starts)


@needs_hot
@pytest.mark.parametrize("starts", [[0, 2], [0, 4], [1, 3], [0, 2, 1, 3], [], [0, 3, 2]])
def test_make_plan_refuses_step_starts_that_are_not_monotone_or_out_of_range(starts: list[int]) -> None:
    rows, _ = _good_rows(ctl_words.ctypes.data)
    with pytest.raises(ValueError):
        _plan(rows, starts)


@needs_hot
def test_make_plan_refuses_unknown_codes_and_malformed_buffers() -> None:
    rows, starts = _good_rows(ctl_words.ctypes.data)
    with pytest.raises(ValueError, match="dtype"):
        _plan(rows, starts, dtype=13)
    with pytest.raises(ValueError, match="op code"):
        _plan(rows, starts, op=7)
    with pytest.raises(ValueError, match="op code"):
        _plan(rows, starts, op=4)  # bitwise-and of float64
    with pytest.raises(ValueError, match="itemsize"):
        _plan(rows, starts, itemsize=4)
    with pytest.raises(ValueError, match="doorbell"):
        _plan(rows, starts, bells=[b"x" * 200])
    with pytest.raises(ValueError, match="doorbell"):
        _plan(rows, starts, bells=["not bytes"])
    raw = np.asarray(rows, dtype=np.int64).tobytes()
    with pytest.raises(ValueError, match="malformed"):
        native._hotpath.plan(raw[:-8], np.asarray(starts, np.int32).tobytes(), [b"b"], 12, 0, 8, 0, None)
    with pytest.raises(ValueError, match="malformed"):
        native._hotpath.plan(raw, np.asarray(starts, np.int32).tobytes()[:-1], [b"b"], 12, 0, 8, 0, None)


@needs_hot
def test_a_plan_the_native_executor_refuses_is_a_typed_error_naming_the_row() -> None:
    from ringflow.errors import ProtocolError
    rows = hotpath._Rows()
    rows.add(hotpath.T_COPY, dst=(1, 0), src=(0, 0), nbytes=64)
    rows.rows[0][7] = 9  # a buffer index the executor has no base address for
    rows.end_step()
    with pytest.raises(ProtocolError, match="row 0: buffer index"):
        rows.plan(np.dtype(np.float64), "sum", [])
    rows.rows[0][7] = 1
    assert isinstance(rows.plan(np.dtype(np.float64), "sum", []), hotpath.NativePlan)


@needs_hot
def test_the_plan_rows_codes_are_the_ones_the_c_module_reads() -> None:
    codes = native._hotpath.plan_codes()
    names = ("NCOLS", "T_SEND", "T_RECV", "T_RECV_REDUCE", "T_COPY", "T_REDUCE", "RC_DONE", "RC_STALLED",
             "RC_MISMATCH", "RC_PROTOCOL", "RC_CMA", "RC_REGION", "CHECK_RC")
    assert {n: getattr(hotpath, n) for n in names} == {n: codes[n] for n in names}
    assert {str(dt): code for dt, code in hotpath._DTYPES.items()} == \
        {str(dt): codes[str(dt)] for dt in hotpath._DTYPES}
    assert {op: code for op, code in hotpath.OPS.items() if op != "avg"} == \
        {op: codes[op] for op in hotpath.OPS if op != "avg"}


def test_a_mismatched_check_message_keeps_exactly_detail_max_bytes_as_the_native_executor_does() -> None:
    from ringflow.runtime.transport.base import Sink
    name = f"ringflow-test-{uuid.uuid4().hex[:8]}-0-1-c0"
    out = shm.ShmOut(name, 4, 3008, 1, b"\0ringflow-test-nobody")  # slots that do not divide DETAIL_MAX
    inn = shm.ShmIn(name, 0, b"\0ringflow-test-nobody")
    try:
        payload = np.frombuffer(bytes(range(256)) * 40, dtype=np.uint8)  # 10,240 bytes: four slots
        send = out.send(payload, Kind.CHECK, 7, 0, 0)
        recv = inn.recv(Sink(np.zeros(100, np.uint8)), 100, 7, check=True, op_seq=0, tag=0)
        for _ in range(1000):
            if send.done and recv.done:
                break
            send.progress()
            recv.progress()
        assert send.done and recv.done and recv.mismatch is not None
        assert recv.mismatch.detail == payload[:protocol.DETAIL_MAX].tobytes()
    finally:
        inn.close()
        out.close()
