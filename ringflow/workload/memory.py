"""Memory per GPU: weights, gradients, optimizer states per ZeRO stage, activations per recompute mode.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Sec. 4: with 16-bit activations, one GPT layer stores ``s b h (34 + 5 a s / h)`` bytes;
with tensor parallelism t and no sequence parallelism ``s b h (10 + 24/t + 5 a s/(h t))``; with sequence
parallelism ``s b h/t (34 + 5 a s / h)``; selective recomputation drops the ``5 a s / h`` term (the attention
scores are recomputed); full recomputation keeps only the layer input, ``2 s b h`` (``/t`` with SP).
We enumerate the same stored tensors from the model's dimensions (so GQA, SwiGLU and dropout-free Llama get
their own constant; a GPT layer with dropout gives exactly 34 and 5as/h), and FlashAttention (which never
stores the ``a s^2`` scores) removes the score term just as selective recomputation does.

Pipeline: with 1F1B the first stage holds ``p`` micro-batches in flight, i.e. activations of ``L`` layers; the
interleaved schedule multiplies that by ``1 + (p-1)/(p v)`` (Korthikanti et al. Sec. 4.2.3, Narayanan et al.).

Model state per parameter (mixed precision with Adam; ZeRO paper, Rajbhandari et al. 2020, Sec. 3.1):
weights ``w = 2`` B (bf16), gradients ``g`` B (4: Megatron's fp32 main grads; 2 in the ZeRO paper), optimizer
``o = 12`` B (fp32 master copy + Adam m and v). Per GPU with data-parallel degree d:
stage 0: (w+g+o) P; stage 1: (w+g) P + o P/d; stage 2: w P + (g+o) P/d; stage 3 (FSDP): (w+g+o) P/d.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Layout
from .models import ModelSpec

WEIGHT_BYTES = 2       # bf16 weights
OPTIMIZER_BYTES = 12   # fp32 master weights + Adam first and second moments
FP8_WEIGHT_COPY_BYTES = 1  # FP8 training keeps an extra fp8 copy of the weights for the GEMMs
ACT_BYTES = 2          # 16-bit activations


def model_state_bytes_per_param(zero: int, dp: int, grad_bytes: int = 4, precision: str = "bf16") -> float:
    """Bytes per (locally owned) parameter for weights + grads + optimizer under ZeRO stage `zero`."""
    w = WEIGHT_BYTES + (FP8_WEIGHT_COPY_BYTES if precision == "fp8" else 0)
    g, o = grad_bytes, OPTIMIZER_BYTES
    if zero == 0:
        return float(w + g + o)
    if zero == 1:
        return w + g + o / dp
    if zero == 2:
        return w + (g + o) / dp
    return (w + g + o) / dp


def stage_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Parameters held by one GPU of pipeline stage `stage` (layers / tp, experts / ep, embeddings on the ends)."""
    layers = model.layers // layout.pp
    dense = model.attention_params() + 2 * model.norm_params()
    experts = model.experts * model.expert_params() + (model.hidden * model.experts if model.is_moe else 0)
    per_layer = dense / layout.tp + experts / (layout.tp * layout.ep)
    p = layers * per_layer
    emb = model.vocab * model.hidden / layout.tp
    if stage == 0:
        p += emb + (model.seq_len * model.hidden if model.position == "learned" else 0)
    if stage == layout.pp - 1:
        p += model.norm_params()
        if not model.tied_embeddings or layout.pp > 1:
            p += emb  # untied output layer, or the tied copy Megatron keeps on the last stage
    return p


def activation_bytes_per_layer(model: ModelSpec, layout: Layout, recompute: str | None = None) -> float:
    """Stored activation bytes of one layer for one micro-batch on one GPU (Korthikanti et al. 2022, Sec. 4)."""
    r = layout.recompute if recompute is None else recompute
    s = layout.seq_len / layout.cp
    b = layout.micro_batch
    h, kv, f, a = model.hidden, model.kv_hidden, model.ffn_hidden, model.heads
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    drop = 1 if model.dropout else 0
    # replicated across TP ranks unless sequence parallel: norms inputs (2 x 2sbh), QKV input 2sbh,
    # MLP input 2sbh, two dropout masks sbh each
    replicated = (4 + 2 + 2 + 2 * drop) * s * b * h
    # split across TP ranks: Q, K, V, attention-output input; MLP intermediates (top_k experts per token)
    mlp_inner = (3 if model.gated_mlp else 2) * 2 * s * b * f * model.top_k
    split = (2 * h + 2 * kv + 2 * kv + 2 * h) * s * b + mlp_inner
    # attention scores: softmax output 2 a s^2 b; with dropout also its mask a s^2 b and output 2 a s^2 b
    scores = (2 + 3 * drop) * a * s * s * b if not layout.flash_attention and r == "none" else 0.0
    if r == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    if sp:
        return (replicated + split + scores) / t
    return replicated + (split + scores) / t


def inflight_factor(layout: Layout) -> float:
    """Layers' worth of micro-batches the first stage holds, as a multiple of L/p x p = L."""
    p, v = layout.pp, layout.interleave
    m = layout.microbatches
    base = min(p, m) / p
    if v > 1:
        return base * (1 + (p - 1) / (p * v))
    return base


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the fullest pipeline stage."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    overhead_bytes: float
    capacity_bytes: float

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
                "capacity_bytes": self.capacity_bytes, "fits": self.fits}


# CUDA context, NCCL buffers, allocator fragmentation: a fixed reserve per GPU. ~5 GB is what
# PyTorch jobs typically lose to context + NCCL + fragmentation on 80 GB parts (our assumption, settable).
DEFAULT_RESERVE_BYTES = 5e9


def memory_per_gpu(model: ModelSpec, layout: Layout, capacity_bytes: float,
                   reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> MemoryBreakdown:
    """Memory of the fullest GPU (first or last pipeline stage) with the OOM verdict."""
    best: MemoryBreakdown | None = None
    for stage in sorted({0, layout.pp - 1}):
        P = stage_params(model, layout, stage)
        d = layout.dp * layout.cp  # ZeRO shards over the data-parallel (x context-parallel) ranks
        w = WEIGHT_BYTES + (FP8_WEIGHT_COPY_BYTES if layout.precision == "fp8" else 0)
        g, o = layout.grad_bytes, OPTIMIZER_BYTES
        z = layout.zero
        wb = P * w / (d if z >= 3 else 1)
        gb = P * g / (d if z >= 2 else 1)
        ob = P * o / (d if z >= 1 else 1)
        layers_here = model.layers / layout.pp
        act = activation_bytes_per_layer(model, layout) * layers_here * layout.pp * inflight_factor(layout)
        if layout.recompute == "full":  # one layer's full activations are rebuilt during its backward
            act += activation_bytes_per_layer(model, layout, "none")
        if stage == layout.pp - 1:  # logits (fp32 for the loss) of one micro-batch
            act += 4.0 * layout.micro_batch * layout.seq_len / layout.cp * model.vocab / layout.tp
        if z == 3:  # gathered parameters of the layer being computed (and the prefetched next one)
            wb += 2 * w * (model.layer_params() / layout.tp)
        mb = MemoryBreakdown(wb, gb, ob, act, reserve_bytes, capacity_bytes)
        if best is None or mb.total_bytes > best.total_bytes:
            best = mb
    assert best is not None
    return best
