"""Memory per GPU: weights, gradients, optimizer states per ZeRO stage, activations per recompute mode.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Sec. 4: with 16-bit activations, one GPT layer stores ``s b h (34 + 5 a s / h)`` bytes;
with tensor parallelism t and no sequence parallelism ``s b h (10 + 24/t + 5 a s/(h t))``; with sequence
parallelism ``s b h/t (34 + 5 a s / h)``; selective recomputation drops the ``5 a s / h`` term (the attention
scores are recomputed); full recomputation keeps only the layer input, ``2 s b h`` (``/t`` with SP).
We enumerate the same stored tensors from the model's dimensions (so GQA, SwiGLU and dropout-free Llama get
their own constant; a GPT layer with dropout gives exactly 34 and 5as/h), and FlashAttention (which never
stores the ``a s^2`` scores) removes the score term just as selective recomputation does. An MoE layer stores
the top_k dispatched copies of its input and the intermediates of top_k (x the capacity factor, padded) plus
the shared experts; MLA's compressed latents are computed by un-split projections, so every TP rank keeps them.

Activation offloading (Megatron ``--cpu-offloading-num-layers``, `Layout.offload_layers`): that many of a stage's
layers move their stored activations to host memory and back for the backward pass; they count nothing here.

Pipeline: with 1F1B stage i holds ``min(p - i, m)`` micro-batches in flight; interleaved (v chunks per stage)
``(p - i - 1) 2 + (v - 1) p + 1`` chunks (Megatron's warm-up count), which for stage 0 is Korthikanti et al.'s
``L (1 + (p-1)/(p v))`` (Sec. 4.2.3). Every stage is checked (uneven splits, embedding on the first, logits on
the last) and the fullest is reported.

Model state per parameter (mixed precision with Adam; ZeRO paper, Rajbhandari et al. 2020, Sec. 3.1):
weights ``w = 2`` B (bf16), gradients ``g`` B (4: Megatron's fp32 main grads; 2 in the ZeRO paper), optimizer
``o = 12`` B (fp32 master copy + Adam m and v). Per GPU with data-parallel degree d:
stage 0: (w+g+o) P; stage 1: (w+g) P + o P/d; stage 2: w P + (g+o) P/d; stage 3 (FSDP): (w+g+o) P/d.
Dense weights shard over dp x cp, expert weights over the expert-data-parallel degree (tp cp dp / (etp ep)).

FP8 activations: Transformer Engine keeps the FP8-quantised input of every FP8 GEMM for its weight gradient
(QKV, attention-output, MLP-input and down-projection inputs: 1 byte an element, not 2); norm inputs, Q/K/V for
the attention backward and the up-projection outputs stay 16-bit.

FP8 (Transformer Engine on Hopper): the BF16 weights stay and TE adds an FP8 copy of every GEMM weight *and
its transpose* (Hopper's FP8 GEMMs take only the TN layout, so ``Float8Tensor`` keeps both by default: TE
PR #1300, https://github.com/NVIDIA/TransformerEngine/pull/1300, and the TE user guide "FP8 weight caching",
https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/examples/fp8_primer.html): w = 2 + 2 B.
With ``fp8_params`` (Megatron ``--fp8-param-gather`` = TE ``fp8_model_init``) the BF16 copy is dropped: w = 2 B
(FP8 data + transpose); the FP32 master stays in the optimizer's 12 B. Activations are counted in 16 bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Layout
from .models import ModelSpec

WEIGHT_BYTES = 2       # bf16 weights
OPTIMIZER_BYTES = 12   # fp32 master weights + Adam first and second moments
FP8_WEIGHT_COPY_BYTES = 2  # TE's FP8 weight copy + its transpose (Hopper), beside the bf16 weights
ACT_BYTES = 2          # 16-bit activations


def weight_bytes(precision: str = "bf16", fp8_params: bool = False) -> float:
    """Bytes per parameter of the weights the GPU keeps for its GEMMs (see module docstring)."""
    if precision != "fp8":
        return float(WEIGHT_BYTES)
    return float(FP8_WEIGHT_COPY_BYTES if fp8_params else WEIGHT_BYTES + FP8_WEIGHT_COPY_BYTES)


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


def activation_bytes_per_layer(model: ModelSpec, layout: Layout, recompute: str | None = None,
                               index: int | None = None) -> float:
    """Stored activation bytes of layer `index` (default: an MoE layer of an MoE model) for one micro-batch on
    one GPU (Korthikanti et al. 2022, Sec. 4, generalised as in the module docstring)."""
    r = layout.recompute if recompute is None else recompute
    s = layout.seq_len / layout.cp
    b = layout.micro_batch
    h, a = model.hidden, model.heads
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    if r == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    drop = 1 if model.dropout else 0
    # GEMM inputs kept for the weight gradient: 2 bytes, or 1 under FP8 (Transformer Engine saves the quantised
    # input of an FP8 GEMM, not its 16-bit source)
    g_in = 1 if layout.precision == "fp8" else 2
    moe = model.is_moe if index is None else model.is_moe_layer(index)
    # replicated across TP ranks unless sequence parallel: norms inputs (2 x 2sbh), QKV input, MLP input (an MoE
    # layer's router input stays 16-bit), two dropout masks sbh each
    replicated = (4 + g_in + (2 if moe else g_in) + 2 * drop) * s * b * h
    # split across TP ranks: Q, K, V (16-bit, for the attention backward), the attention output (input of O);
    # MLP intermediates: the up (and gate) projection output 16-bit, the down projection's input a GEMM input
    attn = (2 * (model.q_width + model.kv_hidden + model.v_width) + g_in * model.heads * model.v_dim) * s * b
    gate = 2 if model.gated_mlp else 1
    per_ffn = 2 * gate + g_in
    if moe:
        pad = layout.capacity_factor or 1.0
        mlp = per_ffn * s * b * model.moe_ffn * (model.top_k * pad + model.shared_experts) + \
            g_in * s * b * h * model.top_k * pad  # dispatched copies of the input (the experts' GEMM input)
    else:
        mlp = per_ffn * s * b * model.ffn_hidden
    # MLA latents (un-split down projections): input and output of their norms, and the shared rope key
    latent = 2 * s * b * (2 * (model.q_lora_rank + model.kv_lora_rank) + model.qk_rope_head_dim) \
        if model.is_mla else 0.0
    # attention scores: softmax output 2 a s^2 b; with dropout also its mask a s^2 b and output 2 a s^2 b
    scores = (2 + 3 * drop) * a * s * s * b if not layout.flash_attention and r == "none" else 0.0
    split = attn + mlp + scores
    if sp:
        return latent + (replicated + split) / t
    return latent + replicated + split / t


def inflight_microbatches(layout: Layout, stage: int) -> float:
    """Micro-batches' worth of activations stage `stage` holds at its peak (1F1B or interleaved warm-up)."""
    p, v, m = layout.pp, layout.interleave, layout.microbatches
    if v == 1:
        return float(min(p - stage, m))
    return min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v) / v


