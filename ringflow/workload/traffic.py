"""Per-epoch traffic: the closed-form formulas (`seed_traffic`) beside what ringflow's algorithms really send.

``--formula exact`` maps each parallel dimension onto a cluster (DP, FSDP and PP
between servers, one GPU per server; TP inside one server; 3-D the Megatron way, TP innermost), lets the
tuner pick the algorithm for every call (ring, tree, hierarchical, ...), and asks the simulator's analytic
engine for the bytes each call puts on every link. Rows give, per epoch:

- ``backward_bytes`` / ``forward_bytes``: bytes the GPUs inject (what the closed form counts);
- ``tiers``: link-bytes per tier (a byte crossing GPU->NVSwitch->GPU counts twice on "nvlink"; one crossing
  servers counts on "nic" going up and coming down, and on "leaf-spine" when it leaves its leaf).

What a training step really sends (P parameters of 2-byte gradients, t tokens per step, h hidden, L layers):

| dim | per step | closed-form count |
|---|---|---|
| DP | one all-reduce of 2P per replica group: ring 2(G-1)/G x 2P per GPU | full mesh: every GPU sends 2P to G-1 others |
| FSDP | per layer: all-gather forward, all-gather + reduce-scatter backward | one all-gather + one all-reduce per layer |
| TP | 2 all-reduces of the activations (2 t h bytes) per layer forward, 2 of their gradients backward | backward: all-reduces of all P parameters per layer (4 N P L (G-1)), forward: full mesh |
| PP | one activation send forward and one gradient send back per stage boundary | same |

Plus the GPU-storage class: data loading (tokens x token bytes, once per epoch) and checkpoints
(weights + fp32 master + Adam moments, 14 B/parameter, every `checkpoint_every` steps).
"""  # noqa: E501 - a markdown table's rows cannot wrap
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from .layercomm import stage_calls
from .layout import Layout, expert_groups, first_groups, group_endpoints, rank_groups
from .memory import OPTIMIZER_BYTES, WEIGHT_BYTES
from .models import ModelSpec

BF16 = 2
TOKEN_ID_BYTES = 4  # int32 token ids as Megatron's indexed datasets store them for vocabularies > 65,535


@dataclass
class CallCost:
    """What one collective call puts on the wire, from the simulator."""

    algorithm: str
    injected_bytes: float
    tiers: dict[str, float]
    time_s: float


@dataclass
class ExactRow:
    """One parallel dimension's per-epoch traffic as ringflow's algorithms generate it."""

    mode: str
    pattern: str
    backward_bytes: float = 0.0
    backward_syncs: float = 0.0
    forward_bytes: float = 0.0
    forward_transfers: float = 0.0
    tiers: dict[str, float] = field(default_factory=dict)
    algorithms: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, cost: CallCost, calls: float, backward: bool) -> None:
        """Add `calls` calls of one kind."""
        if backward:
            self.backward_bytes += cost.injected_bytes * calls
        else:
            self.forward_bytes += cost.injected_bytes * calls
        for k, v in cost.tiers.items():
            self.tiers[k] = self.tiers.get(k, 0.0) + v * calls
        if cost.algorithm not in self.algorithms:
            self.algorithms.append(cost.algorithm)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (same keys as the closed-form rows, plus tiers)."""
        return {"mode": self.mode, "pattern": self.pattern, "backward_bytes": self.backward_bytes,
                "backward_syncs": self.backward_syncs, "forward_bytes": self.forward_bytes,
                "forward_transfers": self.forward_transfers, "total_bytes": self.backward_bytes + self.forward_bytes,
                "network_bytes": self.network_bytes, "tiers": dict(self.tiers),
                "algorithms": list(self.algorithms), "note": self.note}

    @property
    def network_bytes(self) -> float:
        """Bytes that leave their server (NIC link-bytes count up and down, so half of them)."""
        return self.tiers.get("nic", 0.0) / 2


def call_cost(topo: Any, collective: str, nbytes: float, group: Sequence[str]) -> CallCost:
    """Bytes injected and link-bytes per tier of one call, as the simulator routes the tuner's algorithm."""
    from ..sim import simulate
    n = len(group)
    size = max(int(nbytes), 2 * n)
    res = simulate(topo, collective, size, nranks=n, endpoints=list(group), dtype="bfloat16")
    tiers = {t["tier"]: float(t["bytes"]) for t in res.tiers() if t["bytes"] > 0}
    fab = res.fabric
    eps = set(group)
    injected = 0.0
    if fab is not None:
        for i, (u, _v) in enumerate(fab.edges):
            if u in eps:
                injected += float(res.link_bytes[i])
    scale = nbytes / size
    return CallCost(res.algorithm, injected * scale, {k: v * scale for k, v in tiers.items()},
                    res.time_us * 1e-6)


