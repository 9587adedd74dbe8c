"""Optional native parts: streaming-store copies, the native executor and the call recorder's per-call path.
Without a C compiler the install still succeeds, ringflow copies with NumPy, runs every plan in Python and
records calls in Python (ringflow.runtime.native.available() and hot_available() are then False, record_native()
None)."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("ringflow.runtime.native._streamcopy", ["ringflow/runtime/native/_streamcopy.c"],
              extra_compile_args=["-O2"], optional=True),
    Extension("ringflow.runtime.native._hotpath", ["ringflow/runtime/native/_hotpath.c"],
              extra_compile_args=["-O3", "-std=gnu11"], optional=True),
    Extension("ringflow.runtime.native._record", ["ringflow/runtime/native/_record.c"],
              extra_compile_args=["-O2"], optional=True),
])
