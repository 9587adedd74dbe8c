"""Context parallelism as torch's ring attention runs it: per-step kernels, FP32 merges, exposed K/V exchange.

torchtitan's context parallelism is PyTorch's experimental ring attention
(``torch/distributed/tensor/experimental/_attention.py`` as of the 2.6 release; torchtitan's published runs used
torch 1963fc8, 2024-12-23), entered through ``context_parallel`` (torchtitan 9dec370 ``torchtitan/utils.py``
lines 171-193) with the K/V exchange chosen by ``set_rotate_method`` (``config_manager.py`` lines 365-367: default
``allgather``; ``alltoall`` passes K/V around the ring: ``cp_comm: p2p`` here). What a CP rank runs per layer and
pass, read from that code (n = b x s / cp local tokens, two round-robin chunks of n/2 each):

- **what is exchanged**: torchtitan's attention repeats K and V to the query's heads before SDPA (``repeat_kv``,
  ``torchtitan/models/llama/model.py`` lines 201-209 at 9dec370), so the ring carries K and V at ``heads / tp``
  heads, not at the grouped-query ``kv_heads``;
- **steps** (``_templated_ring_attention``): step 0 runs the flash kernel causally over the local n x n block;
  each of the cp - 1 later steps, with the round-robin load balancer (``_ContextParallelOptions.
  enable_load_balance = True``), runs it without a mask over n x n/2 (the first half of the received K/V) or n/2 x
  n (the second half of Q): every step keeps n^2/2 scores, so each kernel call runs at the table's causal rate
  (step 0, length n) or its non-causal rate (the later steps, length n/2) (`attention_tables`);
- **output merge in FP32** (``_SDPAMerger``, ``convert_to_f32 = True``): step 0's output is cast to FP32; each
  later step merges its block ``out - sigmoid(lse_b - lse) * (out - out_b)`` over the full output or, for the
  half-Q steps, its second half followed by ``_partial_update``'s ``torch.cat`` of both halves; ``results()``
  casts back to BF16;
- **backward** (``_templated_ring_attention_backward``): dQ, dK, dV accumulate in FP32 (``zeros_like(...,
  dtype=float32)``); each step adds the kernel's dQ (half-Q steps: ``_partial_update``, a cat), receives the
  running FP32 dK/dV from the previous rank, adds its own (half-K steps: ``_partial_update``), concatenates them
  (``torch.cat``) and sends them on with ``permute_tensor`` (``_RotateMethod.ALL_TO_ALL`` whatever the rotate
  method), waited for after the next step's kernel; the last send is waited for right after the loop, with no
  kernel to hide under; dQ, dK, dV are cast back to BF16 at the end;
- **K/V exchange**: ``allgather`` all-gathers the concatenated K/V once per pass (``_AllGatherRotater``: issued
  at step 0, waited for at step 1, so it hides under step 0's kernel only); ``alltoall`` sends them to the next
  rank each step, waited for after that step's kernel. Forward, the recomputed forward (full activation
  checkpointing) and backward each exchange K/V anew.

Memory-bound bytes per element follow the profile's pointwise mode (`kernels.KernelProfile.pointwise`): eager,
each PyTorch op reads and writes its tensors (the merge is a cast, a subtraction, a broadcast multiply and a
subtraction: 6 + 12 + 8 + 12 bytes per element; a copy or ``torch.cat`` 4 B at BF16, 8 B at FP32); compiled
(torchtitan ``apply_compile`` compiles each block with ``fullgraph=True``, parallelize_llama.py line 303, so
the ring attention is traced with it), a merge or accumulation is one kernel reading the FP32 running value and
the BF16 block and writing FP32 (10 B), ``_partial_update``'s cat costs the untouched half's copy (8 B), the
dK/dV ``torch.cat`` is the accumulation's own output, zero-filled accumulators fold into the first add, and the
``torch.cat`` of K/V feeding a rotater that ignores it (every all-gather step after the first) is dead code.
Per-(token, head) LSE tensors are a 1/head_dim share of these and left out. Each CP rank runs a different mix of
full and half steps; the busiest rank sets the time (the per-layer exchange keeps the ranks in step).

Megatron runs Transformer Engine's context parallelism (`kernels.KernelProfile.context_parallel`
``transformer-engine``), priced as `layercomm` and `steptime` describe; Ulysses (``cp_comm: a2a``), which torch
does not implement, keeps that pricing too.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from .attention_tables import measured_flops
from .kernels import (
    ATTENTION_KERNELS,
    PASSES,
    AttentionWork,
    KernelProfile,
    attention_pass_s,
    attention_work,
    kernel_profile,
)
from .layercomm import CommCall, stage_calls
from .layout import Layout
from .models import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from .compute import EfficiencyModel, GpuSpec

TORCH_RING = "torch-ring"
BF16_BYTES = 2
FP32_BYTES = 4
RING_METHODS = ("p2p", "allgather")   # torch's rotate methods: alltoall (p2p here) and allgather


def uses_torch_ring(layout: Layout, kernels: str | KernelProfile) -> bool:
    """Whether `layout` runs torch's ring attention: cp > 1, a profile whose CP is torch's, a ring exchange."""
    return layout.cp > 1 and layout.cp_comm in RING_METHODS and \
        kernel_profile(kernels).context_parallel == TORCH_RING


@dataclass(frozen=True)
class RingElements:
    """Elements per CP rank and layer of the tensors the ring attention touches (module docstring)."""

    q: float     # query: local tokens x heads / tp x d_qk
    out: float   # output: local tokens x heads / tp x d_v
    k: float     # key at the query's heads (repeat_kv)
    v: float     # value at the query's heads

    @property
    def kv_bytes(self) -> float:
        """Bytes of the BF16 K and V one rank exchanges per pass."""
        return (self.k + self.v) * BF16_BYTES


def ring_elements(model: ModelSpec, layout: Layout) -> RingElements:
    """The elements of Q, O, K and V one CP rank holds per layer (K and V repeated to the query's heads)."""
    n = layout.micro_batch * layout.seq_len / layout.cp
    heads = model.heads / layout.tp
    return RingElements(n * heads * model.qk_head_dim, n * heads * model.v_dim, n * heads * model.qk_head_dim,
                        n * heads * model.v_dim)


def merge_bytes(el: RingElements, cp: int, rank: int, compiled: bool, method: str = "allgather") -> dict[str, float]:
    """Memory-bound bytes one layer's ring attention moves on CP rank `rank` per pass ('forward', 'backward')
    beyond its flash kernels (module docstring): casts, FP32 merges and accumulations, copies and cats."""
    if not 0 <= rank < cp:
        raise InvalidArgument(f"CP rank {rank} outside 0..{cp - 1}", "give a rank of the CP group")
    if method not in RING_METHODS:
        raise InvalidArgument(f"ring exchange {method!r}", f"use one of {', '.join(RING_METHODS)}")
    kv = el.k + el.v
    cats = 1 if compiled and method == "allgather" else cp - 1
    copies = (0.0 if compiled else 2 * BF16_BYTES * kv) + cats * 2 * BF16_BYTES * kv   # contiguous(), cat(K, V)
    full = 10.0 if compiled else 38.0                  # a merge over the full output, per element
    half = 9.0 if compiled else 19.0 + 8.0             # over half of it, then _partial_update's cat
    fwd = copies + 6 * el.out + 6 * el.out             # step 0's cast to FP32, results()' cast back
    fwd += sum((full if i <= rank else half) * el.out for i in range(1, cp))
    add_full, add_half = 10.0, (9.0 if compiled else 5.0 + 8.0)   # FP32 += BF16; half, then the cat
    first = 6.0 if compiled else FP32_BYTES + 10.0                  # zeros_like folded in, or written then added
    bwd = copies + first * (el.q + kv) + 6 * (el.q + kv)            # step 0's adds; the casts back to BF16
    bwd += 0.0 if compiled else 2 * FP32_BYTES * kv                 # step 0's torch.cat of dK, dV
    for i in range(1, cp):
        bwd += (add_full if i <= rank else add_half) * el.q
        bwd += (add_half if i <= rank else add_full) * kv + (0.0 if compiled else 2 * FP32_BYTES * kv)
    return {"forward": fwd, "backward": bwd}


@dataclass(frozen=True)
class RingKernels:
    """Seconds of one layer's flash kernel calls per pass: step 0 (causal) and each later step."""

    first: dict[str, float]
    step: dict[str, float]

    def total_s(self, pass_: str, cp: int) -> float:
        """All cp calls of one pass."""
        return self.first[pass_] + (cp - 1) * self.step[pass_]


def ring_kernels(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel, attn_flops: float,
                 layers: int, rate: float) -> RingKernels:
    """Flash kernel seconds per layer of the ring's steps: each keeps 1/cp of the layer's scores (the causal
    ones of `attn_flops`, the stage's forward attention model FLOPs over `layers` layers), step 0 at the causal
    rate of length n, the later steps at the non-causal rate of length n/2 (module docstring)."""
    if layers < 1:
        raise InvalidArgument(f"layers={layers}", "give the stage's layer count, >= 1")
    kernel = kernel_profile(e.kernels).attention
    table = ATTENTION_KERNELS[kernel].table
    per_step = attention_work(model, attn_flops / layers / layout.cp)
    n = layout.seq_len / layout.cp

    def call_s(work: AttentionWork, pass_: str, causal: bool) -> float:
        measured = measured_flops(gpu.name, gpu.bf16_flops, table, pass_, model.qk_head_dim, n if causal else n / 2,
                                  causal=causal)
        return attention_pass_s(kernel, work, pass_, rate, gpu.exp_per_s, gpu.async_mma, measured)

    return RingKernels({p: call_s(per_step, p, True) for p in PASSES}, {p: call_s(per_step, p, False) for p in PASSES})


def ring_attention_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel, attn_flops: float,
                     rate: float, layers: int) -> tuple[float, float]:
    """(forward, backward) seconds of a stage's attention under torch's ring attention: the flash kernel calls at
    their shapes plus the busiest CP rank's merge and accumulation bytes at HBM bandwidth x mem_eff."""
    if not attn_flops:
        return 0.0, 0.0
    k = ring_kernels(model, layout, gpu, e, attn_flops, layers, rate)
    el = ring_elements(model, layout)
    compiled = kernel_profile(e.kernels).pointwise == "compiled"
    per_rank = [merge_bytes(el, layout.cp, r, compiled, layout.cp_comm) for r in range(layout.cp)]
    busiest = max(per_rank, key=lambda b: b["forward"] + b["backward"])
    mem_Bps = e.elementwise_Bps(gpu)
    fwd, bwd = (layers * (k.total_s(p, layout.cp) + busiest[p] / mem_Bps) for p in PASSES)
    return fwd, bwd


