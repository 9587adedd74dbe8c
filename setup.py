"""Optional native part: streaming-store copies. Without a C compiler the install still succeeds
and ringflow copies with NumPy (ringflow.runtime.native.available() is then False)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("ringflow.runtime.native._streamcopy", ["ringflow/runtime/native/_streamcopy.c"],
                             extra_compile_args=["-O2"], optional=True)])
