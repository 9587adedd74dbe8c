"""Operator timings on one GPU beside what ringflow's compute model predicts for them, in one run.

    python benchmarks/gpu_operators.py --out DIR [--models llama3-8b,llama3-70b] [--seq 8192] [--compile]
    python benchmarks/gpu_operators.py --out DIR --device cpu --models tiny --seq 64 --reps 1 --gpu H200  # smoke

Measures, in BF16 unless named:
- GEMMs of each model's decoder layer (QKV, attention output, gate+up, down) at tensor-parallel widths 1 and 8:
  the forward product and the backward's two (input gradient, weight gradient), as (M, N, K) rows; the same
  forward products in FP8 (`torch._scaled_mm`, per-tensor scales) where the GPU has FP8 tensor cores;
- causal attention forward + backward (`scaled_dot_product_attention`, grouped-query heads as the model has);
- memory-bound kernels on the layer's activations: copy, add, RMSNorm, SiLU x gate (GB/s moved);
- MoE expert GEMMs of Qwen3-30B-A3B (128 experts x 512 tokens, hidden 2048, expert width 768): a loop of one
  GEMM per expert (eager frameworks) and one batched GEMM; the token permute by indexing (GB/s);
- one whole decoder layer (RMSNorm, QKV, rotary, attention, output, residual, RMSNorm, SwiGLU MLP, residual)
  forward + backward, eager and with --compile also `torch.compile`d, in model TFLOP/s (3x the forward FLOPs),
  beside ringflow's prediction for that layer on this GPU (`workload.compute.microbatch_times`, the
  torchtitan-eager or -compile kernel profile: a PyTorch block, as here).

Each time is the median of --reps timed runs after warm-up (CUDA events on a GPU). Writes DIR/operators.json
(every row, with the GPU, driver, CUDA, cuDNN and torch versions and the command) and DIR/operators.png (GEMM
TFLOP/s against the GEMM's smallest dimension, with matplotlib); prints one table per part.
"""
from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ringflow.errors import InvalidArgument
from ringflow.tables import print_table
from ringflow.workload.compute import GpuSpec, efficiency_for, gpu_spec, microbatch_times
from ringflow.workload.kernels import kernel_profile
from ringflow.workload.layout import Layout
from ringflow.workload.models import ModelSpec, load_model

TINY = ModelSpec("tiny", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024)
MOE_SHAPE = {"experts": 128, "tokens": 512, "hidden": 2048, "width": 768}   # Qwen3-30B-A3B, issue 58
TP_WIDTHS = (1, 8)


def model_of(name: str) -> ModelSpec:
    """A registry model, or the tiny shape of a smoke run."""
    return TINY if name == "tiny" else load_model(name)


def timed_s(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 3, inner: int = 1,
            graph: bool = False) -> float:
    """Median seconds of one call of `fn` over `reps` timed runs of `inner` back-to-back calls each, after
    `warmup` untimed calls. On a GPU the host runs ahead of the kernels within a run, so a kernel longer than its
    launch is timed without the launch; with `graph` the `inner` calls are captured once as a CUDA graph and
    replayed, which times the kernels alone whatever their length (GEMMs; not autograd)."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
        return statistics.median(times)
    run: Callable[[], Any] = lambda: [fn() for _ in range(inner)]   # noqa: E731
    if graph:
        torch.cuda.synchronize(device)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                run()
            run = g.replay
        except RuntimeError as exc:   # not capturable: the back-to-back calls, timed as they are
            print(f"CUDA graph capture failed ({str(exc).splitlines()[0][:80]}); timing without", file=sys.stderr)
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / inner)
    return statistics.median(times)


def environment(device: torch.device) -> dict[str, Any]:
    """What ran: GPU, driver, CUDA, cuDNN, torch, Python, host CPU."""
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "cpu": platform.processor() or platform.machine(), "device": str(device)}
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), capability=list(torch.cuda.get_device_capability(device)))
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = out.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def catalog_gpu(env: dict[str, Any]) -> GpuSpec | None:
    """ringflow's catalog entry for the GPU that ran (`gpu_spec` matches device names), None for another."""
    try:
        return gpu_spec(str(env["gpu"])) if "gpu" in env else None
    except InvalidArgument:
        return None


