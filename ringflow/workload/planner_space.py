"""The planner's search space: every EP x TP x PP x DP x CP layout of a model on a GPU count, and the knobs.

Dimensions (each only where it applies):

- TP divides the attention heads and stays inside one server; sequence parallelism is on whenever TP > 1
  (Megatron requires it with EP > 1 and TP > 1: "When using expert parallelism and tensor parallelism, sequence
  parallelism must be used", megatron/core/model_parallel_config.py).
- CP (context parallelism) where the sequence is long enough to split: powers of two that leave every CP rank
  at least `CP_MIN_TOKENS` tokens, the sequence divisible by 2 x CP (Megatron's load-balanced causal split,
  ``get_batch_on_this_cp_rank``, cuts it into 2 x CP chunks) and, with TP > 1, each rank's part by TP (sequence
  parallelism splits it again). The CP exchange: ring attention (p2p), all-gather of K/V, and Ulysses all-to-all
  where TP x CP divides the heads.
- PP divides the layers, or does not and puts the remainder on the end stages: the middle stages hold
  ceil(layers / PP) each and the first and last split the rest (Megatron-Core
  ``--decoder-first/last-pipeline-num-layers``), every split of it with ``asymmetric_stages`` (DeepSeek-V3's 61
  layers on 16 stages: 1 + 14 x 4 + 4 ... 4 + 14 x 4 + 1), only the even one (Llama 3 405B: 7 + 14 x 8 + 7)
  without.
- DP = GPUs / (TP x CP x PP), dividing the global batch.
- EP for MoE models: divides the routed experts (Megatron ``arguments.py``: "num_experts must be a multiple of
  expert_model_parallel_size") and, with the expert-TP degree ETP, ETP x EP divides TP x CP x DP: experts fold
  over a stage's dense ranks (Megatron-Core ``parallel_state.initialize_model_parallel``: the world size must be a
  multiple of ETP x EP x PP, the rest is the expert-data-parallel degree; MoE parallel folding, arXiv:2504.14960).
  ETP is TP (Megatron's default) or 1 (whole experts), dividing the expert FFN; the token dispatcher is
  all-to-all or flex (DeepEP / HybridEP; Megatron's flex dispatcher requires EP > 1).
- micro-batch (divides the per-replica batch), ZeRO 0-3, recomputation none / selective / full / op
  (per-operator checkpointing), interleaving v (divides layers / PP, even stages only, micro-batches a multiple
  of PP).

A candidate is a `Shape` (a tuple of those choices, cheap to enumerate and sort); `to_layout` makes the `Layout`.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from .layout import CP_COMM, Layout, even_ends
from .models import ModelSpec
from .moe import DISPATCHERS

CP_MIN_TOKENS = 2048   # tokens per CP rank below which the planner does not split the sequence


@dataclass(frozen=True)
class PlanSpace:
    """What the planner may vary (None: every value that applies to the model, see the module docstring)."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] | None = None          # None: the divisors of the layers and the powers of two
    micro_batch: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full", "op")
    interleave: tuple[int, ...] = (1, 2, 4)
    cp: tuple[int, ...] | None = None          # None: 1, and the powers of two leaving CP_MIN_TOKENS per rank
    cp_comm: tuple[str, ...] = CP_COMM
    ep: tuple[int, ...] | None = None          # None: 1 for dense models, the divisors of the experts for MoE
    etp: tuple[int, ...] | None = None         # expert TP; 0 = TP. None: (0, 1) for MoE, (0,) for dense
    dispatcher: tuple[str, ...] | None = None  # None: every kind (moe.DISPATCHERS) where EP > 1
    uneven_stages: bool = True   # pp not dividing the layers: the remainder on the end stages
    asymmetric_stages: bool = True   # ... split unevenly between the first and the last stage too


class Shape(NamedTuple):
    """One candidate layout's choices (the rest of the `Layout` is fixed by the search)."""

    tp: int
    cp: int
    pp: int
    dp: int
    first: int        # layers on the first stage (0: even split)
    last: int         # layers on the last stage (0: even split)
    micro_batch: int
    interleave: int
    zero: int
    recompute: str
    ep: int
    etp: int          # 0: the TP degree
    dispatcher: str
    cp_comm: str


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pipeline_degrees(layers: int, space: PlanSpace) -> list[int]:
    if space.pp is not None:
        return list(space.pp)
    return sorted(set(_divisors(layers)) | {1 << k for k in range(1, layers.bit_length()) if 1 << k <= layers})


def pipeline_splits(layers: int, space: PlanSpace) -> list[tuple[int, int]]:
    """(pp, layers on each end stage, 0 for an even split): the divisors of the layers, and with
    `space.uneven_stages` the powers of two that do not divide them, their end stages lighter (`even_ends`)."""
    out = []
    for pp in _pipeline_degrees(layers, space):
        if layers % pp == 0:
            out.append((pp, 0))
        elif space.uneven_stages and (ends := even_ends(layers, pp)):
            out.append((pp, ends))
    return out


