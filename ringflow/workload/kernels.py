"""Memory-bound kernels of a transformer layer, per framework: which tensors each kernel reads and writes.

A framework is a profile of mechanisms (`KernelProfile`): how its norms, rotary embeddings, MLP activation and
residual adds run (hand-fused kernels, one ATen kernel, a torch.compile'd block, or one kernel per PyTorch op)
and how it computes the loss. Each kernel moves its tensors through HBM once: a kernel reading an element of r
bytes and writing one of w bytes costs (r + w) bytes per element, at HBM bandwidth x ``mem_eff``.

Per token of one layer (h = hidden, q = heads x head_dim, k = kv_heads x head_dim, f = ffn_hidden; a width is
divided by tp where the tensor is split: q, k, f always, h under sequence parallelism):

- **composed RMSNorm** (torchtitan ``RMSNorm``, torchtitan/models/norms.py at 9dec370:
  ``self._norm(x.float()).type_as(x) * self.weight`` with ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) +
  eps)``): forward cast, pow, mean, multiply, cast back, weight multiply (+ two per-token kernels); backward the
  autograd formula of each (weight multiply and its weight gradient, cast, the two uses of ``x.float()`` and their
  sum, ``pow``'s ``2 x`` rebuilt, cast back);
- **one-kernel norm** (``F.layer_norm`` / ``F.rms_norm``, Transformer Engine's, Inductor's): forward reads x and
  writes y; backward reads x and dy and writes dx, and reads both again for the weight gradient;
- **rotary** (torchtitan ``apply_rotary_emb``: ``xq.float()``, a complex multiply, ``type_as``) eager: three
  kernels per pass on q and on k; fused or compiled: one;
- **grouped-query K/V** (torchtitan ``repeat_kv``, expand + reshape): a copy of K and V to q's width forward, a
  sum back backward, in every profile that feeds SDPA without native GQA;
- **MLP activation**: SwiGLU eager as SiLU then the gate multiply (backward: both multiply gradients and
  ``silu_backward``), fused or compiled as one kernel each pass; GELU one kernel each pass everywhere;
- **residual adds**: eager one add forward and one gradient accumulation backward each; a compiled block fuses
  the attention residual into the next norm (it writes h and the normed h in one pass);
- **loss** (last stage, per token over the vocabulary V/tp): ``cross_entropy(logits.float())`` eager (torchtitan
  train.py at 9dec370, lines 131-138: not compiled) casts, log-softmaxes and back; a fused cross entropy
  (Megatron's vocab-parallel one, flash-attn's Triton one) reads the logits forward and reads them and writes
  their gradient backward.

The compute model (`compute.microbatch_times`) keeps its stored-activation term, fitted with the Megatron stacks
of the fitting half, for the fused reference profile (`REFERENCE`), and adds for any other profile the time of
the bytes its kernels move beyond the reference's (`extra_bytes_per_token`): a compiled block lands near zero,
an eager one well above. Kernels of per-token scalars (mean, rsqrt) are counted (`Inventory.launches`); the
per-kernel launch time is a parameter (`EfficiencyModel.kernel_launch_s`, 0: no sourced figure yet).
MoE layers keep the stored-activation term alone (no PyTorch-native MoE profile yet).

Four more mechanisms ride on the profile and the run's precision:

- **sequence dimension** (``sequence_dim``): the activation dimension sequence parallelism shards. Megatron-Core
  keeps activations as [s, b, h] and gathers and reduce-scatters along dim 0, on contiguous buffers (0).
  torchtitan keeps (b, s, h) and shards dim 1 (DTensor ``Shard(1)``: torchtitan 9dec370 ``parallelize_llama.py``
  lines 133-192), and PyTorch's functional collectives then copy each collective's whole buffer:
  ``all_gather_tensor`` gathers along dim 0 and concatenates the chunks along ``gather_dim`` (``torch.cat(
  torch.chunk(res, group_size, dim=0), dim=gather_dim)``), ``reduce_scatter_tensor`` first concatenates the input's
  chunks along dim 0 (``torch.cat(torch.chunk(self, group_size, dim=scatter_dim))``), torch
  ``distributed/_functional_collectives.py``. Each such copy reads and writes the buffer once, on the compute
  stream before the GEMM that reads the gathered buffer or the collective that reads the concatenated one
  (`layercomm` ``copy_bytes``); a collective async TP fuses with its GEMM takes its chunks in place (`tpoverlap`);

- **checkpoint** (`CHECKPOINTS`): what full recomputation reruns. ``reentrant`` (Megatron-Core's
  ``tensor_parallel.checkpoint``, a ``CheckpointFunction``) reruns the whole checkpointed forward in backward;
  ``non-reentrant`` (``torch.utils.checkpoint(use_reentrant=False)``, which torchtitan's ``checkpoint_wrapper``
  applies per TransformerBlock: torchtitan 9dec370 ``parallelize_llama.py`` line 234, ``ptd_checkpoint_wrapper``
  with its default ``CheckpointImpl.NO_REENTRANT``) stops "recomputation as soon as it has computed all needed
  Tensors" (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default), and under torch.compile the
  backward graph holds only the forward nodes its gradients need. Nothing after a layer's last GEMM is needed
  by that layer's backward, so the collective that ends the layer (the MLP's reduce-scatter or all-reduce, an
  MoE layer's combine) is not rerun (`layercomm`, `tpoverlap`); nor is a dense layer's last GEMM, the MLP's
  down projection (`skips_last_gemm`, `compute.microbatch_times`): the last tensor backward needs is its input,
  which autograd saves as it records an ATen matmul, before the kernel runs (the early stop fires there), and
  which a compiled block's backward graph reads without the GEMM. An eager FP8 linear (torchao's Float8 autograd
  Function) saves its tensors only after its forward has run, so there the GEMM is rerun;

- **attention kernel** (`ATTENTION_KERNELS`, `attention_work`, `attention_pass_s`): a FlashAttention kernel
  computes, per (query, key) score it keeps (causal: half the square, ``heads x s_eff / 2`` per token), on tensor
  cores ``2 (d_qk + d_v)`` FLOPs forward (QK^T, PV) and ``2 (3 d_qk + 2 d_v)`` backward (QK^T recomputed, dV, dP,
  dQ, dK), and one exponential per pass on the special-function units, whose rate (`hardware.gpus`
  ``exp_per_s``) is far below the tensor cores': "the H100 SXM5 GPU has 989 TFLOPS of FP16 matmul but only 3.9
  TFLOPS of special functions such as exponential" (Shah et al., FlashAttention-3, arXiv:2407.08608, section
  3.1, "Pingpong scheduling"). The tensor FLOPs run at the GEMM rate of the compute curve; the kernel's
  generation sets how the two add up per pass:

  - ``flash2`` (FlashAttention-2, PyTorch SDPA's flash backend): softmax between the two GEMMs of a tile, not
    overlapped: tensor time + exponential time;
  - ``flash3`` and ``cudnn`` (FlashAttention-3; cuDNN fused attention, Transformer Engine's ``FusedAttention``)
    on GPUs with asynchronous tensor cores (Hopper, Blackwell: ``async_mma``): warp-specialised ping-pong
    scheduling runs one warpgroup's softmax while another's GEMMs run, so a pass takes the longer of the two;
    on older GPUs they add up as ``flash2``. cuDNN is put in FlashAttention-3's class because it runs at its
    rate: 631 against 632 TFLOP/s forward on H100 at head_dim 128 (pytorch/pytorch#142132, tritonbench);
  - ``triton-flash`` (``flash_attn_triton.py``): FlashAttention-2 "is around 1.3-1.5x faster than
    FlashAttention in Triton in the forward pass and around 2x faster in the backward pass" (Dao,
    arXiv:2307.08691, section 4.1, A100), so its forward takes 1.4x and its backward 2x ``flash2``'s time.

  Where a published measurement covers the GPU and the kernel (`attention_tables`: the FlashAttention-3 paper's
  H100 figures for FlashAttention-2, cuDNN and FlashAttention-3), a pass runs at the measured rate instead, times
  the kernel's factors. A layout without FlashAttention (``flash_attention: false``) runs attention as two batched
  GEMMs over the full square at the GEMM rate (backward twice the forward) with its softmax among the memory-bound
  kernels;
- **FP8 quantisation** (`fp8_cast_bytes_per_token`): an FP8 GEMM reads FP8 operands, so every activation
  operand of every FP8 linear layer (its input forward, its output gradient backward) is cast from BF16 in a
  pass that reads 2 bytes and writes an FP8 row-wise and column-wise copy (1 + 1 bytes; the column-wise one
  feeds the weight-gradient GEMM). Per-tensor current scaling (Transformer Engine ``Float8CurrentScaling``,
  torchao's dynamic tensorwise ``Float8Linear``) first reads the tensor once more for its amax: Transformer
  Engine v2.8 ``pytorch/csrc/quantizer.cpp`` ``Float8CurrentScalingQuantizer::quantize_impl`` (lines 497-535:
  ``nvte_compute_amax`` then ``nvte_quantize_v2``), except on a norm's output, whose amax the norm kernel
  computes (``csrc/extensions/normalization.cpp`` lines 102-120, ``FUSED_NORM_AMAX_FP8``). Block scaling
  (MXFP8) computes its scales in the cast itself: no amax pass. FP8 weights (``fp8_params``) are cast once a
  step, not per micro-batch: not counted here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .layout import Layout
from .models import ModelSpec

NORMS = ("fused", "native", "composed")
POINTWISE = ("fused", "compiled", "eager")
LOSSES = ("fused", "eager_fp32")
PASSES = ("forward", "backward")
CP_IMPLS = ("transformer-engine", "torch-ring")   # Transformer Engine's CP; torch's experimental ring attention
CHECKPOINTS = ("reentrant", "non-reentrant")       # full recomputation: the whole layer, or what backward needs


@dataclass(frozen=True)
class AttentionKernel:
    """An attention kernel generation (module docstring)."""

    name: str
    overlapped: bool                 # softmax under the GEMMs where the GPU has asynchronous tensor cores
    factors: tuple[float, float]     # (forward, backward) time over the mechanism's (or the measured table's)
    source: str
    table: str                       # the kernel measured in attention_tables whose rate this one runs at


ATTENTION_KERNELS: dict[str, AttentionKernel] = {k.name: k for k in (
    AttentionKernel("flash2", False, (1.0, 1.0), "FlashAttention-2, Dao arXiv:2307.08691; PyTorch SDPA flash backend",
                    "flash2"),
    AttentionKernel("flash3", True, (1.0, 1.0), "FlashAttention-3, Shah et al. arXiv:2407.08608 section 3.1",
                    "flash3"),
    AttentionKernel("cudnn", True, (1.0, 1.0), "cuDNN fused attention (Transformer Engine FusedAttention, PyTorch "
                    "SDPA cudnn backend): FlashAttention-3's rate on H100, pytorch/pytorch#142132", "cudnn"),
    AttentionKernel("triton-flash", False, (1.4, 2.0), "FlashAttention in Triton: FlashAttention-2 1.3-1.5x faster "
                    "forward, 2x backward, arXiv:2307.08691 section 4.1 (A100)", "flash2"),
)}
FP8_RECIPES = ("tensorwise", "block")   # per-tensor current / dynamic scaling; MXFP8 block scaling
CAST_READ_BYTES = 2     # a BF16 operand read by the cast (and by the amax pass)
CAST_WRITE_BYTES = 2    # its FP8 row-wise and column-wise copies


@dataclass(frozen=True)
class KernelProfile:
    """How a framework runs the memory-bound work of a layer (module docstring)."""

    name: str
    norm: str        # fused | native (one ATen kernel a pass) | composed (PyTorch ops: cast, pow, mean, ...)
    pointwise: str   # fused (hand-written) | compiled (torch.compile per block) | eager (one kernel per op)
    loss: str        # fused cross entropy | eager_fp32 (logits.float() then cross_entropy)
    source: str
    attention: str = "flash2"   # attention kernel (ATTENTION_KERNELS): flash2 | flash3 | cudnn | triton-flash
    context_parallel: str = "transformer-engine"   # CP_IMPLS: whose ring attention (`context_parallel` module)
    checkpoint: str = "reentrant"   # CHECKPOINTS: what full recomputation reruns (module docstring)
    sequence_dim: int = 0           # the activation dimension sequence parallelism shards (module docstring)

    def __post_init__(self) -> None:
        for field, value, allowed in (("norm", self.norm, NORMS), ("pointwise", self.pointwise, POINTWISE),
                                      ("loss", self.loss, LOSSES), ("attention", self.attention,
                                                                    tuple(ATTENTION_KERNELS)),
                                      ("context_parallel", self.context_parallel, CP_IMPLS),
                                      ("checkpoint", self.checkpoint, CHECKPOINTS)):
            if value not in allowed:
                raise InvalidArgument(f"kernel profile {self.name!r}: {field}={value!r}",
                                      f"use one of {', '.join(allowed)}")
        if self.sequence_dim not in (0, 1):
            raise InvalidArgument(f"kernel profile {self.name!r}: sequence_dim={self.sequence_dim!r}",
                                  "use 0 ([s, b, h] activations) or 1 ((b, s, h) activations)")


REFERENCE = "megatron-te"
_TITAN_SDPA = ("attention F.scaled_dot_product_attention, whose default backend order with torch 1963fc8 (2024-12-23) "
               "puts the flash backend (FlashAttention-2) first and cuDNN last on H100: cuDNN SDPA deprioritized "
               "after the 2.5 release (pytorch/pytorch#141274, 2024-11-21; #142132 on 2.6.0.dev20241204: 'This is "
               "expected'), back first on sm90/sm100 only from 2.9 (pytorch/pytorch#162073)")
_TITAN_AC = ("activation checkpointing per TransformerBlock by ptd_checkpoint_wrapper "
             "(parallelisms/parallelize_llama.py lines 233-234, 272-276): torch's non-reentrant checkpoint")
PROFILES: dict[str, KernelProfile] = {p.name: p for p in (
    KernelProfile("megatron-te", "fused", "fused", "fused",
                  "Megatron-Core with Transformer Engine: fused norm (LayerNormLinear), fused RoPE, fused SwiGLU, "
                  "fused bias-dropout-add, vocab-parallel fused cross entropy; the compute curve's reference; "
                  "attention cuDNN FusedAttention: Transformer Engine get_attention_backend (transformer_engine/"
                  "pytorch/attention/dot_product_attention/utils.py, 002a3e5) 'Disabling FlashAttention to give "
                  "FusedAttention preference on Hopper+ for performance reasons' (FlashAttention-2 before Hopper)",
                  attention="cudnn"),
    KernelProfile("torchtitan-eager", "composed", "eager", "eager_fp32",
                  "torchtitan 9dec370 without compile: train_configs/llama3_8b.toml 'compile = false', "
                  "'norm_type = \"rmsnorm\"' (models/norms.py RMSNorm in PyTorch ops); eager fp32 loss (train.py "
                  "lines 131-138); " + _TITAN_SDPA + "; " + _TITAN_AC, context_parallel="torch-ring",
                  checkpoint="non-reentrant", sequence_dim=1),
    KernelProfile("torchtitan-compile", "composed", "compiled", "eager_fp32",
                  "torchtitan 9dec370 with training.compile: each TransformerBlock torch.compile'd "
                  "(parallelisms/parallelize_llama.py apply_compile, lines 297-306); the final norm and the fp32 "
                  "loss stay eager (train.py lines 131-138); " + _TITAN_SDPA + "; " + _TITAN_AC,
                  context_parallel="torch-ring", checkpoint="non-reentrant", sequence_dim=1),
    KernelProfile("llm-foundry-2023", "native", "eager", "fused",
                  "llm-foundry scripts/train/benchmarking/submit_benchmarks.py (5e85bd62): "
                  "norm_type 'low_precision_layernorm' (one F.layer_norm kernel, line 307), no torch.compile; MPT "
                  "defaults: GELU MLP, loss_fn 'fused_crossentropy' (flash-attn's Triton cross entropy, "
                  "llmfoundry/models/mpt/modeling_mpt.py line 981); attention FlashAttention in Triton: "
                  "--attn_impl defaults to 'triton' (line 144, set on the model at line 305; sweep.sh, which lists "
                  "the tables' runs, passes none), llmfoundry/models/layers/flash_attn_triton.py (a copy of "
                  "HazyResearch's flash_attn_triton.py; setup.py b2a43a147 line 66 installs its triton-pre-mlir)",
                  attention="triton-flash"),
)}


def skips_last_gemm(profile: KernelProfile, precision: str) -> bool:
    """Whether full recomputation under `profile` leaves out each dense layer's last GEMM (module docstring)."""
    return profile.checkpoint == "non-reentrant" and not (profile.pointwise == "eager" and precision == "fp8")