def layer_gemms(m: ModelSpec, tokens: int, tp: int) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of the forward GEMMs of one decoder layer at tensor-parallel width `tp`."""
    hd = m.head_dim or m.hidden // m.heads
    qkv = (m.heads + 2 * m.kv_heads) * hd // tp
    up = (2 if m.gated_mlp else 1) * m.ffn_hidden // tp
    return [("qkv", tokens, qkv, m.hidden), ("out", tokens, m.hidden, m.heads * hd // tp),
            ("gate_up", tokens, up, m.hidden), ("down", tokens, m.hidden, m.ffn_hidden // tp)]


def gemm_rows(models: list[ModelSpec], tokens: int, device: torch.device, reps: int,
              peak: GpuSpec | None) -> list[dict[str, Any]]:
    """Every layer GEMM forward and its backward's two, BF16, and the forward in FP8 where supported."""
    rows: list[dict[str, Any]] = []
    dt = torch.bfloat16
    fp8 = has_fp8(device)
    for m in models:
        for tp in TP_WIDTHS:
            for name, M, N, K in layer_gemms(m, tokens, tp):
                x, w, g = (torch.randn(a, b, device=device, dtype=dt) for a, b in ((M, K), (K, N), (M, N)))
                for part, fn, shape in (("forward", lambda x=x, w=w: x @ w, (M, N, K)),
                                        ("input grad", lambda g=g, w=w: g @ w.t(), (M, K, N)),
                                        ("weight grad", lambda x=x, g=g: x.t() @ g, (K, N, M))):
                    s = timed_s(fn, device, reps, inner=5, graph=True)
                    rows.append(_gemm_row(m.name, tp, name, part, "bf16", shape, s, peak))
                if fp8:
                    s = timed_s(fp8_matmul(x, w), device, reps, inner=5, graph=True)
                    rows.append(_gemm_row(m.name, tp, name, "forward", "fp8", (M, N, K), s, peak))
    return rows


def has_fp8(device: torch.device) -> bool:
    """Whether `device` has FP8 tensor cores (compute capability 8.9 on) and this torch `_scaled_mm`."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9) and \
        hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")


def fp8_matmul(x: torch.Tensor, w: torch.Tensor) -> Callable[[], Any]:
    """x @ w as one FP8 GEMM with per-tensor scales (BF16 out), operands cast once, as a call to time."""
    a8 = x.to(torch.float8_e4m3fn)
    b8 = w.t().contiguous().to(torch.float8_e4m3fn).t()   # column-major, as _scaled_mm wants
    one = torch.ones((), device=x.device)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _gemm_row(model: str, tp: int, name: str, part: str, dtype: str, mnk: tuple[int, int, int], s: float,
              peak: GpuSpec | None) -> dict[str, Any]:
    M, N, K = mnk
    tflops = 2.0 * M * N * K / s / 1e12
    top = None if peak is None else peak.peak_flops(dtype) / 1e12
    return {"model": model, "tp": tp, "gemm": name, "pass": part, "dtype": dtype, "m": M, "n": N, "k": K,
            "seconds": s, "tflops": tflops, "of_peak": None if top is None else tflops / top}


def attention_rows(models: list[ModelSpec], seq: int, device: torch.device, reps: int) -> list[dict[str, Any]]:
    """Causal attention forward + backward per model (one sequence), model TFLOP/s = 3 x forward FLOPs."""
    rows = []
    for m in models:
        hd = m.head_dim or m.hidden // m.heads
        q = torch.randn(1, m.heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(1, m.kv_heads, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        dout = torch.randn_like(q)

        def fwd_bwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, dout: torch.Tensor = dout,
                    gqa: bool = m.kv_heads != m.heads) -> None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            o.backward(dout)
        s = timed_s(fwd_bwd, device, reps, inner=3)
        flops = 3 * 2 * m.heads * seq * seq * hd   # causal: half of 4 h s^2 d forward, x3 forward + backward
        rows.append({"model": m.name, "seq": seq, "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": hd,
                     "seconds": s, "tflops": flops / s / 1e12})
    return rows


def memory_rows(m: ModelSpec, tokens: int, device: torch.device, reps: int) -> list[dict[str, Any]]:
    """Memory-bound kernels on one layer's activations, GB/s of bytes read and written."""
    dt = torch.bfloat16
    x, y = (torch.randn(tokens, m.hidden, device=device, dtype=dt) for _ in range(2))
    a, b = (torch.randn(tokens, m.ffn_hidden, device=device, dtype=dt) for _ in range(2))
    w = torch.ones(m.hidden, device=device, dtype=dt)
    e = 2   # bytes per BF16 element
    cases: list[tuple[str, Callable[[], Any], float]] = [
        ("copy", lambda: x.clone(), 2 * x.numel() * e),
        ("add", lambda: x + y, 3 * x.numel() * e),
        ("rmsnorm", lambda: F.rms_norm(x, (m.hidden,), w), 2 * x.numel() * e),
        ("silu x gate", lambda: F.silu(a) * b, 3 * a.numel() * e),
    ]
    rows = []
    for name, fn, nbytes in cases:
        s = timed_s(fn, device, reps, inner=10)
        rows.append({"kernel": name, "bytes": nbytes, "seconds": s, "GBps": nbytes / s / 1e9})
    return rows


