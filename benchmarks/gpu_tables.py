"""Operator tables of one GPU for the compute model: GEMM rate over an (M, N, K) grid, attention rate per SDPA
backend, sequence length, head dimension and pass, launch overhead, and the memory-bound kernels of training.

    python benchmarks/gpu_tables.py --out DIR
    python benchmarks/gpu_tables.py --out DIR --device cpu --small   # smoke run of the script itself
    python benchmarks/gpu_tables.py --emit-data DIR/tables.json --out DIR   # the data-file blocks of a GPU run

Measures:
- GEMMs ``(M x K) @ (K x N)`` in BF16 and, where the GPU has FP8 tensor cores, FP8 (`torch._scaled_mm`, per-tensor
  scales), every M, N, K in --dims whose product is at most --max-mnk; TFLOP/s = 2 M N K / time;
- ``scaled_dot_product_attention`` forced to each backend (FlashAttention-2 "flash", "cudnn", "efficient"), the
  FlashAttention-3 paper's setup (arXiv:2407.08608 section 4.1: batch x sequence = 16k tokens, hidden 2048, so
  2048 / head_dim heads), causal and not, forward alone and forward + backward (backward = their difference);
  FLOPs counted as the paper does: forward 4 b h s^2 d (half of it causal), backward 2.5x the forward;
- launch overhead: the host's seconds per eager kernel launch (a loop of in-place adds on a 1-element tensor) and
  per eager ``nn.Linear`` call on a tiny input (the dispatcher's Python and C++ path as well);
- memory-bound kernels of a training step (GB/s of bytes read and written): fused AdamW over FP32 parameters,
  the FP8 cast and per-tensor amax of an activation, cross entropy over BF16 logits;
- grouped expert GEMMs (`torch._grouped_mm`, where this torch has it) of Qwen3-30B-A3B and DeepSeek-V3 experts.

Each time is the median of its timed runs after warm-up (CUDA events around back-to-back calls, GEMMs replayed as
a CUDA graph so that launches are not timed); a row that the backend cannot run records the error instead. Writes
DIR/tables.json (every row, the environment and the command) and prints one table per part. ``--emit-data`` turns a
GPU run's tables.json into the blocks of ringflow/data/gemm_tables.yaml and ringflow/data/attention_kernels.yaml
(DIR/gemm_table.yaml, DIR/attention_table.yaml), with the GPU, driver, CUDA, cuDNN and torch versions and the
command in their source.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_operators import (  # noqa: E402
    SDPA_BACKENDS,
    environment,
    forced_backend,
    fp8_matmul,
    has_fp8,
    show,
    timed_s,
)

BACKENDS = ("flash", "cudnn", "efficient")
FA3_TOKENS, FA3_HIDDEN = 16384, 2048     # arXiv:2407.08608 section 4.1
# expert GEMM shapes: (name, local experts, tokens per expert, hidden, expert width)
GROUPED = (("qwen3-30b-a3b gate_up", 128, 512, 2048, 1536), ("qwen3-30b-a3b down", 128, 512, 768, 2048),
           ("deepseek-v3 ep32 gate_up", 8, 4096, 7168, 4096), ("deepseek-v3 ep32 down", 8, 4096, 2048, 7168),
           ("deepseek-v3 ep64 gate_up", 4, 4096, 7168, 4096))


def reps_for(est_s: float, budget_s: float, low: int = 3, high: int = 20) -> int:
    """Timed runs for a call of about `est_s` seconds within `budget_s` per row."""
    return max(low, min(high, int(budget_s / max(est_s, 1e-6))))


def gemm_grid(device: torch.device, dims: list[int], max_mnk: float, budget_s: float) -> list[dict[str, Any]]:
    """TFLOP/s of every (M, N, K) in the grid, BF16 and FP8."""
    fp8 = has_fp8(device)
    rows: list[dict[str, Any]] = []
    dt = torch.bfloat16
    for M, N, K in itertools.product(dims, dims, dims):
        if M * N * K > max_mnk:
            continue
        x, w = torch.randn(M, K, device=device, dtype=dt), torch.randn(K, N, device=device, dtype=dt)
        flops = 2.0 * M * N * K
        calls: list[tuple[str, Callable[[], Any]]] = [("bf16", lambda x=x, w=w: x @ w)]
        if fp8:
            calls.append(("fp8", fp8_matmul(x, w)))
        for dtype, fn in calls:
            est = flops / (1.4e15 if dtype == "fp8" else 7e14) if device.type == "cuda" else flops / 1e11
            inner = max(1, min(50, int(2e-4 / est)))   # a graph of >= ~0.2 ms: the replay's own cost vanishes
            s = timed_s(fn, device, reps_for(est * inner, budget_s), warmup=2, inner=inner, graph=True)
            rows.append({"dtype": dtype, "m": M, "n": N, "k": K, "seconds": s, "tflops": flops / s / 1e12})
        del x, w
    return rows


def attention_table(device: torch.device, seqs: list[int], head_dims: list[int], tokens: int, hidden: int,
                    budget_s: float) -> list[dict[str, Any]]:
    """Forward and backward TFLOP/s of SDPA per backend, sequence length, head dimension and causality."""
    rows: list[dict[str, Any]] = []
    for backend, hd, causal, seq in itertools.product(BACKENDS, head_dims, (False, True), seqs):
        b, h = max(1, tokens // seq), hidden // hd
        q, k, v = (torch.randn(b, h, seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        fwd_flops = 4.0 * b * h * seq * seq * hd * (0.5 if causal else 1.0)
        row: dict[str, Any] = {"backend": backend, "head_dim": hd, "causal": causal, "seq": seq, "batch": b,
                               "heads": h}

        def fwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, c: bool = causal) -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=c)

        def fwd_bwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, c: bool = causal,
                    d: torch.Tensor = dout) -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=c).backward(d)
        try:
            with forced_backend(backend):
                est = fwd_flops / 4e14 if device.type == "cuda" else fwd_flops / 1e10
                inner = max(1, min(10, int(1e-3 / est)))   # the host runs ahead of kernels of >= ~1 ms in all
                f_s = timed_s(fwd, device, reps_for(est * inner, budget_s, high=10), warmup=2, inner=inner)
                fb_s = timed_s(fwd_bwd, device, reps_for(3.5 * est * inner, budget_s, high=10), warmup=2,
                               inner=inner)
        except (RuntimeError, ValueError) as exc:
            rows.append({**row, "error": str(exc).splitlines()[0][:200]})
            continue
        bwd_s = max(fb_s - f_s, 1e-12)
        rows.append({**row, "forward_s": f_s, "backward_s": bwd_s, "forward_tflops": fwd_flops / f_s / 1e12,
                     "backward_tflops": 2.5 * fwd_flops / bwd_s / 1e12,
                     "fwd_bwd_tflops": 3.5 * fwd_flops / fb_s / 1e12})
        del q, k, v, dout
    return rows


def launch_rows(device: torch.device, n: int) -> list[dict[str, Any]]:
    """Host seconds per eager launch: an in-place add, and an nn.Linear call, each on a tiny tensor."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    y = torch.zeros(1, device=device)
    lin = torch.nn.Linear(16, 16, device=device)
    xs = torch.zeros(4, 16, device=device)
    rows = []
    for name, fn in (("add_ (1 element)", lambda: y.add_(1.0)), ("nn.Linear forward (4 x 16)", lambda: lin(xs))):
        for _ in range(100):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host_s = (time.perf_counter() - t0) / n
        sync()
        wall_s = (time.perf_counter() - t0) / n
        rows.append({"op": name, "host_s": host_s, "wall_s": wall_s, "calls": n})
    return rows