def kernel_profile(name: str | KernelProfile) -> KernelProfile:
    """A kernel profile by name (a profile is itself); an unknown name is an InvalidArgument naming the known ones."""
    if isinstance(name, KernelProfile):
        return name
    p = PROFILES.get(str(name).lower())
    if p is None:
        raise InvalidArgument(f"unknown kernel profile {name!r}", f"use one of {', '.join(PROFILES)}")
    return p


def _hidden_width(model: ModelSpec, layout: Layout) -> float:
    """The hidden width a norm or residual works on per GPU: split by tp under sequence parallelism."""
    t = layout.tp
    return model.hidden / t if layout.sequence_parallel and t > 1 else float(model.hidden)


@dataclass(frozen=True)
class Inventory:
    """Bytes per token the memory-bound kernels of one layer and pass move, and how many kernels they are."""

    nbytes: float
    launches: int


Kernels = list[tuple[float, float]]   # (bytes read, bytes written) per token of one kernel


def _norm(kind: str, width: float, pass_: str) -> Kernels:
    if kind == "composed":
        # forward: cast, pow, mean, (+eps, rsqrt: per token), x*rstd, cast back, *weight
        fwd = ((2, 4), (4, 4), (4, 0), (0, 0), (0, 0), (4, 4), (4, 2), (2, 2))
        # backward: dy*weight, weight grad (mul, sum), cast, d(x*rstd): dy*rstd, dy*x, sum; rsqrt and +eps (per token),
        # mean's expand, pow: x^1, *2, *grad; the two grads of x.float() summed; cast back
        steps = ((2, 2), (4, 2), (2, 0), (2, 4), (4, 4), (8, 4), (4, 0), (0, 0), (0, 0), (0, 4), (4, 4), (4, 4),
                 (8, 4), (8, 4), (4, 2))
        return [(r * width, w * width) for r, w in (fwd if pass_ == "forward" else steps)]
    if pass_ == "forward":
        return [(2 * width, 2 * width)]
    return [(4 * width, 2 * width), (4 * width, 0.0)]   # dx; the weight gradient's pass over x and dy


