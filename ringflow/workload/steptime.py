"""Step time of one training iteration: compute, exposed communication per dimension, pipeline bubble.

Per micro-batch on every pipeline stage i (uneven splits, dense/MoE layers, embedding and logits on the ends):

    t_i = forward + backward + recompute                 (compute.py)
        + TP exposed: the TP regions' all-reduces (or all-gather + reduce-scatter with sequence parallelism);
          with ``overlap_tp`` each collective decomposed into per-rank chunks beside its GEMM, or overlapped in
          bulk, or left exposed, as the implementation (``tp_overlap``) runs it (`tpoverlap.py`)
        + CP exposed: ring attention's K/V passes hidden under the attention compute (p2p), or the Ulysses
          all-to-alls / Llama-3 all-gathers (exposed)
        + EP exposed: dispatch + combine all-to-all per MoE layer and pass, sized from the routing (a flex
          dispatcher across servers: hierarchical, one network copy per destination server); the
          expert-TP all-gather / reduce-scatter of the dispatched tokens (with TP overlap like TP); with
          ``overlap_ep`` the all-to-alls hide under another micro-batch's compute (DualPipe-style, Megatron's
          combined 1F1B), exposed beyond it and in the warm-up and cool-down, where a forward or a backward runs
          alone (`ep_overlap_share`)
        + PP: one activation send forward and one gradient send backward per virtual stage
        + with pipelining and ZeRO-3 per block (``fsdp_units: per_block``, PyTorch FSDP): the post-backward
          accumulation of the stage's unsharded gradients in the reduce dtype (`fsdp.accumulate_s`)
      (the collectives come from `layercomm.stage_calls`, the same list the traffic figures use)

    pipeline = (m + (p-1)/v) x max_i t_i   (the slowest stage paces 1F1B; bubble share (p-1)/(m v + p - 1))
    DP exposed = max(last bucket, t_dp - backward of the last micro-batch)  with ``overlap_grad_reduce``
                 (all of t_dp without); dense gradients over the DP group, expert gradients over the
                 expert-DP group; ZeRO-1/2 add the parameter all-gather after the optimizer (hidden under the
                 next forward with ``overlap_param_gather``); ZeRO-3 gathers parameters forward and backward and
                 reduce-scatters gradients per micro-batch, hidden under its compute; ZeRO-3 applied per block
                 and to the root (``fsdp_units: per_block``, PyTorch FSDP as torchtitan runs it) as `fsdp.py`
                 prices it
    step = pipeline + DP exposed + optimizer (memory-bound update of the local parameters)

Outputs: breakdown in seconds (``moe_dispatch``: the MoE router, permute, token dispatcher and host wait of
`moe.py`, apart from the rest of the compute), MFU against the BF16 or the FP8 dense peak (``mfu_peak``; model
FLOPs: 3 x forward per token), HFU (+ recomputation and padded expert slots), tokens/s, time to train on a token
budget, network-wait fraction (exposed communication / step), and the scale factor T_n/(n T).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from .commmodel import AlphaBetaModel, CommModel
from .compute import (
    EfficiencyModel,
    GpuSpec,
    MicrobatchTimes,
    efficiency_for,
    gpu_of_topology,
    in_training,
    microbatch_times,
)
from .context_parallel import stage_calls_for, stage_ring_exposed_s, uses_torch_ring
from .kernels import kernel_profile
from .layercomm import CommCall
from .layout import Layout, expert_groups, group_endpoints, rank_groups, rank_of
from .memory import OPTIMIZER_BYTES, MemoryBreakdown, memory_per_gpu, stage_param_split, stage_params
from .models import ModelSpec

ACT_BYTES = 2  # bf16 activations on the wire
MFU_PEAKS = ("bf16", "fp8")


@dataclass
class StepResult:
    """Everything `ringflow train` prints."""

    model: str
    layout: Layout
    gpu: str
    step_time_s: float
    breakdown: dict[str, float]
    memory: MemoryBreakdown
    tokens_per_s: float
    mfu: float
    hfu: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    network_wait_fraction: float
    bubble_fraction: float
    comm_bytes_per_step: dict[str, float] = field(default_factory=dict)
    comm_model: str = "alpha-beta"
    contention: dict[str, float] = field(default_factory=dict)
    mfu_peak: str = "bf16"              # which dense peak MFU and HFU are measured against
    peak_tflops: float = 0.0            # that peak, per GPU
    slowest_stage: int = 0              # the pipeline stage that paces the step
    stage_times_s: list[float] = field(default_factory=list)  # per micro-batch, every stage
    software: str = ""

    def time_to_train_s(self, tokens: float) -> float:
        """Seconds to train on `tokens` tokens at this rate."""
        return tokens / self.tokens_per_s

    def to_dict(self, token_budget: float | None = None) -> dict[str, Any]:
        """The --json object of `ringflow train`."""
        d = {"model": self.model, "gpu": self.gpu, "gpus": self.layout.gpus, "layout": self.layout.to_dict(),
             "step_time_s": self.step_time_s, "breakdown": dict(self.breakdown),
             "tflops_per_gpu": self.tflops_per_gpu, "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
             "mfu": self.mfu, "hfu": self.hfu, "mfu_peak": self.mfu_peak, "peak_tflops": self.peak_tflops,
             "tokens_per_s": self.tokens_per_s,
             "memory_per_gpu_bytes": self.memory.total_bytes, "memory": self.memory.to_dict(),
             "fits_in_memory": self.memory.fits, "network_wait_fraction": self.network_wait_fraction,
             "bubble_fraction": self.bubble_fraction, "comm_bytes_per_step": dict(self.comm_bytes_per_step),
             "comm_model": self.comm_model, "contention": dict(self.contention),
             "slowest_stage": self.slowest_stage, "stage_times_s": list(self.stage_times_s),
             "software": self.software}
        if token_budget:
            d["token_budget"] = token_budget
            d["time_to_train_s"] = self.time_to_train_s(token_budget)
            d["time_to_train_days"] = self.time_to_train_s(token_budget) / 86400.0
        return d


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of the pipeline's time lost to fill and drain: (p-1)/(m v + p - 1); 1F1B (v=1): (p-1)/(m+p-1)."""
    if p < 1 or m < 1 or v < 1:
        raise InvalidArgument(f"p={p}, m={m}, v={v} must be >= 1")
    return (p - 1) / (m * v + p - 1)


