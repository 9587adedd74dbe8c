"""The one-way layer contract (pyproject's [tool.importlinter]): no package imports a layer above it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_upward_import_and_no_cycle_between_packages() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "1 kept, 0 broken" in res.stdout


def test_import_ringflow_stays_light() -> None:
    code = ("import sys, ringflow; heavy = [m for m in ('torch', 'matplotlib', 'ringflow.runtime', 'ringflow.sim', "
            "'ringflow.hostmodel', 'networkx') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