def _pointwise(model: ModelSpec, kind: str, pass_: str, q: float, k: float, f: float) -> Kernels:
    out: Kernels = []
    if model.position == "rope":   # on q and on k: eager cast, complex multiply, cast back; else one kernel
        steps = ((2, 4), (4, 4), (4, 2)) if kind == "eager" else ((2, 2),)
        out += [(r * w_, wr * w_) for w_ in (q, k) for r, wr in steps]
    if model.kv_heads != model.heads:   # repeat_kv: K and V copied to q's width; summed back
        out += [(2 * k, 2 * q)] * 2 if pass_ == "forward" else [(2 * q, 2 * k)] * 2
    if model.gated_mlp:
        if kind == "eager":
            out += [(2 * f, 2 * f), (4 * f, 2 * f)] if pass_ == "forward" else [(4 * f, 2 * f)] * 3
        else:
            out += [(4 * f, 2 * f)] if pass_ == "forward" else [(6 * f, 4 * f)]
    else:
        out += [(2 * f, 2 * f)] if pass_ == "forward" else [(4 * f, 2 * f)]
    return out


def _residuals(kind: str, pass_: str, h: float) -> Kernels:
    """The two residual adds (forward) or gradient accumulations (backward) a framework runs on their own."""
    if kind == "compiled" and pass_ == "forward":
        return [(4 * h, 2 * h)]   # the attention residual rides in the next norm's kernel (`_norms`)
    if kind == "compiled":
        return []                 # both accumulations ride in the norms' backward kernels
    return [(4 * h, 2 * h)] * 2


