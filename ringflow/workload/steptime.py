"""Step time of one training iteration: compute, exposed communication per dimension, pipeline bubble.

Per micro-batch on the slowest pipeline stage (the last one, which also computes the logits):

    t_mb = forward + backward + recompute             (compute.py)
         + TP exposed: 2 all-reduces per layer forward, 2 backward (+2 in a full-recompute forward); with
           sequence parallelism each all-reduce is a reduce-scatter + all-gather pair; hidden under GEMMs
           down to max(comm - gemm, comm/4) with ``overlap_tp``
         + CP exposed: ring attention passes K and V around the CP ring, hidden under attention compute
         + EP exposed: two all-to-alls (dispatch, combine) per MoE layer forward, two backward
         + PP: one activation send forward and one gradient send backward per virtual stage, size
           b s h / t (Megatron's scatter/gather over TP ranks) or b s h / t with sequence parallelism

    pipeline = m t_mb + bubble,  bubble = (p-1)/v x t_mb   (1F1B: bubble share (p-1)/(m+p-1); Narayanan et al.)
    DP exposed = max(last bucket, t_dp - backward of the last micro-batch)  with ``overlap_grad_reduce``
                 (all of t_dp without); ZeRO-1/2 add the parameter all-gather after the optimizer (hidden
                 under the next forward with ``overlap_param_gather``); ZeRO-3 gathers parameters forward
                 and backward and reduce-scatters gradients per micro-batch, hidden under its compute
    step = pipeline + DP exposed + optimizer (memory-bound update of the local parameters)

Outputs: breakdown in seconds, MFU (model FLOPs: 3 x forward per token), HFU (+ recomputation),
tokens/s, time to train on a token budget, network-wait fraction (exposed communication / step), and
the scale factor T_n/(n T) (throughput of n workers over n times one worker's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from .commmodel import AlphaBetaModel, CommModel
from .compute import EfficiencyModel, GpuSpec, gpu_of_topology, microbatch_times
from .layout import Layout, first_groups, group_endpoints, rank_groups, rank_of
from .memory import OPTIMIZER_BYTES, MemoryBreakdown, memory_per_gpu, stage_params
from .models import ModelSpec

ACT_BYTES = 2  # bf16 activations on the wire


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

    def time_to_train_s(self, tokens: float) -> float:
        """Seconds to train on `tokens` tokens at this rate."""
        return tokens / self.tokens_per_s

    def to_dict(self, token_budget: float | None = None) -> dict[str, Any]:
        """The --json object of `ringflow train`."""
        d = {"model": self.model, "gpu": self.gpu, "gpus": self.layout.gpus, "layout": self.layout.to_dict(),
             "step_time_s": self.step_time_s, "breakdown": dict(self.breakdown),
             "tflops_per_gpu": self.tflops_per_gpu, "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
             "mfu": self.mfu, "hfu": self.hfu, "tokens_per_s": self.tokens_per_s,
             "memory_per_gpu_bytes": self.memory.total_bytes, "memory": self.memory.to_dict(),
             "fits_in_memory": self.memory.fits, "network_wait_fraction": self.network_wait_fraction,
             "bubble_fraction": self.bubble_fraction, "comm_bytes_per_step": dict(self.comm_bytes_per_step),
             "comm_model": self.comm_model, "contention": dict(self.contention)}
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


def step_time(model: ModelSpec, layout: Layout, topo: Any, *, gpu: GpuSpec | None = None,
              comm: CommModel | None = None, eff: EfficiencyModel | None = None,
              reserve_bytes: float | None = None, contention: bool = False) -> StepResult:
    """Predict one training step of `model` split by `layout` on `topo` (see module docstring).

    With `contention`, every dimension's communication is scaled by the slowdown the simulator's flow
    engine finds when all of that dimension's groups communicate at once (`contention.py`).
    """
    layout.check_model(model)
    gpu = gpu or gpu_of_topology(topo)
    comm = comm or AlphaBetaModel()
    eff = eff or EfficiencyModel()
    groups = first_groups(layout)
    ep = lambda dim: group_endpoints(topo, groups.of(dim)[0])  # noqa: E731 - one representative group
    L, p, v, m = layout, layout.pp, layout.interleave, layout.microbatches
    s_local = L.seq_len / L.cp
    layers = model.layers / p
    mb = microbatch_times(model, L, gpu, eff, stage="last")
    act_bytes = L.micro_batch * s_local * model.hidden * ACT_BYTES  # one activation tensor b x s x h
    factors = _contention_factors(model, L, topo, act_bytes) if contention else {}
    f = lambda dim: factors.get(dim, 1.0)  # noqa: E731

    # ---- tensor parallel: 4 all-reduces per layer (+2 with full recompute)
    t_tp = 0.0
    bytes_tp = 0.0
    if L.tp > 1:
        n_calls = (4 + (2 if L.recompute == "full" else 0)) * layers
        if L.sequence_parallel:
            one = comm.time_s("reduce_scatter", act_bytes, ep("tp"), topo) + \
                comm.time_s("all_gather", act_bytes, ep("tp"), topo)
        else:
            one = comm.time_s("all_reduce", act_bytes, ep("tp"), topo)
        t_tp = n_calls * one * f("tp")
        if L.overlap_tp:
            gemm_s = mb.total_s
            t_tp = max(t_tp - gemm_s, t_tp / 4)
        bytes_tp = n_calls * 2 * (L.tp - 1) / L.tp * act_bytes  # per rank
    # ---- context parallel: K and V around the ring, fwd once, bwd twice (dK, dV back)
    t_cp = 0.0
    if L.cp > 1:
        kv_bytes = 2 * L.micro_batch * s_local * model.kv_hidden * ACT_BYTES / L.tp
        ring = comm.time_s("sendrecv", kv_bytes, ep("cp")[:2], topo) * (L.cp - 1)
        attn_s = mb.total_s * 0.3  # attention share of layer compute at long context (assumption)
        t_cp = max(0.0, 3 * ring * layers - attn_s)
    # ---- expert parallel: dispatch + combine all-to-all per MoE layer, forward and backward
    t_ep = 0.0
    if model.is_moe and L.ep > 1:
        a2a_bytes = (L.micro_batch * s_local * model.top_k * model.hidden * ACT_BYTES
                     / (L.tp if L.sequence_parallel else 1))
        t_ep = 4 * layers * comm.time_s("all_to_all", a2a_bytes, ep("ep"), topo) * f("ep")
    # ---- pipeline point-to-point, per micro-batch and virtual stage
    t_pp = 0.0
    if p > 1:
        msg = act_bytes / L.tp
        pair = group_endpoints(topo, groups.pp[0][:2])
        t_pp = 2 * v * comm.time_s("sendrecv", msg, pair, topo) * f("pp")
    t_mb = mb.total_s + t_tp + t_cp + t_ep + t_pp
    bubble = (p - 1) / v * t_mb
    pipeline = m * t_mb + bubble

    # ---- data parallel (over dp x cp ranks)
    P_local = stage_params(model, L, p - 1 if p > 1 else 0)
    dpg = ep("dp") if L.dp > 1 else []
    t_dp_exposed = 0.0
    bytes_dp = 0.0
    if L.dp > 1:
        grad_b = P_local * L.grad_bytes
        param_b = P_local * 2
        bucket = min(L.bucket_bytes, grad_b)
        window = mb.backward_s + mb.recompute_s if L.overlap_grad_reduce else 0.0
        if L.zero in (0,):
            t_red = comm.time_s("all_reduce", grad_b, dpg, topo) * f("dp")
            last = comm.time_s("all_reduce", bucket, dpg, topo) * f("dp")
            t_dp_exposed = max(last, t_red - window) if L.overlap_grad_reduce else t_red
            bytes_dp = 2 * (L.dp - 1) / L.dp * grad_b
        elif L.zero in (1, 2):
            t_red = comm.time_s("reduce_scatter", grad_b, dpg, topo) * f("dp")
            last = comm.time_s("reduce_scatter", bucket, dpg, topo) * f("dp")
            t_ag = comm.time_s("all_gather", param_b, dpg, topo) * f("dp")
            ag_first = comm.time_s("all_gather", min(L.bucket_bytes / 2, param_b), dpg, topo) * f("dp")
            t_dp_exposed = (max(last, t_red - window) if L.overlap_grad_reduce else t_red) + \
                (ag_first if L.overlap_param_gather else t_ag)
            bytes_dp = (L.dp - 1) / L.dp * (grad_b + param_b)
        else:  # ZeRO-3 / FSDP: per micro-batch: gather params fwd + bwd, reduce-scatter grads
            per_mb = (2 * comm.time_s("all_gather", param_b, dpg, topo) +
                      comm.time_s("reduce_scatter", grad_b, dpg, topo)) * f("dp")
            layer_share = 1.0 / max(layers, 1)
            if L.overlap_param_gather:
                exposed_mb = max(0.0, per_mb - mb.total_s) + per_mb * layer_share
            else:
                exposed_mb = per_mb
            t_dp_exposed = m * exposed_mb
            bytes_dp = m * (L.dp - 1) / L.dp * (2 * param_b + grad_b)
    # ---- optimizer: read+write weights, grads, fp32 master, Adam m and v of the local shard
    shard = P_local / (L.dp * L.cp if L.zero >= 1 else 1)
    t_opt = shard * (2 * 2 + L.grad_bytes + 2 * OPTIMIZER_BYTES) / (gpu.hbm_GBps * 1e9 * eff.mem_eff)

    step = pipeline + t_dp_exposed + t_opt
    compute = m * (mb.forward_s + mb.backward_s)
    breakdown = {"compute": compute, "recompute": m * mb.recompute_s, "tp_exposed": m * t_tp,
                 "cp_exposed": m * t_cp, "ep_exposed": m * t_ep, "pp_p2p": (m + (p - 1) / v) * t_pp,
                 "bubble": (p - 1) / v * (mb.total_s), "dp_exposed": t_dp_exposed, "optimizer": t_opt}
    # during fill and drain the per-micro-batch communication still runs: it belongs to its dimension
    breakdown["tp_exposed"] += (p - 1) / v * t_tp
    breakdown["cp_exposed"] += (p - 1) / v * t_cp
    breakdown["ep_exposed"] += (p - 1) / v * t_ep
    tokens = L.tokens_per_step
    model_flops = model.training_flops_per_token(L.seq_len) * tokens
    # recomputation FLOPs: per micro-batch per GPU, times micro-batches, times GPUs
    hw_flops = model_flops + (mb.hardware_flops - mb.model_flops) * m * L.gpus
    net = breakdown["tp_exposed"] + breakdown["cp_exposed"] + breakdown["ep_exposed"] + breakdown["pp_p2p"] + \
        breakdown["dp_exposed"]
    mem = memory_per_gpu(model, L, gpu.memory_bytes, **({} if reserve_bytes is None else
                                                          {"reserve_bytes": reserve_bytes}))
    peak = gpu.bf16_flops
    return StepResult(
        model=model.name, layout=L, gpu=gpu.name, step_time_s=step, breakdown=breakdown, memory=mem,
        tokens_per_s=tokens / step, mfu=model_flops / (step * L.gpus * peak),
        hfu=hw_flops / (step * L.gpus * peak), tflops_per_gpu=model_flops / step / L.gpus / 1e12,
        hw_tflops_per_gpu=hw_flops / step / L.gpus / 1e12, network_wait_fraction=net / step,
        bubble_fraction=bubble_fraction(p, m, v),
        comm_bytes_per_step={"tp": m * bytes_tp, "dp": bytes_dp,
                             "pp": (2 * v * m * act_bytes / L.tp) if p > 1 else 0.0},
        comm_model=getattr(comm, "name", type(comm).__name__), contention=factors)


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