@dataclass
class _Stage:
    mb: MicrobatchTimes
    comm: dict[str, float]      # exposed seconds per dimension, per micro-batch
    calls: list[CommCall]
    accumulate_s: float = 0.0   # FSDP's unsharded gradient accumulation per micro-batch (`fsdp.accumulate_s`)

    @property
    def total_s(self) -> float:
        return self.mb.total_s + sum(self.comm.values()) + self.accumulate_s


def _accumulate_s(model: ModelSpec, L: Layout, stage: int, gpu: GpuSpec, eff: EfficiencyModel) -> float:
    """FSDP's per-micro-batch gradient accumulation on pipeline stage `stage` (0 unless ZeRO-3 per block)."""
    if L.zero != 3 or L.fsdp_units != "per_block" or L.pp == 1:
        return 0.0
    from .fsdp import accumulate_s, stage_units
    units = stage_units(model, L, stage, *stage_param_split(model, L, stage))
    return accumulate_s(units, L, eff.elementwise_Bps(gpu))


def _hierarchical_a2a_s(nbytes: float, grp: list[str], topo: Any, comm: CommModel, model: ModelSpec) -> float | None:
    """Seconds of one flex (DeepEP / HybridEP) dispatch or combine across servers: each token crosses the network
    once per other server holding one of its experts (at most the model's node limit), then fans out over NVLink
    (`moe.dispatch_bytes`); None where the group sits in one server or the model has no link table."""
    links = getattr(comm, "links", None)
    if links is None or len(grp) < 2:
        return None
    gl = links(grp, topo)
    if gl.servers < 2 or gl.n % gl.per_server:
        return None
    from .moe import dispatch_bytes
    tokens = nbytes / (model.top_k * model.hidden * ACT_BYTES)
    nv_b, net_b = dispatch_bytes(tokens, model.top_k, model.hidden, gl.n, gl.per_server, True, model.node_limit)
    return (gl.inter_hop_us + gl.intra_hop_us) * 1e-6 + max(nv_b / (gl.nvlink_GBps * 1e9), net_b / (gl.nic_GBps * 1e9))