def ring_exposed_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel, attn_flops: float,
                   layers: int, time_s: Callable[[str, float], float]) -> float:
    """Exposed seconds per micro-batch of a stage's ring K/V and dK/dV exchange (module docstring).

    `time_s(collective, nbytes)` prices one call over the CP group ('all_gather': nbytes its output) or between
    neighbours ('sendrecv'). Per layer: the all-gather beyond step 0's kernel, or each step's send beyond that
    step's kernel, in the forward, the recomputed forward (full recomputation) and the backward; backward adds
    each FP32 dK/dV send beyond the next step's kernel, and the last one whole."""
    if not attn_flops:
        return 0.0
    tokens = layout.micro_batch * layout.seq_len / layout.cp   # the BF16 GEMM rate compute.microbatch_times uses
    rate = gpu.bf16_flops * e.gemm_efficiency(model.hidden / layout.tp, tokens) * e.software_factor
    k = ring_kernels(model, layout, gpu, e, attn_flops, layers, rate)
    el = ring_elements(model, layout)
    cp = layout.cp
    forwards = 2 if layout.recompute == "full" else 1
    dkv_s = time_s("sendrecv", (el.k + el.v) * FP32_BYTES)
    if layout.cp_comm == "allgather":
        gather_s = time_s("all_gather", cp * el.kv_bytes)
        fwd = max(0.0, gather_s - k.first["forward"])
        bwd = max(0.0, gather_s - k.first["backward"])
    else:
        send_s = time_s("sendrecv", el.kv_bytes)
        fwd = max(0.0, send_s - k.first["forward"]) + (cp - 2) * max(0.0, send_s - k.step["forward"])
        bwd = max(0.0, send_s - k.first["backward"]) + (cp - 2) * max(0.0, send_s - k.step["backward"])
    bwd += (cp - 1) * max(0.0, dkv_s - k.step["backward"]) + dkv_s
    return layers * (forwards * fwd + bwd)


