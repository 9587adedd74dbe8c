"""Copies whose destination sits just after the source modulo 4 KiB (NumPy arrays 16 bytes into a page, slots on a
page boundary): the native move keeps memmove's result, and collectives on arrays at every such page offset, through
slots and single-copy reads, on the native executor and in Python, give the exact result."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.runtime import native

ROOT = Path(__file__).resolve().parents[1]
needs_native = pytest.mark.skipif(native._streamcopy is None, reason="native module not built (no C compiler)")


@needs_native
@settings(max_examples=60, deadline=None)
@given(nbytes=st.integers(0, 3 * 4096 + 200), src_off=st.integers(4300, 12000),
       shift=st.one_of(st.integers(-130, 130), st.integers(-4170, -4020), st.integers(4020, 4170)))
def test_move_equals_memmove_for_every_distance_and_overlap(nbytes: int, src_off: int, shift: int) -> None:
    base = np.random.default_rng(nbytes * 7 + src_off).integers(0, 256, 32768, dtype=np.uint8)
    dst_off = src_off + shift
    got, want = base.copy(), base.copy()
    want[dst_off:dst_off + nbytes] = want[src_off:src_off + nbytes].copy()
    native._streamcopy.move(got[dst_off:].ctypes.data, got[src_off:].ctypes.data, nbytes)
    assert np.array_equal(got, want)


RANK_SCRIPT = r"""
import sys
import numpy as np
import ringflow

def at(offset, n, dtype):
    raw = np.zeros(n * np.dtype(dtype).itemsize + 8192, np.uint8)
    start = (-raw.ctypes.data) % 4096 + offset
    return raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)

comm = ringflow.init()
r, n = comm.rank, comm.size
bad = 0
for count in (97, 16411, 262147):
    for off in (0, 8, 16, 48, 4088):
        for dtype in (np.float32, np.int64):
            base = (np.arange(count) % 251).astype(dtype)
            x = at(off, count, dtype)
            x[:] = base + r
            comm.all_reduce(x)
            bad += not np.array_equal(x, base * n + sum(range(n)))
            x[:] = base + r
            out = at(off, count * n, dtype)
            comm.all_gather(x, out=out)
            bad += not np.array_equal(out, np.concatenate([base + k for k in range(n)]))
            x[:] = base + r
            comm.broadcast(x, root=n - 1)
            bad += not np.array_equal(x, base + n - 1)
            a = at(off, count * n, dtype)
            a[:] = np.arange(count * n).astype(dtype) + 1000 * r
            b = at(off, count * n, dtype)
            comm.all_to_all(a, out=b)
            want = np.concatenate([np.arange(r * count, (r + 1) * count).astype(dtype) + 1000 * k for k in range(n)])
            bad += not np.array_equal(b, want)
print("WRONG", bad, flush=True)
sys.exit(1 if bad else 0)
"""


@pytest.mark.parametrize("native_on", ["1", pytest.param("0", marks=pytest.mark.long)])
def test_collectives_on_arrays_at_every_page_offset_are_exact(native_on: str, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RINGFLOW_NATIVE=native_on)
    env.pop("RINGFLOW_SHM_DISABLE", None)
    proc = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--timeout", "120", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("WRONG 0") == 2, proc.stdout[-2000:]
