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


def _runtime_imports() -> dict[str, set[str]]:
    """Each ringflow.runtime module -> the runtime modules it imports when it runs (at the top or inside a function;
    imports under `if TYPE_CHECKING:` are for the type checker only and left out)."""
    import ast

    pkg = ROOT / "ringflow" / "runtime"
    names = {str(p.relative_to(ROOT).with_suffix("")).replace("/", ".").removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in names.items():
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                up = base[:len(base) - node.level + 1] if node.level else []
                stem = ".".join(up + ([node.module] if node.module else []))
                targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
            deps.update(t for t in targets if t in names and t != mod)
        graph[mod] = deps
    return graph


def test_no_runtime_module_imports_one_that_imports_it_back() -> None:
    import networkx as nx

    g = nx.DiGraph((a, b) for a, deps in _runtime_imports().items() for b in deps
                   if not b.startswith(a + ".") and not a.startswith(b + "."))   # a package and its own modules
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"runtime import cycles: {sorted(cycles, key=len)[:5]}"