def _norms(prof: KernelProfile, pass_: str, h: float) -> Kernels:
    """The two norms of a block; a compiled block's second norm also adds the residual (reads 2, writes 2)."""
    if prof.pointwise != "compiled":
        return _norm(prof.norm, h, pass_) * 2
    if pass_ == "forward":
        return [(2 * h, 2 * h), (4 * h, 4 * h)]
    return [(6 * h, 2 * h), (4 * h, 0.0)] * 2   # dx with the residual gradient added; the weight gradient


def layer_inventory(model: ModelSpec, layout: Layout, profile: str | KernelProfile, pass_: str) -> Inventory:
    """Bytes per token (of this GPU's micro-batch) and kernels of one dense layer's memory-bound work in `pass_`
    ('forward' or 'backward') under `profile` (module docstring)."""
    prof = kernel_profile(profile)
    if pass_ not in PASSES:
        raise InvalidArgument(f"pass {pass_!r}", f"use one of {', '.join(PASSES)}")
    t = layout.tp
    h = _hidden_width(model, layout)
    q, k, f = model.q_width / t, model.kv_hidden / t, model.ffn_hidden / t
    kernels = _norms(prof, pass_, h) + _pointwise(model, prof.pointwise, pass_, q, k, f) + \
        _residuals(prof.pointwise, pass_, h)
    return Inventory(sum(r + w for r, w in kernels), len(kernels))