def _gemm_rate(model: ModelSpec, L: Layout, gpu: GpuSpec, eff: EfficiencyModel, rows: float) -> float:
    """FLOP/s of a linear layer's GEMM with `rows` rows on this GPU, as `compute.microbatch_times` prices the
    linear layers (the efficiency curve at width hidden / tp; FP8 at its peak and factor)."""
    e = eff.gemm_efficiency(model.hidden / L.tp, rows) * eff.software_factor
    if L.precision == "fp8":
        e *= gpu.fp8_flops / gpu.bf16_flops * eff.fp8_gemm_factor
    return gpu.bf16_flops * e


def _tp_overlap_s(calls: list[CommCall], L: Layout, topo: Any, comm: CommModel, grp: list[str], f: Any,
                  model: ModelSpec, span: tuple[int, int], gpu: GpuSpec, eff: EfficiencyModel) -> float:
    """Exposed seconds of a stage's TP collectives per micro-batch under ``overlap_tp`` (`tpoverlap`)."""
    from .tpoverlap import exposed_s, tp_pieces
    nb = {c.collective: c.nbytes for c in calls if c.dim == "tp"}
    rs_copy = sum(c.copy_bytes for c in calls if c.dim == "tp" and c.collective == "reduce_scatter")
    pieces = tp_pieces(model, L, span[0], span[1], nb.get("all_gather", 0.0), nb.get("reduce_scatter", 0.0),
                       kernel_profile(eff.kernels).checkpoint, rs_copy)
    links = getattr(comm, "links", None)
    hop_s = links(grp, topo).intra_hop_us * 1e-6 if links is not None else 0.0
    rows = L.micro_batch * L.seq_len / L.cp
    return exposed_s(pieces, L.tp, lambda coll, nbytes: comm.time_s(coll, nbytes, grp, topo) * f("tp"),
                     lambda r: _gemm_rate(model, L, gpu, eff, r), rows, eff.elementwise_Bps(gpu), hop_s)


def _stage_time(calls: list[CommCall], mb: MicrobatchTimes, L: Layout, topo: Any, comm: CommModel,
                groups: dict[str, list[str]], f: Any, model: ModelSpec, span: tuple[int, int], gpu: GpuSpec,
                eff: EfficiencyModel) -> dict[str, float]:
    """Exposed communication seconds per dimension for one micro-batch of a stage (layers span[0]..span[1]-1)."""
    raw: dict[str, float] = {}
    hidden: dict[tuple[str, str], float] = {}  # (dimension, what it hides under) -> seconds
    if "cp" in groups and uses_torch_ring(L, eff.kernels):   # torch's ring attention prices its own exchange
        cp_grp = groups["cp"]
        raw["cp"] = stage_ring_exposed_s(model, L, gpu, eff, span, lambda coll, nb: comm.time_s(
            coll, nb, cp_grp[:2] if coll == "sendrecv" else cp_grp, topo) * f("cp"))
        calls = [c for c in calls if c.dim != "cp"]
    if L.overlap_tp and "tp" in groups:
        raw["tp"] = _tp_overlap_s(calls, L, topo, comm, groups["tp"], f, model, span, gpu, eff)
    for c in calls:
        if c.dim not in groups or (c.dim == "tp" and L.overlap_tp):
            continue
        grp = groups[c.dim][:2] if c.collective == "sendrecv" else groups[c.dim]  # a ring pass: neighbour pairs
        one = _hierarchical_a2a_s(c.nbytes, grp, topo, comm, model) \
            if c.dim == "ep" and L.ep_dispatcher == "flex" else None
        if one is None:
            one = comm.time_s(c.collective, c.nbytes, grp, topo)
        s = c.calls * (one * f("tp" if c.dim == "etp" else c.dim) + c.copy_bytes / eff.elementwise_Bps(gpu))
        key = "ep" if c.dim == "etp" else c.dim
        under = c.hides_under
        if under == "attention" or (under == "compute" and L.overlap_ep):
            hidden[(key, under)] = hidden.get((key, under), 0.0) + s
        else:
            raw[key] = raw.get(key, 0.0) + s
    for (key, under), s in hidden.items():
        if under == "attention":
            exposed = max(0.0, s - mb.attention_s)
        else:   # EP overlap: only the steady phase pairs a forward with a backward
            share = ep_overlap_share(L)
            exposed = (1.0 - share) * s + max(0.0, share * s - mb.total_s)
        raw[key] = raw.get(key, 0.0) + exposed
    return {k: raw.get(k, 0.0) for k in ("tp", "cp", "ep", "pp")}


