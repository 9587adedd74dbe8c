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


def test_train_plot_to_a_missing_directory_fails_before_computing(tmp_path):
    p = _run("train", "--model", "llama3-8b", "--topo", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp", "2",
             "--plot", str(tmp_path / "missing" / "t.png"), ok=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "InvalidArgument" in p.stderr and str(tmp_path / "missing") in p.stderr and "fix:" in p.stderr
    bad = _run("plan", "--gpus", "16", "--plot", str(tmp_path / "plan.txt"), ok=False)
    assert bad.returncode == 2 and ".txt" in bad.stderr and ".png" in bad.stderr


def test_train_plot_says_where_it_wrote(tmp_path):
    png = tmp_path / "train.png"
    p = _run("train", "--model", "llama3-8b", "--topo", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp", "2",
             "--plot", str(png), "--json")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(p.stdout)["plot"] == str(png)            # stdout is the JSON alone ...
    assert f"wrote plot to {png}" in p.stderr.replace("\n", "")  # ... the report goes to stderr


def _trace(steps: int, warmup_gap_s: float, gap_s: float, nranks: int = 2) -> dict:
    """nranks ranks recorded on this host: per step one 1 MiB all-reduce, then a compute gap (step 0's longer)."""
    from ringflow.workload.recorded import TRACE_FORMAT
    calls = []
    for r in range(nranks):
        t = 0
        for s in range(steps):
            calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": s, "op": "all_reduce", "dtype": "float32",
                          "count": 1 << 18, "nbytes": 1 << 20, "root": None, "async": False, "status": "ok",
                          "site": "train.py:10", "enq_ns": t, "start_ns": t, "end_ns": t + 1})
            t += 1 + int((warmup_gap_s if s == 0 else gap_s) * 1e9)
    return {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": nranks,
            "groups": {"w": list(range(nranks))}, "ranks": {str(r): {"hostname": "cpuhost"} for r in range(nranks)},
            "calls": calls, "flight": {}}


def test_replay_gives_the_steady_step_apart_from_warm_up_and_warns_on_unscaled_cpu_compute(tmp_path):
    tr = tmp_path / "trace.json"
    tr.write_text(json.dumps(_trace(steps=5, warmup_gap_s=0.5, gap_s=0.01)))
    p = _run("replay", str(tr), "--topo", "dgx-h100", "--no-contention")
    assert "steady-state step" in p.stdout and "warm-up step 0" in p.stdout
    assert "replayed unscaled" in p.stderr and "--compute-model" in p.stderr and "cpuhost" in p.stderr
    d = json.loads(_run("replay", str(tr), "--topo", "dgx-h100", "--no-contention", "--json").stdout)
    assert d["warmup_step_s"] == pytest.approx(d["steps"][0]["time_s"]) and d["steady_steps"] == [1, 2, 3]
    # the mean leaves out the 0.5 s warm-up and the last mark's tail: each step is the 10 ms gap plus the all-reduce
    assert d["step_s"] == pytest.approx(sum(r["time_s"] for r in d["steps"][1:4]) / 3)
    assert 0.01 < d["step_s"] < 0.011 and d["warmup_step_s"] > 0.5
    assert d["warnings"]
    scaled = json.loads(_run("replay", str(tr), "--topo", "dgx-h100", "--no-contention", "--compute-scale", "0.1",
                             "--json").stdout)
    assert scaled["warnings"] == [] and scaled["step_s"] < 0.002


def test_train_takes_the_way_tp_overlap_runs_and_names_the_choices_for_a_wrong_one():
    args = ("train", "--model", "llama3-70b", "--topo", "dgx-h100", "--nodes", "4", "--tp", "8", "--zero", "3",
            "--pp", "1", "--global-batch", "64", "--seq-len", "8192", "--overlap-tp", "--json")
    ub, at = (json.loads(_run(*args, "--tp-overlap", w).stdout)["step_time_s"] for w in ("userbuffers", "async_tp"))
    assert at > ub   # async TP leaves the backward reduce-scatters exposed that userbuffers hides (tpoverlap.py)
    p = _run(*args, "--tp-overlap", "bogus", ok=False)
    assert p.returncode != 0 and "userbuffers" in p.stderr and "async_tp" in p.stderr


def test_train_takes_how_zero_3_groups_its_gathers():
    args = ("train", "--model", "llama3-8b", "--topo", "dgx-h100", "--nodes", "2", "--tp", "1", "--pp", "1",
            "--zero", "3", "--global-batch", "64", "--seq-len", "8192", "--json")
    per_block, bucketed = (json.loads(_run(*args, "--fsdp-units", u).stdout)["step_time_s"]
                           for u in ("per_block", "bucketed"))
    assert per_block != bucketed
    p = _run(*args, "--fsdp-units", "layers", ok=False)
    assert p.returncode != 0 and "per_block" in p.stderr and "bucketed" in p.stderr
