"""Compute time: FLOPs per micro-batch over peak x a shape-dependent efficiency, plus memory-bound work.

Model (all constants below are settable through `EfficiencyModel`):

    t_gemm = FLOPs_gemm / (peak x eff_max x d / (d + d_half) x n / (n + n_half))
    t_mem  = c x activation_bytes / (hbm_GBps x mem_eff)

- on a GPU a measured GEMM table covers (`gemm_tables`, ``EfficiencyModel.gemm_tables``), the curve is not used:
  each linear layer's forward GEMM and its two backward products (`linear_gemms`), the logit GEMM and each routed
  expert's GEMMs (`expert_gemms`, at one expert's rows) run at the table's rate for their (M, N, K) and dtype,
  times ``software_factor``;
- ``d`` = hidden / tp, the per-GPU GEMM width: narrow GEMMs (small models, wide TP) reach a smaller fraction
  of the tensor-core peak (tile quantisation, wave quantisation, launch overhead);
- ``n`` = tokens per micro-batch per GPU (b x s / cp), the GEMM's other dimension;
- memory-bound kernels (norms, activation functions, dropout, softmax, residual adds) move the activation
  tensors a layer stores: in the forward pass each is written and read (c = 2), in the backward pass read,
  and its gradient written and read (c = 4). Their byte count is `memory.activation_bytes_per_layer` with
  recompute "none", so the 5as/h softmax term of non-FlashAttention models costs time here too.
- FP8 runs the linear layers' GEMMs at the FP8 peak, of which real GEMMs reach ``fp8_gemm_factor`` of the
  BF16 efficiency (measured on one H200, issue 58: FP8 per-tensor ``_scaled_mm`` 1,230-1,440 TFLOP/s against
  BF16 640-820 on the same Llama-3 layer shapes, midpoints 1,335 / 730 = 1.83 of the 2x peak ratio: 0.914);
  attention stays in BF16 (Transformer Engine runs attention in FP8 only with the recipe's ``fp8_dpa``, off by
  default; torchao converts ``nn.Linear`` modules only: "both BFLOAT16 Tensor Core and FP8 Tensor Core are
  involved", torchtitan benchmarks/llama3_h100_202412_torchtitan.md), and so does the output layer's logit GEMM
  (torchtitan 9dec370 ``torchtitan/float8.py`` line 99 leaves ``output`` out of the conversion; Megatron-Core
  core_v0.15.0 ``gpt_model.py`` line 234 builds it as ``tensor_parallel.ColumnParallelLinear``, not a Transformer
  Engine module). Quantizing the GEMM operands (a cast per
  operand, and an amax pass under per-tensor current scaling) is memory-bound work of its own
  (`kernels.fp8_cast_bytes_per_token`), each pass and each recomputation, at HBM bandwidth x mem_eff.
- Attention runs as the kernel profile's attention kernel (`kernels.ATTENTION_KERNELS`): a FlashAttention kernel's
  tensor FLOPs over the causal half of the scores (backward with QK^T recomputed) at the BF16 GEMM rate, and one
  exponential per kept score and pass at the GPU's special-function rate (``GpuSpec.exp_per_s``), added
  (FlashAttention-2) or overlapped (FlashAttention-3 and cuDNN on GPUs with asynchronous tensor cores), times the
  kernel's factors (FlashAttention in Triton 1.4x forward, 2x backward); `kernels.attention_pass_s`. Where a
  published measurement covers the GPU and the kernel (`attention_tables`), a pass runs at its rate instead. Without
  FlashAttention (``layout.flash_attention`` false) the model's attention FLOPs run at the GEMM rate.
- A pipeline stage computes its own layers (uneven splits, dense and MoE layers, windowed attention), the last
  one also the logits; an MoE layer's routed experts run ``capacity_factor`` x the balanced load when buffers
  are padded to capacity (GShard / Switch Transformer convention), else the balanced load, times the layout's
  ``expert_imbalance`` (the busiest expert's load over the balanced one). Transformer Engine runs the expert GEMMs
  as one GEMM per local expert (`moe` module docstring), so their efficiency is the curve's at one expert's rows
  (`moe.rows_per_expert`, `expert_gemm_rate`), floored per pass by the local experts' weight traffic at HBM
  bandwidth (`expert_roofline_s`); a grouped GEMM of 128 experts x 512 tokens (hidden 2048, width 768) measured
  648-714 TFLOP/s on one H200 (issue 58), the dense curve's range. Each MoE layer and pass adds its router, token
  permute/unpermute, sort-by-local-expert and token-dispatcher time (`moe.layer_cost`, the dispatcher's rate
  fitted per kind); a dropless
  MoE layer's forward lasts at least the host's time to launch it (`moe.host_wait_s`, fitted per kind).
- A run under a board power limit below the GPU's default (``GpuSpec.at_power_limit``) holds a lower SM clock
  through tensor-core-bound work: its tensor peaks and exponential rate, and so every GEMM, attention and softmax
  time above, scale by the sustained clock there over the clock at the default limit the tables were measured at
  (``hardware.gpus``, measured per limit where a source gives it); the memory-bound terms keep HBM bandwidth.
- Through a training run a GPU's tensor cores hold a lower SM clock than its datasheet peaks and the tables
  (timed in short bursts) assume, by a figure fitted per GPU model on published runs (`in_training`,
  `GpuSpec.at_clock`, ``sustained`` in ``ringflow/data/fitted.json``, `published` module docstring); `step_time`
  and the planner apply it to the topology's GPU, MFU stays against the datasheet peak, and a measured sustained
  clock would replace the fit.
- ``software_factor`` multiplies the GEMM efficiency: the framework's share (kernels, fusion, launch gaps)
  beside the hardware. Named profiles (`SOFTWARE_PROFILES`) give its default per framework generation.
- ``kernels`` names the framework's memory-bound kernel profile (`kernels.PROFILES`): the stored-activation term
  above stands for the fused Megatron-Core / Transformer Engine kernels the curve was fitted with; any other
  profile adds the time of the bytes its own kernels move beyond those (unfused eager norms, rotary, SwiGLU and
  residual adds; an fp32 eager loss), each pass and each recomputation, at HBM bandwidth x mem_eff.

eff_max, d_half and n_half come from ``ringflow/data/fitted.json``: fitted by ``python -m ringflow.workload.fitting``
on the fitting half of the published registry only (the reference era's cases, Megatron-LM 2021 on A100s); mem_eff
is the fraction of HBM bandwidth elementwise kernels reach.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from .attention_tables import measured_flops
from .context_parallel import ring_attention_s, uses_torch_ring
from .gemm_tables import max_flops_per_s, passes_of, sequence_flops_per_s
from .kernels import (
    ATTENTION_KERNELS,
    FP8_RECIPES,
    PASSES,
    REFERENCE,
    KernelProfile,
    attention_pass_s,
    attention_work,
    extra_bytes_per_token,
    fp8_cast_bytes_per_token,
    kernel_profile,
    skips_last_gemm,
)
from .layout import Layout
from .memory import activation_bytes_per_layer
from .models import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..topology.graph import Topology


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense tensor FLOP/s, HBM bandwidth and capacity, exponential rate of one GPU model."""

    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_GBps: float
    memory_bytes: float
    exp_per_s: float = 0.0      # special-function base-2 exponentials per second (0: not known, left out)
    async_mma: bool = False     # asynchronous tensor cores (Hopper and later): softmax can overlap the GEMMs
    nccl_sm_share: float = 0.0  # share of the SMs a running NCCL collective holds (hardware.gpus); 0: not known
    power_limit_W: float = 0.0  # the board power limit the rates above hold at (hardware.gpus); 0: not known
    clock: float = 1.0          # the SM clock the rates above hold at, over the clock of the datasheet's peaks

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s in `dtype` ('fp8', else the BF16/FP16 peak) at the clock this spec holds."""
        return self.fp8_flops if dtype == "fp8" else self.bf16_flops

    def datasheet_flops(self, dtype: str) -> float:
        """The datasheet's dense peak FLOP/s in `dtype` (what MFU is measured against, whatever the clock)."""
        return self.peak_flops(dtype) / self.clock

    def at_power_limit(self, watts: float) -> GpuSpec:
        """This GPU under a `watts` board power limit: its tensor peaks and exponential rate (what the compute-bound
        GEMM, attention and softmax times scale with) times the sustained SM clock there over the clock at its
        current limit (`hardware.gpus.GpuModel.clock_ratio`); HBM bandwidth and capacity unchanged."""
        from ..hardware.gpus import GPU_MODELS
        if watts == self.power_limit_W:
            return self
        model = GPU_MODELS.get(self.name)
        if model is None:
            raise InvalidArgument(f"{self.name} at a {watts!r} W power limit: not a catalog GPU",
                                  f"use one of {', '.join(GPU_MODELS)}")
        return replace(self.at_clock(model.clock_ratio(watts, self.power_limit_W or None)),
                       power_limit_W=float(watts))

    def at_clock(self, ratio: float) -> GpuSpec:
        """This GPU with its SM clock at `ratio` times the one its rates hold at: tensor peaks and exponential rate
        scaled, HBM bandwidth and capacity unchanged (the memory clock does not follow the SM clock)."""
        if not (isinstance(ratio, (int, float)) and 0 < ratio <= 2):
            raise InvalidArgument(f"{self.name}: SM clock ratio {ratio!r}", "give a ratio in (0, 2]")
        if ratio == 1:
            return self
        return replace(self, bf16_flops=self.bf16_flops * ratio, fp8_flops=self.fp8_flops * ratio,
                       exp_per_s=self.exp_per_s * ratio, clock=self.clock * ratio)