def memory_kernel_rows(device: torch.device, small: bool, reps: int) -> list[dict[str, Any]]:
    """Fused AdamW, FP8 cast + amax, cross entropy: GB/s of the bytes each reads and writes."""
    rows: list[dict[str, Any]] = []
    n = 1 << (16 if small else 27)   # FP32 parameters of the optimizer step
    params = [torch.zeros(n, device=device, requires_grad=True)]
    params[0].grad = torch.randn(n, device=device)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=1e-4, fused=fused, foreach=not fused)
    opt.step()
    s = timed_s(opt.step, device, reps, inner=3)
    rows.append({"kernel": f"AdamW step ({'fused' if fused else 'foreach'}, FP32)", "elements": n,
                 "bytes": 7 * 4 * n, "seconds": s, "GBps": 7 * 4 * n / s / 1e9})   # read p g m v, write p m v
    tokens, hidden = (64, 256) if small else (8192, 4096)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    if hasattr(torch, "float8_e4m3fn"):
        s = timed_s(lambda: x.abs().amax(), device, reps, inner=10)
        rows.append({"kernel": "amax (BF16)", "elements": x.numel(), "bytes": 2 * x.numel(), "seconds": s,
                     "GBps": 2 * x.numel() / s / 1e9})
        s = timed_s(lambda: (x * 2.0).to(torch.float8_e4m3fn), device, reps, inner=10)
        rows.append({"kernel": "scale + cast BF16 -> FP8", "elements": x.numel(), "bytes": 3 * x.numel(),
                     "seconds": s, "GBps": 3 * x.numel() / s / 1e9})
    vocab = 1024 if small else 128256
    logits = torch.randn(tokens, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device=device)

    def ce() -> None:
        F.cross_entropy(logits.float(), target).backward()
    s = timed_s(ce, device, reps, inner=2)
    nbytes = logits.numel() * (2 + 4 + 4 + 4 + 2)   # read BF16, FP32 copy, its gradient, back to BF16
    rows.append({"kernel": "cross entropy fwd + bwd (eager, FP32 upcast)", "elements": logits.numel(),
                 "bytes": nbytes, "seconds": s, "GBps": nbytes / s / 1e9})
    return rows