def exact_1d(model: ModelSpec, tokens: float, steps: float, gpus: int, topo_for: Any) -> list[ExactRow]:
    """The four 1-D rows as real algorithms send them (G GPUs; TP in one server, others across)."""
    P, L, H = float(model.params()), model.layers, model.hidden
    t_step = tokens / steps
    across = topo_for(gpus, one_per_server=True)
    inside = topo_for(gpus, one_per_server=False)
    g_across = _one_per_server(across, gpus)
    g_inside = inside.endpoints()[:gpus]
    rows = []
    dp = ExactRow("DP", "all-reduce", backward_syncs=1, note="ring/tree all-reduce of the 2P-byte gradient")
    dp.add(call_cost(across, "all_reduce", 2 * P, g_across), steps, True)
    rows.append(dp)
    fsdp = ExactRow("FSDP", "all-gather + reduce-scatter", backward_syncs=L, forward_transfers=L,
                    note="per layer: all-gather forward; all-gather + reduce-scatter backward")
    layer_b = 2 * P / L
    fsdp.add(call_cost(across, "all_gather", layer_b, g_across), steps * L, False)
    fsdp.add(call_cost(across, "all_gather", layer_b, g_across), steps * L, True)
    fsdp.add(call_cost(across, "reduce_scatter", layer_b, g_across), steps * L, True)
    rows.append(fsdp)
    tp = ExactRow("TP", "all-reduce", backward_syncs=2 * L, forward_transfers=2 * L,
                  note="2 all-reduces of the activations per layer forward, 2 of their gradients backward")
    act = t_step * H * BF16
    c = call_cost(inside, "all_reduce", act, g_inside)
    tp.add(c, 2 * L * steps, False)
    tp.add(c, 2 * L * steps, True)
    rows.append(tp)
    pp = ExactRow("PP", "point-to-point", backward_syncs=gpus - 1, forward_transfers=gpus - 1,
                  note="one activation (forward) and one gradient (backward) per stage boundary")
    c = call_cost(across, "sendrecv", act, g_across[:2])
    pp.add(c, (gpus - 1) * steps, False)
    pp.add(c, (gpus - 1) * steps, True)
    rows.append(pp)
    return rows


def exact_3d(model: ModelSpec, tokens: float, steps: float, layout: Layout, topo: Any) -> list[ExactRow]:
    """TP, PP and DP traffic of a Megatron-mapped 3-D layout on `topo`, per epoch."""
    P, L, H = float(model.params()), model.layers, model.hidden
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    groups = rank_groups(layout)
    t_step = tokens / steps
    rows = []
    if tp > 1:
        r = ExactRow("TP", "all-reduce", backward_syncs=2 * L / pp, forward_transfers=2 * L / pp,
                     note=f"{pp * dp} groups of {tp}; activations of t/dp tokens")
        c = call_cost(topo, "all_reduce", t_step / dp * H * BF16, group_endpoints(topo, groups.tp[0]))
        calls = 2 * (L / pp) * steps * pp * dp
        r.add(c, calls, False)
        r.add(c, calls, True)
        rows.append(r)
    if pp > 1:
        r = ExactRow("PP", "point-to-point", backward_syncs=pp - 1, forward_transfers=pp - 1,
                     note="each TP rank sends 1/tp of the activation (Megatron scatter/gather)")
        pair = group_endpoints(topo, groups.pp[0][:2])
        c = call_cost(topo, "sendrecv", t_step / dp * H * BF16 / tp, pair)
        calls = (pp - 1) * steps * dp * tp
        r.add(c, calls, False)
        r.add(c, calls, True)
        rows.append(r)
    if dp > 1:
        r = ExactRow("DP", "all-reduce", backward_syncs=1, note=f"{tp * pp} groups of {dp}; 2P/(tp pp) bytes each")
        c = call_cost(topo, "all_reduce", 2 * P / (tp * pp), group_endpoints(topo, groups.dp[0]))
        r.add(c, steps * tp * pp, True)
        rows.append(r)
    return rows + (exact_cp_ep(model, tokens, steps, layout, topo) if layout.cp > 1 or layout.ep > 1 else [])