def _from_catalog() -> dict[str, GpuSpec]:
    """The hardware catalog's GPUs (ringflow.hardware.gpus: dense datasheet peaks, sources per entry) in the
    units this module uses; GPUs without BF16 (P100, V100) train in FP16, and without FP8 at their 16-bit peak."""
    from ..hardware.gpus import GPU_MODELS
    out = {}
    for g in GPU_MODELS.values():
        half = (g.bf16_tflops or g.fp16_tflops) * 1e12
        out[g.name] = GpuSpec(g.name, half, (g.fp8_tflops or g.bf16_tflops or g.fp16_tflops) * 1e12,
                              float(g.memory_GBps), float(g.memory_GB) * 1e9, g.exp_per_s, g.async_mma,
                              g.nccl_sm_share, g.power_limit_W)
    return out


GPUS: dict[str, GpuSpec] = _from_catalog()


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU model up by name ('H100', 'NVIDIA H100 80GB HBM3', 'a100' ...)."""
    key = str(name).upper()
    for n in sorted(GPUS, key=len, reverse=True):  # 'GB200' before 'B200'
        if n in key:
            return GPUS[n]
    raise InvalidArgument(f"unknown GPU model {name!r}", f"known: {', '.join(GPUS)}")


def gpu_of_topology(topo: Topology) -> GpuSpec:
    """The GPU model of a topology's first endpoint (node attribute 'model')."""
    ep = topo.endpoints()[0]
    model = topo.graph.nodes[ep].get("model") or getattr(topo, "meta", {}).get("gpu") or getattr(topo, "name", "")
    return gpu_spec(str(model))


