"""ZeRO stages 1-3 (`ringflow.parallel.zero`) on 2 and 3 real processes (`ringflow run`) equal plain data
parallelism (stage 0) to 1e-12 in float64 after 6 Adam steps, and keep the share of parameters, gradients and
optimizer state that `ringflow.workload.memory`'s per-stage formula predicts (exact up to the padding of each
layer to a multiple of n)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringflow.errors import InvalidArgument
from ringflow.parallel.zero import Unit, ZeroDP, predicted_fractions

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-12
ITEM = 8   # float64


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.long)])
def test_zero_stages_equal_data_parallel_and_shard_as_predicted(n: int) -> None:
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), str(ROOT / "tests" / "zero_ranks.py")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    line = next(ln for ln in proc.stdout.splitlines() if '"stages"' in ln)
    res = json.loads(line[line.index("{"):])
    ref = np.array(res["stages"]["0"]["params"])
    assert np.isfinite(ref).all()
    for stage in ("1", "2", "3"):
        got = res["stages"][stage]
        assert np.abs(np.array(got["params"]) - ref).max() <= TOL, stage
        assert np.allclose(got["losses"], res["stages"]["0"]["losses"], rtol=0, atol=TOL)
    for stage in ("0", "1", "2", "3"):
        got = res["stages"][stage]
        pred = predicted_fractions(int(stage), n)
        pad = got["units"] * (n - 1) * ITEM * (2 if stage != "0" else 0)
        for part in ("params", "grads", "optimizer"):
            want = pred[part] * got["full"][part]
            assert abs(got["state"][part] - want) <= pad, (stage, part, got["state"][part], want)
    # the headline ratios, as the formula states them
    assert predicted_fractions(1, n)["optimizer"] == pytest.approx(1 / n)
    assert predicted_fractions(2, n)["grads"] == pytest.approx(1 / n)
    assert predicted_fractions(3, n) == pytest.approx({"params": 1 / n, "grads": 1 / n, "optimizer": 1 / n})


def test_units_and_errors() -> None:
    u = Unit(layer=0, lo=10, hi=17, chunk=3, off=0)
    assert [u.owned(r) for r in range(3)] == [(10, 13), (13, 16), (16, 17)]
    assert Unit(0, 0, 2, 1, 0).owned(2) == (2, 2)
    assert predicted_fractions(0, 4) == {"params": 1.0, "grads": 1.0, "optimizer": 1.0}
    with pytest.raises(InvalidArgument):
        ZeroDP(None, None, 4)  # type: ignore[arg-type]