def loss_inventory(model: ModelSpec, layout: Layout, profile: str | KernelProfile, pass_: str) -> Inventory:
    """Bytes per token and kernels of the loss over the logits (last pipeline stage), and the final norm."""
    prof = kernel_profile(profile)
    v = model.vocab / layout.tp
    if prof.loss == "eager_fp32":   # logits.float(), log_softmax, nll; backward: nll grad, softmax grad, cast
        steps = ((2, 4), (4, 4), (0, 0)) if pass_ == "forward" else ((0, 4), (8, 4), (4, 2))
        kernels = [(r * v, w * v) for r, w in steps]
    else:
        kernels = [(2 * v, 0.0)] if pass_ == "forward" else [(2 * v, 2 * v)]
    # the final norm stays outside a compiled block: it runs as the profile's norm kernel
    kernels += _norm(prof.norm, _hidden_width(model, layout), pass_)
    return Inventory(sum(r + w for r, w in kernels), len(kernels))


def extra_bytes_per_token(model: ModelSpec, layout: Layout, profile: str | KernelProfile, pass_: str,
                          dense_layers: int, last_stage: bool = False) -> Inventory:
    """Bytes per token and kernels that `profile` moves beyond the fused reference profile (`REFERENCE`) in
    `pass_` over `dense_layers` dense layers, plus the loss and final norm when `last_stage`; negative where it
    fuses more than the reference."""
    ref = kernel_profile(REFERENCE)
    parts = [(layer_inventory(model, layout, profile, pass_), layer_inventory(model, layout, ref, pass_),
              dense_layers)]
    if last_stage:
        parts.append((loss_inventory(model, layout, profile, pass_), loss_inventory(model, layout, ref, pass_), 1))
    return Inventory(sum((m.nbytes - b.nbytes) * n for m, b, n in parts),
                     sum((m.launches - b.launches) * n for m, b, n in parts))