def ep_overlap_share(layout: Layout) -> float:
    """The share of the micro-batches whose EP all-to-alls `overlap_ep` can hide: Megatron's combined 1F1B runs
    the first forward and the last backward alone (core_v0.15.0 ``combined_1f1b.py`` lines 51 and 93) and, with
    pipelining, all its warm-up forwards and cool-down backwards: ``(p - 1) x 2 + (v - 1) x p + 1`` of the ``m v``
    model-chunk micro-batches on the first stage, the most of any (``schedules.py`` lines 728-734, the micro-batch
    group per virtual stage at its default p); ``p - 1 + 1`` without interleaving."""
    p, v = layout.pp, layout.interleave
    if p == 1:
        alone = 1
    elif v > 1:
        alone = (p - 1) * 2 + (v - 1) * p + 1
    else:
        alone = p
    return max(0.0, 1.0 - alone / (layout.microbatches * v))


def _comm_groups(model: ModelSpec, L: Layout, topo: Any) -> dict[str, list[str]]:
    """Endpoints of the first TP, CP, EP and expert-TP group and of the first PP pair (stages 0 and 1)."""
    ranks = {"tp": tuple(rank_of(L, t, 0, 0, 0) for t in range(L.tp)),
             "cp": tuple(rank_of(L, 0, c, 0, 0) for c in range(L.cp)),
             "ep": tuple(j * L.expert_tp for j in range(L.ep))}   # = first_groups(L), without its DP group
    groups = {d: group_endpoints(topo, ranks[d]) for d in ("tp", "cp", "ep") if getattr(L, d) > 1}
    if L.expert_tp > 1 and model.is_moe:
        groups["etp"] = group_endpoints(topo, expert_groups(L)["etp"])
    if L.pp > 1:
        groups["pp"] = group_endpoints(topo, (rank_of(L, 0, 0, 0, 0), rank_of(L, 0, 0, 0, 1)))
    return groups


def _stage_key(model: ModelSpec, L: Layout, i: int, a: int, b: int) -> tuple:
    """Stages with equal keys (layers, MoE layers, FLOPs, ends) cost the same per micro-batch."""
    n_moe = sum(1 for j in range(a, b) if model.is_moe_layer(j))
    return (b - a, n_moe, model.span_flops_per_token(L.seq_len, a, b), i == 0, i == L.pp - 1)


def _pipeline_stages(model: ModelSpec, L: Layout, topo: Any, gpu: GpuSpec, comm: CommModel, eff: EfficiencyModel,
                     f: Any, groups: dict[str, list[str]]) -> list[_Stage]:
    """Compute and exposed communication per micro-batch of every pipeline stage (alike stages computed once)."""
    stages: list[_Stage] = []
    seen: dict[tuple, _Stage] = {}
    for i, (a, b) in enumerate(L.stage_ranges(model)):
        key = _stage_key(model, L, i, a, b)
        st = seen.get(key)
        if st is None:
            mb = microbatch_times(model, L, gpu, eff, stage=i)
            calls = stage_calls_for(model, L, i, eff.kernels)
            st = seen[key] = _Stage(mb, _stage_time(calls, mb, L, topo, comm, groups, f, model, (a, b), gpu, eff),
                                    calls, _accumulate_s(model, L, i, gpu, eff))
        stages.append(st)
    return stages