def in_training(gpu: GpuSpec, sustained: Mapping[str, float] | None = None) -> GpuSpec:
    """`gpu` at the SM clock its tensor cores sustain through a training run: the figure `sustained` (default: the
    ``sustained`` figures fitted in ``ringflow/data/fitted.json``, `published` module docstring) holds for its model;
    a model without one keeps its rates."""
    return gpu.at_clock((_SUSTAINED if sustained is None else sustained).get(gpu.name, 1.0))


def _fitted_constants() -> dict[str, Any]:
    """The constants `ringflow.workload.fitting.refit` wrote (fitting half only)."""
    return dict(json.loads((Path(__file__).resolve().parents[1] / "data" / "fitted.json").read_text())["constants"])


def _fitted_curve(c: dict[str, Any]) -> dict[str, float]:
    """eff_max, d_half, n_half and the MoE dispatchers' rates of the fitted constants `c` (a dispatcher without a
    fitted rate gets 0, the term left out)."""
    out = {k: float(c[k]) for k in ("eff_max", "d_half", "n_half")}
    rates, hosts = c.get("dispatch_eps") or {}, c.get("dispatch_host_s") or {}
    out.update({f"{k}_dispatch_eps": float(rates.get(k, 0.0)) for k in ("alltoall", "flex")})
    out.update({f"{k}_host_s": float(hosts.get(k, 0.0)) for k in ("alltoall", "flex")})
    return out