def grouped_rows(device: torch.device, small: bool, reps: int) -> list[dict[str, Any]]:
    """Grouped expert GEMMs with torch._grouped_mm (one kernel for all local experts)."""
    rows: list[dict[str, Any]] = []
    for name, E, T, H, W in GROUPED:
        if small:
            E, T, H, W = min(E, 4), 64, 128, 128
        a = torch.randn(E * T, H, device=device, dtype=torch.bfloat16)
        b = torch.randn(E, W, H, device=device, dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.arange(T, E * T + 1, T, device=device, dtype=torch.int32)
        flops = 2.0 * E * T * H * W
        row: dict[str, Any] = {"op": name, "experts": E, "tokens": T, "hidden": H, "width": W}
        try:
            s = timed_s(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), device, reps, inner=5)
        except (RuntimeError, AttributeError, TypeError) as exc:
            rows.append({**row, "error": str(exc).splitlines()[0][:200]})
            continue
        rows.append({**row, "seconds": s, "tflops": flops / s / 1e12})
    return rows


def provenance(res: dict[str, Any]) -> str:
    """What ran, for a data file's source: GPU, power limit, driver, CUDA, cuDNN, torch, the command."""
    env = res["environment"]
    smi = [p.strip() for p in str(env.get("nvidia_smi", "")).split(",")]
    driver, power = (smi + ["?", "?"])[:2]
    cudnn = env.get("cudnn") or 0
    return (f"measured on one {env.get('gpu')} ({power} limit, driver {driver}), CUDA {env.get('cuda')}, "
            f"cuDNN {cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}, torch {env.get('torch')}: "
            f"`{res['command'].split(' ', 1)[-1]}`")


