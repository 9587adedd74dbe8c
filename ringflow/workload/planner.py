"""Search parallel layouts for a model on a cluster: drop what does not fit, rank the rest by step time.

Search space: TP (divides the heads, at most one server), PP (divides the layers, or a power of two with lighter
end stages: `pipeline_splits`), DP = GPUs / (TP x PP x CP),
EP for MoE models (divides the experts and DP x CP),
micro-batch (divides the per-replica batch), ZeRO stage 0-3, recomputation none/selective/full, and
interleaving v (divides layers / PP). Sequence parallelism is on whenever TP > 1 (same traffic as plain TP,
less activation memory). Memory is checked first (cheap), the step time only for layouts that fit.
Complexity: O(|TP| |PP| |mb| |ZeRO| |recompute| |v|) step-time evaluations, each O(1) collective lookups
(the comm model caches by group shape), about 10^3 - 10^4 for a 1,024-GPU cluster; from PARALLEL_MIN_LAYOUTS
layouts on they are timed over the machine's cores (concurrent.futures, forked workers).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from .commmodel import AlphaBetaModel, BudgetSpent, CommModel, DeadlineModel, default_comm_model
from .compute import EfficiencyModel, GpuSpec, gpu_of_topology
from .layout import Layout, even_ends
from .memory import memory_per_gpu
from .models import ModelSpec
from .steptime import StepResult, step_time


@dataclass(frozen=True)
class PlanSpace:
    """What the planner may vary."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] | None = None          # None: every divisor of the layers
    micro_batch: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    interleave: tuple[int, ...] = (1, 2, 4)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] | None = None          # None: 1 for dense models, divisors of the experts for MoE
    uneven_stages: bool = True   # pp not dividing the layers: fewer on the end stages (Llama 3 405B: 7, 8 x 14, 7)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pipeline_splits(layers: int, space: PlanSpace) -> list[tuple[int, int]]:
    """(pp, layers on each end stage, 0 for an even split): the divisors of the layers, and with
    `space.uneven_stages` the powers of two that do not divide them, their end stages lighter (`even_ends`)."""
    pps = space.pp if space.pp is not None else \
        sorted(set(_divisors(layers)) | {1 << k for k in range(1, layers.bit_length()) if 1 << k <= layers})
    out = []
    for pp in pps:
        if layers % pp == 0:
            out.append((pp, 0))
        elif space.uneven_stages and (ends := even_ends(layers, pp)):
            out.append((pp, ends))
    return out


