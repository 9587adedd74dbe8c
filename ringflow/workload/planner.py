"""Search parallel layouts for a model on a cluster: drop what does not fit, rank the rest by step time.

The search space (EP x TP x PP x DP x CP, uneven pipeline stages, expert TP, the MoE token dispatcher, CP
exchange, micro-batch, ZeRO, recomputation, interleaving) is `planner_space`. Every candidate is checked for
memory before it is timed. With ``keep`` (the CLI's --top) a best-first branch and bound returns the same best
``keep`` layouts as timing every one. Its queue entries, each bounded below the step of every candidate in it:

0. (TP, CP, PP split, micro-batch, v, recompute): the pipeline at the slowest stage's FLOPs alone (unlimited HBM
   bandwidth and EP 1, so no memory-bound term, expert-weight roofline or dispatcher, and the expert GEMMs at the
   highest rate a measured GEMM table gives, `compute.EfficiencyModel.expert_rate_bound`; no expert choice beats
   it);
1. + (EP, expert TP, dispatcher): that stage's compute (`compute.microbatch_times`);
2. + the CP exchange: that stage's compute and exposed TP, CP, EP and PP time (`steptime.stage_bound_s`);
3. + the ZeRO stage (one candidate): plus that stage's exposed DP time and optimizer step (`steptime.stage_dp_s`);
   popped, it is checked for memory and timed.

Any one stage's time is at most the pacing stage's, and `step_time` only adds to the pipeline, so a bound never
exceeds a covered step (the test suite checks it over whole searches; a timed step below its bound, or a bound
below its parent's, raises `BoundViolated` rather than rank silently otherwise). An entry is expanded while its
bound can reach the keep-th best step found. From PARALLEL_MIN_LAYOUTS candidates on, entries are expanded in
rounds by forked worker processes (concurrent.futures); the queue stays in this process.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidArgument, RingflowError
from .commmodel import AlphaBetaModel, BudgetSpent, CommModel, DeadlineModel, default_comm_model
from .compute import EfficiencyModel, GpuSpec, gpu_of_topology, in_training, microbatch_times
from .layout import Layout
from .memory import memory_per_gpu, stage_memory
from .models import ModelSpec
from .planner_space import PlanSpace, Shape, candidates, pipeline_splits, shapes, to_layout
from .steptime import StepResult, slowest_compute, stage_bound_s, stage_dp_s, step_time

__all__ = ["PlanSpace", "Plan", "plan", "candidates", "pipeline_splits", "PARALLEL_MIN_LAYOUTS"]


@dataclass
class Plan:
    """The planner's answer."""

    ranked: list[StepResult]
    evaluated: int    # layouts that fit and were timed
    oom: int          # layouts examined that do not fit
    searched: int     # candidates in the search space
    checked: dict[int, StepResult] = field(default_factory=dict)  # rank -> the same layout timed by `refine`
    budget_spent: bool = False    # the refine pass stopped at its time budget before its last layout
    pruned: int = 0   # candidates never examined: their lower bound exceeds the keep-th best step

    def top(self, k: int = 10) -> list[StepResult]:
        """The k fastest layouts that fit."""
        return self.ranked[:k]


class _Memo:
    """Memoised `time_s` (and `links`, where the model has them) of one comm model on one topology: a search
    asks for the same groups and sizes many times, and the models walk the group on every call."""

    def __init__(self, inner: CommModel) -> None:
        self.inner, self.name = inner, inner.name
        self._times: dict[tuple, float] = {}
        self._links: dict[tuple, Any] = {}
        if hasattr(inner, "links"):
            self.links = self._group_links

    def time_s(self, collective: str, nbytes: float, group: Sequence[str], topo: Any) -> float:
        """The inner model's seconds, computed once per (collective, size, group)."""
        key = (collective, nbytes, tuple(group))
        hit = self._times.get(key)
        if hit is None:
            hit = self._times[key] = self.inner.time_s(collective, nbytes, group, topo)
        return hit

    def _group_links(self, group: Sequence[str], topo: Any) -> Any:
        key = tuple(group)
        hit = self._links.get(key)
        if hit is None:
            hit = self._links[key] = self.inner.links(group, topo)  # type: ignore[attr-defined]
        return hit


