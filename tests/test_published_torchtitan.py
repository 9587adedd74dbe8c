"""torchtitan's published H100 runs: the Grand Teton GPU's own memory (hbm_GB) and one group per configuration."""
from __future__ import annotations

from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.workload.memory_cases import case_memory
from ringflow.workload.published import Constants, _check_case, load_cases, predict

URL = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"


@pytest.fixture(scope="module")
def titan() -> list[dict]:
    return [c for c in load_cases() if c["source"]["url"] == URL]


def _one(titan: list[dict], cid: str) -> dict:
    return next(c for c in titan if c["id"] == cid)


def test_every_grand_teton_run_has_the_sources_96_gb_not_the_presets_80(titan: list[dict]) -> None:
    assert titan
    for c in titan:
        assert c["hbm_GB"] == 96 and "96GB HBM2e" in c["hbm_source"]["where"]
        assert case_memory(c).capacity_bytes == pytest.approx(96e9)
        assert case_memory({k: v for k, v in c.items() if k != "hbm_GB"}).capacity_bytes == pytest.approx(80e9)


def test_the_stated_capacity_reaches_the_prediction_and_its_memory_check(titan: list[dict]) -> None:
    case = _one(titan, "torchtitan-llama31-8b-fsdp128-compile-float8")
    pr = predict(case, Constants.defaults())
    assert pr.status == "ok" and pr.info["capacity_gib"] == pytest.approx(96e9 / 2**30)
    small = predict(dict(case, hbm_GB=40), Constants.defaults())
    assert small.info["capacity_gib"] == pytest.approx(40e9 / 2**30) and small.info["fits_in_memory"] is False


@pytest.mark.parametrize("bad", [0, -96, "96", True])
def test_a_capacity_not_positive_is_refused(tmp_path: Path, titan: list[dict], bad: object) -> None:
    with pytest.raises(ConfigError, match="hbm_GB"):
        _check_case(dict(titan[0], hbm_GB=bad), tmp_path / "cases.yaml")


def test_a_capacity_without_its_source_is_refused(tmp_path: Path, titan: list[dict]) -> None:
    case = {k: v for k, v in titan[0].items() if k != "hbm_source"}
    with pytest.raises(ConfigError, match="hbm_source"):
        _check_case(case, tmp_path / "cases.yaml")


@pytest.mark.parametrize("technique", ["", "-compile", "-compile-float8"])
def test_one_technique_on_8_and_128_gpus_is_one_group(titan: list[dict], technique: str) -> None:
    eight, many = _one(titan, f"torchtitan-llama31-8b-fsdp8{technique}"), \
        _one(titan, f"torchtitan-llama31-8b-fsdp128{technique}")
    assert eight["group"] == many["group"] and eight["set"] == many["set"]
    assert (eight["gpus"], many["gpus"]) == (8, 128)
    assert {k: v for k, v in eight["layout"].items() if k != "global_batch"} == \
        {k: v for k, v in many["layout"].items() if k != "global_batch"}
    assert eight["kernels"] == many["kernels"]


def _sweep(titan: list[dict], table: str) -> list[dict]:
    return [c for c in titan if c["source"]["where"].startswith(f"Table {table}")]


@pytest.mark.parametrize(("table", "gpus", "rows"), [("2", 8, 4), ("6", 512, 4)])
def test_a_sequence_length_sweep_is_one_group_with_one_sequence_per_fsdp_rank(
        titan: list[dict], table: str, gpus: int, rows: int) -> None:
    sweep = _sweep(titan, table)
    assert len(sweep) == rows and len({c["group"] for c in sweep}) == 1
    assert sorted(c["layout"]["seq_len"] for c in sweep) == [32768, 65536, 131072, 262144]
    for c in sweep:
        lay = c["layout"]
        fsdp = gpus // (lay["cp"] * lay.get("tp", 1) * lay.get("pp", 1))
        assert c["gpus"] == gpus and lay["seq_len"] == 32768 * lay["cp"]
        assert lay["global_batch"] == fsdp * (8 if lay.get("pp", 1) > 1 else 1)
    assert all(c["group"] not in {o["group"] for o in titan if o not in sweep} for c in sweep)


def test_table_5s_two_schedules_are_two_configurations(titan: list[dict]) -> None:
    plain = _one(titan, "torchtitan-llama31-405b-fsdp8-tp8-pp8-1f1b")
    looped = _one(titan, "torchtitan-llama31-405b-fsdp8-tp8-pp8-interleaved")
    assert plain["group"] != looped["group"]
    assert (plain["layout"]["interleave"], looped["layout"]["interleave"]) == (1, 2)
    assert {k: v for k, v in plain["layout"].items() if k != "interleave"} == \
        {k: v for k, v in looped["layout"].items() if k != "interleave"}
