"""Memory per GPU: weights, gradients and optimizer states as each framework shards and offloads them,
activations per recompute policy (`memory_activations`), communication buffers, CUDA context and allocator
fragmentation (sourced allowances, ``ringflow/data/memory_allowances.yaml``).

Model state per parameter (mixed precision with Adam; ZeRO paper, Rajbhandari et al. 2020, Sec. 3.1):
weights ``w = 2`` B (bf16), gradients ``g`` B (4: Megatron's fp32 main grads, ``grad_reduce_in_fp32``; 2 when
the grads stay 16-bit), optimizer ``o = 12`` B (fp32 master copy + Adam m and v). Per GPU with data-parallel
degree d: stage 0: (w+g+o) P; stage 1 (Megatron's distributed optimizer): (w+g) P + o P/d; stage 2:
w P + (g+o) P/d; stage 3 (FSDP): (w+g+o) P/d. Dense weights shard over dp x cp, expert weights over the
expert-data-parallel degree (tp cp dp / (etp ep)). With 16-bit grads the optimizer steps on an fp32 copy of the
local grad shard (Megatron's table: ``4 + 16/d`` bytes for 16-bit params and grads against ``6 + 12/d``); that
copy and the activations are never alive together, so the peak is the larger of the two.

ZeRO-3 / FSDP keeps the layer being computed and the prefetched next one gathered (``reshard_after_forward``,
PyTorch FSDP2's default); without resharding (ZeRO-2-like FSDP, Llama 3's setting) a stage's gathered weights
stay from forward to backward. Under pipelining, PyTorch FSDP per block (``fsdp_units: per_block``) reduces
gradients only after a stage's last micro-batch (`fsdp.py`), so until then they accumulate unsharded in the
reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``, PyTorch ``_composable/fsdp/_fsdp_param.py``): the
whole stage's gradients at ``grad_bytes`` each. Optimizer offload (Megatron ``--optimizer-cpu-offload`` with
``--optimizer-offload-fraction``, DeepSpeed ``offload_optimizer``) moves that fraction of the optimizer states to
host memory. DeepSeek-V3 (arXiv:2412.19437) keeps the AdamW moments in BF16 (Sec. 3.3.3: 8 B of optimizer state a
parameter) and, with DualPipe, two copies of the model parameters (Sec. 3.2.1).

FP8 (Transformer Engine): the BF16 weights stay and TE adds FP8 copies of every GEMM weight: data and, on Hopper
(TN-only FP8 GEMMs), its transpose (``Float8Tensor``, TE PR #1300); Blackwell runs non-TN FP8 GEMMs, so per-tensor
FP8 keeps one copy there, and block-scaled FP8 (MXFP8) keeps row- and column-wise copies everywhere. With
``fp8_params`` (Megatron ``--fp8-param-gather`` = TE ``fp8_model_init``) the BF16 copy is dropped; the FP32 master
stays in the optimizer's 12 B. Without a GPU named the Hopper layout is assumed.

Activation offloading (Megatron ``--cpu-offloading-num-layers``, `Layout.offload_layers`): that many of a stage's
layers move their stored activations to host memory and back for the backward pass; they count nothing here.

The loss: Megatron's fused vocab-parallel cross entropy keeps one fp32 copy of a micro-batch's logits (4 B per
logit, ``logit_bytes``); an eager ``cross_entropy(logits.float(), ...)`` (torchtitan) reaches three fp32 tensors
of that size in the loss backward (the saved log-softmax, its gradient and the logits' gradient): 12 B.

Every pipeline stage is checked (uneven splits, embedding on the first, logits on the last) and the fullest is
reported. Overhead: the CUDA context, NCCL's buffers for each communicator the rank uses, and the caching
allocator's fragmentation as a fraction of the peak allocated bytes (``classic`` or ``expandable`` segments); a
fixed ``reserve_bytes`` replaces all three.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from .layout import Layout
from .memory_activations import (
    RECOMPUTE_MODULES,
    activation_bytes_per_layer,
    check_modules,
    inflight_factor,
    inflight_microbatches,
)
from .models import ModelSpec

__all__ = ["WEIGHT_BYTES", "OPTIMIZER_BYTES", "FP8_WEIGHT_COPY_BYTES", "ACT_BYTES", "DEFAULT_RESERVE_BYTES",
           "RECOMPUTE_MODULES", "MemoryPolicy", "MemoryBreakdown", "activation_bytes_per_layer",
           "inflight_factor", "inflight_microbatches", "load_allowances", "weight_bytes",
           "model_state_bytes_per_param", "stage_param_split", "stage_params", "stage_memory", "memory_per_gpu",
           "overhead_bytes", "communicators", "peak_memory"]

WEIGHT_BYTES = 2       # bf16 weights
OPTIMIZER_BYTES = 12   # fp32 master weights + Adam first and second moments
FP8_WEIGHT_COPY_BYTES = 2  # TE's FP8 weight copy + its transpose (Hopper), beside the bf16 weights
ACT_BYTES = 2          # 16-bit activations
# The fixed overhead callers may still pass as `reserve_bytes` (CUDA context, NCCL, fragmentation in one figure).
DEFAULT_RESERVE_BYTES = 5e9
ALLOCATORS = ("classic", "expandable")
FP8_RECIPES = ("tensor", "block")
_ALLOWANCES = Path(__file__).resolve().parents[1] / "data" / "memory_allowances.yaml"


@lru_cache(maxsize=1)
def load_allowances() -> dict[str, Any]:
    """The sourced allowances (ringflow/data/memory_allowances.yaml)."""
    return dict(yaml.safe_load(_ALLOWANCES.read_text()))


@dataclass(frozen=True)
class MemoryPolicy:
    """How a framework holds memory beyond what `Layout` says (Megatron-Core and PyTorch names in comments)."""

    recompute_modules: tuple[str, ...] = ()   # Megatron-Core recompute_modules (selective granularity)
    grad_bytes: int = 0                      # main-grad element size; 0 = the layout's (grad_reduce_in_fp32: 4)
    fp8_recipe: str = "tensor"               # tensor: per-tensor scaling (delayed/current); block: MXFP8
    reshard_after_forward: bool = True       # ZeRO-3/FSDP frees gathered weights after each layer's forward
    optimizer_offload_fraction: float = 0.0  # share of optimizer states in host memory
    allocator: str = "expandable"            # PyTorch caching allocator: classic or expandable_segments:True
    logit_bytes: float = 4.0                 # bytes per logit alive at the loss (see module docstring)
    optimizer_bytes: int = OPTIMIZER_BYTES   # fp32 master + Adam moments; 8 with BF16 moments (DeepSeek-V3)
    weight_copies: int = 1                   # model replicas a rank keeps (DeepSeek's DualPipe: 2)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # source notes, not read

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", tuple(sorted(check_modules(self.recompute_modules))))
        if self.grad_bytes not in (0, 2, 4):
            raise ConfigError(f"grad_bytes={self.grad_bytes!r}", "use 4 (fp32 main grads), 2 (bf16) or 0 (layout's)")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe={self.fp8_recipe!r}", f"use one of {', '.join(FP8_RECIPES)}")
        if self.allocator not in ALLOCATORS:
            raise ConfigError(f"allocator={self.allocator!r}", f"use one of {', '.join(ALLOCATORS)}")
        if self.optimizer_bytes not in (4, 8, 12, 16) or self.weight_copies not in (1, 2):
            raise ConfigError(f"optimizer_bytes={self.optimizer_bytes!r}, weight_copies={self.weight_copies!r}",
                              "optimizer bytes per parameter 4, 8, 12 or 16; weight copies 1 or 2")
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise ConfigError(f"optimizer_offload_fraction={self.optimizer_offload_fraction!r}",
                              "give a fraction between 0 and 1")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> MemoryPolicy:
        """A policy from a registry entry's ``memory`` mapping; unknown keys are a ConfigError."""
        d = dict(d or {})
        known = {"recompute_modules", "grad_bytes", "fp8_recipe", "reshard_after_forward",
                 "optimizer_offload_fraction", "allocator", "logit_bytes", "optimizer_bytes", "weight_copies"}
        bad = sorted(set(d) - known - {"source"})
        if bad:
            raise ConfigError(f"unknown memory setting(s) {', '.join(bad)}", f"use {', '.join(sorted(known))}")
        src = d.pop("source", None)
        kw: dict[str, Any] = {k: (tuple(v) if k == "recompute_modules" else v) for k, v in d.items()}
        return cls(**kw, extra={"source": src} if src else {})