def plan(model: ModelSpec, topo: Any, gpus: int, global_batch: int, seq_len: int | None = None, *,
         space: PlanSpace | None = None, gpu: GpuSpec | None = None, comm: CommModel | None = None,
         eff: EfficiencyModel | None = None, precision: str = "bf16", refine: CommModel | None | str = "auto",
         refine_top: int = 10, refine_budget_s: float = 12.0, keep: int | None = None, workers: int | None = None,
         progress: Callable[[int, int], None] | None = None, clock: Callable[[], float] = time.monotonic) -> Plan:
    """Rank the fitting layouts of `model` on `gpus` GPUs of `topo` by predicted step time.

    The search times layouts with `comm` (default: the closed-form alpha-beta model, fast) and ranks by it.
    With `keep` only layouts whose lower bound can still reach the `keep` best are examined (those best are
    exact); without it every fitting layout is timed. The best `refine_top` are also timed with `refine`
    (default: the simulator's analytic engine when present) within `refine_budget_s` seconds (on `clock`; a
    layout left unfinished is not reported), beside them in `Plan.checked`. `workers` > 1 forces worker
    processes, 1 forbids them (default: the machine's cores from PARALLEL_MIN_LAYOUTS candidates on).
    """
    if gpus > len(topo.endpoints()):
        raise InvalidArgument(f"{gpus} GPUs asked but the topology has {len(topo.endpoints())}",
                              "raise --nodes or lower --gpus")
    if keep is not None and keep < 1:
        raise InvalidArgument(f"keep={keep}", "keep at least one layout (the --top count), or None for all")
    seq = seq_len or model.seq_len
    gpu = gpu or in_training(gpu_of_topology(topo))
    memo = _Memo(comm or AlphaBetaModel())
    eff = eff or EfficiencyModel()
    if refine == "auto":
        refine = default_comm_model("auto")
        if isinstance(refine, AlphaBetaModel):
            refine = None
    space = space or PlanSpace()
    per_server = max(len(g) for g in topo.host_groups()) if topo.hosts() else 8
    found = list(shapes(model, gpus, global_batch, seq, space, per_server))
    if not found:
        raise InvalidArgument(f"no layout of {gpus} GPUs fits the batch {global_batch} and model {model.name}",
                              "choose a global batch divisible by the data-parallel degrees, or other GPU counts")
    job = _Job(model, topo, gpu, memo, eff, global_batch, seq, precision)
    search = _Search(job, found, keep, progress)
    search.run(_workers(workers, len(found)))
    if not search.timed:
        need, lay = search.leanest()
        raise InvalidArgument(
            f"none of the {len(found)} layouts of {model.name} on {gpus} GPUs fits in "
            f"{gpu.memory_bytes / 1e9:.0f} GB per GPU; the leanest (TP {lay.tp} x PP {lay.pp} x DP {lay.dp}"
            f"{f' x CP {lay.cp}' if lay.cp > 1 else ''}{f', EP {lay.ep}' if lay.ep > 1 else ''}, "
            f"ZeRO-{lay.zero}, recompute {lay.recompute}, micro-batch {lay.micro_batch}) needs "
            f"{need / 1e9:.0f} GB per GPU",
            f"give about {need / gpu.memory_bytes:.1f}x the GPUs (--gpus, --nodes), or a shorter --seq-len")
    results = [r for _, r in sorted(search.timed, key=lambda t: (t[1].step_time_s, t[0]))]
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
    n_fit = len(results)
    return Plan(results, n_fit, search.oom, len(found), checked, spent, len(found) - n_fit - search.oom)


PARALLEL_MIN_LAYOUTS = 2000   # below this a search takes seconds: worker start-up would cost more than it saves
_ROUND = 16                   # queue entries per worker and round
_JOB: Any = None              # the search forked workers expand entries of (inherited, never pickled)
# what splits a queue entry of each level: 0 -> 1 by the expert choices, 1 -> 2 by the CP exchange, 2 -> 3 by the
# ZeRO stage; level 3 entries are single candidates, examined
_LEVELS: tuple[Callable[[Shape], tuple], ...] = (lambda s: (s.ep, s.etp, s.dispatcher), lambda s: (s.cp_comm,),
                                                 lambda s: (s.zero,))
_EXAMINE = len(_LEVELS)
# a bound and its step add the same terms in another order: rounding may put the bound above, never by more
_SLACK = 1e-9

_Entry = tuple[float, int, int, list[int]]      # (bound, first candidate, level, candidates)
_Outcome = tuple[list[_Entry], list[tuple[int, "StepResult | tuple[float, bool]"]]]


def _workers(asked: int | None, n_candidates: int) -> int:
    import multiprocessing as mp
    import os
    if "fork" not in mp.get_all_start_methods():
        return 1
    if asked is not None:
        return max(1, asked)
    return os.cpu_count() or 1 if n_candidates >= PARALLEL_MIN_LAYOUTS else 1