@dataclass(frozen=True)
class AttentionWork:
    """What a FlashAttention kernel computes for causal attention (module docstring)."""

    forward_flops: float    # tensor-core FLOPs of QK^T and PV over the kept scores
    backward_flops: float   # QK^T recomputed, dV, dP, dQ and dK
    exps: float             # exponentials in each pass: one per kept score


def attention_work(model: ModelSpec, model_flops: float) -> AttentionWork:
    """The kernel's work behind `model_flops` forward attention FLOPs on Megatron's non-causal count
    (``2 s_eff heads (d_qk + d_v)`` per token and layer): it keeps half the scores (causal)."""
    dqk, dv = model.qk_head_dim, model.v_dim
    scores = model_flops / (4.0 * (dqk + dv))
    return AttentionWork(scores * 2.0 * (dqk + dv), scores * 2.0 * (3 * dqk + 2 * dv), scores)


def attention_pass_s(kernel: str, work: AttentionWork, pass_: str, flops_per_s: float, exp_per_s: float,
                     async_mma: bool, measured_flops_per_s: float | None = None) -> float:
    """Seconds of one pass ('forward' or 'backward') of attention `kernel` over `work`: at the measured rate of
    its table kernel where one is given (`attention_tables.measured_flops`), else its tensor FLOPs at
    `flops_per_s` and its exponentials at `exp_per_s` (0: not known, left out), overlapped where the kernel
    overlaps them and the GPU has asynchronous tensor cores (module docstring); times the kernel's factors."""
    k = ATTENTION_KERNELS.get(kernel)
    if k is None:
        raise InvalidArgument(f"attention kernel {kernel!r}", f"use one of {', '.join(ATTENTION_KERNELS)}")
    if pass_ not in PASSES:
        raise InvalidArgument(f"pass {pass_!r}", f"use one of {', '.join(PASSES)}")
    if flops_per_s <= 0 or exp_per_s < 0:
        raise InvalidArgument(f"attention rates flops_per_s={flops_per_s}, exp_per_s={exp_per_s}",
                              "give a FLOP rate > 0 and an exponential rate >= 0")
    forward = pass_ == "forward"
    flops = work.forward_flops if forward else work.backward_flops
    if measured_flops_per_s is not None:
        if measured_flops_per_s <= 0:
            raise InvalidArgument(f"measured attention rate {measured_flops_per_s}", "give a FLOP rate > 0")
        return flops / measured_flops_per_s * k.factors[0 if forward else 1]
    tensor_s = flops / flops_per_s
    exp_s = work.exps / exp_per_s if exp_per_s else 0.0
    base = max(tensor_s, exp_s) if k.overlapped and async_mma else tensor_s + exp_s
    return base * k.factors[0 if forward else 1]