def slowest_compute(model: ModelSpec, layout: Layout, gpu: GpuSpec, eff: EfficiencyModel | None = None
                    ) -> tuple[int, float]:
    """(stage, compute seconds per micro-batch) of the pipeline stage computing longest (forward, backward and
    recompute, no communication; the first of equals)."""
    e = eff or EfficiencyModel()
    seen: dict[tuple, float] = {}
    best = (0, -1.0)
    for i, (a, b) in enumerate(layout.stage_ranges(model)):
        key = _stage_key(model, layout, i, a, b)
        if key not in seen:
            seen[key] = microbatch_times(model, layout, gpu, e, stage=i).total_s
            if seen[key] > best[1]:
                best = (i, seen[key])
    return best


def stage_bound_s(model: ModelSpec, layout: Layout, topo: Any, *, gpu: GpuSpec, comm: CommModel,
                  eff: EfficiencyModel | None = None, stage: int | None = None) -> float:
    """Seconds per micro-batch of the stage that paces the pipeline (compute, exposed TP, CP, EP and PP), or of
    pipeline stage `stage` alone (never more than the pacing stage's).

    ``(microbatches + (pp - 1) / interleave)`` times this is at most `step_time`'s pipeline, a lower bound of its
    step (the DP exposure and the optimizer add to it); it reads no ZeRO figure, and the DP degree only where the
    first PP pair sits."""
    layout.check_model(model)
    e = eff or EfficiencyModel()
    groups = _comm_groups(model, layout, topo)
    if stage is None:
        return max(s.total_s for s in _pipeline_stages(model, layout, topo, gpu, comm, e, lambda dim: 1.0, groups))
    mb = microbatch_times(model, layout, gpu, e, stage=stage)
    calls = stage_calls_for(model, layout, stage, e.kernels)
    span = layout.stage_ranges(model)[stage]
    return _Stage(mb, _stage_time(calls, mb, layout, topo, comm, groups, lambda dim: 1.0, model, span, gpu, e),
                  calls, _accumulate_s(model, layout, stage, gpu, e)).total_s