def _non_tn_fp8(gpu: str | None) -> bool:
    if not gpu:
        return False
    key = str(gpu).upper()
    return any(n in key for n in load_allowances()["non_tn_fp8_gpus"])


def weight_bytes(precision: str = "bf16", fp8_params: bool = False, gpu: str | None = None,
                 fp8_recipe: str = "tensor") -> float:
    """Bytes per parameter of the weights the GPU keeps for its GEMMs (see module docstring)."""
    if precision != "fp8":
        return float(WEIGHT_BYTES)
    copies = 1.0 if _non_tn_fp8(gpu) and fp8_recipe == "tensor" else float(FP8_WEIGHT_COPY_BYTES)
    return copies if fp8_params else WEIGHT_BYTES + copies


def model_state_bytes_per_param(zero: int, dp: int, grad_bytes: int = 4, precision: str = "bf16",
                                fp8_params: bool = False) -> float:
    """Bytes per (locally owned) parameter for weights + grads + optimizer under ZeRO stage `zero`."""
    w = weight_bytes(precision, fp8_params)
    g, o = grad_bytes, OPTIMIZER_BYTES
    if zero == 0:
        return float(w + g + o)
    if zero == 1:
        return w + g + o / dp
    if zero == 2:
        return w + (g + o) / dp
    return (w + g + o) / dp