def _fp8_operands(model: ModelSpec, layout: Layout, index: int, pass_: str) -> tuple[float, float]:
    """(elements a norm produced, other elements) per token that layer `index`'s FP8 linear layers quantize in
    `pass_`: forward their inputs, backward their output gradients; routed and shared experts once per copy."""
    t = layout.tp
    h = _hidden_width(model, layout)
    qkv = (model.q_width + model.kv_hidden + model.v_width) / t
    attn_out = model.heads * model.v_dim / t
    if model.is_moe_layer(index):
        copies, f, et = model.top_k + model.shared_experts, model.moe_ffn, layout.expert_tp
    else:
        copies, f, et = 1, model.ffn_hidden, t
    up = (2 if model.gated_mlp else 1) * f
    if pass_ == "forward":
        from_norm = h + (0.0 if model.is_moe_layer(index) else h)   # the QKV input; a dense MLP's fc1 input
        other = attn_out + copies * f / et + (copies * model.hidden if model.is_moe_layer(index) else 0.0)
        return from_norm, other
    return 0.0, qkv + h + copies * (up / et + (model.hidden if model.is_moe_layer(index) else h))


def fp8_cast_bytes_per_token(model: ModelSpec, layout: Layout, recipe: str, pass_: str, start: int,
                             stop: int) -> float:
    """Bytes per token (of this GPU's micro-batch) that quantizing the FP8 GEMM operands of layers start..stop-1
    moves in `pass_` (module docstring); 0 unless the layout trains in FP8."""
    if recipe not in FP8_RECIPES:
        raise InvalidArgument(f"fp8_recipe={recipe!r}", f"use one of {', '.join(FP8_RECIPES)}")
    if pass_ not in PASSES:
        raise InvalidArgument(f"pass {pass_!r}", f"use one of {', '.join(PASSES)}")
    if layout.precision != "fp8":
        return 0.0
    total = 0.0
    for i in range(start, stop):
        from_norm, other = _fp8_operands(model, layout, i, pass_)
        total += (from_norm + other) * (CAST_READ_BYTES + CAST_WRITE_BYTES)
        if recipe == "tensorwise":
            total += other * CAST_READ_BYTES
    return total