_FITTED = _fitted_constants()
_CURVE = _fitted_curve(_FITTED)
_SUSTAINED: dict[str, float] = {k: float(v) for k, v in (_FITTED.get("sustained") or {}).items()}
# One H200 (issue 58): FP8 per-tensor _scaled_mm 1,230-1,440 TFLOP/s, BF16 GEMMs 640-820, same layer shapes.
FP8_GEMM_FACTOR = (1230 + 1440) / 2 / ((640 + 820) / 2) / 2


@dataclass(frozen=True)
class EfficiencyModel:
    """Shape-dependent efficiency of GEMMs and memory-bound kernels (see module docstring)."""

    eff_max: float = _CURVE["eff_max"]   # fitted on the registry's fitting half (data/fitted.json)
    d_half: float = _CURVE["d_half"]     # GEMM width (hidden / tp) at which efficiency is half of eff_max; fitted
    n_half: float = _CURVE["n_half"]     # tokens per micro-batch at which efficiency halves; fitted
    mem_eff: float = 0.8       # fraction of HBM bandwidth that elementwise kernels reach (assumption)
    fp8_gemm_factor: float = FP8_GEMM_FACTOR  # FP8 GEMMs' efficiency over BF16's (measured, module docstring)
    fp8_recipe: str = "tensorwise"  # FP8 scaling (kernels.FP8_RECIPES): tensorwise current scaling or block (MX)
    software_factor: float = 1.0  # framework efficiency multiplier (see SOFTWARE_PROFILES)
    # MoE token dispatchers: routed elements per second per GPU and pass (workload/moe.py); fitted, 0 = left out
    alltoall_dispatch_eps: float = _CURVE["alltoall_dispatch_eps"]
    flex_dispatch_eps: float = _CURVE["flex_dispatch_eps"]
    # ... and the host's seconds per dropless MoE layer forward (moe.host_wait_s); fitted, 0 = left out
    alltoall_host_s: float = _CURVE["alltoall_host_s"]
    flex_host_s: float = _CURVE["flex_host_s"]
    fused_permute: bool = True    # MoE permute/unpermute as one fused kernel (Megatron --moe-permute-fusion)
    kernels: str | KernelProfile = REFERENCE   # kernel profile (workload/kernels.py), by name or itself
    kernel_launch_s: float = 0.0  # per memory-bound kernel beyond the reference's (no sourced figure yet: 0)
    gemm_tables: bool = True      # GEMMs at a measured table's rates where one covers the GPU (gemm_tables)
    expert_rate_bound: bool = False  # expert GEMMs at the table's highest rate: a lower bound of their time

    def __post_init__(self) -> None:
        kernel_profile(self.kernels)   # an unknown profile name is an InvalidArgument naming the known ones
        if self.fp8_recipe not in FP8_RECIPES:
            raise InvalidArgument(f"fp8_recipe={self.fp8_recipe!r}", f"use one of {', '.join(FP8_RECIPES)}")
        if self.kernel_launch_s < 0:
            raise InvalidArgument(f"kernel_launch_s={self.kernel_launch_s}", "give a launch time >= 0 seconds")

    def elementwise_Bps(self, gpu: GpuSpec) -> float:   # noqa: N802 - units in the name
        """Bytes per second memory-bound kernels move on `gpu`: its HBM bandwidth times `mem_eff`."""
        return gpu.hbm_GBps * 1e9 * self.mem_eff

    def dispatch_eps(self, dispatcher: str) -> float:
        """The fitted rate of a token dispatcher kind (moe.DISPATCHERS)."""
        return self.flex_dispatch_eps if dispatcher == "flex" else self.alltoall_dispatch_eps

    def dispatch_host_s(self, dispatcher: str) -> float:
        """The fitted host seconds per dropless MoE layer forward of a token dispatcher kind."""
        return self.flex_host_s if dispatcher == "flex" else self.alltoall_host_s

    def gemm_efficiency(self, d: float, n: float) -> float:
        """Fraction of peak a GEMM of width d with n rows reaches."""
        return self.eff_max * d / (d + self.d_half) * n / (n + self.n_half)


