"""A parallel layout (TP x PP x DP x EP x CP and the training knobs) and its Megatron-style rank mapping.

Rank order (Megatron's default ``tp-cp-ep-dp-pp``): TP is innermost, so a TP group is consecutive ranks inside
one server; then CP, then DP, then PP outermost. A global rank is the index into ``topology.endpoints()``,
which sorts GPUs by (server, index), so consecutive ranks share a server. Experts fold over the same
``tp x cp x dp`` ranks of a stage (Megatron-Core's MoE parallel folding): expert-TP (``etp``, default tp)
innermost, then EP, then expert-DP, so with etp = tp an EP group is every tp-th rank and with etp = 1 it is
consecutive ranks.

Pipeline stages hold ``layers / pp`` layers each, or an uneven split: ``first_stage_layers`` /
``last_stage_layers`` (Megatron-Core ``--decoder-first/last-pipeline-num-layers``: the other stages split the rest
evenly) or an explicit ``stage_layers`` list. The embedding sits on the first stage, the final norm and the
output layer on the last. With interleaving (v virtual stages per GPU) every stage needs at least v layers;
its chunks may differ by one layer (Megatron-Core's ``--pipeline-model-parallel-layout``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import ConfigError, InvalidArgument
from .models import ModelSpec
from .moe import check_dispatcher

RECOMPUTE_MODES = ("none", "selective", "full", "op")   # op: per-operator selective checkpointing (torchtitan)
PRECISIONS = ("bf16", "fp8")
CP_COMM = ("p2p", "a2a", "allgather")   # ring attention, Ulysses all-to-all, all-gather of K/V (Llama 3)
TP_OVERLAPS = ("userbuffers", "async_tp")   # Transformer Engine userbuffers; PyTorch async TP (tpoverlap.py)
FSDP_UNITS = ("bucketed", "per_block")   # how ZeRO-3 groups its gathers: buckets per micro-batch; one unit per
                                         # transformer block + the root module (PyTorch fully_shard, fsdp.py)


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
    recompute: str = "none"         # none | selective | full | op
    sequence_parallel: bool = False
    interleave: int = 1             # virtual pipeline stages per GPU (1 = plain 1F1B)
    bucket_bytes: int = 40_000_000 * 4   # DP gradient bucket (Megatron: 40M fp32 elements)
    overlap_grad_reduce: bool = True     # DP reduce overlapped with backward, bucket by bucket
    overlap_param_gather: bool = True    # ZeRO/FSDP gathers prefetched under compute
    overlap_tp: bool = False             # TP collectives hidden under their GEMMs (workload/tpoverlap.py)
    tp_overlap: str = "userbuffers"      # how overlap_tp runs: userbuffers (Megatron --tp-comm-overlap, Transformer
                                         # Engine) or async_tp (PyTorch micro-pipelined TP, torchtitan)
    precision: str = "bf16"
    flash_attention: bool = True         # attention scores never stored (Dao et al. 2022)
    grad_bytes: int = 4                  # gradient element size (Megatron keeps fp32 main grads)
    etp: int = 0                         # expert tensor parallelism (0 = tp, Megatron's default)
    cp_comm: str = "p2p"                 # context parallelism: p2p (ring attention), a2a (Ulysses), allgather
    stage_layers: tuple[int, ...] = ()   # explicit layers per pipeline stage (sums to the model's layers)
    first_stage_layers: int = 0          # layers on the first stage (0 = even split); the rest split evenly
    last_stage_layers: int = 0           # layers on the last stage (0 = even split)
    capacity_factor: float = 0.0         # MoE: expert capacity / balanced load; tokens beyond it are dropped and
                                         # buffers padded to it (0 = dropless, balanced load)
    fp8_params: bool = False             # FP8 training keeps weights only in FP8 (Megatron --fp8-param-gather)
    overlap_ep: bool = False             # MoE all-to-alls hidden under another micro-batch's compute (DeepSeek's
                                         # DualPipe, Megatron --overlap-moe-expert-parallel-comm)
    offload_layers: int = 0              # layers per pipeline stage whose stored activations go to host memory
                                         # (Megatron --cpu-offloading-num-layers); the copies hide under compute
    ep_dispatcher: str = "alltoall"      # MoE token dispatcher: alltoall (Megatron's all-to-all) or flex (DeepEP /
                                         # HybridEP, Megatron --moe-flex-dispatcher-backend); workload/moe.py
    expert_imbalance: float = 1.0        # MoE: busiest expert's load / balanced load (1: force-balanced routing)
    fsdp_units: str = "bucketed"         # ZeRO-3 units: bucketed (gathers and reduce-scatters per micro-batch,
                                         # hidden under its compute) or per_block (PyTorch FSDP applied per block
                                         # and to the root, as torchtitan does: workload/fsdp.py)

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "seq_len", "interleave"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"layout {f}={v!r} must be an integer >= 1", f"set --{f.replace('_', '-')} >= 1")
        for f in ("etp", "first_stage_layers", "last_stage_layers", "offload_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"layout {f}={v!r} must be an integer >= 0", f"set --{f.replace('_', '-')} >= 0")
        if not isinstance(self.stage_layers, tuple):
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        self._check_options()

    def _check_options(self) -> None:
        for name, choices in (("tp_overlap", TP_OVERLAPS), ("cp_comm", CP_COMM), ("fsdp_units", FSDP_UNITS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name}={getattr(self, name)!r}", f"use one of {', '.join(choices)}")
        if self.overlap_tp and self.tp > 1 and not self.sequence_parallel:
            raise ConfigError("overlap_tp without sequence parallelism: TP overlap decomposes the all-gathers and "
                              "reduce-scatters of sequence parallelism", "add --sequence-parallel or drop --overlap-tp")
        if self.capacity_factor and not self.capacity_factor >= 1.0:
            raise ConfigError(f"capacity_factor={self.capacity_factor!r} below 1 drops tokens even when balanced",
                              "give a capacity factor >= 1 (e.g. 1.25), or 0 for dropless routing")
        check_dispatcher(self.ep_dispatcher)
        if not (isinstance(self.expert_imbalance, (int, float)) and self.expert_imbalance >= 1.0):
            raise ConfigError(f"expert_imbalance={self.expert_imbalance!r} below 1",
                              "give the busiest expert's load over the balanced load (>= 1; 1 = balanced)")
        if self.fp8_params and self.precision != "fp8":
            raise ConfigError("fp8_params without precision fp8", "add --precision fp8 or drop --fp8-params")
        if self.stage_layers and (self.first_stage_layers or self.last_stage_layers):
            raise ConfigError("both stage_layers and first/last_stage_layers given",
                              "give the whole list (--stage-layers) or only the ends (--first/--last-stage-layers)")
        if (self.stage_layers or self.first_stage_layers or self.last_stage_layers) and self.pp == 1:
            raise ConfigError("uneven pipeline stages with pp = 1", "raise --pp, or drop the stage-layer options")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero={self.zero!r}", "ZeRO stage must be 0, 1, 2 or 3 (3 = FSDP)")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute={self.recompute!r}", f"use one of {', '.join(RECOMPUTE_MODES)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r}", f"use one of {', '.join(PRECISIONS)}")
        if (self.tp * self.dp * self.cp) % (self.expert_tp * self.ep):
            raise ConfigError(f"etp x ep = {self.expert_tp} x {self.ep} must divide tp x dp x cp = "
                              f"{self.tp * self.dp * self.cp}",
                              "experts fold over the tp x cp x dp ranks of a stage: choose ep (and etp) dividing them")
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
    def expert_tp(self) -> int:
        """Tensor-parallel degree inside an expert (etp, default tp)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the expert weights: tp x cp x dp / (etp x ep)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

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
        self.stage_layer_counts(model)
        if (self.ep > 1 or self.etp) and not model.is_moe:
            raise ConfigError(f"ep={self.ep} / etp={self.etp} for the dense model {model.name}",
                              "expert parallelism needs a MoE model (experts > 1): drop --ep / --etp")
        if self.ep > 1 and model.experts % self.ep:
            raise ConfigError(f"ep={self.ep} does not divide experts={model.experts}", "choose ep dividing experts")
        if self.capacity_factor and not model.is_moe:
            raise ConfigError(f"capacity_factor for the dense model {model.name}", "drop --capacity-factor")
        if model.is_moe and model.moe_ffn % self.expert_tp:
            raise ConfigError(f"etp={self.expert_tp} does not divide the expert FFN size {model.moe_ffn}",
                              "choose --etp dividing the expert FFN (1 keeps experts whole)")
        if self.seq_len % self.cp:
            raise ConfigError(f"seq_len={self.seq_len} not divisible by cp={self.cp}", "choose cp dividing seq len")
        if self.cp > 1 and self.cp_comm == "a2a" and model.heads % (self.tp * self.cp):
            raise ConfigError(f"Ulysses context parallelism (cp_comm a2a) splits heads over tp x cp = "
                              f"{self.tp * self.cp}, which does not divide heads={model.heads}",
                              "use --cp-comm p2p or allgather, or a cp with tp x cp dividing the heads")

    def stage_layer_counts(self, model: ModelSpec) -> tuple[int, ...]:
        """Layers on each pipeline stage (all its virtual chunks), first to last; raises if not expressible."""
        return _stage_counts(self, model.layers)

    def stage_ranges(self, model: ModelSpec) -> list[tuple[int, int]]:
        """(first layer, one past the last layer) of each pipeline stage."""
        out, start = [], 0
        for n in self.stage_layer_counts(model):
            out.append((start, start + n))
            start += n
        return out


