"""`ringflow replay --compute-model`: each step's compute taken from the workload model, the recording's shape
kept (how a step's compute is spread over its gaps, and how ranks differ)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload.compute import efficiency_for, gpu_spec, microbatch_times
from ringflow.workload.models import load_model
from ringflow.workload.recorded import TRACE_FORMAT
from ringflow.workload.replay import compute_gaps, origin_ns, per_rank
from ringflow.workload.replay_compute import model_gaps, model_step_compute_s, parse_layout

# per rank, per step: the compute before each of the step's two calls (ms); rank 1 computes more than rank 0
CALLS = (("all_reduce", "train.py:10"), ("all_gather", "train.py:11"))
GAPS_MS = {0: [[1.0, 3.0], [2.0, 2.0], [4.0, 1.0]], 1: [[2.0, 6.0], [3.0, 3.0], [5.0, 5.0]]}


def trace() -> dict:
    """Two ranks, three steps of (all_reduce from train.py:10, all_gather from train.py:11)."""
    calls = []
    for r, steps in GAPS_MS.items():
        t, seq = 0, 0
        for gaps in steps:
            for (op, site), gap_ms in zip(CALLS, gaps, strict=True):
                t += int(gap_ms * 1e6)
                calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": seq, "op": op, "dtype": "float32",
                              "count": 1024, "nbytes": 4096, "root": None, "async": False, "status": "ok",
                              "site": site, "enq_ns": t, "start_ns": t, "end_ns": t + 1000})
                t += 1000
                seq += 1
    return {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": 2, "groups": {"w": [0, 1]},
            "ranks": {"0": {}, "1": {}}, "calls": calls, "flight": {}}


def test_each_step_gets_the_models_compute_and_keeps_its_shape() -> None:
    tr = trace()
    target = 0.5
    gaps, factors = model_gaps(tr, target)
    rec = {r: compute_gaps(cs, origin_ns(tr)) for r, cs in per_rank(tr).items()}
    # steps begin at the all_reduce (the marker); step j: the gaps after its all_reduce up to the next one's
    bounds = [0, 2, 4, 5]
    assert len(factors) == 3
    for j in range(3):
        lo, hi = bounds[j] + 1, bounds[j + 1] + 1
        mean = (sum(gaps[0][lo:hi]) + sum(gaps[1][lo:hi])) / 2
        assert mean == pytest.approx(target)
        for r in (0, 1):   # every gap of the step scaled by the same factor
            ratios = [g / f for g, f in zip(gaps[r][lo:hi], rec[r][lo:hi], strict=True)]
            assert ratios == pytest.approx([factors[j]] * (hi - lo))
    mean_factor = sum(factors) / 3
    assert gaps[0][0] == pytest.approx(rec[0][0] * mean_factor)   # before the first marker: the mean factor
    assert gaps[1][0] == pytest.approx(rec[1][0] * mean_factor)


def test_model_step_compute_is_the_micro_batches_compute_averaged_over_stages() -> None:
    model, gpu = load_model("llama3-8b"), gpu_spec("h100-sxm")
    eff = efficiency_for()
    one = parse_layout("micro_batch=1,global_batch=16,seq_len=4096,dp=8")
    assert model_step_compute_s(model, one, gpu) == pytest.approx(2 * microbatch_times(model, one, gpu, eff).total_s)
    two = parse_layout("pp=2,micro_batch=1,global_batch=16,seq_len=4096,dp=4")
    stages = [microbatch_times(model, two, gpu, eff, stage=i).total_s for i in range(2)]
    assert model_step_compute_s(model, two, gpu) == pytest.approx(4 * sum(stages) / 2)


def test_layout_dp_is_what_the_other_degrees_leave_of_the_ranks_unless_given() -> None:
    assert parse_layout("tp=2, pp=2", nranks=16).dp == 4
    assert parse_layout("tp=2,dp=1", nranks=16).dp == 1
    assert parse_layout("tp=2").dp == 1


@pytest.mark.parametrize("text", ["tp", "warp=2", "tp=two", "micro_batch=1,bogus=3"])
def test_a_bad_layout_says_what_keys_exist(text: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_layout(text)
    assert "key=value" in err.value.hint or "give" in err.value.hint


def test_cli_replays_with_the_models_compute(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace()))
    p = subprocess.run([sys.executable, "-m", "ringflow", "replay", str(path), "--topo", "dgx-h100",
                        "--compute-model", "llama3-8b", "--model-layout", "micro_batch=1,global_batch=4,seq_len=2048",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    cm = res["compute_model"]
    assert cm["layout"]["dp"] == 2 and cm["step_compute_s"] > 0
    mean_factor = sum(cm["step_factors"]) / 3
    for r in ("0", "1"):   # three steps of the model's compute (on average over ranks) plus the first gap
        first = (GAPS_MS[int(r)][0][0] - 1.0) / 1e3 * mean_factor   # the trace starts at its first call (1 ms)
        assert res["compute_s"][r] == pytest.approx(sum(
            f * sum(x / 1e3 for x in g) for f, g in zip(cm["step_factors"], _step_gaps(int(r)), strict=True)) + first)
    both = subprocess.run([sys.executable, "-m", "ringflow", "replay", str(path), "--compute-model", "llama3-8b",
                           "--compute-scale", "2"], capture_output=True, text=True, timeout=120)
    assert both.returncode != 0 and "--compute-scale" in both.stderr + both.stdout


def _step_gaps(r: int) -> list[list[float]]:
    """Rank r's recorded gaps (ms) per step, as model_gaps cuts steps: after each marker up to the next."""
    flat = [g for step in GAPS_MS[r] for g in step]
    return [flat[1:3], flat[3:5], flat[5:6]]
