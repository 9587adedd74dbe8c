"""DP, TP, PP, parameter-server and async-DP runs on 2 to 4 real processes (`ringflow run`), read via --json-out.

Tolerances (float64): every equivalence with single-process training is
checked to max |difference| <= 1e-12 (observed ~1e-16, from summation order).
No timing is asserted.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-12


def run_example(tmp_path: Path, n: int, script: str, *args: str, timeout_s: float = 90.0) -> dict:
    """Launch examples/<script> on n processes and return the JSON it wrote."""
    out = tmp_path / f"{script}.{n}.json"
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), str(ROOT / "examples" / script),
           *args, "--json-out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


# 2 ranks: the torch test; 3 ranks: PS and async DP
@pytest.mark.parametrize("n", [1, pytest.param(4, marks=pytest.mark.long)])
def test_ddp_numpy_equals_single_process(tmp_path: Path, n: int) -> None:
    r = run_example(tmp_path, n, "ddp_numpy.py", "--steps", "4", "--batch", "48", "--bucket-cap", "4KiB",
                    "--first-bucket", "1KiB", "--overlap-width", "64", "--overlap-steps", "2")
    assert r["max_err"] <= TOL
    assert len(r["buckets"]) >= 3                       # the plan really has several buckets
    assert all(order == list(range(len(r["buckets"]))) for order in r["launch_orders"])
    assert r["in_order_all_ranks"]
    assert 0.0 <= r["overlap_fraction"] <= 1.0


@pytest.mark.long
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch (optional extra) is not installed")
def test_ddp_torch_equals_single_process(tmp_path: Path) -> None:
    r = run_example(tmp_path, 2, "ddp_torch.py", "--steps", "4", "--batch", "48", "--bucket-cap", "4KiB",
                    "--first-bucket", "1KiB", "--overlap-width", "64", "--overlap-steps", "2")
    assert r["max_err"] <= TOL
    assert len(r["buckets"]) >= 3
    assert all(order == list(range(len(r["buckets"]))) for order in r["launch_orders"])
    assert r["in_order_all_ranks"]


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.long)])
def test_tensor_parallel_block_equals_unsplit(tmp_path: Path, n: int) -> None:
    r = run_example(tmp_path, n, "tensor_parallel.py", "--d-model", "16", "--heads", "4", "--d-ff", "32",
                    "--steps", "3")
    for key in ("out_err", "dx_err", "grad_err", "param_err"):
        assert r[key] <= TOL, key
    assert r["calls"] == {"forward": 2, "backward": 2}


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.long)])
def test_pipeline_both_schedules_equal_single_process(tmp_path: Path, n: int) -> None:
    m = 4
    r = run_example(tmp_path, n, "pipeline_parallel.py", "--micro-batches", str(m), "--steps", "3",
                    "--batch", "32", "--width", "16")
    for name in ("gpipe", "1f1b"):
        assert r[name]["max_err"] <= TOL, name
        assert r[name]["theory"] == pytest.approx((n - 1) / (m + n - 1))
        assert 0.0 <= r[name]["bubble"] < 1.0
    assert r["gpipe"]["peak_inflight"] == [m] * n
    assert r["1f1b"]["peak_inflight"] == [min(n - s, m) for s in range(n)]
    assert r["gpipe"]["loss"] == pytest.approx(r["1f1b"]["loss"], abs=TOL)


@pytest.mark.long
def test_param_server_consistency_sharded(tmp_path: Path) -> None:
    s = 1
    r = run_example(tmp_path, 3, "param_server.py", "--placement", "sharded", "--staleness", str(s),
                    "--steps", "8", "--batch", "48", "--slow-ms", "15")
    assert r["bsp"]["dist_dp"] <= TOL                          # BSP == synchronous DP
    assert r["bsp"]["worker_steps"] == [8, 8, 8] and r["bsp"]["staleness_max"] == 0
    assert r["ssp"]["max_clock_gap"] <= s                      # SSP bound, from the servers' clock records
    for mode in ("bsp", "ssp", "asp"):
        assert r[mode]["updates"] >= 8 * 3 and r[mode]["accuracy"] > 0.5


@pytest.mark.long
@pytest.mark.parametrize("placement", ["cpu", "rank0"])
def test_param_server_other_placements(tmp_path: Path, placement: str) -> None:
    r = run_example(tmp_path, 3, "param_server.py", "--placement", placement, "--modes", "bsp,ssp",
                    "--staleness", "0", "--steps", "6", "--batch", "48", "--slow-ms", "5")
    assert r["bsp"]["dist_dp"] <= TOL
    assert r["ssp"]["max_clock_gap"] == 0


@pytest.mark.long
def test_async_dp_replicas_agree_after_drain(tmp_path: Path) -> None:
    r = run_example(tmp_path, 3, "async_dp.py", "--steps", "10", "--batch", "48", "--slow-ms", "10")
    assert r["async"]["replica_spread"] <= TOL
    assert r["async"]["accuracy"] > 0.5 and r["sync"]["accuracy"] > 0.5


@pytest.mark.long
def test_hybrid_dp_x_tp_equals_unsplit(tmp_path: Path) -> None:
    r = run_example(tmp_path, 4, "hybrid_parallel.py", "--tp", "2", "--steps", "3")
    assert (r["tp"], r["dp"]) == (2, 2)
    assert r["param_err"] <= TOL