@dataclass(frozen=True)
class SoftwareProfile:
    """A training framework generation: its GEMM-efficiency multiplier, its memory-bound kernels
    (`kernels.PROFILES`) and what it stands for."""

    name: str
    software_factor: float
    description: str
    kernels: str = REFERENCE


# The factors are parameters, not fits: 1.0 is the efficiency curve as fitted on Megatron-LM 2021 (Narayanan et
# al. Table 1). Calibrating them against published runs is `ringflow validate --published`'s job; until a
# calibrated value replaces one, every profile keeps 1.0 and the choice only labels the run.
SOFTWARE_PROFILES: dict[str, SoftwareProfile] = {
    "megatron-core-2025": SoftwareProfile(
        "megatron-core-2025", 1.0, "Megatron-Core with Transformer Engine, FlashAttention, grouped-GEMM MoE, "
        "distributed optimizer (NVIDIA/Megatron-LM core_r0.12, 2025); the default"),
    "megatron-lm-2021": SoftwareProfile(
        "megatron-lm-2021", 1.0, "Megatron-LM as in Narayanan et al. 2021 (arXiv:2104.04473): fused kernels, "
        "no FlashAttention, no sequence parallelism; the curve's own fit"),
    "deepspeed-2022": SoftwareProfile(
        "deepspeed-2022", 1.0, "Megatron-DeepSpeed with ZeRO as used for BLOOM 176B (arXiv:2211.05100) and MT-NLG "
        "530B (arXiv:2201.11990)"),
    "torchtitan-eager": SoftwareProfile(
        "torchtitan-eager", 1.0, "torchtitan (PyTorch FSDP2/TP/PP) without torch.compile: every norm, rotary, "
        "activation and residual op its own kernel", "torchtitan-eager"),
    "torchtitan-compile": SoftwareProfile(
        "torchtitan-compile", 1.0, "torchtitan with each transformer block torch.compile'd (Inductor fuses the "
        "block's pointwise work); eager fp32 loss", "torchtitan-compile"),
    "llm-foundry-2023": SoftwareProfile(
        "llm-foundry-2023", 1.0, "llm-foundry / Composer (PyTorch FSDP) MPT: one-kernel LayerNorm, eager GELU and "
        "residual adds, fused cross entropy", "llm-foundry-2023"),
}
DEFAULT_SOFTWARE = "megatron-core-2025"


def efficiency_for(software: str = DEFAULT_SOFTWARE, base: EfficiencyModel | None = None) -> EfficiencyModel:
    """The efficiency model of a named software profile (on top of `base`'s hardware constants)."""
    prof = SOFTWARE_PROFILES.get(str(software).lower())
    if prof is None:
        raise InvalidArgument(f"unknown software profile {software!r}",
                              f"use one of {', '.join(SOFTWARE_PROFILES)}")
    return replace(base or EfficiencyModel(), software_factor=prof.software_factor, kernels=prof.kernels)


@dataclass(frozen=True)
class MicrobatchTimes:
    """Seconds one GPU spends on one micro-batch of its pipeline stage (chunk = all its layers)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    model_flops: float      # forward + backward FLOPs of the micro-batch on this GPU (MFU numerator)
    hardware_flops: float   # + recomputation (HFU numerator)
    attention_s: float = 0.0  # forward + backward time of the attention scores (what ring attention hides under)
    moe_s: float = 0.0        # of forward + backward: MoE router, permute, dispatcher and host wait (moe.py)

    @property
    def total_s(self) -> float:
        """Forward + backward + recompute."""
        return self.forward_s + self.backward_s + self.recompute_s


def linear_gemms(model: ModelSpec, layout: Layout, tokens: float) -> list[tuple[float, float, float]]:
    """The forward GEMMs (M, N, K) of one dense decoder layer on one tensor-parallel rank at `tokens` rows: the
    attention's input projections (Q, K, V, or MLA's down and up projections, as one), its output projection, the
    MLP's up (and gate) and down projections."""
    t, h = layout.tp, model.hidden
    out_k = model.heads * model.v_dim
    attn_in = (model.attention_matmul_params() - out_k * h) / h
    up = (2 if model.gated_mlp else 1) * model.ffn_hidden
    return [(tokens, attn_in / t, h), (tokens, h, out_k / t), (tokens, up / t, h), (tokens, h, model.ffn_hidden / t)]