def emit_data(res: dict[str, Any], out: Path) -> None:
    """Write the GEMM table and the attention table of a GPU run as the data files' YAML blocks."""
    import yaml
    src = provenance(res)
    gpu = str(res["environment"].get("gpu", "")).replace("NVIDIA ", "")
    by_shape: dict[tuple[int, int, int], dict[str, float]] = {}
    for r in res.get("gemm", []):
        by_shape.setdefault((r["m"], r["n"], r["k"]), {})[r["dtype"]] = r["tflops"]
    rows = [[m, n, k, round(v["bf16"], 1), round(v["fp8"], 1) if "fp8" in v else None]
            for (m, n, k), v in sorted(by_shape.items())]
    gemm = {"gpu": gpu, "source": src + " (GEMM grid, each (M x K) @ (K x N) replayed as a CUDA graph)",
            "columns": ["m", "n", "k", "bf16_tflops", "fp8_tflops"], "rows": rows}
    (out / "gemm_table.yaml").write_text(yaml.safe_dump({"tables": [gemm]}, default_flow_style=None, width=120,
                                                         sort_keys=False))
    ok = [r for r in res.get("attention", []) if "error" not in r and r["backend"] in SDPA_BACKENDS]
    seqs = sorted({r["seq"] for r in ok})
    kernels: dict[str, dict[str, dict[int, list[float]]]] = {}
    for r in ok:
        k = kernels.setdefault(SDPA_BACKENDS[r["backend"]], {})
        suffix = "_causal" if r["causal"] else ""
        for series, key in (("forward", "forward_tflops"), ("backward", "backward_tflops")):
            row = k.setdefault(series + suffix, {}).setdefault(r["head_dim"], [0.0] * len(seqs))
            row[seqs.index(r["seq"])] = round(r[key])
    att = {"gpu": gpu, "source": src + " (SDPA forced to each backend; batch x seqlen = 16k tokens, hidden 2048, as "
           "arXiv:2407.08608 section 4.1)", "seq_len": seqs, "kernels": kernels}
    (out / "attention_table.yaml").write_text(yaml.safe_dump({"tables": [att]}, default_flow_style=None,
                                                              width=120, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    """Measure every part, print the tables, write DIR/tables.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for tables.json")
    ap.add_argument("--device", default="cuda", help="cuda or cpu (cpu: a smoke run of the script itself)")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--dims", default="256,512,1024,2048,4096,8192,16384,32768", help="GEMM M, N, K values")
    ap.add_argument("--max-mnk", type=float, default=2.0 ** 40, help="largest M x N x K timed")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384,32768", help="attention sequence lengths")
    ap.add_argument("--budget", type=float, default=0.03, help="seconds of timed runs per row, about")
    ap.add_argument("--parts", default="gemm,attention,launch,memory,grouped", help="which parts to run")
    ap.add_argument("--emit-data", type=Path, help="a GPU run's tables.json: write its data-file blocks to --out")
    a = ap.parse_args(argv)
    if a.emit_data:
        a.out.mkdir(parents=True, exist_ok=True)
        emit_data(json.loads(a.emit_data.read_text()), a.out)
        print(f"wrote {a.out / 'gemm_table.yaml'} and {a.out / 'attention_table.yaml'}")
        return 0
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --small for a smoke run", file=sys.stderr)
        return 2
    parts = set(a.parts.split(","))
    res: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]), "environment": environment(device)}
    a.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (a.out / "tables.json").write_text(json.dumps(res, indent=1))
    if "launch" in parts:
        res["launch"] = launch_rows(device, 200 if a.small else 5000)
        show("eager launch overhead (host seconds per call)", res["launch"], ["op", "host_s", "wall_s"])
        save()
    if "memory" in parts:
        res["memory"] = memory_kernel_rows(device, a.small, 3 if a.small else 20)
        show("memory-bound kernels of a training step", res["memory"], ["kernel", "elements", "GBps"])
        save()
    if "grouped" in parts:
        res["grouped"] = grouped_rows(device, a.small, 3 if a.small else 20)
        show("grouped expert GEMMs (torch._grouped_mm)", res["grouped"],
             ["op", "experts", "tokens", "hidden", "width", "tflops", "error"])
        save()
    if "attention" in parts:
        seqs = [128, 256] if a.small else [int(v) for v in a.seqs.split(",")]
        tokens, hidden = (512, 256) if a.small else (FA3_TOKENS, FA3_HIDDEN)
        res["attention"] = attention_table(device, seqs, [64, 128], tokens, hidden, a.budget)
        show("SDPA per backend (FLOPs as arXiv:2407.08608 counts them)", res["attention"],
             ["backend", "head_dim", "causal", "seq", "forward_tflops", "backward_tflops", "error"])
        save()
    if "gemm" in parts:
        dims = [64, 128] if a.small else [int(v) for v in a.dims.split(",")]
        res["gemm"] = gemm_grid(device, dims, a.max_mnk, a.budget)
        show("GEMM grid (M x K) @ (K x N)", res["gemm"], ["dtype", "m", "n", "k", "tflops"])
        save()
    print(f"wrote {a.out / 'tables.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