def end_stage_splits(layers: int, pp: int) -> list[tuple[int, int]]:
    """(first, last) layers of the end stages when pp does not divide the layers: the middle stages hold
    ceil(layers / pp) each, the ends share the rest, each at least 1 and at most a middle stage's count."""
    mid = -(-layers // pp)
    rest = layers - (pp - 2) * mid
    if pp < 2 or rest < 2:
        return []
    return [(a, rest - a) for a in range(max(1, rest - mid), min(mid, rest - 1) + 1)]


def stage_splits(layers: int, space: PlanSpace) -> list[tuple[int, int, int]]:
    """(pp, first, last) of every pipeline split searched: even splits (0, 0), the symmetric uneven one of
    `pipeline_splits`, then with `space.asymmetric_stages` every other split of `end_stage_splits`."""
    out = []
    for pp in _pipeline_degrees(layers, space):
        if layers % pp == 0:
            out.append((pp, 0, 0))
            continue
        if not space.uneven_stages:
            continue
        ends = even_ends(layers, pp)
        if ends:
            out.append((pp, ends, ends))
        if space.asymmetric_stages:
            out.extend((pp, a, b) for a, b in end_stage_splits(layers, pp) if a != b)
    return out


def cp_degrees(seq_len: int, space: PlanSpace) -> tuple[int, ...]:
    """The CP degrees searched: `space.cp`, or 1 and the powers of two leaving CP_MIN_TOKENS tokens per rank."""
    if space.cp is not None:
        return space.cp
    out, cp = [1], 2
    while seq_len // cp >= CP_MIN_TOKENS and seq_len % (2 * cp) == 0:
        out.append(cp)
        cp *= 2
    return tuple(out)


def _grid(model: ModelSpec, gpus: int, global_batch: int, seq_len: int, space: PlanSpace,
          gpus_per_server: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(tp, cp, pp, dp, first, last) of the search space that divide the GPUs, heads, sequence and batch."""
    splits = stage_splits(model.layers, space)
    cps = cp_degrees(seq_len, space)
    for tp in space.tp:
        if tp > gpus_per_server or model.heads % tp or gpus % tp:
            continue
        for cp in cps:
            if cp > 1 and (seq_len % (2 * cp) or (seq_len // cp) % tp):
                continue
            for pp, first, last in splits:
                if gpus % (tp * pp * cp) or seq_len % cp:
                    continue
                dp = gpus // (tp * pp * cp)
                if global_batch % dp:
                    continue
                yield tp, cp, pp, dp, first, last


def _expert_choices(model: ModelSpec, space: PlanSpace, tp: int, cp: int, dp: int) -> list[tuple[int, int, str]]:
    """(ep, etp, dispatcher) that fold over the tp x cp x dp ranks of a stage."""
    if not model.is_moe:
        eps: tuple[int, ...] = space.ep or (1,)
        return [(ep, 0, "alltoall") for ep in eps if ep == 1]
    eps = space.ep if space.ep is not None else tuple(_divisors(model.experts))
    etps = space.etp if space.etp is not None else (0, 1)
    kinds = space.dispatcher if space.dispatcher is not None else DISPATCHERS
    out: list[tuple[int, int, str]] = []
    for ep in eps:
        if model.experts % ep:
            continue
        seen = set()
        for etp in etps:
            e = etp or tp
            if e in seen or model.moe_ffn % e or (tp * cp * dp) % (e * ep):
                continue
            seen.add(e)
            out.extend((ep, etp, k) for k in (kinds if ep > 1 else ("alltoall",)))
    return out


def shapes(model: ModelSpec, gpus: int, global_batch: int, seq_len: int, space: PlanSpace,
           gpus_per_server: int = 8) -> Iterator[Shape]:
    """Every candidate of the search space that is valid for the model and GPU count, in a fixed order."""
    for tp, cp, pp, dp, first, last in _grid(model, gpus, global_batch, seq_len, space, gpus_per_server):
        per_replica = global_batch // dp
        experts = _expert_choices(model, space, tp, cp, dp)
        exchanges = [c for c in space.cp_comm if c != "a2a" or model.heads % (tp * cp) == 0] if cp > 1 \
            else ["p2p"]
        for mb in space.micro_batch:
            if per_replica % mb:
                continue
            for v in space.interleave:
                if v > 1 and (pp == 1 or first or last or model.layers % (pp * v) or (per_replica // mb) % pp):
                    continue
                for z in space.zero:
                    if z > 0 and dp == 1:
                        continue
                    for rc in space.recompute:
                        for ep, etp, kind in experts:
                            for exchange in exchanges:
                                yield Shape(tp, cp, pp, dp, first, last, mb, v, z, rc, ep, etp, kind, exchange)


def to_layout(s: Shape, global_batch: int, seq_len: int, precision: str = "bf16") -> Layout:
    """The `Layout` of a candidate."""
    return Layout(tp=s.tp, pp=s.pp, dp=s.dp, cp=s.cp, ep=s.ep, micro_batch=s.micro_batch,
                  global_batch=global_batch, seq_len=seq_len, zero=s.zero, recompute=s.recompute,
                  sequence_parallel=s.tp > 1, interleave=s.interleave, precision=precision,
                  first_stage_layers=s.first, last_stage_layers=s.last, etp=s.etp, ep_dispatcher=s.dispatcher,
                  cp_comm=s.cp_comm)


def candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int, space: PlanSpace,
               gpus_per_server: int = 8, precision: str = "bf16") -> Iterator[Layout]:
    """Every layout of the search space that is valid for the model and GPU count."""
    for s in shapes(model, gpus, global_batch, seq_len, space, gpus_per_server):
        yield to_layout(s, global_batch, seq_len, precision)