def expert_gemms(model: ModelSpec, layout: Layout, rows: float) -> list[tuple[float, float, float]]:
    """The forward GEMMs (M, N, K) of one routed expert at `rows` rows: up (and gate), down."""
    f = model.moe_ffn / layout.expert_tp
    return [(rows, (2 if model.gated_mlp else 1) * f, model.hidden), (rows, model.hidden, f)]


def table_rates(gpu: GpuSpec, dtype: str, gemms: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(forward, backward) FLOP/s of `gemms` at the measured GEMM table's rates for `gpu`, or None without one."""
    fwd, bwd = (sequence_flops_per_s(gpu.name, gpu.peak_flops(dtype), dtype, g) for g in passes_of(gemms))
    return None if fwd is None or bwd is None else (fwd, bwd)


def _stage_index(layout: Layout, stage: str | int) -> int:
    if isinstance(stage, int):
        if not 0 <= stage < layout.pp:
            raise InvalidArgument(f"stage {stage} outside 0..{layout.pp - 1}")
        return stage
    named = {"first": 0, "last": layout.pp - 1, "middle": layout.pp // 2}
    if stage not in named:
        raise InvalidArgument(f"stage {stage!r}", "give a stage index or first, middle, last")
    return named[stage]


def expert_roofline_s(flops: float, params: float, weight_bytes: float, rate: float, mem_Bps: float,
                      grad_bytes: int = 4) -> tuple[float, float]:
    """(forward, backward) seconds of the routed-expert GEMMs of a micro-batch: each pass the longer of its FLOPs
    at the GEMM rate and its weight traffic at HBM bandwidth (forward reads the `params` local expert weights of
    `weight_bytes` each; backward reads them for the input gradient and reads and writes the `grad_bytes` main
    gradient). Few tokens per expert (small micro-batches over many experts) make the weights set the time."""
    if not flops:
        return 0.0, 0.0
    fwd = max(flops / rate, params * weight_bytes / mem_Bps)
    bwd = max(2 * flops / rate, params * (weight_bytes + 2 * grad_bytes) / mem_Bps)
    return fwd, bwd


def expert_gemm_rate(model: ModelSpec, layout: Layout, e: EfficiencyModel, tokens: float, rate: float,
                     gpu: GpuSpec | None = None) -> float:
    """FLOP/s of the routed experts' GEMMs, each expert its own GEMM at one local expert's rows
    (`moe.rows_per_expert`, times the capacity factor where buffers are padded): at the measured GEMM table's
    rates where one covers `gpu` (forward and backward GEMMs together), else `rate` (the linear layers' FLOP/s at
    a micro-batch of `tokens` rows) with the row term of the efficiency curve read at the expert's rows."""
    from .moe import rows_per_expert
    rows = rows_per_expert(tokens / layout.tp, model.top_k, layout.ep, model.experts, layout.expert_tp)
    rows *= layout.capacity_factor or 1.0
    if gpu is not None and e.gemm_tables:
        fwd, bwd = passes_of(expert_gemms(model, layout, rows))
        dtype, peak = layout.precision, gpu.peak_flops(layout.precision)
        both = max_flops_per_s(gpu.name, peak, dtype) if e.expert_rate_bound else \
            sequence_flops_per_s(gpu.name, peak, dtype, fwd + bwd)
        if both is not None:
            return both * e.software_factor
    if e.expert_rate_bound:   # the curve's row term at its limit
        return rate * (tokens + e.n_half) / tokens
    d = model.hidden / layout.tp
    return rate * e.gemm_efficiency(d, rows) / e.gemm_efficiency(d, tokens)


def _moe_layer_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel, tokens: float,
                 mem_Bps: float) -> float:
    """Router, permute/unpermute, sort and dispatcher seconds of one MoE layer and pass (workload/moe.py)."""
    from .moe import layer_cost
    sort = layout.ep > 1 and layout.ep_dispatcher == "alltoall" and model.experts // layout.ep > 1
    return layer_cost(tokens, model.top_k, model.hidden, model.experts, mem_Bps, gpu.hbm_GBps * 1e9,
                      e.dispatch_eps(layout.ep_dispatcher) if layout.ep > 1 else 0.0, e.fused_permute,
                      sort_local=sort).total_s


def _kernel_extra_s(model: ModelSpec, layout: Layout, e: EfficiencyModel, tokens: float, dense_layers: int,
                    last_stage: bool, mem_Bps: float) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of the memory-bound kernels that `e.kernels` runs beyond the fused
    reference profile (`kernels.extra_bytes_per_token`) for one micro-batch; the recompute pass rebuilds the
    layers' forward kernels, not the loss."""
    if e.kernels == REFERENCE or not dense_layers and not last_stage:
        return 0.0, 0.0, 0.0
    out = []
    for pass_, last in (("forward", last_stage), ("backward", last_stage), ("forward", False)):
        inv = extra_bytes_per_token(model, layout, e.kernels, pass_, dense_layers, last)
        out.append(tokens * inv.nbytes / mem_Bps + inv.launches * e.kernel_launch_s)
    return out[0], out[1], out[2]


def _attention_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel, attn_flops: float,
                 rate: float) -> tuple[float, float]:
    """(forward, backward) seconds of the attention scores behind `attn_flops` model FLOPs: the profile's
    FlashAttention kernel (`kernels.attention_pass_s`), or two batched GEMMs over the full square without one."""
    if not attn_flops:
        return 0.0, 0.0
    if not layout.flash_attention:
        return attn_flops / rate, 2 * attn_flops / rate
    kernel = kernel_profile(e.kernels).attention
    work = attention_work(model, attn_flops)
    table = ATTENTION_KERNELS[kernel].table
    fwd, bwd = (attention_pass_s(kernel, work, p, rate, gpu.exp_per_s, gpu.async_mma,
                                 measured_flops(gpu.name, gpu.bf16_flops, table, p, model.qk_head_dim,
                                                layout.seq_len / layout.cp))
                for p in PASSES)
    return fwd, bwd


