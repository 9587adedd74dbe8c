"""Optional native parts: streaming-store copies and the native executor. Without a C compiler the install
still succeeds, ringflow copies with NumPy and runs every plan in Python (ringflow.runtime.native.available()
and hot_available() are then False)."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("ringflow.runtime.native._streamcopy", ["ringflow/runtime/native/_streamcopy.c"],
              extra_compile_args=["-O2"], optional=True),
    Extension("ringflow.runtime.native._hotpath", ["ringflow/runtime/native/_hotpath.c"],
              extra_compile_args=["-O3", "-std=gnu11"], optional=True),
])
