"""The SM clock a GPU sustains through training: one fitted figure per GPU model, fitted on the fitting runs of the
stacks the compute model describes by their kernels, applied to every training case on that GPU."""
from __future__ import annotations

import copy

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload.compute import gpu_spec
from ringflow.workload.fitting import stored_constants
from ringflow.workload.published import Constants, fit, load_cases, predict, stack_factor_era


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return load_cases()


def test_a_clock_ratio_scales_the_tensor_and_exponential_rates_and_leaves_memory() -> None:
    full = gpu_spec("GB200")
    slow = full.at_clock(0.8)
    assert (slow.bf16_flops, slow.fp8_flops, slow.exp_per_s) == pytest.approx(
        (full.bf16_flops * 0.8, full.fp8_flops * 0.8, full.exp_per_s * 0.8))
    assert (slow.hbm_GBps, slow.memory_bytes, slow.name) == (full.hbm_GBps, full.memory_bytes, full.name)
    assert full.at_clock(1.0) is full
    for bad in (0.0, -0.5, 3.0, float("nan")):
        with pytest.raises(InvalidArgument, match="clock ratio"):
            full.at_clock(bad)


def test_only_stacks_without_a_kernel_profile_take_a_per_stack_factor(cases: list[dict]) -> None:
    by_era = {c["era"]: c for c in cases if c["kind"] == "training" and not c.get("kernels")}
    assert stack_factor_era(by_era["megatron-core-2025"]) is None    # the reference kernel profile's stack
    assert stack_factor_era(by_era["megatron-lm-2021"]) is None      # the compute curve's own era
    assert stack_factor_era(by_era["meta-llama3-2024"]) == "meta-llama3-2024"
    assert all(stack_factor_era(c) is None for c in cases if c.get("kernels"))


def test_the_stored_figures_were_fitted_per_gpu_on_fitting_runs_of_that_gpu_only(cases: list[dict]) -> None:
    consts = stored_constants(cases)
    by_id = {c["id"]: c for c in cases}
    assert consts.sustained and all(0 < k <= 1 for k in consts.sustained.values())
    for gpu in consts.sustained:
        used = consts.fitted_on[f"sustained[{gpu}]"]
        assert used and all(by_id[i]["set"] == "fit" and by_id[i]["kind"] == "training" for i in used)
        assert all(gpu in by_id[i]["system"].upper() for i in used), (gpu, used)
    assert "software[megatron-core-2025]" not in consts.fitted_on


def test_a_gpus_figure_moves_every_training_prediction_on_it_and_no_other(cases: list[dict]) -> None:
    h100 = next(c for c in cases if c["id"] == "llm-foundry-mpt-13b-h100-128")
    a100 = next(c for c in cases if c["id"] == "llm-foundry-mpt-13b-a100-8")
    base = Constants.defaults()
    slow = copy.deepcopy(base)
    slow.sustained["H100"] = 0.8
    assert predict(h100, slow).value < 0.9 * predict(h100, base).value
    assert predict(a100, slow).value == predict(a100, base).value


def test_the_fit_reads_no_held_out_value(cases: list[dict]) -> None:
    fitting, held = "bridge-25.11-gb200-llama31-405b-fp8", "bridge-25.11-gb200-llama3-8b-fp8"   # dense, one GPU
    pick = [c for c in cases if c["id"] in (fitting, held, "narayanan-t1-18.4b")]
    assert {c["id"]: c["set"] for c in pick}[held] == "held_out"
    first = fit(pick)
    assert first.fitted_on["sustained[GB200]"] == [fitting] and 0 < first.sustained["GB200"] <= 1
    moved = copy.deepcopy(pick)
    for c in moved:
        if c["id"] == held:
            c["value"] *= 0.5
    assert fit(moved).to_dict() == first.to_dict()
    for c in moved:   # the check can fail: the fitting value moves the figure
        if c["id"] == fitting:
            c["value"] *= 0.5
    assert fit(moved).sustained["GB200"] < first.sustained["GB200"]


def test_train_runs_the_topologys_gpu_at_its_sustained_clock_and_reports_mfu_against_the_datasheet() -> None:
    from ringflow.workload.commmodel import AlphaBetaModel
    from ringflow.workload.compute import in_training
    from ringflow.workload.layout import Layout
    from ringflow.workload.models import load_model
    from ringflow.workload.steptime import step_time
    from ringflow.workload.validation import cluster_for
    model, topo = load_model("llama3-8b"), cluster_for("dgx-h100", 1)
    lay = Layout(dp=8, micro_batch=1, global_batch=8, seq_len=4096)
    h100 = gpu_spec("H100")
    k = in_training(h100).clock
    assert 0 < k < 1 and k == stored_constants(load_cases()).sustained["H100"]
    sustained = step_time(model, lay, topo, comm=AlphaBetaModel())
    at_peak = step_time(model, lay, topo, comm=AlphaBetaModel(), gpu=h100)
    assert sustained.breakdown["compute"] > at_peak.breakdown["compute"] * (1 + (1 - k) / 2)
    assert sustained.peak_tflops == at_peak.peak_tflops == pytest.approx(h100.bf16_flops / 1e12)
    assert sustained.mfu < at_peak.mfu