def step_time(model: ModelSpec, layout: Layout, topo: Any, *, gpu: GpuSpec | None = None,
              comm: CommModel | None = None, eff: EfficiencyModel | None = None,
              reserve_bytes: float | None = None, contention: bool = False, mfu_peak: str = "bf16",
              software: str | None = None) -> StepResult:
    """Predict one training step of `model` split by `layout` on `topo` (see module docstring).

    `mfu_peak` ('bf16' or 'fp8') is the dense peak MFU/HFU are reported against; `software` names an
    efficiency profile (compute.SOFTWARE_PROFILES) when `eff` is not given. With `contention`, every
    dimension's communication is scaled by the slowdown the simulator's flow engine finds when all of that
    dimension's groups communicate at once (`contention.py`).
    """
    layout.check_model(model)
    if mfu_peak not in MFU_PEAKS:
        raise InvalidArgument(f"mfu_peak={mfu_peak!r}", f"use one of {', '.join(MFU_PEAKS)}")
    gpu = gpu or in_training(gpu_of_topology(topo))
    comm = comm or AlphaBetaModel()
    if eff is None:
        eff = efficiency_for(software) if software else EfficiencyModel()
    L, p, v, m = layout, layout.pp, layout.interleave, layout.microbatches
    s_local = L.seq_len / L.cp
    act_bytes = L.micro_batch * s_local * model.hidden * ACT_BYTES  # one activation tensor b x s x h
    factors = _contention_factors(model, L, topo, act_bytes) if contention else {}
    f = lambda dim: factors.get(dim, 1.0)  # noqa: E731
    stages = _pipeline_stages(model, L, topo, gpu, comm, eff, f, _comm_groups(model, L, topo))
    times = [s.total_s for s in stages]
    slow = max(range(p), key=lambda i: (times[i], i))
    S = stages[slow]
    mb, t_mb = S.mb, S.total_s
    fill = (p - 1) / v
    pipeline = (m + fill) * t_mb

    t_dp_exposed, bytes_dp, t_opt = _data_parallel(model, L, topo, comm, gpu, eff, stages, f)
    step = pipeline + t_dp_exposed + t_opt
    c = S.comm
    breakdown = {"compute": m * (mb.forward_s + mb.backward_s - mb.moe_s), "moe_dispatch": m * mb.moe_s,
                 "recompute": m * mb.recompute_s,
                 "tp_exposed": (m + fill) * c["tp"], "cp_exposed": (m + fill) * c["cp"],
                 "ep_exposed": (m + fill) * c["ep"], "pp_p2p": (m + fill) * c["pp"],
                 "grad_accumulate": (m + fill) * S.accumulate_s,
                 "bubble": fill * mb.total_s, "dp_exposed": t_dp_exposed, "optimizer": t_opt}
    tokens = L.tokens_per_step
    model_flops = model.training_flops_per_token(L.seq_len) * tokens
    # recomputation (and padded expert) FLOPs: per micro-batch per GPU, times micro-batches, times GPUs
    hw_flops = model_flops + (mb.hardware_flops - mb.model_flops) * m * L.gpus
    net = sum(breakdown[k] for k in ("tp_exposed", "cp_exposed", "ep_exposed", "pp_p2p", "dp_exposed"))
    mem = memory_per_gpu(model, L, gpu.memory_bytes, **({} if reserve_bytes is None else
                                                          {"reserve_bytes": reserve_bytes}))
    peak = gpu.datasheet_flops(mfu_peak)
    wire: dict[str, float] = {"tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0}
    for call in S.calls:
        wire["ep" if call.dim == "etp" else call.dim] += m * call.wire_bytes
    return StepResult(
        model=model.name, layout=L, gpu=gpu.name, step_time_s=step, breakdown=breakdown, memory=mem,
        tokens_per_s=tokens / step, mfu=model_flops / (step * L.gpus * peak),
        hfu=hw_flops / (step * L.gpus * peak), tflops_per_gpu=model_flops / step / L.gpus / 1e12,
        hw_tflops_per_gpu=hw_flops / step / L.gpus / 1e12, network_wait_fraction=net / step,
        bubble_fraction=bubble_fraction(p, m, v), comm_bytes_per_step={**wire, "dp": bytes_dp},
        comm_model=getattr(comm, "name", type(comm).__name__), contention=factors, mfu_peak=mfu_peak,
        peak_tflops=peak / 1e12, slowest_stage=slow, stage_times_s=times, software=software or "")


def _data_parallel(model: ModelSpec, L: Layout, topo: Any, comm: CommModel, gpu: GpuSpec, eff: EfficiencyModel,
                   stages: list[_Stage], f: Any) -> tuple[float, float, float]:
    """(exposed DP seconds, DP bytes per rank, optimizer seconds) of the stage where they are largest."""
    dpg, edpg = _dp_groups(L, topo)
    best = (0.0, 0.0, 0.0)
    for i, (st, (a, b)) in enumerate(zip(stages, L.stage_ranges(model), strict=True)):
        if i and stages[i] is stages[i - 1] and i != L.pp - 1:
            continue  # same shape as the previous stage (parameters differ only on the ends)
        t_exp, nbytes, t_opt = _dp_stage(model, L, topo, comm, gpu, eff, st.mb, i, b - a, dpg, edpg, f)
        if t_exp + t_opt > best[0] + best[2]:
            best = (t_exp, nbytes, t_opt)
    return best


def _dp_groups(L: Layout, topo: Any) -> tuple[list[str], list[str]]:
    """Endpoints of the first DP group (= first_groups(L).dp[0]) and of the first expert-DP group."""
    step = rank_of(L, 0, 0, 1, 0) if L.dp > 1 else 1   # ranks 0, step, 2 step ...: rank_of(L, 0, 0, d, 0)
    dpg = group_endpoints(topo, tuple(range(0, step * L.dp, step))) if L.dp > 1 else []
    edpg = group_endpoints(topo, expert_groups(L)["edp"]) if L.expert_dp > 1 else []
    return dpg, edpg


def _dp_stage(model: ModelSpec, L: Layout, topo: Any, comm: CommModel, gpu: GpuSpec, eff: EfficiencyModel,
              mb: MicrobatchTimes, i: int, n_layers: int, dpg: list[str], edpg: list[str], f: Any
              ) -> tuple[float, float, float]:
    """(exposed DP seconds, DP bytes per rank, optimizer seconds) of pipeline stage i."""
    dense_p, expert_p = stage_param_split(model, L, i)
    t_exp, nbytes = 0.0, 0.0
    if L.zero == 3 and L.fsdp_units == "per_block" and len(dpg) > 1:
        from .fsdp import exposed_s, stage_units

        def over(grp: list[str]) -> Any:
            return lambda coll, nb: comm.time_s(coll, nb, grp, topo) * f("dp") if len(grp) > 1 else 0.0
        t_exp, nbytes = exposed_s(stage_units(model, L, i, dense_p, expert_p), L, mb, (over(dpg), over(edpg)),
                                  gpu.nccl_sm_share)
        nbytes *= (len(dpg) - 1) / len(dpg)
    else:
        for P, grp in ((dense_p, dpg), (expert_p, edpg)):
            if P and len(grp) > 1:
                te, nb = _dp_one(P, grp, L, topo, comm, mb, f, n_layers, gpu.nccl_sm_share)
                t_exp, nbytes = t_exp + te, nbytes + nb
    shard = dense_p / (L.dp * L.cp if L.zero >= 1 else 1) + expert_p / (L.expert_dp if L.zero >= 1 else 1)
    t_opt = shard * (2 * 2 + L.grad_bytes + 2 * OPTIMIZER_BYTES) / eff.elementwise_Bps(gpu)
    return t_exp, nbytes, t_opt


def stage_dp_s(model: ModelSpec, layout: Layout, topo: Any, *, gpu: GpuSpec, comm: CommModel,
               eff: EfficiencyModel | None = None, stage: int = 0) -> float:
    """Exposed DP seconds plus the optimizer step of pipeline stage `stage` alone: `step_time` adds the largest
    of these over its stages to the pipeline."""
    e = eff or EfficiencyModel()
    a, b = layout.stage_ranges(model)[stage]
    mb = microbatch_times(model, layout, gpu, e, stage=stage)
    t_exp, _, t_opt = _dp_stage(model, layout, topo, comm, gpu, e, mb, stage, b - a, *_dp_groups(layout, topo),
                                lambda dim: 1.0)
    return t_exp + t_opt


def _dp_one(P: float, grp: list[str], L: Layout, topo: Any, comm: CommModel, mb: MicrobatchTimes,
            f: Any, n_layers: int, sm_share: float = 0.0) -> tuple[float, float]:
    """Exposed seconds and bytes per rank of reducing (and gathering) P parameters' gradients over `grp`; a
    collective hidden under compute adds `sm_share` x its hidden time (the SMs its kernel holds, `fsdp.exposed_s`)."""
    n, m = len(grp), L.microbatches
    grad_b = P * L.grad_bytes
    param_b = P * 2
    bucket = min(L.bucket_bytes, grad_b)
    window = mb.backward_s + mb.recompute_s if L.overlap_grad_reduce else 0.0
    if L.zero == 0:
        t_red = comm.time_s("all_reduce", grad_b, grp, topo) * f("dp")
        last = comm.time_s("all_reduce", bucket, grp, topo) * f("dp")
        exposed = max(last, t_red - window) if L.overlap_grad_reduce else t_red
        return exposed + sm_share * (t_red - exposed), 2 * (n - 1) / n * grad_b
    if L.zero in (1, 2):
        t_red = comm.time_s("reduce_scatter", grad_b, grp, topo) * f("dp")
        last = comm.time_s("reduce_scatter", bucket, grp, topo) * f("dp")
        t_ag = comm.time_s("all_gather", param_b, grp, topo) * f("dp")
        ag_first = comm.time_s("all_gather", min(L.bucket_bytes / 2, param_b), grp, topo) * f("dp")
        exposed = (max(last, t_red - window) if L.overlap_grad_reduce else t_red) + \
            (ag_first if L.overlap_param_gather else t_ag)
        return exposed + sm_share * (t_red + t_ag - exposed), (n - 1) / n * (grad_b + param_b)
    # ZeRO-3 / FSDP: per micro-batch: gather params fwd + bwd, reduce-scatter grads
    per_mb = (2 * comm.time_s("all_gather", param_b, grp, topo) +
              comm.time_s("reduce_scatter", grad_b, grp, topo)) * f("dp")
    if L.overlap_param_gather:  # the first layer's gather is never hidden
        exposed_mb = max(0.0, per_mb - mb.total_s) + per_mb / max(n_layers, 1)
    else:
        exposed_mb = per_mb
    return m * (exposed_mb + sm_share * max(0.0, per_mb - exposed_mb)), m * (n - 1) / n * (2 * param_b + grad_b)


def _contention_factors(model: ModelSpec, L: Layout, topo: Any, act_bytes: float) -> dict[str, float]:
    """Per-dimension slowdown when all groups of the dimension communicate at once (flow engine)."""
    from .contention import dimension_factor
    g = rank_groups(L)
    eps = lambda ranks: group_endpoints(topo, ranks)  # noqa: E731
    out: dict[str, float] = {}
    if L.tp > 1:
        out["tp"] = dimension_factor(topo, "all_reduce", act_bytes, [eps(x) for x in g.tp])["factor"]
    if L.pp > 1:
        pairs = [eps((rank_of(L, t, c, d, 0), rank_of(L, t, c, d, 1)))
                 for d in range(L.dp) for c in range(L.cp) for t in range(L.tp)]
        out["pp"] = dimension_factor(topo, "sendrecv", act_bytes / L.tp, pairs)["factor"]
    if L.dp > 1:
        P = stage_params(model, L, L.pp - 1 if L.pp > 1 else 0)
        coll = "all_reduce" if L.zero == 0 else "reduce_scatter"
        out["dp"] = dimension_factor(topo, coll, P * L.grad_bytes, [eps(x) for x in g.dp])["factor"]
    if model.is_moe and L.ep > 1:
        a2a = act_bytes * model.top_k
        out["ep"] = dimension_factor(topo, "all_to_all", a2a, [eps(x) for x in g.ep])["factor"]
    return out


def scale_factors(model: ModelSpec, layout: Layout, topo_for: Any, dps: list[int], **kw: Any) -> list[dict[str, float]]:
    """The scale factor T_n/(n T) as data parallelism grows (weak scaling: batch per replica fixed).

    `topo_for(gpus)` returns a topology with at least that many GPUs. T is the throughput per GPU of the
    smallest run in `dps`; T_n the throughput of n GPUs.
    """
    rows = []
    per_replica = layout.global_batch // layout.dp
    base = None
    for d in sorted(dps):
        lay = layout.with_(dp=d, global_batch=per_replica * d)
        r = step_time(model, lay, topo_for(lay.gpus), **kw)
        if base is None:
            base = r.tokens_per_s / lay.gpus
        rows.append({"gpus": lay.gpus, "dp": d, "tokens_per_s": r.tokens_per_s, "step_time_s": r.step_time_s,
                     "scale_factor": r.tokens_per_s / (lay.gpus * base)})
    return rows
