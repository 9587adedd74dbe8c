"""The native modules are part of the product wherever they can be built; the forced Python path still works."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ringflow.runtime import native

MODULES = ("_hotpath", "_record", "_streamcopy")


def _build_tools() -> tuple[str | None, bool]:
    """(the C compiler setuptools builds with, if on PATH; whether Python's headers are installed)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    return shutil.which(compiler), headers


def test_every_native_module_is_built_where_a_compiler_and_python_headers_exist() -> None:
    compiler, headers = _build_tools()
    if compiler is None or not headers:
        pytest.skip(f"cannot build C extensions here (compiler on PATH: {compiler}, Python.h: {headers}): "
                    "the Python fallbacks are what runs")
    missing = [m for m in MODULES if getattr(native, m) is None]
    assert not missing, (f"ringflow.runtime.native.{', '.join(missing)} not built although {compiler} and Python.h "
                         "exist: the build failed; reinstall with the compiler on PATH "
                         "(`pip install --no-build-isolation -e .` and read its compiler errors)")


JOB = '''
import json, sys
import numpy as np
import ringflow
from ringflow.runtime import native
with ringflow.init() as comm:
    ok = True
    for n in (1, 1000, 300_000):
        x = np.arange(n, dtype=np.float64) + comm.rank
        comm.all_reduce(x)
        ok &= bool(np.array_equal(x, 2 * np.arange(n, dtype=np.float64) + 1))
    json.dump({"ok": ok, "native_runs": native.hot_stats()["runs"]}, open(f"{sys.argv[1]}/r{comm.rank}.json", "w"))
'''


def test_the_forced_python_path_runs_collectives_exactly_with_no_native_plan(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "RINGFLOW_NATIVE": "0"}
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--timeout", "90",
                        str(tmp_path / "job.py"), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for r in range(2):
        res = json.loads((tmp_path / f"r{r}.json").read_text())
        assert res == {"ok": True, "native_runs": 0}, res
