"""The collectives one GPU of a pipeline stage issues per micro-batch: one list for step time and traffic.

Per micro-batch (``T = b s / cp`` tokens on the GPU, activations ``A = T h x 2`` B, passes = forward + backward,
+1 forward with full recomputation):

- **TP** (tp > 1): one region per attention block, per dense MLP and per MoE layer with shared experts; each
  region per pass is one all-reduce of A (Megatron), or with sequence parallelism an all-gather + a
  reduce-scatter of A (the same bytes; activations between regions are then split by TP). A run that trains
  in FP8 all-gathers the FP8 GEMM operand, one byte an element: Transformer Engine quantizes before it
  gathers (``pytorch/distributed.py`` ``gather_along_first_dim`` -> ``_all_gather_fp8`` under delayed and
  current scaling; ``module/base.py`` ``grad_output_preprocess`` gathers the output gradient with its
  quantizer), and so does torchao's Float8 TP (torchtitan 9dec370 ``parallelize_llama.py`` lines 148-161 pick
  ``PrepareFloat8ModuleInput``, whose cast "happens before the all-gather", and ``Float8RowwiseParallel``, which
  casts the output gradient before backward's all-gather: torchao ``float8/float8_tensor_parallel.py``);
  the reduce-scatters carry the GEMMs' BF16 outputs. With ``overlap_tp`` the TP calls hide under their
  GEMMs as `tpoverlap` prices them. Where full recomputation reruns only what backward needs (a kernel profile's
  ``checkpoint: non-reentrant``, `kernels`), the recompute pass leaves out the collective that ends each layer:
  the MLP's (or shared experts') reduce-scatter or all-reduce. Where sequence parallelism shards the second
  activation dimension (a kernel profile's ``sequence_dim: 1``, PyTorch DTensors of (b, s, h)), each all-gather
  and reduce-scatter also copies its whole buffer through HBM (``copy_bytes``: read and written once, `kernels`);
- **EP** (ep > 1, MoE layers): a dispatch and a combine all-to-all per pass, each rank's send buffer
  ``T/tp x top_k x h x 2`` B (x the capacity factor when padded, x the expert imbalance: the busiest rank
  receives that much more; tokens are split over TP ranks before dispatch); the fraction ``(ep-1)/ep`` of it
  leaves the rank; with ``overlap_ep`` hidden under compute; a non-reentrant recompute reruns the dispatch,
  not the combine that ends the layer;
- **ETP** (expert TP > 1, MoE layers): the dispatched tokens all-gathered over the expert-TP group before the
  experts and reduce-scattered after, per pass (exposed: no TP-overlap decomposition of the grouped expert
  GEMMs is modelled);
- **CP** (cp > 1, every layer): ``p2p`` ring attention passes this rank's K and V (``T x (k d_qk + k d_v) x 2 / tp``
  B, k = kv heads) to the next rank cp-1 times forward, and K, V plus dK, dV backward (2 (cp-1)), hidden under
  the attention compute; ``a2a`` (Ulysses) all-to-alls Q, K, V before attention and the output after, per pass;
  ``allgather`` (Llama 3) all-gathers K, V forward and reduce-scatters dK, dV backward;
- **PP** (pp > 1): one activation send forward and one gradient send back per virtual stage, ``A / tp``
  (Megatron's scatter/gather over TP ranks).

``nbytes`` follows `commmodel`: an all-gather's output, a reduce-scatter's input, an all-to-all's send buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .kernels import CHECKPOINTS
from .layout import Layout
from .models import ModelSpec

ACT_BYTES = 2
FP8_BYTES = 1
_WIRE = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}


@dataclass(frozen=True)
class CommCall:
    """`calls` collectives of one kind per micro-batch on one GPU."""

    dim: str            # tp, etp, ep, cp, pp
    collective: str
    nbytes: float       # buffer per call (commmodel convention)
    calls: float
    group: int          # group size
    hides_under: str = ""   # "gemm" (TP overlap, `tpoverlap`), "attention" (ring attention), "compute" (EP overlap)
    forward_share: float = 0.5  # the share of `calls` in the forward pass (the rest: backward)
    copy_bytes: float = 0.0     # HBM bytes per call that lay the buffer out for the collective (`kernels`)

    @property
    def wire_bytes(self) -> float:
        """Bytes this GPU sends for all `calls` (a ring's share; an all-to-all's part leaving the rank)."""
        return self.calls * self.nbytes * _WIRE[self.collective](self.group)


def stage_calls(model: ModelSpec, layout: Layout, stage: int, checkpoint: str = "reentrant",
                sequence_dim: int = 0) -> list[CommCall]:
    """Every collective one GPU of pipeline stage `stage` issues per micro-batch (see module docstring);
    `checkpoint` ('reentrant' or 'non-reentrant', `kernels.CHECKPOINTS`) says what full recomputation reruns,
    `sequence_dim` (0 or 1) which activation dimension sequence parallelism shards."""
    if checkpoint not in CHECKPOINTS:
        raise InvalidArgument(f"checkpoint={checkpoint!r}", f"use one of {', '.join(CHECKPOINTS)}")
    if sequence_dim not in (0, 1):
        raise InvalidArgument(f"sequence_dim={sequence_dim!r}", "use 0 ([s, b, h]) or 1 ((b, s, h))")
    L = layout
    start, stop = L.stage_ranges(model)[stage]
    n_layers = stop - start
    n_moe = sum(1 for i in range(start, stop) if model.is_moe_layer(i))
    n_dense = n_layers - n_moe
    tokens = L.micro_batch * L.seq_len / L.cp
    act = tokens * model.hidden * ACT_BYTES
    passes = 2 + (1 if L.recompute == "full" else 0)
    # a non-reentrant recompute stops at the layer's last saved tensor: the collective ending the layer is left
    ends = 1 if L.recompute == "full" and checkpoint == "non-reentrant" else 0
    out: list[CommCall] = []
    if L.tp > 1:
        regions = n_layers + n_dense + (n_moe if model.shared_experts else 0)
        scatters = regions * passes - ends * (regions - n_layers)   # the MLP regions end their layers
        if L.sequence_parallel:
            gather = act * FP8_BYTES / ACT_BYTES if L.precision == "fp8" else act
            out += [CommCall("tp", "all_gather", gather, regions * passes, L.tp, "gemm",
                             copy_bytes=2 * gather * sequence_dim),
                    CommCall("tp", "reduce_scatter", act, scatters, L.tp, "gemm", copy_bytes=2 * act * sequence_dim)]
        else:
            out.append(CommCall("tp", "all_reduce", act, scatters, L.tp))
    pad = L.capacity_factor or 1.0
    routed = tokens / L.tp * model.top_k * pad * L.expert_imbalance * model.hidden * ACT_BYTES
    if n_moe and L.ep > 1:
        out.append(CommCall("ep", "all_to_all", routed, (2 * passes - ends) * n_moe, L.ep, "compute"))
    if n_moe and L.expert_tp > 1:
        gathered = routed * L.expert_tp
        out += [CommCall("etp", "all_gather", gathered, passes * n_moe, L.expert_tp),
                CommCall("etp", "reduce_scatter", gathered, passes * n_moe, L.expert_tp)]
    if L.cp > 1:
        out += _cp_calls(model, L, n_layers, tokens)
    if L.pp > 1:
        out.append(CommCall("pp", "sendrecv", act / L.tp, 2 * L.interleave, 2))
    return out


def _cp_calls(model: ModelSpec, L: Layout, n_layers: int, tokens: float) -> list[CommCall]:
    kv_split = min(L.tp, model.kv_heads)  # K/V heads per TP rank (replicated when fewer heads than ranks)
    kv = tokens * (model.kv_hidden + model.v_width) * ACT_BYTES / kv_split
    rec = 1 if L.recompute == "full" else 0
    if L.cp_comm == "p2p":
        return [CommCall("cp", "sendrecv", kv, (3 + rec) * (L.cp - 1) * n_layers, 2, "attention", 1 / 3)]
    if L.cp_comm == "a2a":
        qkv = tokens * (model.q_width / L.tp + (model.kv_hidden + model.v_width) / kv_split) * ACT_BYTES
        o = tokens * model.heads * model.v_dim / L.tp * ACT_BYTES
        return [CommCall("cp", "all_to_all", qkv, (2 + rec) * n_layers, L.cp),
                CommCall("cp", "all_to_all", o, (2 + rec) * n_layers, L.cp)]
    return [CommCall("cp", "all_gather", kv * L.cp, (1 + rec) * n_layers, L.cp, "", 1.0),
            CommCall("cp", "reduce_scatter", kv * L.cp, n_layers, L.cp, "", 0.0)]
