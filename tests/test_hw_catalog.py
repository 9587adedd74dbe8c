"""Hardware catalog: computed PCIe figures (seed worked examples), link generations, GPUs, CLI."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ringflow.cli import build_app
from ringflow.errors import InvalidArgument
from ringflow.hardware import (
    GPU_MODELS,
    NET_LINKS,
    NVLINK_GENERATIONS,
    NVSWITCH_GENERATIONS,
    SOCKET_LINKS,
    catalog_rows,
    gpu_model,
    ib_for_gbps,
    nvlink_gen,
    pcie_arithmetic,
    pcie_GBps,
    pcie_gen,
)


def test_seed_pcie_worked_examples_exact() -> None:
    # seed 002: Gen2 x1 = 500 MB/s, Gen2 x8 = 4 GB/s, Gen3 x1 = 984.6 MB/s, Gen3 x16 = 15.754 GB/s
    assert pcie_GBps(2, 1) * 1000 == pytest.approx(500.0, abs=1e-9)
    assert pcie_GBps(2, 8) == pytest.approx(4.0, abs=1e-12)
    assert round(pcie_GBps(3, 1) * 1000, 1) == 984.6
    assert round(pcie_GBps(3, 16), 3) == 15.754
    assert round(pcie_gen(3).lane_gbps(), 3) == 7.877          # 8 * 128/130 Gb/s
    assert round(pcie_gen(3).lane_gbps() * 16, 3) == 126.031   # seed: 126.031 Gbps
    assert round(pcie_gen(3).bidirectional_GBps(16), 2) == 31.51  # "~32 GB/s bidirectional"


def test_pcie_generations_double_and_flit_mode() -> None:
    assert pcie_GBps(1, 1) == pytest.approx(0.25)
    for g in (4, 5):
        assert pcie_GBps(g, 16) == pytest.approx(2 * pcie_GBps(g - 1, 16))
    # Gen6 FLIT mode: 64 GT/s x 242/256 -> 121 GB/s per direction at x16 (not 2 x Gen5 = 126 GB/s)
    assert pcie_GBps(6, 16) == pytest.approx(64 * 242 / 256 * 16 / 8)
    assert pcie_GBps(6, 16) < 2 * pcie_GBps(5, 16)
    r = pcie_arithmetic(3, 16)
    assert r["efficiency"] == "128/130" and r["bidirectional_GBps"] == pytest.approx(2 * r["per_direction_GBps"])


@pytest.mark.parametrize("gen,lanes", [(0, 16), (7, 16), (3, 3), (3, 64)])
def test_pcie_bad_input_is_typed(gen: int, lanes: int) -> None:
    with pytest.raises(InvalidArgument, match="PCIe"):
        pcie_GBps(gen, lanes)


def test_nvlink_generations_match_vendor_totals() -> None:
    totals = {n.gpu: n.gpu_bidir_GBps for n in NVLINK_GENERATIONS.values()}
    assert totals == {"P100": 160.0, "V100": 300.0, "A100": 600.0, "H100": 900.0, "B200": 1800.0}
    assert nvlink_gen(1).link_bidir_GBps == 40.0 and nvlink_gen(2).link_bidir_GBps == 50.0
    assert [n.links_per_gpu for n in NVLINK_GENERATIONS.values()] == [4, 6, 12, 18, 18]
    for s in NVSWITCH_GENERATIONS.values():
        assert s.gpu_GBps == pytest.approx(nvlink_gen(s.nvlink_gen).gpu_GBps)   # switch gives a GPU all its links
    assert NVSWITCH_GENERATIONS[1].ports == 18                                # seed: 18 NVLink ports per chip


def test_network_and_socket_links() -> None:
    assert [ib_for_gbps(g).name for g in (100, 200, 400, 800)] == ["IB-EDR", "IB-HDR", "IB-NDR", "IB-XDR"]
    assert NET_LINKS["IB-NDR"].GBps == 50.0 and NET_LINKS["800GbE"].bidir_GBps == 200.0
    eth = sorted(n.gbps for n in NET_LINKS.values() if n.family == "ethernet")
    assert eth == [25, 50, 100, 200, 400, 800]
    assert SOCKET_LINKS["QPI-6.4"].bidir_GBps == pytest.approx(25.6)   # the seed's DGX-1 QPI figure
    with pytest.raises(InvalidArgument):
        ib_for_gbps(300)


def test_gpu_models_dense_figures() -> None:
    assert set(GPU_MODELS) >= {"P100", "V100", "A100", "H100", "H200", "B200"}
    h100 = gpu_model("h100")
    assert h100.bf16_tflops == pytest.approx(1979 / 2) and h100.fp8_tflops == pytest.approx(3958 / 2)
    assert gpu_model("H200").memory_GB == 141 and gpu_model("H200").bf16_tflops == h100.bf16_tflops
    assert gpu_model("P100").bf16_tflops is None and gpu_model("V100").fp8_tflops is None
    with pytest.raises(InvalidArgument, match="not known"):
        gpu_model("K80")


def test_every_catalog_row_names_its_source() -> None:
    rows = catalog_rows()
    assert len(rows) >= 30
    for r in rows:
        assert r["source"] and len(r["source"]) > 5, r
        if r["per_dir_GBps"] is not None:
            assert r["bidir_GBps"] == pytest.approx(2 * r["per_dir_GBps"])


def test_cli_hw_pcie_and_list() -> None:
    runner = CliRunner()
    app = build_app()
    res = runner.invoke(app, ["hw", "pcie", "--gen", "3", "--lanes", "16"])
    assert res.exit_code == 0 and "15.754 GB/s per direction" in res.output and "128/130" in res.output
    res = runner.invoke(app, ["hw", "pcie", "--gen", "2", "--lanes", "8", "--json"])
    data = json.loads(res.output)
    assert data["per_direction_GBps"] == pytest.approx(4.0) and data["encoding"] == "8b/10b"
    res = runner.invoke(app, ["hw", "list", "--json", "--kind", "gpu"])
    names = [r["name"] for r in json.loads(res.output)]
    assert "H100" in names and "B200" in names
    res = runner.invoke(app, ["hw", "list"])
    assert res.exit_code == 0 and "NVLink4" in res.output
