"""Stored activations per layer and micro-batch, per recompute policy and kernel; micro-batches in flight.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198),
Sec. 4: with 16-bit activations one GPT layer stores ``s b h (34 + 5 a s / h)`` bytes; with tensor parallelism t
and no sequence parallelism ``s b h (10 + 24/t + 5 a s/(h t))``; with sequence parallelism
``s b h/t (34 + 5 a s / h)``; selective recomputation drops the ``5 a s / h`` term (the attention scores are
recomputed); full recomputation keeps only the layer input, ``2 s b h`` (``/t`` with SP). We enumerate the same
stored tensors from the model's dimensions (so GQA, SwiGLU and dropout-free Llama get their own constant; a GPT
layer with dropout gives exactly 34 and 5as/h), and FlashAttention (which never stores the ``a s^2`` scores;
Dao et al. 2022, arXiv:2205.14135, Sec. 3.1) removes the score term just as selective recomputation does. An MoE
layer stores the top_k dispatched copies of its input and the intermediates of top_k (x the capacity factor,
padded) plus the shared experts; MLA's compressed latents are computed by un-split projections, so every TP rank
keeps them.

FP8 (Transformer Engine): TE keeps the FP8-quantised input of every FP8 GEMM for its weight gradient (QKV,
attention-output, MLP-input and down-projection inputs: 1 byte an element, not 2); norm inputs, Q/K/V for the
attention backward and the up-projection outputs stay 16-bit.

Recompute modules (Megatron-Core ``TransformerConfig.recompute_modules`` with ``recompute_granularity:
selective``; megatron/core/transformer/transformer_config.py): ``core_attn`` recomputes the attention scores;
``layernorm`` the outputs of norms not fused into the next GEMM (an MoE layer's pre-MLP norm, MLA's input norm);
``moe_act`` the experts' activation function (its output, the down projection's input, is not kept);
``mla_up_proj`` MLA's up projections and RoPE (Q, K, V are not kept); ``mlp`` a dense MLP, ``moe`` a whole MoE
block and ``shared_experts`` the shared experts (each keeps only its input). ``layernorm``, ``moe_act`` and
``mla_up_proj`` discard the output of the recomputed part (``CheckpointWithoutOutput``), the others checkpoint
it normally; either way the stored tensors named are what goes.

Per-operator selective checkpointing (``recompute: op``; torchtitan's ``selective_ac_option = 'op'``,
torchtitan/parallelisms/parallelize_llama.py at 9dec370, ``_save_list`` and ``_custom_policy``): inside each
block the outputs of the attention kernel and of every odd-numbered ``aten.mm`` (Q, V, the MLP's first input
projection, the down projection in a Llama block) are saved, the other matmuls and every elementwise op are
recomputed in the backward pass (`op_checkpoint_split`); the block input is kept as well. Float8 linears are
counted the same way (torchtitan's Table 3 readings: Float8 keeps 0.2 GiB less than BF16, compiled).

Pipeline: with 1F1B stage i holds ``min(p - i, m)`` micro-batches in flight; interleaved (v chunks per stage)
``(p - i - 1) 2 + (v - 1) p + 1`` chunks (Megatron's warm-up count), which for stage 0 is Korthikanti et al.'s
``L (1 + (p-1)/(p v))`` (Sec. 4.2.3).
"""
from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError
from .layout import Layout
from .models import ModelSpec

RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts")


def check_modules(modules: Iterable[str]) -> frozenset[str]:
    """The recompute modules as a set; an unknown name is a ConfigError naming the known ones."""
    out = frozenset(modules)
    bad = sorted(out - set(RECOMPUTE_MODULES))
    if bad:
        raise ConfigError(f"unknown recompute module(s) {', '.join(bad)}",
                          f"use Megatron-Core's names: {', '.join(RECOMPUTE_MODULES)}")
    return out


def _block_matmuls(model: ModelSpec) -> list[tuple[float, float]]:
    """(output width, forward FLOPs per token) of a dense block's matmuls in call order: Q, K, V, O, then the
    MLP's input projection(s) and its down projection."""
    h, f = model.hidden, model.ffn_hidden
    out = [(float(model.q_width), 2.0 * h * model.q_width), (float(model.kv_hidden), 2.0 * h * model.kv_hidden),
           (float(model.v_width), 2.0 * h * model.v_width), (float(h), 2.0 * model.heads * model.v_dim * h)]
    out += [(float(f), 2.0 * h * f)] * (2 if model.gated_mlp else 1)
    return out + [(float(h), 2.0 * f * h)]