@dataclass
class _Job:
    model: ModelSpec
    topo: Any
    gpu: GpuSpec
    comm: CommModel
    eff: EfficiencyModel
    global_batch: int
    seq_len: int
    precision: str

    def layout(self, s: Shape) -> Layout:
        return to_layout(s, self.global_batch, self.seq_len, self.precision)

    def examine(self, s: Shape) -> StepResult | tuple[float, bool]:
        """The step of a layout that fits; when it does not, (bytes, whether they are its peak): the first and
        the last stage (the most micro-batches in flight; the logits) are checked first, then every stage,
        before any timing."""
        lay = self.layout(s)
        cap = self.gpu.memory_bytes
        for stage in sorted({0, lay.pp - 1}):
            mem = stage_memory(self.model, lay, stage, cap)
            if not mem.fits:
                return mem.total_bytes, lay.pp == 1
        mem = memory_per_gpu(self.model, lay, cap)
        if not mem.fits:
            return mem.total_bytes, True
        return step_time(self.model, lay, self.topo, gpu=self.gpu, comm=self.comm, eff=self.eff)


class BoundViolated(RingflowError):
    """A planner bound exceeded the step it bounds: the step-time model changed under the search."""


def _violated(what: str) -> BoundViolated:
    return BoundViolated(what, "report it: the step-time model changed under the planner's bounds; plan without "
                         "keep (ringflow plan --all) meanwhile")