def moe_rows(device: torch.device, reps: int, small: bool) -> list[dict[str, Any]]:
    """Expert GEMMs of Qwen3-30B-A3B as a per-expert loop and as one batched GEMM; the token permute."""
    sh = dict(MOE_SHAPE, experts=8, tokens=64, hidden=256, width=128) if small else MOE_SHAPE
    E, T, H, W = sh["experts"], sh["tokens"], sh["hidden"], sh["width"]
    dt = torch.bfloat16
    x = torch.randn(E, T, H, device=device, dtype=dt)
    w = torch.randn(E, H, W, device=device, dtype=dt)
    flops = 2.0 * E * T * H * W
    loop_s = timed_s(lambda: [x[i] @ w[i] for i in range(E)], device, reps)
    bmm_s = timed_s(lambda: torch.bmm(x, w), device, reps, inner=5)
    tokens = x.reshape(E * T, H)
    perm = torch.randperm(E * T, device=device)
    perm_s = timed_s(lambda: tokens.index_select(0, perm), device, reps, inner=10)
    return [{"op": "expert GEMMs, one per expert", **sh, "seconds": loop_s, "tflops": flops / loop_s / 1e12},
            {"op": "expert GEMMs, one batched GEMM", **sh, "seconds": bmm_s, "tflops": flops / bmm_s / 1e12},
            {"op": "token permute (index_select)", **sh, "seconds": perm_s,
             "GBps": 2 * tokens.numel() * 2 / perm_s / 1e9}]


class DecoderLayer(torch.nn.Module):
    """A Llama decoder layer in plain PyTorch (RMSNorm, GQA attention with rotary, SwiGLU MLP, no bias)."""

    def __init__(self, m: ModelSpec, seq: int) -> None:
        super().__init__()
        hd = m.head_dim or m.hidden // m.heads
        self.m, self.hd = m, hd
        self.norm1, self.norm2 = torch.nn.RMSNorm(m.hidden), torch.nn.RMSNorm(m.hidden)
        self.qkv = torch.nn.Linear(m.hidden, (m.heads + 2 * m.kv_heads) * hd, bias=False)
        self.out = torch.nn.Linear(m.heads * hd, m.hidden, bias=False)
        self.gate_up = torch.nn.Linear(m.hidden, 2 * m.ffn_hidden, bias=False)
        self.down = torch.nn.Linear(m.ffn_hidden, m.hidden, bias=False)
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rotary(self, t: torch.Tensor) -> torch.Tensor:
        a, b = t[..., ::2], t[..., 1::2]
        c, s = self.get_buffer("cos").to(t.dtype), self.get_buffer("sin").to(t.dtype)
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, hd = self.m, self.hd
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([m.heads * hd, m.kv_heads * hd, m.kv_heads * hd], dim=-1)
        q, k, v = (t.view(b, s, -1, hd).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(self.rotary(q), self.rotary(k), v, is_causal=True,
                                           enable_gqa=m.kv_heads != m.heads)
        h = x + self.out(o.transpose(1, 2).reshape(b, s, -1))
        g, u = self.gate_up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(g) * u)


