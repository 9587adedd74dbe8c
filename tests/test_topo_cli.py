"""`ringflow topo show|rings|detect|list` end to end (in-process CLI)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ringflow.cli import build_app
from ringflow.cli.common import run_app

FIX = Path(__file__).parent / "fixtures" / "nvidia_smi"


@pytest.fixture(scope="module")
def app():
    return build_app()


def test_rings_json_contract(app) -> None:
    res = CliRunner().invoke(app, ["topo", "rings", "dgx1-v100", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["rings"] and all(sorted(r["ranks"]) == list(range(8)) for r in data["rings"])
    assert data["rings"][0]["bottleneck_GBps"] == 50.0
    assert all(set(r["hop_types"]) == {"nvlink"} for r in data["rings"])
    assert len(data["trees"]) == 2 and data["trees"][0]["parent"].count(-1) == 1


def test_rings_with_gpu_subset_uses_nvidia_smi_numbers(app) -> None:
    res = CliRunner().invoke(app, ["topo", "rings", "dgx1-v100", "--gpus", "4,5,6,7", "--json"])
    data = json.loads(res.output)
    assert sorted(data["rings"][0]["ranks"]) == [4, 5, 6, 7]


def test_show_prints_matrix_and_bandwidths(app) -> None:
    res = CliRunner().invoke(app, ["topo", "show", "dgx1-v100"])
    assert res.exit_code == 0 and "NV2" in res.output and "PIX" in res.output and "bottleneck" in res.output
    data = json.loads(CliRunner().invoke(app, ["topo", "show", "dgx-h100", "--json"]).output)
    i0, i1 = data["devices"].index("GPU0"), data["devices"].index("GPU1")
    assert data["classes"][i0][i1] == "NV18" and data["bw_GBps"][i0][i1] == 450.0


def test_detect_dump_feeds_show_and_rings(app, tmp_path: Path) -> None:
    dump = str(tmp_path / "dgx1.yaml")
    res = CliRunner().invoke(app, ["topo", "detect", "--nvidia-smi-text", str(FIX / "dgx1_v100.txt"), "--dump", dump])
    assert res.exit_code == 0 and "8 GPUs" in res.output
    data = json.loads(CliRunner().invoke(app, ["topo", "rings", dump, "--json"]).output)
    assert data["rings"][0]["bottleneck_GBps"] == 50.0
    assert CliRunner().invoke(app, ["topo", "show", dump]).exit_code == 0
    res = CliRunner().invoke(app, ["topo", "detect", "--json"])       # this machine, GPUs or not
    assert res.exit_code == 0 and "note" in json.loads(res.output)["detected"]


def test_errors_exit_2_with_a_named_problem(app, tmp_path: Path, capsys, monkeypatch) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "ringflow.topology", "version": 1, "nodes": [{"id": "g", "kind": "gpu"}],
                               "links": [{"a": "g", "b": "h", "type": "nvlink", "bw_GBps": 1, "latency_us": 0}]}))
    with pytest.raises(SystemExit) as exc:
        run_app(app, ["topo", "rings", str(bad)])
    assert exc.value.code == 2
    monkeypatch.setenv("RINGFLOW_RINGS", "0 1 2")
    with pytest.raises(SystemExit) as exc:
        run_app(app, ["topo", "rings", "dgx-h100"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "links[0].b" in err and "RINGFLOW_RINGS" in err


def test_list_presets(app) -> None:
    data = json.loads(CliRunner().invoke(app, ["topo", "list", "--json"]).output)
    assert {"dgx1-v100", "dgx-h100", "gb200-nvl72", "host-cpu"} <= {r["name"] for r in data}


def test_cluster_and_path_commands(app, tmp_path: Path) -> None:
    dump = str(tmp_path / "c.json")
    res = CliRunner().invoke(app, ["topo", "cluster", "dgx-h100", "--nodes", "64", "--nic", "400G", "--dump", dump,
                                   "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["switches"] == {"leaf": 16, "spine": 8, "core": 0}
    assert info["upward_GBps"]["nic"] == 512 * 50.0 and info["upward_GBps"]["leaf-spine"] == 512 * 50.0
    data = json.loads(CliRunner().invoke(app, ["topo", "path", dump, "0:GPU1", "63:GPU1", "--json"]).output)
    assert data["nccl_class"] == "NET" and data["bottleneck_GBps"] == 50.0 and data["ecmp_paths"] == 8
    assert [h["tier"] for h in data["hops"]].count("leaf-spine") == 2
    data = json.loads(CliRunner().invoke(app, ["topo", "path", "dgx1-v100", "GPU0", "GPU5", "--json"]).output)
    assert data["smi_class"] == "SYS" and data["nccl_class"] == "NVB"