class _Search:
    """The best-first branch and bound of the module docstring; without `keep` every candidate is examined, in
    order. The queue lives here; expanding its entries (bounding the next level, or examining a candidate) runs
    here or, in rounds, in forked worker processes."""

    def __init__(self, job: _Job, found: list[Shape], keep: int | None, progress: Callable[[int, int], None] | None):
        self.job, self.found, self.keep, self.progress = job, found, keep, progress
        self.timed: list[tuple[int, StepResult]] = []
        self.oom = 0
        self.too_big: list[tuple[float, bool, int]] = []   # (bytes, whether the peak, candidate) of each OOM
        self.best: list[float] = []          # max-heap (negated) of the keep best steps
        self.stage: dict[int, int] = {}      # candidate -> the pipeline stage its bounds look at
        self.done = 0
        self._flops_gpu = replace(job.gpu, hbm_GBps=float("inf"))
        self._flops_eff = replace(job.eff, expert_rate_bound=True)   # no expert layout's GEMMs run faster

    @property
    def threshold(self) -> float:
        """The keep-th best step so far: a bound above it cannot reach the keep best."""
        return -self.best[0] if self.keep is not None and len(self.best) >= self.keep else float("inf")

    def run(self, workers: int) -> None:
        """Expand queue entries while the smallest bound can still reach the keep best."""
        heap = self._groups() if self.keep is not None else \
            [(0.0, i, _EXAMINE, [i]) for i in range(len(self.found))]
        if workers < 2:
            while self._open(heap):
                self._merge(heap, self.expand(heapq.heappop(heap)))
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor
            global _JOB
            _JOB = self
            try:
                with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
                    while self._open(heap):
                        batch: list[_Entry] = []
                        while self._open(heap) and len(batch) < workers * _ROUND:
                            batch.append(heapq.heappop(heap))
                        parts = [batch[k::workers] for k in range(workers)]
                        for outcome in pool.map(_expand_forked, parts):
                            self._merge(heap, outcome)
            finally:
                _JOB = None
        if self.progress:
            self.progress(len(self.found), len(self.found))

    def _open(self, heap: list[_Entry]) -> bool:
        return bool(heap) and heap[0][0] * (1 - _SLACK) <= self.threshold

    def expand(self, entry: _Entry) -> _Outcome:
        """The next level's entries of `entry`, or its candidate examined (level 3 or an exhaustive search)."""
        bound, _, level, members = entry
        if level < _EXAMINE:
            return self._split(level, bound, members), []
        r = self.job.examine(self.found[members[0]])
        if not isinstance(r, tuple) and r.step_time_s < bound * (1 - _SLACK):
            raise _violated(f"the bound {bound:.6g} s exceeds the step {r.step_time_s:.6g} s of "
                            f"{self.found[members[0]]}")
        return [], [(members[0], r)]

    def _merge(self, heap: list[_Entry], outcome: _Outcome) -> None:
        entries, examined = outcome
        for e in entries:
            heapq.heappush(heap, e)
        for i, r in examined:
            self.done += 1
            if isinstance(r, tuple):
                self.oom += 1
                self.too_big.append((r[0], r[1], i))
                continue
            self.timed.append((i, r))
            if self.keep is not None:
                if len(self.best) < self.keep:
                    heapq.heappush(self.best, -r.step_time_s)
                elif r.step_time_s < -self.best[0]:
                    heapq.heapreplace(self.best, -r.step_time_s)
        if examined and self.progress:
            self.progress(self.done, len(self.found))

    def _groups(self) -> list[_Entry]:
        """One queue entry per (tp, cp, pp split, micro-batch, v, recompute), bounded by its FLOPs."""
        groups: dict[tuple, list[int]] = {}
        for i, s in enumerate(self.found):
            groups.setdefault((s.tp, s.cp, s.pp, s.first, s.last, s.micro_batch, s.interleave, s.recompute),
                              []).append(i)
        heap = []
        j = self.job
        for members in groups.values():
            s = self.found[members[0]]
            # FLOPs only: unlimited HBM bandwidth, EP 1 (no dispatcher, no expert-weight roofline), the slowest
            # stage; the levels below bound that stage only (any one stage's time is at most the pacing one's)
            lay = j.layout(s._replace(ep=1, etp=0, dispatcher="alltoall", cp_comm="p2p", zero=0))
            stage, flops_s = slowest_compute(j.model, lay, self._flops_gpu, self._flops_eff)
            for i in members:
                self.stage[i] = stage
            heap.append((self._fill(s) * flops_s, members[0], 0, members))
        heapq.heapify(heap)
        return heap

    def _fill(self, s: Shape) -> float:
        """Micro-batches plus the pipeline fill (as step_time's pipeline multiplies the pacing stage)."""
        return self.job.global_batch // (s.micro_batch * s.dp) + (s.pp - 1) / s.interleave

    def _bound(self, level: int, i: int, parent: float) -> float:
        """Step-time lower bound of every candidate agreeing with candidate i on the fields grouped at `level`
        (1: the stage's compute with this EP, expert TP and dispatcher; 2: + its TP, CP, EP and PP exposure;
        3: + its DP exposure and optimizer step, this candidate alone), `parent` the bound one level up."""
        j, s = self.job, self.found[i]
        if level == 1:
            lay = j.layout(s._replace(cp_comm="p2p", zero=0))
            return self._fill(s) * microbatch_times(j.model, lay, j.gpu, j.eff, stage=self.stage[i]).total_s
        if level == 2:
            return self._fill(s) * stage_bound_s(j.model, j.layout(s), j.topo, gpu=j.gpu, comm=j.comm, eff=j.eff,
                                                 stage=self.stage[i])
        return parent + stage_dp_s(j.model, j.layout(s), j.topo, gpu=j.gpu, comm=j.comm, eff=j.eff,
                                   stage=self.stage[i])

    def _split(self, level: int, bound: float, members: list[int]) -> list[_Entry]:
        """A queue entry's candidates split by the fields of the next level, each bounded at that level."""
        parts: dict[tuple, list[int]] = {}
        for i in members:
            parts.setdefault(_LEVELS[level](self.found[i]), []).append(i)
        out = []
        for same in parts.values():
            b = self._bound(level + 1, same[0], bound)
            if b < bound * (1 - _SLACK):
                raise _violated(f"a bound fell from {bound:.6g} s to {b:.6g} s at level {level + 1} for "
                                f"{self.found[same[0]]}")
            out.append((b, same[0], level + 1, same))
        return out

    def leanest(self) -> tuple[float, Layout]:
        """The smallest peak memory of the layouts that do not fit, and that layout (a stage's bytes are a lower
        bound of the peak: peaks are computed in that order until no smaller one can follow)."""
        best: tuple[float, int] | None = None
        for nbytes, peak, i in sorted(self.too_big):
            if best is not None and nbytes >= best[0]:
                break
            if not peak:
                nbytes = memory_per_gpu(self.job.model, self.job.layout(self.found[i]), self.job.gpu.memory_bytes
                                        ).total_bytes
            if best is None or nbytes < best[0]:
                best = (nbytes, i)
        assert best is not None, "a search without a fitting layout examined every candidate"
        return best[0], self.job.layout(self.found[best[1]])


def _expand_forked(entries: list[_Entry]) -> _Outcome:
    search: _Search = _JOB
    children: list[_Entry] = []
    examined: list[tuple[int, StepResult | tuple[float, bool]]] = []
    for e in entries:
        more, done = search.expand(e)
        children += more
        examined += done
    return children, examined
