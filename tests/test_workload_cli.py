"""The contract for scripts: `ringflow traffic|train|plan|ps --json` run as real processes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "ringflow", *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_traffic_seed_json_contract():
    p = _run("traffic", "--model", "llama3-70b", "--tokens", "156e9", "--batch", "2048", "--gpus", "8",
             "--formula", "seed", "--tp", "8", "--pp", "8", "--dp", "16", "--json")
    d = json.loads(p.stdout)
    keys = {"mode", "pattern", "backward_bytes", "backward_syncs", "forward_bytes", "forward_transfers"}
    assert all(keys <= set(r) for r in d["rows"])
    printed = {r["mode"]: r["seed_printed"] for r in d["rows"]}
    assert printed == {"DP": [1396, 0], "FSDP": [175, 175], "TP": [26622, 21840], "PP": [17.9, 17.9]}
    assert round(d["three_d"]["total_EB"]) == 85 and d["totals"]["3d"] == d["three_d"]["total_bytes"]
    assert d["switch"]["seed_switches"] == 20


def test_traffic_exact_json_has_tiers_and_storage():
    d = json.loads(_run("traffic", "--formula", "both", "--gpus", "4", "--tp", "2", "--pp", "2", "--dp", "2",
                        "--json").stdout)
    assert {r["mode"] for r in d["exact_rows"]} == {"DP", "FSDP", "TP", "PP"}
    assert all("tiers" in r and r["algorithms"] for r in d["exact_rows"])
    assert d["exact_3d"]["total_bytes"] > 0 and d["storage"]["checkpoint_bytes"] > 0
    assert any(x["mode"] == "DP" and "full-mesh" in x["why"] for x in d["differences"])


def test_train_json_contract():
    d = json.loads(_run("train", "--model", "llama3-8b", "--topo", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp",
                        "2", "--dp", "4", "--seq-len", "4096", "--global-batch", "64", "--micro-batch", "1",
                        "--recompute", "selective", "--sequence-parallel", "--interleave", "2", "--zero", "1",
                        "--precision", "bf16", "--comm", "alpha-beta", "--json").stdout)
    for k in ("step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s", "memory_per_gpu_bytes",
              "network_wait_fraction", "breakdown"):
        assert k in d
    assert d["step_time_s"] == pytest.approx(sum(d["breakdown"].values()), rel=1e-9)
    assert 0 < d["mfu"] < 1 and 0 <= d["network_wait_fraction"] < 1


def test_plan_json_and_bad_input():
    d = json.loads(_run("plan", "--model", "llama3-8b", "--gpus", "16", "--topo", "dgx-h100", "--batch", "32",
                        "--seq-len", "2048", "--top", "3", "--no-check", "--json").stdout)
    assert len(d["top"]) == 3 and d["top"][0]["step_time_s"] <= d["top"][1]["step_time_s"]
    assert d["check_budget_spent"] is False and not any("sim_check" in r for r in d["top"])
    # a budget too small for one simulation: no layout is checked and the output says the budget ran out
    out = _run("plan", "--model", "llama3-8b", "--gpus", "16", "--topo", "dgx-h100", "--batch", "32",
               "--seq-len", "2048", "--top", "3", "--check-budget", "0").stdout
    assert "checked 0 of the top 3 within --check-budget 0 s" in out
    bad = _run("train", "--recompute", "sometimes", "--nodes", "1", "--pp", "1", ok=False)
    assert bad.returncode == 2 and "recompute" in bad.stderr


def test_train_uneven_stages_moe_and_mfu_peak():
    d = json.loads(_run("train", "--model", "qwen3-235b-a22b", "--topo", "dgx-h100", "--nodes", "4", "--tp", "2",
                        "--pp", "4", "--ep", "4", "--etp", "1", "--first-stage-layers", "22",
                        "--last-stage-layers", "22", "--seq-len", "2048", "--global-batch", "8",
                        "--precision", "fp8", "--mfu-peak", "fp8", "--capacity-factor", "1.25",
                        "--software", "megatron-core-2025", "--comm", "alpha-beta", "--json").stdout)
    assert d["layout"]["stage_layers"] == [] and d["mfu_peak"] == "fp8" and d["peak_tflops"] > 1500
    assert len(d["stage_times_s"]) == 4 and d["comm_bytes_per_step"]["ep"] > 0
    assert d["step_time_s"] == pytest.approx(sum(d["breakdown"].values()), rel=1e-9)
    bad = _run("train", "--model", "llama3-405b", "--nodes", "16", "--tp", "8", "--pp", "16", "--comm",
               "alpha-beta", ok=False)
    assert bad.returncode != 0 and "--first-stage-layers 7 --last-stage-layers 7" in bad.stderr
    bad = _run("train", "--model", "llama3-8b", "--nodes", "1", "--pp", "2", "--stage-layers", "16,x", ok=False)
    assert bad.returncode != 0 and "--stage-layers" in bad.stderr
