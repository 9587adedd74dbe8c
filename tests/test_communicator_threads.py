"""One thread per communicator: calls from a second thread are refused with InvalidUsage, never mixed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nthreads", [2, pytest.param(4, marks=pytest.mark.long)])
def test_a_second_thread_gets_invalid_usage_and_the_owner_exact_results(nthreads: int) -> None:
    calls = 300
    p = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--no-bind", "--timeout", "240", "--",
                        sys.executable, str(ROOT / "tests" / "threads_ranks.py"), str(nthreads), str(calls)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line.split("] ", 1)[1]) for line in p.stdout.splitlines() if "{" in line]
    assert len(rows) == 2, p.stdout
    for c in rows:
        assert c["wrong"] == 0 and c["exact"] == calls, c
        assert c["other_ran"] == 0, c
        assert c["refused"] > 0 and c["refused_named"] == c["refused"], c
        assert c["handed_over_exact"] == 20, c
