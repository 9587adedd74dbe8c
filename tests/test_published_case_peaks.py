"""A published case's own GPU peaks (peak_tflops) and power limit (power_limit_W): sourced, checked, and what its
prediction runs at."""
from __future__ import annotations

from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.workload.published import Constants, _check_case, load_cases, predict


@pytest.fixture(scope="module")
def titan() -> dict:
    return next(c for c in load_cases() if c["id"] == "torchtitan-llama31-8b-fsdp128-compile-float8")


def test_every_grand_teton_run_states_the_sources_500_w_limit_on_the_sxm_part() -> None:
    runs = [c for c in load_cases() if c["id"].startswith("torchtitan-")]
    assert len(runs) == 18
    for c in runs:
        assert c["power_limit_W"] == 500 and "peak_tflops" not in c
        assert "default 500W power limit" in c["power_source"]["where"]


def test_a_lower_peak_predicts_proportionally_less_compute_bound_throughput(titan: dict) -> None:
    consts = Constants.defaults()
    at_sxm = dict(titan, peak_tflops={"bf16": 989.5, "fp8": 1979.0})
    half = dict(titan, peak_tflops={"bf16": 989.5 / 2, "fp8": 1979.0 / 2})
    fast, slow = predict(at_sxm, consts).value, predict(half, consts).value
    assert fast is not None and slow is not None
    assert slow < fast / 1.3   # GEMMs dominate: halving the peak costs most of the throughput


@pytest.mark.parametrize("bad", [{"bf16": 900.0}, {"fp8": 1800.0}, {"bf16": -1.0}, {"bf16": 900.0, "fp4": 1.0}])
def test_a_peak_without_its_source_or_not_positive_is_refused(tmp_path: Path, titan: dict, bad: dict) -> None:
    case = dict(titan, peak_tflops=bad)
    if bad != {"bf16": 900.0}:
        case["peak_source"] = {"url": "https://example.org", "where": "x"}
    with pytest.raises(ConfigError, match="peak_tflops"):
        _check_case(case, tmp_path / "cases.yaml")


@pytest.mark.parametrize("bad", [0, -500, "500", True, float("nan")])
def test_a_power_limit_not_a_positive_number_is_refused(tmp_path: Path, titan: dict, bad: object) -> None:
    case = dict(titan, power_limit_W=bad, power_source={"url": "https://example.org", "where": "x"})
    with pytest.raises(ConfigError, match="power_limit_W"):
        _check_case(case, tmp_path / "cases.yaml")


def test_a_power_limit_without_its_source_is_refused(tmp_path: Path, titan: dict) -> None:
    case = {k: v for k, v in titan.items() if k != "power_source"}
    with pytest.raises(ConfigError, match="power_limit_W"):
        _check_case(dict(case, power_limit_W=500), tmp_path / "cases.yaml")


def test_a_stated_power_limit_reaches_the_prediction(titan: dict) -> None:
    consts = Constants.defaults()
    src = {"url": "https://example.org", "where": "x"}
    at = {w: predict(dict(titan, power_limit_W=w, power_source=src), consts).value for w in (400, 500, 700)}
    assert at[400] < at[500] < at[700]
    assert at[700] / at[500] < 1969.0 / 1731.0   # the memory-bound kernels and the communication do not slow
