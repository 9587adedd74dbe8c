"""Optional native parts: streaming-store copies, the native executor and the call recorder's per-call path.
Without a C compiler the install still succeeds, ringflow copies with NumPy, runs every plan in Python and
records calls in Python (ringflow.runtime.native.available() and hot_available() are then False, record_native()
None); where a compiler and Python's headers exist, tests/test_native_build.py fails if a module did not build.

The native executor's shared-memory protocol numbers come from ringflow/runtime/transport/protocol.py: this
script writes them into ringflow/runtime/native/_protocol.h before compiling."""
import importlib.util
import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def write_protocol_header() -> None:
    """Regenerate native/_protocol.h from transport/protocol.py (rewritten only when its text changes)."""
    spec = importlib.util.spec_from_file_location(
        "_ringflow_protocol", os.path.join(HERE, "ringflow", "runtime", "transport", "protocol.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = os.path.join(HERE, mod.HEADER_PATH)
    text = mod.c_header()
    try:
        with open(path) as fh:
            if fh.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as fh:
        fh.write(text)


write_protocol_header()
setup(ext_modules=[
    Extension("ringflow.runtime.native._streamcopy", ["ringflow/runtime/native/_streamcopy.c"],
              depends=["ringflow/runtime/native/_copy.h"], extra_compile_args=["-O2"], optional=True),
    Extension("ringflow.runtime.native._hotpath",
              [f"ringflow/runtime/native/_hotpath{part}.c"
               for part in ("", "_reduce", "_shm", "_run", "_plan", "_runner", "_door", "_shape")],
              depends=["ringflow/runtime/native/_hotpath.h", "ringflow/runtime/native/_protocol.h",
                       "ringflow/runtime/native/_copy.h"],
              extra_compile_args=["-O3", "-std=gnu11"], optional=True),
    Extension("ringflow.runtime.native._record",
              [f"ringflow/runtime/native/_record{part}.c"
               for part in ("", "_site", "_slots", "_ring", "_call", "_pack")],
              depends=["ringflow/runtime/native/_record.h"], extra_compile_args=["-O2"], optional=True),
])