def ring_calls(model: ModelSpec, layout: Layout, layers: int) -> list[CommCall]:
    """The CP exchange of `layers` layers per micro-batch under torch's ring attention, for the traffic figures:
    K/V all-gathered (or sent cp - 1 times) per forward, recomputed forward and backward; cp FP32 dK/dV sends
    backward. ``hides_under`` "ring": `ring_exposed_s` prices their exposure."""
    el = ring_elements(model, layout)
    cp = layout.cp
    forwards = 2 if layout.recompute == "full" else 1
    passes = forwards + 1
    if layout.cp_comm == "allgather":
        kv = CommCall("cp", "all_gather", cp * el.kv_bytes, passes * layers, cp, "ring", forwards / passes)
    else:
        kv = CommCall("cp", "sendrecv", el.kv_bytes, passes * (cp - 1) * layers, 2, "ring", forwards / passes)
    return [kv, CommCall("cp", "sendrecv", (el.k + el.v) * FP32_BYTES, cp * layers, 2, "ring", 0.0)]


def stage_calls_for(model: ModelSpec, layout: Layout, stage: int, kernels: str | KernelProfile) -> list[CommCall]:
    """`layercomm.stage_calls`, its CP calls replaced by `ring_calls` where the layout runs torch's ring."""
    prof = kernel_profile(kernels)
    calls = stage_calls(model, layout, stage, prof.checkpoint, prof.sequence_dim)
    if not uses_torch_ring(layout, kernels):
        return calls
    start, stop = layout.stage_ranges(model)[stage]
    return [c for c in calls if c.dim != "cp"] + ring_calls(model, layout, stop - start)


def stage_ring_exposed_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, e: EfficiencyModel,
                         span: tuple[int, int], time_s: Callable[[str, float], float]) -> float:
    """`ring_exposed_s` for the layers span[0]..span[1]-1 of a pipeline stage, per micro-batch."""
    start, stop = span
    _, at, _ = model.span_flops_per_token(layout.seq_len, start, stop)
    attn = layout.micro_batch * layout.seq_len / layout.cp * at / layout.tp
    return ring_exposed_s(model, layout, gpu, e, attn, stop - start, time_s)