def sdpa_kernel_of(torch_version: str) -> str:
    """The attention kernel (kernels.ATTENTION_KERNELS) PyTorch's SDPA runs on Hopper by default in this release:
    cuDNN first from 2.9 (pytorch/pytorch#162073), the flash backend (FlashAttention-2) before it."""
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return "cudnn" if (major, minor) >= (2, 9) else "flash2"


def predicted_layer_s(m: ModelSpec, seq: int, gpu: GpuSpec, compiled: bool, attention: str = "") -> float:
    """ringflow's forward + backward seconds of one decoder layer (one sequence, BF16, no recomputation): a
    2-layer model's micro-batch less a 1-layer one's, so the logits cancel; `attention` names the kernel SDPA
    runs (default: the torchtitan profile's own)."""
    lay = Layout(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=seq)
    name = "torchtitan-compile" if compiled else "torchtitan-eager"
    eff = efficiency_for(name)
    if attention:
        eff = replace(eff, kernels=replace(kernel_profile(name), name=f"{name}-{attention}", attention=attention))
    two, one = (microbatch_times(replace(m, layers=n), lay, gpu, eff) for n in (2, 1))
    return (two.forward_s + two.backward_s) - (one.forward_s + one.backward_s)


def _layer_step(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of a layer, as a call to time."""
    return lambda: fn(x).sum().backward()


def layer_rows(models: list[ModelSpec], seq: int, device: torch.device, reps: int, compile_too: bool,
               gpu: GpuSpec | None, attention: str = "", backends: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One decoder layer forward + backward per model, eager with torch's SDPA choice and with each of
    `backends` forced (and compiled), beside ringflow's prediction with the kernel that ran."""
    rows = []
    for m in models:
        layer = DecoderLayer(m, seq).to(device=device, dtype=torch.bfloat16)
        x = torch.randn(1, seq, m.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        mm, at, _ = m.span_flops_per_token(seq, 0, 1)
        flops = 3.0 * seq * (mm + at)
        runs = [(False, "")] + [(False, b) for b in backends] + ([(True, "")] if compile_too else [])
        for compiled, backend in runs:
            fn: Callable[[torch.Tensor], torch.Tensor] = torch.compile(layer) if compiled else layer
            step = _layer_step(fn, x)
            kernel = SDPA_BACKENDS[backend] if backend else attention
            try:
                with forced_backend(backend):
                    t0 = time.perf_counter()
                    step()   # the first call compiles
                    first_s = time.perf_counter() - t0
                    s = timed_s(step, device, reps)
            except RuntimeError as exc:
                rows.append({"model": m.name, "seq": seq, "compiled": compiled, "sdpa": backend or "default",
                             "failed": str(exc).splitlines()[0][:200]})
                continue
            pred = predicted_layer_s(m, seq, gpu, compiled, kernel) if gpu is not None else None
            rows.append({"model": m.name, "seq": seq, "compiled": compiled, "sdpa": backend or "default",
                         "predicted_with": kernel, "first_call_s": first_s,
                         "seconds": s, "tflops": flops / s / 1e12, "predicted_s": pred,
                         "predicted_tflops": None if pred is None else flops / pred / 1e12,
                         "error": None if pred is None else s / pred - 1.0})
    return rows


# SDPA backends that run a kernel of kernels.ATTENTION_KERNELS, and that kernel's name
SDPA_BACKENDS = {"flash": "flash2", "cudnn": "cudnn"}


def forced_backend(backend: str) -> Any:
    """A context that forces SDPA onto one backend (flash, cudnn, efficient; '': torch's own choice)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    if not backend:
        return contextlib.nullcontext()
    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return "n/a" if v is None else str(v)


def show(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Print one part's rows as a table."""
    print_table(title, cols, [[_fmt(r.get(c)) for c in cols] for r in rows])


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """GEMM TFLOP/s against the GEMM's smallest dimension, one marker per dtype (False without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dt, mark in (("bf16", "o"), ("fp8", "s")):
        pts = [(min(r["m"], r["n"], r["k"]), r["tflops"]) for r in rows if r["dtype"] == dt]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=mark, label=dt.upper())
    ax.set_xscale("log")
    ax.set_xlabel("smallest GEMM dimension")
    ax.set_ylabel("TFLOP/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> int:
    """Measure every part, print the tables, write the JSON and the plot."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for operators.json and operators.png")
    ap.add_argument("--models", default="llama3-8b,llama3-70b", help="comma-separated model names (or 'tiny')")
    ap.add_argument("--seq", type=int, default=8192, help="sequence length of one micro-batch of 1")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per row (median)")
    ap.add_argument("--device", default="cuda", help="cuda or cpu (cpu: a smoke run of the script itself)")
    ap.add_argument("--compile", action="store_true", help="also time the decoder layer under torch.compile")
    ap.add_argument("--gpu", default="", help="ringflow's catalog GPU to predict for (default: the device's own)")
    ap.add_argument("--attention", default="", help="the attention kernel SDPA runs, for the layer's prediction "
                    "(flash2, cudnn, ...; default: by this torch's release, sdpa_kernel_of)")
    ap.add_argument("--layer-backends", default="flash,cudnn", help="SDPA backends to also force the eager layer onto")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    models = [model_of(n.strip()) for n in a.models.split(",") if n.strip()]
    env = environment(device)
    gpu = gpu_spec(a.gpu) if a.gpu else catalog_gpu(env)
    tokens = a.seq
    attention = a.attention or sdpa_kernel_of(torch.__version__)
    res: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]), "environment": env,
                           "catalog_gpu": None if gpu is None else gpu.name, "seq": a.seq, "reps": a.reps,
                           "predicted_attention": attention}
    res["gemm"] = gemm_rows(models, tokens, device, a.reps, gpu)
    show("GEMMs (M x K) @ (K x N)", res["gemm"], ["model", "tp", "gemm", "pass", "dtype", "m", "n", "k", "tflops",
                                                  "of_peak"])
    res["attention"] = attention_rows(models, a.seq, device, a.reps)
    show("causal attention, forward + backward", res["attention"], ["model", "seq", "heads", "kv_heads", "tflops"])
    res["memory"] = memory_rows(models[0], tokens, device, a.reps)
    show(f"memory-bound kernels ({models[0].name} activations)", res["memory"], ["kernel", "bytes", "GBps"])
    res["moe"] = moe_rows(device, a.reps, small=device.type != "cuda")
    show("MoE expert GEMMs and permute", res["moe"], ["op", "experts", "tokens", "tflops", "GBps"])
    backends = tuple(b for b in a.layer_backends.split(",") if b) if device.type == "cuda" else ()
    res["layer"] = layer_rows(models, a.seq, device, a.reps, a.compile, gpu, attention, backends)
    show("decoder layer, forward + backward (model TFLOP/s) beside ringflow's prediction with the kernel that ran",
         res["layer"],
         ["model", "compiled", "sdpa", "predicted_with", "seconds", "tflops", "predicted_tflops", "error"])
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "operators.json").write_text(json.dumps(res, indent=1))
    drew = plot(res["gemm"], a.out / "operators.png")
    print(f"wrote {a.out / 'operators.json'}" + (f" and {a.out / 'operators.png'}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
