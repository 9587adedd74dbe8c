"""A parallel layout (TP x PP x DP x EP x CP and the training knobs) and its Megatron-style rank mapping.

Rank order (Megatron's default ``tp-cp-ep-dp-pp``): TP is innermost, so a TP group is consecutive ranks inside
one server; then CP, then DP, then PP outermost. A global rank is the index into ``topology.endpoints()``,
which sorts GPUs by (server, index), so consecutive ranks share a server. EP groups are carved out of the
DP x CP ranks of one PP stage (Megatron's expert-data-parallel split).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import ConfigError, InvalidArgument
from .models import ModelSpec

RECOMPUTE_MODES = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True)
class Layout:
    """How one training job is split over GPUs, plus the knobs that change its cost."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1
    micro_batch: int = 1            # sequences per micro-batch
    global_batch: int = 512         # sequences per optimizer step
    seq_len: int = 2048
    zero: int = 0                   # 0 none, 1 optimizer states, 2 + gradients, 3 + parameters (= FSDP)
    recompute: str = "none"         # none | selective | full
    sequence_parallel: bool = False
    interleave: int = 1             # virtual pipeline stages per GPU (1 = plain 1F1B)
    bucket_bytes: int = 40_000_000 * 4   # DP gradient bucket (Megatron: 40M fp32 elements)
    overlap_grad_reduce: bool = True     # DP reduce overlapped with backward, bucket by bucket
    overlap_param_gather: bool = True    # ZeRO/FSDP gathers prefetched under compute
    overlap_tp: bool = False             # TP collectives hidden under GEMMs (Megatron tp-comm-overlap)
    precision: str = "bf16"
    flash_attention: bool = True         # attention scores never stored (Dao et al. 2022)
    grad_bytes: int = 4                  # gradient element size (Megatron keeps fp32 main grads)

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "seq_len", "interleave"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"layout {f}={v!r} must be an integer >= 1", f"set --{f.replace('_', '-')} >= 1")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero={self.zero!r}", "ZeRO stage must be 0, 1, 2 or 3 (3 = FSDP)")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute={self.recompute!r}", f"use one of {', '.join(RECOMPUTE_MODES)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r}", f"use one of {', '.join(PRECISIONS)}")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"ep={self.ep} must divide dp x cp = {self.dp * self.cp}",
                              "experts are spread over the data-parallel ranks of a stage")
        if self.global_batch % (self.micro_batch * self.dp):
            raise ConfigError(f"global batch {self.global_batch} is not a multiple of micro-batch x dp = "
                              f"{self.micro_batch} x {self.dp}", "choose a global batch divisible by both")
        if self.interleave > 1 and self.pp == 1:
            raise ConfigError("interleave > 1 needs pp > 1", "set --interleave 1 or raise --pp")

    @property
    def gpus(self) -> int:
        """World size: tp x cp x dp x pp (EP reuses DP ranks)."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per pipeline (gradient-accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one global batch."""
        return self.global_batch * self.seq_len

    def with_(self, **changes: Any) -> Layout:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**asdict(self), "gpus": self.gpus, "microbatches": self.microbatches}

    def check_model(self, model: ModelSpec) -> None:
        """Raise if the model cannot be split this way."""
        if model.heads % self.tp or model.kv_heads % min(self.tp, model.kv_heads):
            raise ConfigError(f"tp={self.tp} does not divide heads={model.heads} / kv_heads={model.kv_heads}",
                              "choose a TP degree that divides the attention heads")
        if model.layers % (self.pp * self.interleave):
            raise ConfigError(f"layers={model.layers} not divisible by pp x interleave = "
                              f"{self.pp} x {self.interleave}", "choose pp (and interleave) dividing the layers")
        if self.ep > 1 and model.experts % self.ep:
            raise ConfigError(f"ep={self.ep} does not divide experts={model.experts}", "choose ep dividing experts")
        if self.ep > 1 and not model.is_moe:
            raise ConfigError("ep > 1 for a dense model", "expert parallelism needs a MoE model (experts > 1)")
        if self.seq_len % self.cp:
            raise ConfigError(f"seq_len={self.seq_len} not divisible by cp={self.cp}", "choose cp dividing seq len")


