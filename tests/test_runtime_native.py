"""The optional native part: streaming-store copies must equal NumPy's copies byte for byte."""
from __future__ import annotations

import shutil
import sysconfig

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow import config
from ringflow.runtime import native

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="native module not built (no C compiler at install, or no SSE2)")


def test_native_module_is_built_where_a_compiler_was_there() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]  # what setuptools builds with
    if not shutil.which(compiler):
        pytest.skip("no C compiler here: the NumPy fallback is what runs")
    assert native.available(), "a C compiler exists but ringflow.runtime.native._streamcopy was not built"


@needs_native
@settings(max_examples=40, deadline=None)
@given(nbytes=st.integers(0, 3 * 2**18 + 300), dst_off=st.integers(0, 70), src_off=st.integers(0, 70))
def test_streaming_copy_equals_numpy_at_any_alignment(nbytes: int, dst_off: int, src_off: int) -> None:
    rng = np.random.default_rng(nbytes + 131 * dst_off + src_off)
    src = rng.integers(0, 256, nbytes + src_off, dtype=np.uint8)
    dst = np.zeros(nbytes + dst_off + 64, dtype=np.uint8)
    native._streamcopy.copy(dst[dst_off:].ctypes.data, src[src_off:].ctypes.data, nbytes)
    assert np.array_equal(dst[dst_off:dst_off + nbytes], src[src_off:src_off + nbytes])
    assert not dst[:dst_off].any() and not dst[dst_off + nbytes:].any(), "wrote outside the destination"


@needs_native
def test_copy_into_streams_large_copies_and_keeps_numpy_semantics(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = native._streamcopy

    class Counting:
        STREAMING = real.STREAMING
        ALIAS_MIN_BYTES = real.ALIAS_MIN_BYTES

        @staticmethod
        def copy(d: int, s: int, n: int) -> None:
            calls.append(n)
            real.copy(d, s, n)

        move = staticmethod(real.move)

    monkeypatch.setattr(native, "_streamcopy", Counting)
    src = np.arange(2**19 + 3, dtype=np.float64)
    dst = np.empty_like(src)
    with config.override(STREAM_COPY_MIN_BYTES=2**20):
        native.copy_into(dst, src)
        assert np.array_equal(dst, src) and calls == [src.nbytes]
        native.copy_into(dst[:1000], src[:1000])  # below the streaming size: no streaming
        assert calls == [src.nbytes]
        native.copy_into(src[1:], src[:-1])  # overlapping: memmove semantics
        assert src[0] == 0 and np.array_equal(src[1:], np.arange(2**19 + 2, dtype=np.float64))
        assert calls == [src.nbytes]
        native.copy_into(dst[::2], src[::2])  # strided: NumPy
        assert len(calls) == 1
    with config.override(STREAM_COPY_MIN_BYTES=0):
        assert native.stream_min_bytes() == 0
        native.copy_into(dst, src)
        assert len(calls) == 1 and np.array_equal(dst, src)


def test_copy_into_refuses_a_read_only_destination_as_numpy_does() -> None:
    src = np.arange(4096, dtype=np.float32)
    dst = np.zeros_like(src)
    dst.flags.writeable = False
    with pytest.raises(ValueError):
        native.copy_into(dst, src)
    assert not dst.any()