def microbatch_times(model: ModelSpec, layout: Layout, gpu: GpuSpec,
                     eff: EfficiencyModel | None = None, stage: str | int = "middle") -> MicrobatchTimes:
    """Compute time of one micro-batch on one GPU of a pipeline stage (an index, or 'first', 'middle',
    'last'); the last stage also computes the logits."""
    e = eff or EfficiencyModel()
    i = _stage_index(layout, stage)
    start, stop = layout.stage_ranges(model)[i]
    t, cp = layout.tp, layout.cp
    tokens = layout.micro_batch * layout.seq_len / cp
    peak = gpu.bf16_flops
    eff_bf16 = e.gemm_efficiency(model.hidden / t, tokens) * e.software_factor
    eff_g = eff_bf16
    if layout.precision == "fp8":   # the linear layers' GEMMs; attention stays BF16
        eff_g *= gpu.fp8_flops / gpu.bf16_flops * e.fp8_gemm_factor
    mm, at, ex = model.span_flops_per_token(layout.seq_len, start, stop)
    pad = (layout.capacity_factor - 1.0) if layout.capacity_factor else 0.0
    matmul = tokens * mm / t                       # model FLOPs
    padded = tokens * ex * pad / t                 # padded expert slots: hardware work, not model FLOPs
    attn = tokens * at / t
    logits = tokens * model.logit_flops_per_token() / t if i == layout.pp - 1 else 0.0
    fwd_flops = matmul + attn + logits
    work = fwd_flops + padded
    n_moe = sum(1 for j in range(start, stop) if model.is_moe_layer(j))
    act = sum(activation_bytes_per_layer(model, layout, "none", index=j) * n
              for j, n in ((0, stop - start - n_moe), (model.layers - 1, n_moe)) if n)
    mem_Bps = e.elementwise_Bps(gpu)
    rate = rate_bwd = peak * eff_g
    rate_bf16 = peak * eff_bf16                    # attention and the logit GEMM stay BF16 under FP8
    logit_rate = rate_bf16
    gemms = linear_gemms(model, layout, tokens)
    measured = table_rates(gpu, layout.precision, gemms) if e.gemm_tables else None
    if measured is not None:
        rate, rate_bwd = (r * e.software_factor for r in measured)
        dense_bf16 = measured if layout.precision == "bf16" else table_rates(gpu, "bf16", gemms)
        rate_bf16 = (dense_bf16 or measured)[0] * e.software_factor
        if logits:
            logit_pair = table_rates(gpu, "bf16", [(tokens, model.vocab / t, model.hidden)])
            logit_rate = (logit_pair or measured)[0] * e.software_factor
    attn_fwd_s, attn_bwd_s = _attention_s(model, layout, gpu, e, attn, rate_bf16)
    if attn and layout.flash_attention and uses_torch_ring(layout, e.kernels):   # torch's ring attention (CP)
        attn_fwd_s, attn_bwd_s = ring_attention_s(model, layout, gpu, e, attn, rate_bf16, stop - start)
    logit_s = logits / logit_rate
    cast_fwd, cast_bwd = (tokens * fp8_cast_bytes_per_token(model, layout, e.fp8_recipe, p, start, stop) / mem_Bps
                          for p in ("forward", "backward"))
    # routed experts: a roofline per pass, their GEMM FLOPs against the bytes of the local experts' weights
    # (read forward; read, and the FP32 main gradient read and written, backward)
    x_flops = tokens * ex * (1.0 + pad) / t
    x_params = n_moe * model.routed_expert_params() / (layout.expert_tp * layout.ep)
    x_rate = expert_gemm_rate(model, layout, e, tokens, rate, gpu) if n_moe else rate
    x_fwd, x_bwd = expert_roofline_s(x_flops * layout.expert_imbalance, x_params,
                                     1 if layout.precision == "fp8" else 2, x_rate, mem_Bps, layout.grad_bytes)
    moe_s = n_moe * _moe_layer_s(model, layout, gpu, e, tokens / t, mem_Bps) if n_moe else 0.0
    k_fwd, k_bwd, k_rec = _kernel_extra_s(model, layout, e, tokens, stop - start - n_moe, i == layout.pp - 1,
                                          mem_Bps)
    dense_flops = work - x_flops - attn - logits   # the linear layers' GEMMs (FP8 where the run trains in FP8)
    gemm_s = dense_flops / rate
    t_fwd = gemm_s + logit_s + attn_fwd_s + x_fwd + 2 * act / mem_Bps + moe_s + k_fwd + cast_fwd
    wait = 0.0
    if n_moe and layout.ep > 1 and not layout.capacity_factor:   # dropless: the host waits once per MoE layer
        from .moe import host_wait_s
        wait = n_moe * host_wait_s((t_fwd - logit_s) / (stop - start), e.dispatch_host_s(layout.ep_dispatcher))
    t_fwd += wait
    t_bwd = 2 * (dense_flops / rate_bwd + logit_s) + attn_bwd_s + x_bwd + 4 * act / mem_Bps + moe_s + k_bwd + cast_bwd
    if layout.recompute == "full":
        m_, n_, k_ = gemms[-1]   # the MLP's down projection
        down = 2 * m_ * n_ * k_ * (stop - start - n_moe) \
            if skips_last_gemm(kernel_profile(e.kernels), layout.precision) else 0.0
        rec_flops = matmul + padded + attn - down
        t_rec = (matmul + padded - down) / rate + attn_fwd_s + 2 * act / mem_Bps + k_rec + cast_fwd
    elif layout.recompute == "selective":
        rec_flops = attn
        score = 0.0 if layout.flash_attention else \
            (activation_bytes_per_layer(model, layout.with_(flash_attention=False), "none")
             - activation_bytes_per_layer(model, layout.with_(flash_attention=True), "none")) * (stop - start)
        t_rec = attn_fwd_s + 2 * score / mem_Bps
    elif layout.recompute == "op":   # the matmuls not kept, and every elementwise op, rebuilt (memory_activations)
        from .memory_activations import op_checkpoint_split
        rec_flops = tokens * op_checkpoint_split(model)[1] * (stop - start) / t
        t_rec = rec_flops / rate + 2 * act / mem_Bps + k_rec
    else:
        rec_flops, t_rec = 0.0, 0.0
    return MicrobatchTimes(t_fwd, t_bwd, t_rec, 3 * fwd_flops, 3 * fwd_flops + rec_flops + 3 * padded,
                           attention_s=attn_fwd_s + attn_bwd_s, moe_s=2 * moe_s + wait)