@dataclass(frozen=True)
class RankGroups:
    """The communicators of a layout: every group is a tuple of global ranks."""

    tp: tuple[tuple[int, ...], ...]
    cp: tuple[tuple[int, ...], ...]
    dp: tuple[tuple[int, ...], ...]
    pp: tuple[tuple[int, ...], ...]
    ep: tuple[tuple[int, ...], ...]

    def of(self, dim: str) -> tuple[tuple[int, ...], ...]:
        """Groups of one dimension ('tp', 'cp', 'dp', 'pp', 'ep')."""
        return getattr(self, dim)


def rank_coords(layout: Layout, rank: int) -> dict[str, int]:
    """(tp, cp, dp, pp) coordinates of a global rank, TP innermost."""
    if not 0 <= rank < layout.gpus:
        raise InvalidArgument(f"rank {rank} outside 0..{layout.gpus - 1}")
    t = rank % layout.tp
    c = (rank // layout.tp) % layout.cp
    d = (rank // (layout.tp * layout.cp)) % layout.dp
    p = rank // (layout.tp * layout.cp * layout.dp)
    return {"tp": t, "cp": c, "dp": d, "pp": p}


def rank_of(layout: Layout, tp: int, cp: int, dp: int, pp: int) -> int:
    """Global rank of (tp, cp, dp, pp) coordinates."""
    return tp + layout.tp * (cp + layout.cp * (dp + layout.dp * pp))


def rank_groups(layout: Layout) -> RankGroups:
    """Every communicator of the layout, Megatron order (TP innermost, PP outermost)."""
    L = layout
    tp = tuple(tuple(rank_of(L, t, c, d, p) for t in range(L.tp))
               for p in range(L.pp) for d in range(L.dp) for c in range(L.cp))
    cp = tuple(tuple(rank_of(L, t, c, d, p) for c in range(L.cp))
               for p in range(L.pp) for d in range(L.dp) for t in range(L.tp))
    dp = tuple(tuple(rank_of(L, t, c, d, p) for d in range(L.dp))
               for p in range(L.pp) for c in range(L.cp) for t in range(L.tp))
    pp = tuple(tuple(rank_of(L, t, c, d, p) for p in range(L.pp))
               for d in range(L.dp) for c in range(L.cp) for t in range(L.tp))
    ep_groups: list[tuple[int, ...]] = []
    for p in range(L.pp):
        for t in range(L.tp):
            flat = [rank_of(L, t, c, d, p) for d in range(L.dp) for c in range(L.cp)]
            ep_groups += [tuple(flat[i:i + L.ep]) for i in range(0, len(flat), L.ep)]
    return RankGroups(tp, cp, dp, pp, tuple(ep_groups))


def first_groups(layout: Layout) -> RankGroups:
    """Only the first communicator of every dimension (all are alike in a homogeneous cluster): O(group size)."""
    L = layout
    return RankGroups(
        tp=(tuple(rank_of(L, t, 0, 0, 0) for t in range(L.tp)),),
        cp=(tuple(rank_of(L, 0, c, 0, 0) for c in range(L.cp)),),
        dp=(tuple(rank_of(L, 0, 0, d, 0) for d in range(L.dp)),),
        pp=(tuple(rank_of(L, 0, 0, 0, p) for p in range(L.pp)),),
        ep=(tuple([rank_of(L, 0, c, d, 0) for d in range(L.dp) for c in range(L.cp)][:L.ep]),))


_EPS_CACHE: dict[int, tuple[Any, int, list[str]]] = {}


def _endpoints(topo: Any) -> list[str]:
    """topo.endpoints(), cached per topology object (and its node count, in case it grew)."""
    n = topo.graph.number_of_nodes()
    hit = _EPS_CACHE.get(id(topo))
    if hit is not None and hit[0] is topo and hit[1] == n:
        return hit[2]
    eps = topo.endpoints()
    if len(_EPS_CACHE) > 32:
        _EPS_CACHE.clear()
    _EPS_CACHE[id(topo)] = (topo, n, eps)
    return eps


def group_endpoints(topo: Any, ranks: tuple[int, ...]) -> list[str]:
    """Topology node ids of a group's ranks (rank r = topo.endpoints()[r])."""
    eps = _endpoints(topo)
    if max(ranks) >= len(eps):
        raise InvalidArgument(f"layout needs {max(ranks) + 1} GPUs but topology {topo.name!r} has {len(eps)}",
                              "add nodes (--nodes) or shrink tp x pp x dp")
    return [eps[r] for r in ranks]