def _stage_layers(model: ModelSpec, layout: Layout, stage: int) -> tuple[int, int]:
    """(dense layers, MoE layers) of one pipeline stage."""
    start, stop = layout.stage_ranges(model)[stage]
    moe = sum(1 for i in range(start, stop) if model.is_moe_layer(i))
    return stop - start - moe, moe


def stage_param_split(model: ModelSpec, layout: Layout, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters one GPU of pipeline stage `stage` holds."""
    n_dense, n_moe = _stage_layers(model, layout, stage)
    t = layout.tp
    base = model.attention_params() + 2 * model.norm_params()
    dense = n_dense * (base + model.expert_params(model.ffn_hidden)) / t
    dense += n_moe * (base + model.shared_experts * model.expert_params() + model.router_params()) / t
    experts = n_moe * model.routed_expert_params() / (layout.expert_tp * layout.ep)
    emb = model.vocab * model.hidden / t
    if stage == 0:
        dense += emb + (model.seq_len * model.hidden if model.position == "learned" else 0)
        dense += model.norm_params() if model.embedding_norm else 0
    if stage == layout.pp - 1:
        dense += model.norm_params()
        if not model.tied_embeddings or layout.pp > 1:
            dense += emb  # untied output layer, or the tied copy Megatron keeps on the last stage
    return dense, experts


def stage_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Parameters one GPU of pipeline stage `stage` holds (layers / tp, experts / (etp ep), embeddings on the ends)."""
    return sum(stage_param_split(model, layout, stage))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the fullest pipeline stage."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    overhead_bytes: float
    capacity_bytes: float
    stage: int = 0
    step_temp_bytes: float = 0.0     # alive only while the optimizer steps (activations freed by then)
    detail: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total_bytes(self) -> float:
        """The peak: model state + the larger of activations and the optimizer step's temporaries + overhead."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + \
            max(self.activations_bytes, self.step_temp_bytes) + self.overhead_bytes

    @property
    def fits(self) -> bool:
        """False = out of memory."""
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"weights_bytes": self.weights_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "step_temp_bytes": self.step_temp_bytes, "overhead_bytes": self.overhead_bytes,
                "overhead_detail": dict(self.detail), "total_bytes": self.total_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits, "stage": self.stage}


def communicators(layout: Layout) -> int:
    """NCCL communicators a rank runs collectives or sends on: one per parallel dimension of degree > 1 (TP, CP,
    DP, PP, EP, and the experts' DP group when it differs from the dense one)."""
    L = layout
    n = sum(1 for d in (L.tp, L.cp, L.dp, L.pp) if d > 1)
    if L.ep > 1:
        n += 1 + (1 if L.expert_dp > 1 else 0)
    return n


def overhead_bytes(layout: Layout, allocated_bytes: float, policy: MemoryPolicy | None = None) -> dict[str, float]:
    """CUDA context, NCCL buffers and allocator fragmentation for a rank whose peak allocation is
    `allocated_bytes` (ringflow/data/memory_allowances.yaml)."""
    a = load_allowances()
    pol = policy or MemoryPolicy()
    nccl = communicators(layout) * a["nccl_buffsize_bytes"] * a["nccl_channels"] * a["nccl_peers_per_channel"]
    return {"cuda_context_bytes": float(a["cuda_context_bytes"]), "nccl_buffers_bytes": float(nccl),
            "fragmentation_bytes": float(a["fragmentation"][pol.allocator]) * allocated_bytes}


def stage_memory(model: ModelSpec, layout: Layout, stage: int, capacity_bytes: float,
                 reserve_bytes: float | None = None, *, policy: MemoryPolicy | None = None,
                 gpu: str | None = None) -> MemoryBreakdown:
    """Memory of one GPU of pipeline stage `stage` under `policy` (default: the layout alone) on GPU model `gpu`
    (default: Hopper's FP8 layout); `reserve_bytes` replaces the computed overhead by a fixed figure."""
    L, pol = layout, policy or MemoryPolicy()
    dense_p, expert_p = stage_param_split(model, L, stage)
    d, ed = L.dp * L.cp, L.expert_dp  # ZeRO shards dense weights over dp x cp, experts over expert-DP
    w = weight_bytes(L.precision, L.fp8_params, gpu, pol.fp8_recipe)
    g, o, z = pol.grad_bytes or L.grad_bytes, pol.optimizer_bytes, L.zero

    def sharded(per: float, from_stage: int) -> float:
        return dense_p * per / (d if z >= from_stage else 1) + expert_p * per / (ed if z >= from_stage else 1)
    wb, gb = sharded(w, 3) * pol.weight_copies, sharded(g, 2)
    if z == 3 and L.fsdp_units == "per_block" and L.pp > 1:  # gradient sync deferred to the stage's last backward
        gb = sharded(g, 4)
    ob = sharded(o, 1) * (1.0 - pol.optimizer_offload_fraction)
    # 16-bit main grads: the optimizer steps on an fp32 copy of the local shard (Megatron's distributed optimizer)
    step_temp = sharded(load_allowances()["fp32_grad_copy_bytes"], 1) * (1.0 - pol.optimizer_offload_fraction) \
        if g < 4 else 0.0
    mods = pol.recompute_modules
    n_dense, n_moe = _stage_layers(model, L, stage)
    per_mb = n_dense * (activation_bytes_per_layer(model, L, index=0, modules=mods) if n_dense else 0.0) + \
        n_moe * (activation_bytes_per_layer(model, L, index=model.layers - 1, modules=mods) if n_moe else 0.0)
    if L.offload_layers:  # offloaded layers keep nothing on the GPU once their copy to the host is done
        per_mb *= 1.0 - min(L.offload_layers, n_dense + n_moe) / max(n_dense + n_moe, 1)
    act = per_mb * inflight_microbatches(L, stage)
    if L.recompute == "full":  # one layer's full activations are rebuilt during its backward
        act += activation_bytes_per_layer(model, L, "none", modules=mods)
    if stage == L.pp - 1:  # the loss's logits of one micro-batch
        act += pol.logit_bytes * L.micro_batch * L.seq_len / L.cp * model.vocab / L.tp
    if z == 3:
        if pol.reshard_after_forward:  # the layer being computed and the prefetched next one, gathered
            wb += 2 * w * (model.layer_params() / L.tp)
        else:  # every gathered layer of the stage stays from its forward to its backward
            wb += sharded(w, 4) - sharded(w, 3)  # the whole stage unsharded, less its own shard
    state = wb + gb + ob
    if reserve_bytes is not None:
        return MemoryBreakdown(wb, gb, ob, act, float(reserve_bytes), capacity_bytes, stage, step_temp,
                               {"reserve_bytes": float(reserve_bytes)})
    detail = overhead_bytes(L, state + max(act, step_temp), pol)
    return MemoryBreakdown(wb, gb, ob, act, sum(detail.values()), capacity_bytes, stage, step_temp, detail)


def memory_per_gpu(model: ModelSpec, layout: Layout, capacity_bytes: float,
                   reserve_bytes: float | None = None) -> MemoryBreakdown:
    """Memory of the fullest GPU (every pipeline stage checked) with the OOM verdict, under the default policy."""
    return peak_memory(model, layout, capacity_bytes, reserve_bytes=reserve_bytes)


def peak_memory(model: ModelSpec, layout: Layout, capacity_bytes: float, *, policy: MemoryPolicy | None = None,
                gpu: str | None = None, reserve_bytes: float | None = None) -> MemoryBreakdown:
    """Memory of the fullest GPU under `policy` on GPU model `gpu` (every pipeline stage checked)."""
    best: MemoryBreakdown | None = None
    for stage in range(layout.pp):
        mb = stage_memory(model, layout, stage, capacity_bytes, reserve_bytes, policy=policy, gpu=gpu)
        if best is None or mb.total_bytes > best.total_bytes:
            best = mb
    assert best is not None
    return best
