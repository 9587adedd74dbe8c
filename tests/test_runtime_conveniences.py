"""Module-level identity (`ringflow.get_rank` ...), bitwise and bool reductions, object collectives and
tensor-in/tensor-out on 1-3 real processes (`ringflow run`); identity from launcher environments."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ringflow
from ringflow.runtime.call import identity

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conveniences_on_real_ranks(n: int) -> None:
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), str(ROOT / "tests" / "conveniences_ranks.py")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    lines = [json.loads(ln.split("] ", 1)[1]) for ln in proc.stdout.splitlines() if '"fails"' in ln]
    assert sorted(d["rank"] for d in lines) == list(range(n))
    assert all(d["fails"] == [] for d in lines)


@pytest.mark.parametrize(("env", "want"), [
    ({"RINGFLOW_RANK": "2", "RINGFLOW_WORLD_SIZE": "4", "RINGFLOW_LOCAL_RANK": "0"}, (2, 4, 0)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"}, (5, 6, 2)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (1, 2, 1)),
])
def test_identity_from_launcher_env(env: dict[str, str], want: tuple[int, int, int]) -> None:
    assert (identity.get_rank(env), identity.get_world_size(env), identity.local_rank(env)) == want


def test_identity_without_launcher_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "_default", None)
    with pytest.raises(ringflow.InvalidArgument) as ei:
        identity.get_rank({})
    assert "ringflow run" in (ei.value.hint or "")
    assert identity.local_rank({}) == 0
    with pytest.raises(ringflow.InvalidArgument):
        identity.local_rank({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ringflow.InvalidArgument):
        identity.get_rank({"RANK": "x", "WORLD_SIZE": "2"})
    assert ringflow.get_rank is identity.get_rank