def inflight_factor(layout: Layout) -> float:
    """Layers' worth of micro-batches the first stage holds, as a multiple of L/p x p = L."""
    return inflight_microbatches(layout, 0) / layout.pp


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

    @property
    def total_bytes(self) -> float:
        """Everything counted."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + \
            self.overhead_bytes

    @property
    def fits(self) -> bool:
        """False = out of memory."""
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"weights_bytes": self.weights_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "overhead_bytes": self.overhead_bytes, "total_bytes": self.total_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits, "stage": self.stage}


# CUDA context, NCCL buffers, allocator fragmentation: a fixed reserve per GPU. ~5 GB is what
# PyTorch jobs typically lose to context + NCCL + fragmentation on 80 GB parts (our assumption, settable).
DEFAULT_RESERVE_BYTES = 5e9


def stage_memory(model: ModelSpec, layout: Layout, stage: int, capacity_bytes: float,
                 reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> MemoryBreakdown:
    """Memory of one GPU of pipeline stage `stage`."""
    L = layout
    dense_p, expert_p = stage_param_split(model, L, stage)
    d, ed = L.dp * L.cp, L.expert_dp  # ZeRO shards dense weights over dp x cp, experts over expert-DP
    w = weight_bytes(L.precision, L.fp8_params)
    g, o, z = L.grad_bytes, OPTIMIZER_BYTES, L.zero

    def sharded(per: float, from_stage: int) -> float:
        return dense_p * per / (d if z >= from_stage else 1) + expert_p * per / (ed if z >= from_stage else 1)
    wb, gb, ob = sharded(w, 3), sharded(g, 2), sharded(o, 1)
    n_dense, n_moe = _stage_layers(model, L, stage)
    per_mb = n_dense * (activation_bytes_per_layer(model, L, index=0) if n_dense else 0.0) + \
        n_moe * (activation_bytes_per_layer(model, L, index=model.layers - 1) if n_moe else 0.0)
    if L.offload_layers:  # offloaded layers keep nothing on the GPU once their copy to the host is done
        per_mb *= 1.0 - min(L.offload_layers, n_dense + n_moe) / max(n_dense + n_moe, 1)
    act = per_mb * inflight_microbatches(L, stage)
    if L.recompute == "full":  # one layer's full activations are rebuilt during its backward
        act += activation_bytes_per_layer(model, L, "none")
    if stage == L.pp - 1:  # logits (fp32 for the loss) of one micro-batch
        act += 4.0 * L.micro_batch * L.seq_len / L.cp * model.vocab / L.tp
    if z == 3:  # gathered parameters of the layer being computed (and the prefetched next one)
        wb += 2 * w * (model.layer_params() / L.tp)
    return MemoryBreakdown(wb, gb, ob, act, reserve_bytes, capacity_bytes, stage)


def memory_per_gpu(model: ModelSpec, layout: Layout, capacity_bytes: float,
                   reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> MemoryBreakdown:
    """Memory of the fullest GPU (every pipeline stage checked) with the OOM verdict."""
    best: MemoryBreakdown | None = None
    for stage in range(layout.pp):
        mb = stage_memory(model, layout, stage, capacity_bytes, reserve_bytes)
        if best is None or mb.total_bytes > best.total_bytes:
            best = mb
    assert best is not None
    return best