def _grid_shapes(model: ModelSpec, gpus: int, global_batch: int, seq_len: int, space: PlanSpace,
                 gpus_per_server: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(tp, cp, pp, dp, end-stage layers) of the search space that divide the GPUs, heads, sequence and batch."""
    splits = pipeline_splits(model.layers, space)
    for tp in space.tp:
        if tp > gpus_per_server or model.heads % tp or gpus % tp:
            continue
        for cp in space.cp:
            for pp, ends in splits:
                if gpus % (tp * pp * cp) or seq_len % cp:
                    continue
                dp = gpus // (tp * pp * cp)
                if global_batch % dp:
                    continue
                yield tp, cp, pp, dp, ends


def candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int, space: PlanSpace,
               gpus_per_server: int = 8, precision: str = "bf16") -> Iterator[Layout]:
    """Every layout of the search space that is valid for the model and GPU count."""
    eps = space.ep if space.ep is not None else (tuple(_divisors(model.experts)) if model.is_moe else (1,))
    for tp, cp, pp, dp, ends in _grid_shapes(model, gpus, global_batch, seq_len, space, gpus_per_server):
        per_replica = global_batch // dp
        for mb in space.micro_batch:
            if per_replica % mb:
                continue
            for v in space.interleave:
                if v > 1 and (pp == 1 or ends or model.layers % (pp * v) or (per_replica // mb) % pp):
                    continue
                for z in space.zero:
                    if z > 0 and dp == 1:
                        continue
                    for rc in space.recompute:
                        for ep in eps:
                            if (dp * cp) % ep or (ep > 1 and not model.is_moe):
                                continue
                            yield Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=mb,
                                         global_batch=global_batch, seq_len=seq_len, zero=z, recompute=rc,
                                         sequence_parallel=tp > 1, interleave=v, precision=precision,
                                         first_stage_layers=ends, last_stage_layers=ends)


@dataclass
class Plan:
    """The planner's answer."""

    ranked: list[StepResult]
    evaluated: int
    oom: int
    searched: int
    checked: dict[int, StepResult] = field(default_factory=dict)  # rank -> the same layout timed by `refine`
    budget_spent: bool = False    # the refine pass stopped at its time budget before its last layout

    def top(self, k: int = 10) -> list[StepResult]:
        """The k fastest layouts that fit."""
        return self.ranked[:k]


def plan(model: ModelSpec, topo: Any, gpus: int, global_batch: int, seq_len: int | None = None, *,
         space: PlanSpace | None = None, gpu: GpuSpec | None = None, comm: CommModel | None = None,
         eff: EfficiencyModel | None = None, precision: str = "bf16", refine: CommModel | None | str = "auto",
         refine_top: int = 10, refine_budget_s: float = 12.0,
         progress: Callable[[int, int], None] | None = None, clock: Callable[[], float] = time.monotonic) -> Plan:
    """Rank every fitting layout of `model` on `gpus` GPUs of `topo` by predicted step time.

    The search times every layout with `comm` (default: the closed-form alpha-beta model, fast) and ranks
    by it; the best `refine_top` are also timed with `refine` (default: the simulator's analytic engine when
    present) within `refine_budget_s` seconds (on `clock`; a layout left unfinished is not reported), beside
    them in `Plan.checked`.
    """
    if gpus > len(topo.endpoints()):
        raise InvalidArgument(f"{gpus} GPUs asked but the topology has {len(topo.endpoints())}",
                              "raise --nodes or lower --gpus")
    seq = seq_len or model.seq_len
    gpu = gpu or gpu_of_topology(topo)
    comm = comm or AlphaBetaModel()
    if refine == "auto":
        refine = default_comm_model("auto")
        if isinstance(refine, AlphaBetaModel):
            refine = None
    space = space or PlanSpace()
    per_server = max(len(g) for g in topo.host_groups()) if topo.hosts() else 8
    layouts = list(candidates(model, gpus, global_batch, seq, space, per_server, precision))
    if not layouts:
        raise InvalidArgument(f"no layout of {gpus} GPUs fits the batch {global_batch} and model {model.name}",
                              "choose a global batch divisible by the data-parallel degrees, or other GPU counts")
    fitting = []
    leanest: tuple[float, Layout] | None = None
    for lay in layouts:
        mem = memory_per_gpu(model, lay, gpu.memory_bytes)
        if mem.fits:
            fitting.append(lay)
        elif leanest is None or mem.total_bytes < leanest[0]:
            leanest = (mem.total_bytes, lay)
    if not fitting and leanest is not None:
        need, lay = leanest
        raise InvalidArgument(
            f"none of the {len(layouts)} layouts of {model.name} on {gpus} GPUs fits in "
            f"{gpu.memory_bytes / 1e9:.0f} GB per GPU; the leanest (TP {lay.tp} x PP {lay.pp} x DP {lay.dp}, "
            f"ZeRO-{lay.zero}, recompute {lay.recompute}, micro-batch {lay.micro_batch}) needs "
            f"{need / 1e9:.0f} GB per GPU",
            f"give about {need / gpu.memory_bytes:.1f}x the GPUs (--gpus, --nodes), or a shorter --seq-len")
    results = _time_layouts(model, fitting, topo, gpu, comm, eff, progress)
    results.sort(key=lambda r: r.step_time_s)
    checked: dict[int, StepResult] = {}
    spent = False
    if refine is not None and not isinstance(refine, str) and results:
        # the simulator's figure beside each of the top layouts (ranking stays the search model's, so one
        # model orders the list; where the two disagree the table shows it)
        bounded = DeadlineModel(refine, clock() + refine_budget_s, clock)
        for i in range(min(refine_top, len(results))):
            try:
                checked[i] = step_time(model, results[i].layout, topo, gpu=gpu, comm=bounded, eff=eff)
            except BudgetSpent:
                spent = True
                break
    return Plan(results, len(fitting), len(layouts) - len(fitting), len(layouts), checked, spent)


PARALLEL_MIN_LAYOUTS = 2000   # below this a search takes seconds: worker start-up would cost more than it saves
_CHUNK = 250
_JOB: tuple[Any, ...] = ()    # what forked workers time layouts against (inherited, never pickled)


def _time_layouts(model: ModelSpec, layouts: list[Layout], topo: Any, gpu: GpuSpec, comm: CommModel,
                  eff: EfficiencyModel | None, progress: Callable[[int, int], None] | None,
                  workers: int | None = None) -> list[StepResult]:
    """Step time of every layout, in order: in this process, or for PARALLEL_MIN_LAYOUTS and more (or an explicit
    `workers` > 1) over the machine's cores in forked worker processes (the cluster is inherited, not copied)."""
    import multiprocessing as mp
    import os
    n = workers if workers is not None else \
        (min(os.cpu_count() or 1, 1 + len(layouts) // _CHUNK) if len(layouts) >= PARALLEL_MIN_LAYOUTS else 1)
    if n < 2 or "fork" not in mp.get_all_start_methods():
        out = []
        for i, lay in enumerate(layouts):
            out.append(step_time(model, lay, topo, gpu=gpu, comm=comm, eff=eff))
            if progress:
                progress(i + 1, len(layouts))
        return out
    from concurrent.futures import ProcessPoolExecutor
    global _JOB
    _JOB = (model, topo, gpu, comm, eff)
    chunks = [layouts[i:i + _CHUNK] for i in range(0, len(layouts), _CHUNK)]
    out = []
    try:
        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            for part in pool.map(_time_chunk, chunks):
                out.extend(part)
                if progress:
                    progress(len(out), len(layouts))
    finally:
        _JOB = ()
    return out


def _time_chunk(layouts: list[Layout]) -> list[StepResult]:
    model, topo, gpu, comm, eff = _JOB
    return [step_time(model, lay, topo, gpu=gpu, comm=comm, eff=eff) for lay in layouts]