_PATTERN = {"cp": "context parallel", "ep": "expert all-to-all", "etp": "expert-TP gather/scatter"}


def exact_cp_ep(model: ModelSpec, tokens: float, steps: float, layout: Layout, topo: Any) -> list[ExactRow]:
    """CP, EP and expert-TP traffic per epoch: `layercomm.stage_calls` of every stage, priced by the simulator.

    The epoch's t/dp tokens per replica and step are spread over the layout's micro-batches (bytes scale with
    tokens); every group of a stage sends the same, so one call is simulated per kind.
    """
    L = layout
    fg, eg = first_groups(L), expert_groups(L)
    reps = {"cp": fg.cp[0], "ep": fg.ep[0], "etp": eg["etp"]}
    scale = tokens / steps / L.dp / (L.microbatches * L.micro_batch * L.seq_len)
    rows: dict[str, ExactRow] = {}
    costs: dict[tuple, CallCost] = {}
    for stage in range(L.pp):
        for c in stage_calls(model, L, stage):
            if c.dim not in reps or c.group < 2:
                continue
            key = (c.dim, c.collective, c.nbytes)
            if key not in costs:
                eps = group_endpoints(topo, reps[c.dim][:2] if c.collective == "sendrecv" else reps[c.dim])
                costs[key] = call_cost(topo, c.collective, c.nbytes * scale, eps)
            n = L.tp * L.cp * L.dp  # GPUs of a stage; every rank sends its own message of a point-to-point pass
            groups = n if c.collective == "sendrecv" else n / c.group
            calls = c.calls * L.microbatches * steps * groups
            note = f"{L.cp_comm}, groups of {L.cp}" if c.dim == "cp" else f"groups of {c.group}"
            row = rows.setdefault(c.dim, ExactRow(c.dim.upper(), _PATTERN[c.dim], note=note))
            row.add(costs[key], calls * c.forward_share, False)
            row.add(costs[key], calls * (1 - c.forward_share), True)
    return list(rows.values())


def _one_per_server(topo: Any, n: int) -> list[str]:
    """GPU 0 of each of the first n servers (the same rail)."""
    out = []
    for h in topo.hosts():
        gs = topo.gpus(h) if hasattr(topo, "gpus") else []
        if gs:
            out.append(gs[0])
        if len(out) == n:
            return out
    raise InvalidArgument(f"topology has fewer than {n} servers", "raise --nodes")


def storage_traffic(model: ModelSpec, tokens: float, steps: float, checkpoint_every: int,
                    dataset_bytes: float | None = None) -> dict[str, float]:
    """The GPU-storage class per epoch: data loading and checkpoints."""
    if checkpoint_every < 1:
        raise InvalidArgument(f"checkpoint interval {checkpoint_every} steps", "give --checkpoint-every >= 1")
    ckpt = float(model.params()) * (WEIGHT_BYTES + OPTIMIZER_BYTES)
    n_ckpt = steps / checkpoint_every
    load = tokens * TOKEN_ID_BYTES
    d = {"load_bytes": load, "checkpoint_bytes": ckpt, "checkpoints_per_epoch": n_ckpt,
         "checkpoint_bytes_per_epoch": ckpt * n_ckpt, "total_bytes": load + ckpt * n_ckpt}
    if dataset_bytes:
        d["dataset_bytes"] = dataset_bytes
    return d


DIFFERENCES = [
    ("DP", "the closed form counts a full-mesh exchange (each GPU sends its whole gradient to all G-1 others, "
           "G(G-1) copies); a ring or tree all-reduce sends 2(G-1)/G of it per GPU: G/2 times less."),
    ("FSDP", "the closed form's backward is one all-reduce per layer; FSDP re-gathers the parameters and "
             "reduce-scatters the gradients (2 collectives of the same size as the forward all-gather)."),
    ("TP", "the closed form's backward all-reduces all P parameters in every layer (4 N P L (G-1)); Megatron's TP "
           "backward all-reduces activation gradients, the same size as the forward activations; its forward "
           "row is again a full mesh (G(G-1)), a ring sends 2(G-1), NVLS in an H100 server G+1 (the switch "
           "sums and copies)."),
    ("PP", "agrees: one activation and one gradient per stage boundary (the closed form counts no TP split)."),
    ("units", "the reference table's TP rows are in 2^20 x 1e9 B ('PB' via 1024^2), its other rows in 1e15 B; "
              "its switch sizing reads 51.2 Tb/s as 51.2 TB/s (8x too fast)."),
]
