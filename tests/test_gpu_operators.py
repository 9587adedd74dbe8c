"""The GPU operator benchmark (benchmarks/gpu_operators.py): its layer GEMMs are the compute model's layer FLOPs,
its prediction of one decoder layer is the compute model's, and a CPU smoke run writes every part."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ringflow.workload.compute import gpu_spec  # noqa: E402
from ringflow.workload.models import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_operators", ROOT / "benchmarks" / "gpu_operators.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_operators"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b"])
def test_the_layer_gemms_timed_are_the_linear_flops_the_compute_model_counts(name: str) -> None:
    bench, m = _bench(), load_model(name)
    for tp in (1, 8):
        gemms = bench.layer_gemms(m, 1, tp)
        per_token = sum(2.0 * n * k for _, _, n, k in gemms) * tp
        mm, _, _ = m.span_flops_per_token(8192, 0, 1)
        assert per_token == pytest.approx(mm, rel=1e-9), (tp, per_token, mm)


def test_the_predicted_layer_is_one_layer_of_the_compute_model_and_compiling_is_faster() -> None:
    bench, m, gpu = _bench(), load_model("llama3-8b"), gpu_spec("H200")
    eager, compiled = (bench.predicted_layer_s(m, 8192, gpu, c) for c in (False, True))
    mm, at, _ = m.span_flops_per_token(8192, 0, 1)
    flops = 3.0 * 8192 * (mm + at)
    assert 0 < compiled < eager
    assert flops / eager < gpu.bf16_flops   # below the peak, as every measured layer is


@pytest.mark.long   # CPU BF16 kernels of a tiny model: a few seconds
def test_a_cpu_smoke_run_writes_every_part_with_a_prediction(tmp_path: Path) -> None:
    bench = _bench()
    rc = bench.main(["--out", str(tmp_path), "--device", "cpu", "--models", "tiny", "--seq", "32", "--reps", "1",
                     "--gpu", "H200"])
    assert rc == 0
    res = json.loads((tmp_path / "operators.json").read_text())
    assert res["environment"]["torch"] and res["catalog_gpu"] == "H200"
    assert len(res["gemm"]) == 2 * 4 * 3 and all(r["tflops"] > 0 for r in res["gemm"])
    assert {r["kernel"] for r in res["memory"]} == {"copy", "add", "rmsnorm", "silu x gate"}
    assert len(res["moe"]) == 3 and len(res["attention"]) == 1
    layer = res["layer"][0]
    assert layer["seconds"] > 0 and layer["predicted_s"] > 0
    assert layer["error"] == pytest.approx(layer["seconds"] / layer["predicted_s"] - 1)


def test_the_layer_is_predicted_with_the_attention_kernel_this_torch_runs() -> None:
    bench, m, gpu = _bench(), load_model("llama3-8b"), gpu_spec("H200")
    assert bench.sdpa_kernel_of("2.13.0+cpu") == "cudnn" and bench.sdpa_kernel_of("2.9.1") == "cudnn"
    assert bench.sdpa_kernel_of("2.6.0.dev20241223+cu124") == "flash2"
    flash2, cudnn = (bench.predicted_layer_s(m, 8192, gpu, False, k) for k in ("flash2", "cudnn"))
    assert cudnn < flash2   # cuDNN's measured H100 rates are above FlashAttention-2's
    assert bench.predicted_layer_s(m, 8192, gpu, False) == pytest.approx(flash2)   # torchtitan's own kernel