def op_checkpoint_split(model: ModelSpec) -> tuple[float, float]:
    """(16-bit elements kept per token, matmul FLOPs recomputed per token) of one block under per-operator
    selective checkpointing (module docstring): odd-numbered matmuls kept, even ones recomputed; the block input
    and the attention output kept too."""
    mms = _block_matmuls(model)
    kept = sum(w for i, (w, _) in enumerate(mms) if i % 2 == 0)
    rec = sum(fl for i, (_, fl) in enumerate(mms) if i % 2 == 1)
    return model.hidden + model.heads * model.v_dim + kept, rec


def activation_bytes_per_layer(model: ModelSpec, layout: Layout, recompute: str | None = None,
                               index: int | None = None, modules: Iterable[str] = ()) -> float:
    """Stored activation bytes of layer `index` (default: an MoE layer of an MoE model) for one micro-batch on
    one GPU (Korthikanti et al. 2022, Sec. 4, generalised as in the module docstring), less what the recompute
    `modules` rebuild in the backward pass."""
    r = layout.recompute if recompute is None else recompute
    mods = check_modules(modules)
    s = layout.seq_len / layout.cp
    b = layout.micro_batch
    h, a = model.hidden, model.heads
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    if r == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    if r == "op":
        kept, _ = op_checkpoint_split(model)
        return 2.0 * s * b * kept / t if sp else 2.0 * s * b * (h + (kept - h) / t)
    drop = 1 if model.dropout else 0
    # GEMM inputs kept for the weight gradient: 2 bytes, or 1 under FP8 (Transformer Engine saves the quantised
    # input of an FP8 GEMM, not its 16-bit source)
    g_in = 1 if layout.precision == "fp8" else 2
    moe = model.is_moe if index is None else model.is_moe_layer(index)
    norm_out = "layernorm" in mods
    # replicated across TP ranks unless sequence parallel: norms inputs (2 x 2sbh), QKV input (MLA: the input of
    # its separate norm's consumers), MLP input (an MoE layer's router input stays 16-bit), two dropout masks
    qkv_in = 0 if norm_out and model.is_mla else g_in
    mlp_in = (0 if norm_out else 2) if moe else g_in
    replicated = (4 + qkv_in + mlp_in + 2 * drop) * s * b * h
    # split across TP ranks: Q, K, V (16-bit, for the attention backward), the attention output (input of O);
    # MLP intermediates: the up (and gate) projection output 16-bit, the down projection's input a GEMM input
    qkv = 0 if "mla_up_proj" in mods and model.is_mla else 2 * (model.q_width + model.kv_hidden + model.v_width)
    attn = (qkv + g_in * model.heads * model.v_dim) * s * b
    gate = 2 if model.gated_mlp else 1
    per_ffn = 2 * gate + g_in
    if moe:
        pad = layout.capacity_factor or 1.0
        routed = 0.0 if "moe" in mods else \
            (2 * gate + (0 if "moe_act" in mods else g_in)) * s * b * model.moe_ffn * model.top_k * pad + \
            g_in * s * b * h * model.top_k * pad  # dispatched copies of the input (the experts' GEMM input)
        shared = 0.0 if mods & {"moe", "shared_experts"} else per_ffn * s * b * model.moe_ffn * model.shared_experts
        mlp = routed + shared
    else:
        mlp = 0.0 if "mlp" in mods else per_ffn * s * b * model.ffn_hidden
    # MLA latents (un-split down projections): input and output of their norms, and the shared rope key
    latent = 2 * s * b * (2 * (model.q_lora_rank + model.kv_lora_rank) + model.qk_rope_head_dim) \
        if model.is_mla else 0.0
    # attention scores: softmax output 2 a s^2 b; with dropout also its mask a s^2 b and output 2 a s^2 b
    keep_scores = not layout.flash_attention and r == "none" and "core_attn" not in mods
    scores = (2 + 3 * drop) * a * s * s * b if keep_scores else 0.0
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
