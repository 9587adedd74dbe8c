"""Mixture-of-experts mechanisms beside the expert GEMMs: routing, token permutation, the token dispatcher, load
imbalance and the bytes a dispatch sends inside and across servers.

Per MoE layer and pass (forward or backward) on one GPU, with ``T`` tokens, ``k`` experts per token and hidden
size ``h`` (``T k`` routed tokens, ``T k h`` routed elements):

- **router**: a softmax and a top-k over ``T x E`` scores, memory-bound (read and written at the elementwise HBM
  rate); its ``h E`` GEMM is already in the model FLOPs;
- **permute / unpermute**: gathering the routed tokens into expert order before the dispatch and scattering them
  back after the combine, each reading and writing ``T k h`` elements. An eager indexing gather moves
  `PERMUTE_INDEXING_FRACTION` of the HBM bandwidth (measured: ~0.95 TB/s on one H200, issue 58 of this
  project); a fused permute kernel (Megatron ``--moe-permute-fusion``) the elementwise rate;
- **sort by local expert**: with more than one expert per rank, Megatron's all-to-all dispatcher sorts the
  received tokens by local expert after the dispatch and restores their order before the combine (Megatron-Core
  core_v0.15.0 ``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` lines 667-698
  "Permutation 2" and ``combine_preprocess`` lines 713-732 "Unpermutation 2": ``sort_chunks_by_idxs``, a
  split-and-concatenate copy or Transformer Engine's fused one), each reading and writing ``T k h`` elements at
  the elementwise HBM rate; the backward pass copies their gradients back the same way;
- **token dispatcher**: what a dropless dispatch costs beyond these (token counts per expert, the device-to-host
  copy of the split sizes, chunk sorting; not measured apart yet) is ``T k h / rate`` per pass, the rate a constant of
  the dispatcher kind (`DISPATCHERS`) fitted on the fitting half of the published registry
  (``python -m ringflow.workload.fitting``); 0 leaves the term out;
- **host wait**: a dropless dispatcher copies the routing's token counts to the host and waits for them once per
  MoE layer forward (Megatron-Core core_v0.15.0 ``token_dispatcher.py``: the all-to-all dispatcher syncs at
  ``before_ep_alltoall``, line 524, with ``self.d2h_event.synchronize()``, line 859; HybridEP, 3df200905e, lines
  950-954: an unknown dispatched / permuted token count "will cause a CPU sync"). The host cannot queue work
  past that point, so the GPU waits for it to launch the rest of the layer: a MoE layer's forward takes at least
  the host's time for it, ``host_s`` per dispatcher kind, fitted like the rate (`host_wait_s`); 0 leaves it
  out. Padding to a capacity (``capacity_factor``) makes the counts static: no wait;
- **expert GEMMs**: Transformer Engine's ``GroupedLinear`` (what Megatron-Core's ``TEGroupedMLP`` calls with
  ``moe_grouped_gemm``) runs one cuBLAS GEMM per local expert, round-robin over 4 compute streams, on Hopper and
  Blackwell alike (TE v2.9 and v2.10 ``cublaslt_gemm.cu`` ``nvte_multi_tensor_gemm`` ->
  ``multi_stream_cublas_gemm``; the one grouped kernel, CUTLASS, is Hopper-only, BF16/FP16 only and off unless
  ``NVTE_USE_CUTLASS_GROUPED_GEMM`` is set). Each expert's GEMM has `rows_per_expert` rows, so the GEMM
  efficiency curve (``compute.EfficiencyModel.gemm_efficiency``) is read at those rows, not at the
  micro-batch's tokens. Its FP8 operands are quantized per expert (``split_quantize``): per-tensor current
  scaling launches four kernels per expert and quantization (zero amax, amax, scale, cast), MXFP8 one;
  their host time is part of the fitted ``host_s`` below (no sourced per-launch time);
- **imbalance**: ``expert_imbalance`` (the busiest expert's load over the balanced load, >= 1) multiplies the
  busiest rank's expert GEMMs and what it receives; published MoE benchmarks force-balance tokens (1.0).

`dispatch_bytes` splits one rank's dispatch over NVLink and the network: a flat all-to-all sends each routed
copy to its expert's rank; a hierarchical dispatch (DeepEP, HybridEP) sends a token once to each destination
server, at most ``node_limit`` servers (DeepSeek-V3's node-limited routing: 4), and fans it out over NVLink there.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

DISPATCHERS = ("alltoall", "flex")   # Megatron's all-to-all dispatcher; the flex one (DeepEP / HybridEP)
# One H200, torch index_select / index_add over routed tokens: ~0.95 TB/s of 4.8 TB/s HBM (issue 58, measured).
PERMUTE_INDEXING_TBps = 0.95
PERMUTE_INDEXING_HBM_TBps = 4.8
PERMUTE_INDEXING_FRACTION = PERMUTE_INDEXING_TBps / PERMUTE_INDEXING_HBM_TBps
ACT_BYTES = 2


@dataclass(frozen=True)
class MoeLayerCost:
    """Seconds per MoE layer and pass beside the expert GEMMs and the all-to-all."""

    router_s: float
    permute_s: float
    dispatcher_s: float
    sort_s: float = 0.0   # sorting the received tokens by local expert and back (all-to-all dispatcher)

    @property
    def total_s(self) -> float:
        """Router + permute/unpermute + sort by local expert + dispatcher."""
        return self.router_s + self.permute_s + self.sort_s + self.dispatcher_s


def check_dispatcher(name: str) -> str:
    """The dispatcher kind, or a ConfigError naming the known ones."""
    if name not in DISPATCHERS:
        raise ConfigError(f"ep_dispatcher={name!r}", f"use one of {', '.join(DISPATCHERS)}")
    return name


def layer_cost(tokens: float, top_k: int, hidden: int, experts: int, mem_Bps: float, hbm_Bps: float,
               dispatch_eps: float = 0.0, fused_permute: bool = True, sort_local: bool = False) -> MoeLayerCost:
    """Router, permute/unpermute, sort and dispatcher seconds of one MoE layer in one pass on one GPU.

    `tokens` on the GPU (after TP's sequence split), `mem_Bps` the elementwise HBM rate, `hbm_Bps` the HBM peak,
    `dispatch_eps` the dispatcher's routed elements per second (0: not modelled), `sort_local` whether the
    received tokens are sorted by local expert and back (the all-to-all dispatcher with several local experts)."""
    if tokens < 0 or top_k < 1 or hidden < 1 or experts < 1 or mem_Bps <= 0 or hbm_Bps <= 0:
        raise ConfigError(f"MoE layer cost of tokens={tokens}, top_k={top_k}, hidden={hidden}, experts={experts}",
                          "give non-negative tokens and positive sizes and bandwidths")
    routed = tokens * top_k * hidden
    router = 3 * tokens * experts * 4 / mem_Bps            # fp32 scores: written, read by softmax + top-k, written
    rate = mem_Bps if fused_permute else hbm_Bps * PERMUTE_INDEXING_FRACTION
    permute = 2 * (2 * routed * ACT_BYTES) / rate          # permute and unpermute, each reads and writes T k h
    dispatcher = routed / dispatch_eps if dispatch_eps > 0 else 0.0
    sort = 2 * (2 * routed * ACT_BYTES) / mem_Bps if sort_local else 0.0   # sort and restore, each read + write
    return MoeLayerCost(router, permute, dispatcher, sort)


def rows_per_expert(tokens: float, top_k: int, ep: int, experts: int, expert_tp: int = 1) -> float:
    """Rows of one local expert's GEMM under balanced routing: the `tokens` a GPU routes (after TP's sequence
    split) x `top_k` copies, gathered from the `ep` x `expert_tp` ranks that share the experts, over `experts`."""
    if tokens <= 0 or top_k < 1 or ep < 1 or experts < 1 or expert_tp < 1:
        raise ConfigError(f"rows per expert of tokens={tokens}, top_k={top_k}, ep={ep}, experts={experts}, "
                          f"expert_tp={expert_tp}", "give positive tokens and sizes")
    return tokens * top_k * ep * expert_tp / experts


def host_wait_s(layer_fwd_s: float, host_s: float) -> float:
    """Seconds a MoE layer's forward waits for the host beyond its GPU time `layer_fwd_s`: the host needs
    `host_s` to launch a layer whose token counts it has just waited for (0 when the GPU is the slower)."""
    if layer_fwd_s < 0 or host_s < 0:
        raise ConfigError(f"host wait of a layer of {layer_fwd_s} s on the GPU, {host_s} s on the host",
                          "give non-negative seconds")
    return max(0.0, host_s - layer_fwd_s)


def dispatch_bytes(tokens: float, top_k: int, hidden: int, ep: int, per_server: int, hierarchical: bool,
                   node_limit: int = 0, imbalance: float = 1.0) -> tuple[float, float]:
    """(NVLink bytes, network bytes) one rank sends in one dispatch (the combine returns the same).

    `ep` ranks in the group, `per_server` of them in each server; a routed copy goes to a uniformly chosen expert
    rank. Flat: the copies for other ranks of this server go over NVLink, the rest over the network. Hierarchical:
    a token crosses the network once per other server holding one of its experts (expected distinct servers
    among `top_k` picks, capped by `node_limit`), then fans out over NVLink."""
    if ep < 1 or per_server < 1 or ep % per_server or imbalance < 1.0:
        raise ConfigError(f"dispatch over ep={ep} with {per_server} ranks per server, imbalance {imbalance}",
                          "give ep a multiple of the ranks per server and an imbalance >= 1")
    row = hidden * ACT_BYTES
    copies = tokens * top_k * imbalance
    servers = ep // per_server
    local = copies * (per_server - 1) / ep * row
    if not hierarchical or servers == 1:
        return local, copies * (ep - per_server) / ep * row
    picks = min(top_k, node_limit) if node_limit else top_k
    distinct = servers * (1.0 - (1.0 - 1.0 / servers) ** picks)   # expected servers a token's experts span
    remote_servers = distinct * (servers - 1) / servers
    fanout = copies * (ep - per_server) / ep * row                 # copies delivered inside remote servers
    return local + fanout, tokens * imbalance * remote_servers * row