def even_ends(layers: int, pp: int) -> int | None:
    """Layers x for the first and the last stage so that the pp - 2 stages between split the rest evenly."""
    if pp < 3:
        return layers // 2 if pp == 2 and layers % 2 == 0 else None
    best = None
    for x in range(1, layers // pp + 1):
        rest = layers - 2 * x
        if rest > 0 and rest % (pp - 2) == 0 and (best is None or rest // (pp - 2) - x < best[1]):
            best = (x, rest // (pp - 2) - x)
    return best[0] if best else None


def _stage_counts(L: Layout, layers: int) -> tuple[int, ...]:
    p, v = L.pp, L.interleave
    if L.stage_layers:
        counts = L.stage_layers
        if len(counts) != p or any(not isinstance(c, int) or c < 1 for c in counts) or sum(counts) != layers:
            raise ConfigError(f"stage_layers {list(counts)} must be {p} whole numbers >= 1 summing to the model's "
                              f"{layers} layers", f"give {p} counts, e.g. --stage-layers "
                              f"{','.join(str(layers // p + (i < layers % p)) for i in range(p))}")
    elif L.first_stage_layers or L.last_stage_layers:
        ends = [x for x in (L.first_stage_layers, L.last_stage_layers) if x]
        rest_stages, rest = p - len(ends), layers - sum(ends)
        if (rest_stages == 0 and rest != 0) or (rest_stages and (rest < rest_stages or rest % rest_stages)):
            raise ConfigError(f"after {sum(ends)} layers on the end stages, {rest} layers do not split evenly "
                              f"over the other {rest_stages} stages", "change --first/--last-stage-layers, or give "
                              "every stage with --stage-layers")
        mid = rest // rest_stages if rest_stages else 0
        counts = (L.first_stage_layers or mid,) + (mid,) * (p - 2) + (L.last_stage_layers or mid,)
    else:
        if layers % p:
            x = even_ends(layers, p)
            hint = (f"put fewer layers on the end stages: --first-stage-layers {x} --last-stage-layers {x}"
                    if x else "give every stage's layers with --stage-layers") + ", or choose pp dividing the layers"
            raise ConfigError(f"layers={layers} not divisible by pp={p}", hint)
        counts = (layers // p,) * p
    if v > 1 and min(counts) < v:
        raise ConfigError(f"interleave={v} needs at least {v} layers on every stage; stages hold {list(counts)}",
                          f"choose --interleave <= {min(counts)}, or --interleave 1")
    return tuple(counts)


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
    et, n = L.expert_tp, L.tp * L.cp * L.dp
    for p in range(L.pp):
        base = p * n  # the stage's ranks are base .. base + n - 1, TP innermost
        for e_d in range(L.expert_dp):
            for e_t in range(et):
                ep_groups.append(tuple(base + e_t + et * (j + L.ep * e_d) for j in range(L.ep)))
    return RankGroups(tp, cp, dp, pp, tuple(ep_groups))


def first_groups(layout: Layout) -> RankGroups:
    """Only the first communicator of every dimension (all are alike in a homogeneous cluster): O(group size)."""
    L = layout
    return RankGroups(
        tp=(tuple(rank_of(L, t, 0, 0, 0) for t in range(L.tp)),),
        cp=(tuple(rank_of(L, 0, c, 0, 0) for c in range(L.cp)),),
        dp=(tuple(rank_of(L, 0, 0, d, 0) for d in range(L.dp)),),
        pp=(tuple(rank_of(L, 0, 0, 0, p) for p in range(L.pp)),),
        ep=(tuple(j * L.expert_tp for j in range(L.ep)),))


def expert_groups(layout: Layout) -> dict[str, tuple[int, ...]]:
    """The first expert-TP group (consecutive ranks) and expert-DP group (stride etp x ep) of stage 0."""
    L = layout
    return {"etp": tuple(range(L.expert_tp)),
            "edp": tuple(j * L.expert_tp * L.ep for j in range(L.expert_dp))}


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
