"""TP communication overlap by mechanism: each collective decomposed into per-rank chunks beside its GEMM.

With sequence parallelism a TP region all-gathers its input before the column-parallel GEMMs (QKV, FC1) and
reduce-scatters the output of the row-parallel GEMM (O, FC2); backward all-gathers the output gradient before
O's and FC2's input-gradient GEMMs and reduce-scatters the input gradient of QKV and FC1. ``Layout.overlap_tp``
hides these under the GEMMs, in one of two implementations (``Layout.tp_overlap``):

- ``async_tp``: PyTorch's micro-pipelined TP (torchtitan ``enable_async_tensor_parallel``, which requires
  torch.compile: torchtitan 9dec370 ``parallelisms/parallelize_llama.py`` lines 55-58, 201-205 set Inductor's
  ``_micro_pipeline_tp`` and symmetric memory on the TP group). Inductor's pass
  (``torch/_inductor/fx_passes/micro_pipeline_tp.py``) replaces an all-gather feeding matmuls by
  ``fused_all_gather_matmul`` and a reduce-scatter of ONE matmul's output by ``fused_matmul_reduce_scatter``
  (``fuse_matmul_reduce_scatter`` gives up unless the reduce-scatter's input is a matmul). The input gradient
  of wq/wk/wv, or of w1/w3, is a sum of matmuls, so backward's two reduce-scatters stay NCCL calls, exposed.
- ``userbuffers``: Megatron-Core with Transformer Engine's userbuffers (``--tp-comm-overlap``, which requires
  sequence parallelism: Megatron-LM ``megatron/training/arguments.py``). Megatron-Bridge's configurations
  (``src/megatron/bridge/training/comm_overlap.py``, e.g. ``userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192``)
  run the QKV/FC1 forward all-gathers and the O/FC2 input-gradient all-gathers as ring exchange (a p2p step per
  rank beside the GEMM of the chunk already there), the O/FC2 forward reduce-scatters as ring exchange or a
  pipeline of GEMM splits, and the QKV/FC1 input-gradient reduce-scatters as a bulk overlap with the
  weight-gradient GEMM (``qkv_wgrad`` / ``fc1_wgrad``: ``BulkOverlapCfg``).

A decomposed collective (both implementations alike): the GEMM runs as ``tp`` chunks of rows, one per rank's
shard, at the efficiency of the chunk's shape; chunk k's copy (one shard, ``c = collective / (tp - 1)``) runs
beside chunk k-1's GEMM (``g``), copies one after another:

    t = max(tp g, g + (tp - 1) c)        exposed = t - GEMM at the full shape + extra + tp barriers

A collective left to NCCL also copies its whole buffer where sequence parallelism shards (b, s, h) activations
along s (`kernels` ``sequence_dim``; a fused one takes its chunks in place).
A recompute that reruns only what backward needs (a kernel profile's ``checkpoint: non-reentrant``) leaves out
the reduce-scatter that ends each layer: the MLP's (`layercomm`).

``extra``: an all-gather first copies the local shard into the symmetric buffer (PyTorch
``_pipelined_multi_all_gather_and_consume``: ``copy_shard`` before the barrier); a reduce-scatter ends with the
reduction of the ``tp`` partial chunks it received (PyTorch ``_fused_matmul_reduce_scatter_impl``: ``reduce_fn``
over ``stacked_partials``; Transformer Engine ``CommOverlapP2PBase::split_overlap_rs``: ``reduce_bf16``), each
at HBM bandwidth. A barrier per step costs one NVLink hop. A bulk overlap is exposed beyond its GEMM:
``max(0, collective - GEMM)``. The all-gathers of a run that trains in FP8 carry FP8 (`layercomm`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .layout import TP_OVERLAPS, Layout
from .models import ModelSpec

__all__ = ["TP_OVERLAPS", "TpPiece", "exposed_s", "piece_exposed_s", "tp_pieces"]
PASSES = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class TpPiece:
    """One TP collective of a region and pass, the GEMM it overlaps with, and how."""

    collective: str      # all_gather | reduce_scatter
    pass_: str           # forward | backward | recompute
    nbytes: float        # buffer (commmodel convention: the all-gather's output, the reduce-scatter's input)
    gemm_flops: float    # the GEMM it decomposes with, or hides under (bulk)
    how: str             # decomposed | bulk | exposed
    count: int           # regions of this kind on the stage
    copy_bytes: float = 0.0   # HBM bytes an NCCL call moves laying its buffer out (`layercomm.CommCall`)


def _regions(model: ModelSpec, layout: Layout, start: int, stop: int) -> list[tuple[float, float, int]]:
    """(column GEMM FLOPs, row GEMM FLOPs, count) per token of this GPU for each kind of TP region of layers
    start..stop-1: attention (QKV, O), dense MLP (FC1 [+ gate], FC2), shared experts of an MoE layer."""
    t, h = layout.tp, model.hidden
    n_moe = sum(1 for i in range(start, stop) if model.is_moe_layer(i))
    up = 2 if model.gated_mlp else 1
    out = [(2.0 * h * (model.q_width + model.kv_hidden + model.v_width) / t,
            2.0 * model.heads * model.v_dim * h / t, stop - start)]
    if stop - start - n_moe:
        out.append((2.0 * h * up * model.ffn_hidden / t, 2.0 * model.ffn_hidden * h / t, stop - start - n_moe))
    if n_moe and model.shared_experts:
        f = model.shared_experts * model.moe_ffn
        out.append((2.0 * h * up * f / t, 2.0 * f * h / t, n_moe))
    return out


def tp_pieces(model: ModelSpec, layout: Layout, start: int, stop: int, gather_bytes: float,
              scatter_bytes: float, checkpoint: str = "reentrant", scatter_copy_bytes: float = 0.0
              ) -> list[TpPiece]:
    """The TP collectives of layers start..stop-1 per micro-batch with sequence parallelism, each with its GEMM
    and how `layout.tp_overlap` runs it (module docstring); `gather_bytes` / `scatter_bytes` per call;
    `checkpoint` what full recomputation reruns (`kernels.CHECKPOINTS`); `scatter_copy_bytes` what a
    reduce-scatter left to NCCL copies laying out its buffer."""
    tokens = layout.micro_batch * layout.seq_len / layout.cp
    passes = ("forward", "backward") + (("recompute",) if layout.recompute == "full" else ())
    async_tp = layout.tp_overlap == "async_tp"
    out: list[TpPiece] = []
    for k, (col, row, n) in enumerate(_regions(model, layout, start, stop)):
        ends_layer = k > 0   # the MLP and shared-expert regions end their layers; attention does not
        for p in passes:
            if p == "backward":   # all-gather of dY before the row GEMM's dgrad; reduce-scatter after the column's
                out.append(TpPiece("all_gather", p, gather_bytes, tokens * row, "decomposed", n))
                out.append(TpPiece("reduce_scatter", p, scatter_bytes, tokens * col, "exposed" if async_tp else "bulk",
                                   n, scatter_copy_bytes if async_tp else 0.0))
            else:
                out.append(TpPiece("all_gather", p, gather_bytes, tokens * col, "decomposed", n))
                if not (p == "recompute" and ends_layer and checkpoint == "non-reentrant"):
                    out.append(TpPiece("reduce_scatter", p, scatter_bytes, tokens * row, "decomposed", n))
    return out


def piece_exposed_s(piece: TpPiece, tp: int, comm_s: float, rate: float, chunk_rate: float, mem_Bps: float,
                    hop_s: float) -> float:
    """Exposed seconds of one call of `piece`: `comm_s` the collective alone, `rate` / `chunk_rate` the GEMM's
    FLOP/s at its full shape and at one chunk's (module docstring)."""
    if piece.how == "exposed":
        return comm_s + piece.copy_bytes / mem_Bps
    gemm = piece.gemm_flops / rate
    if piece.how == "bulk":
        return max(0.0, comm_s - gemm)
    g = piece.gemm_flops / tp / chunk_rate
    c = comm_s / (tp - 1)
    t = max(tp * g, g + (tp - 1) * c)
    shard = piece.nbytes / tp
    # all-gather: the local shard copied into the symmetric buffer; reduce-scatter: tp partials summed into one
    extra = 2 * shard / mem_Bps if piece.collective == "all_gather" else (tp + 1) * shard / mem_Bps
    return max(0.0, t - gemm) + extra + tp * hop_s


def exposed_s(pieces: list[TpPiece], tp: int, comm_s: Callable[[str, float], float],
              rate_at: Callable[[float], float], rows: float, mem_Bps: float, hop_s: float) -> float:
    """Exposed seconds of all `pieces` per micro-batch: `comm_s(collective, nbytes)` times one call alone,
    `rate_at(rows)` is the GEMM FLOP/s with that many rows (`rows`: the full GEMM's)."""
    rate, chunk = rate_at(rows), rate_at(rows / tp)
    return sum(p.count * piece_exposed_s(p, tp, comm_s(p.collective, p.nbytes), rate, chunk, mem_Bps, hop_s)
               for p in pieces)
