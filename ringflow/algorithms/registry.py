"""Every algorithm: its builder, the collectives it fits, its closed-form cost (gloo style).

``get_schedule(collective, algorithm, nranks, root=, nsegs=, nchannels=, rings=, host_groups=)``
builds (LRU-cached; schedules are frozen) and ``algorithms_for(collective)`` lists names.

Closed forms count *transfer steps* (steps that move data) and *bytes per rank*: the largest,
over ranks, of max(bytes sent, bytes received). ``S`` is the size of the whole vector:
count x itemsize for all_reduce / reduce / broadcast / sendrecv; n x count x itemsize for
all_gather / gather (output), reduce_scatter / scatter (input) and all_to_all (one rank's
input). ``p = 2^floor(log2 n)``, ``r = n - p`` (fold for non-powers of two),
``K = ceil(log2 n)``, ``segs`` = segments per block.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from .. import config
from ..errors import InvalidArgument, UnknownAlgorithm
from . import (
    bruck,
    dissemination,
    hierarchical,
    nccl_collnet,
    nccl_nvls,
    nccl_pat,
    nccl_pxn,
    p2p,
    pairwise,
    param_server,
    ring,
    tree,
)
from . import halving_doubling as hd
from ._common import ceil_log2, pow2_floor
from .schedule import Collective, Schedule

C = Collective


@dataclass(frozen=True)
class ClosedForm:
    """Transfer steps and bytes per rank as a fraction of S (max over ranks of max(sent, received))."""

    steps: int
    bytes_fraction: Fraction


@dataclass(frozen=True)
class AlgorithmInfo:
    """One algorithm: builder, collectives, cost lines and closed forms per collective."""

    name: str
    family: str
    summary: str
    builder: Callable[..., Schedule]
    cost_lines: dict[Collective, str]
    closed_forms: dict[Collective, Callable[[int, int, int], ClosedForm]] = field(default_factory=dict)
    pipelined: tuple[Collective, ...] = ()  # collectives where nsegs changes the step count (worth tuning)
    multichannel: bool = False   # accepts nchannels > 1 / rings
    grouped: bool = False        # takes host_groups (servers)
    gpu_only: bool = False       # NCCL's GPU algorithms: switch reduction / NVLink peers the CPU runtime lacks

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return tuple(self.cost_lines)

    def closed_form(self, collective: Collective | str, nranks: int, nsegs: int = 1, nchannels: int = 1) -> ClosedForm:
        """Steps and bytes fraction predicted by the closed form."""
        return self.closed_forms[Collective.parse(collective)](nranks, nsegs, nchannels)


F = Fraction


def _cf(steps: int, frac: Fraction | int) -> ClosedForm:
    return ClosedForm(steps, F(frac))


def _dbtree_cf(c: Collective) -> Callable[[int, int, int], ClosedForm]:
    def f(n: int, segs: int, _ch: int) -> ClosedForm:
        if n == 1:
            return _cf(0, 0)
        trees = tree._dbtree_parents(c, n, 0 if c != C.ALL_REDUCE else None)
        nodes = list(range(n))
        heights = [tree._heights(t, nodes)[t.index(-1)] for t in trees]
        h = max(heights)
        steps = segs + 2 * h - 1 if c == C.ALL_REDUCE else segs + h - 1
        per = []
        for r in nodes:
            up = sum(F(0 if t[r] < 0 else 1, 2) for t in trees)
            kids = sum(F(sum(1 for p in t if p == r), 2) for t in trees)
            sent, recv = {C.ALL_REDUCE: (up + kids, up + kids), C.REDUCE: (up, kids)}.get(c, (kids, up))
            per.append(max(sent, recv))
        return _cf(steps, max(per))
    return f


def _binomial_cf(c: Collective) -> Callable[[int, int, int], ClosedForm]:
    def f(n: int, _segs: int, _ch: int) -> ClosedForm:
        K = ceil_log2(n)
        if n == 1:
            return _cf(0, 0)
        if c == C.ALL_REDUCE:
            return _cf(2 * K, K)
        if c in (C.REDUCE, C.BROADCAST):
            return _cf(K, K)
        return _cf(K, F(n - 1, n))
    return f


def _rd_cf(c: Collective) -> Callable[[int, int, int], ClosedForm]:
    def f(n: int, _segs: int, _ch: int) -> ClosedForm:
        if n == 1:
            return _cf(0, 0)
        fo = hd.Fold(n)
        steps = fo.log + (2 if fo.r else 0)
        if c == C.ALL_REDUCE:
            return _cf(steps, fo.log + (1 if fo.r else 0))
        # all_gather: survivor u sends/receives the blocks of aligned survivor groups of size 2^k
        best = F(1) if fo.r else F(0)
        for u in range(fo.p):
            sent = sum(fo.lo((u & ~((1 << k) - 1)) + (1 << k)) - fo.lo(u & ~((1 << k) - 1)) for k in range(fo.log))
            recv = sum(fo.lo(((u ^ (1 << k)) & ~((1 << k) - 1)) + (1 << k)) - fo.lo((u ^ (1 << k)) & ~((1 << k) - 1))
                       for k in range(fo.log))
            if u < fo.r:
                sent, recv = sent + n, recv + 1
            best = max(best, F(max(sent, recv), n))
        return _cf(steps, best)
    return f


def _hd_cf(c: Collective) -> Callable[[int, int, int], ClosedForm]:
    def f(n: int, _segs: int, _ch: int) -> ClosedForm:
        if n == 1:
            return _cf(0, 0)
        fo = hd.Fold(n)
        if c == C.ALL_REDUCE:
            return _cf(2 * fo.log + (2 if fo.r else 0), F(2 * (fo.p - 1), fo.p) + (1 if fo.r else 0))
        # reduce_scatter over per-rank blocks; survivor u owns ranks [lo(u), lo(u+1))
        best = F(1) if fo.r else F(0)
        for u in range(fo.p):
            sent = recv = 0
            for k in range(fo.log):
                d = fo.p >> (k + 1)
                v = u ^ d
                sa, ka = v & ~(d - 1), u & ~(d - 1)
                sent += fo.lo(sa + d) - fo.lo(sa)
                recv += fo.lo(ka + d) - fo.lo(ka)
            if u < fo.r:
                sent, recv = sent + 1, recv + n
            best = max(best, F(max(sent, recv), n))
        return _cf(fo.log + (2 if fo.r else 0), best)
    return f


def _rab_cf(n: int, _segs: int, _ch: int) -> ClosedForm:
    """Rabenseifner reduce with root 0 (the cost test uses root 0)."""
    if n == 1:
        return _cf(0, 0)
    fo = hd.Fold(n)
    u0 = fo.survivor_of(0)
    folded_root = fo.real(u0) != 0
    steps = 2 * fo.log + (1 if fo.r else 0) + (1 if folded_root else 0)
    best = F(1) if fo.r else F(0)
    for u in range(fo.p):
        w = u ^ u0
        sent = recv = F(fo.p - 1, fo.p)
        if w:
            sent += F(w & -w, fo.p)
        recv += sum(F(1 << k, fo.p) for k in range(fo.log) if w % (2 << k) == 0)
        if u < fo.r:
            recv += 1
        if u == u0 and folded_root:
            sent += 1
        best = max(best, sent, recv)
    return _cf(steps, best)


def _bruck_a2a(n: int) -> ClosedForm:
    K = ceil_log2(n)
    blocks = sum(sum(1 for i in range(n) if i >> k & 1) for k in range(K))
    return _cf(K, F(blocks, n))


def _hier_cf(n: int, _segs: int, _ch: int) -> ClosedForm:
    groups = hierarchical.default_host_groups(n)
    H, m = len(groups), len(groups[0])
    return _cf(2 * (m - 1) + 2 * (H - 1), F(2 * (m - 1), m) + F(2 * (H - 1), H * m))


_ALGOS: list[AlgorithmInfo] = [
    AlgorithmInfo(
        "ring", "ring", "ring over ranks (or over topology rings, one per channel); chain pipelining for rooted",
        ring.build,
        {C.ALL_REDUCE: "steps: 2(n-1); bytes per rank: 2(n-1)/n S",
         C.REDUCE_SCATTER: "steps: n-1; bytes per rank: (n-1)/n S",
         C.ALL_GATHER: "steps: n-1; bytes per rank: (n-1)/n S",
         C.BROADCAST: "steps: segs+n-2; bytes per rank: S; time N(segs+n-2)/(segs B) = the seed's N(S+K-2)/(S B)",
         C.REDUCE: "steps: segs+n-2; bytes per rank: S"},
        {C.ALL_REDUCE: lambda n, s, ch: _cf(2 * (n - 1), F(2 * (n - 1), n)),
         C.REDUCE_SCATTER: lambda n, s, ch: _cf(n - 1, F(n - 1, n)),
         C.ALL_GATHER: lambda n, s, ch: _cf(n - 1, F(n - 1, n)),
         C.BROADCAST: lambda n, s, ch: _cf(s + n - 2 if n > 1 else 0, 1 if n > 1 else 0),
         C.REDUCE: lambda n, s, ch: _cf(s + n - 2 if n > 1 else 0, 1 if n > 1 else 0)},
        pipelined=(C.BROADCAST, C.REDUCE), multichannel=True),
    AlgorithmInfo(
        "tree", "tree", "NCCL double binary tree, pipelined in segments (2 channels, half the data each)",
        tree.build_dbtree,
        {C.ALL_REDUCE: "steps: segs+2h-1 (h = tree height ~ log2 n); bytes per rank: <= 2S",
         C.REDUCE: "steps: segs+h-1; bytes per rank: <= S",
         C.BROADCAST: "steps: segs+h-1; bytes per rank: <= S"},
        {c: _dbtree_cf(c) for c in (C.ALL_REDUCE, C.REDUCE, C.BROADCAST)},
        pipelined=(C.ALL_REDUCE, C.REDUCE, C.BROADCAST)),
    AlgorithmInfo(
        "binomial", "tree", "binomial tree (latency-optimal for small messages)", tree.build_binomial,
        {C.ALL_REDUCE: "steps: 2K; bytes per rank: K S",
         C.REDUCE: "steps: K; bytes per rank: K S (root receives K times)",
         C.BROADCAST: "steps: K; bytes per rank: K S (root sends K times)",
         C.GATHER: "steps: K; bytes per rank: (n-1)/n S", C.SCATTER: "steps: K; bytes per rank: (n-1)/n S"},
        {c: _binomial_cf(c) for c in (C.ALL_REDUCE, C.REDUCE, C.BROADCAST, C.GATHER, C.SCATTER)}),
    AlgorithmInfo(
        "recursive_doubling", "halving_doubling", "recursive doubling, whole vector each round (+ fold)",
        hd.build_recursive_doubling,
        {C.ALL_REDUCE: "steps: log2 p + 2[r>0]; bytes per rank: (log2 p + [r>0]) S",
         C.ALL_GATHER: "steps: log2 p + 2[r>0]; bytes per rank: (n-1)/n S (+ S with fold)"},
        {c: _rd_cf(c) for c in (C.ALL_REDUCE, C.ALL_GATHER)}),
    AlgorithmInfo(
        "halving_doubling", "halving_doubling",
        "recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner's all-reduce) (+ fold)",
        hd.build_halving_doubling,
        {C.ALL_REDUCE: "steps: 2 log2 p + 2[r>0]; bytes per rank: 2(p-1)/p S + [r>0] S",
         C.REDUCE_SCATTER: "steps: log2 p + 2[r>0]; bytes per rank: (n-1)/n S for n = p (+ S with fold)"},
        {c: _hd_cf(c) for c in (C.ALL_REDUCE, C.REDUCE_SCATTER)}),
    AlgorithmInfo(
        "rabenseifner", "halving_doubling", "Rabenseifner reduce: halving reduce-scatter + binomial gather to root",
        hd.build_rabenseifner,
        {C.REDUCE: "steps: 2 log2 p + [r>0] + [root folded]; bytes per rank: (p-1)/p S + S/2 for n = p"},
        {C.REDUCE: _rab_cf}),
    AlgorithmInfo(
        "bruck", "bruck", "Bruck: ceil(log2 n) steps for any n (small messages)", bruck.build,
        {C.ALL_GATHER: "steps: K; bytes per rank: (n-1)/n S",
         C.ALL_TO_ALL: "steps: K; bytes per rank: sum_k #{i<n with bit k set}/n S (about K/2 S)"},
        {C.ALL_GATHER: lambda n, s, ch: _cf(ceil_log2(n), F(n - 1, n)),
         C.ALL_TO_ALL: lambda n, s, ch: _bruck_a2a(n)}),
    AlgorithmInfo(
        "pairwise", "pairwise", "pairwise exchange: step i, rank r sends to r+i, receives from r-i",
        pairwise.build_pairwise,
        {C.ALL_TO_ALL: "steps: n-1; bytes per rank: (n-1)/n S",
         C.ALL_TO_ALLV: "steps: n-1; bytes per rank: sum of the rank's off-diagonal splits",
         C.ALL_GATHER: "steps: n-1; bytes per rank: (n-1)/n S",
         C.REDUCE_SCATTER: "steps: n-1; bytes per rank: (n-1)/n S"},
        {c: (lambda n, s, ch: _cf(n - 1, F(n - 1, n)))
         for c in (C.ALL_TO_ALL, C.ALL_TO_ALLV, C.ALL_GATHER, C.REDUCE_SCATTER)}),
    AlgorithmInfo(
        "one_shot", "pairwise", "one-shot (direct) all-reduce: all-to-all of the whole buffer, sum in rank order",
        pairwise.build_one_shot, {C.ALL_REDUCE: "steps: 1; bytes per rank: (n-1) S"},
        {C.ALL_REDUCE: lambda n, s, ch: _cf(1 if n > 1 else 0, n - 1)}),
    AlgorithmInfo(
        "direct", "pairwise", "direct (linear) gather / scatter: the root talks to everyone in one step",
        pairwise.build_direct,
        {C.GATHER: "steps: 1; bytes per rank: (n-1)/n S (at the root)",
         C.SCATTER: "steps: 1; bytes per rank: (n-1)/n S (at the root)"},
        {c: (lambda n, s, ch: _cf(1 if n > 1 else 0, F(n - 1, n))) for c in (C.GATHER, C.SCATTER)}),
    AlgorithmInfo(
        "hierarchical", "hierarchical", "two-level: intra-host ring reduce-scatter, inter-host ring per shard, "
        "intra-host all-gather", hierarchical.build,
        {C.ALL_REDUCE: "steps: 2(m-1) + 2(H-1); bytes per rank: 2(m-1)/m S + 2(H-1)/(H m) S (inter-host)"},
        {C.ALL_REDUCE: _hier_cf}),
    AlgorithmInfo(
        "param_server", "param_server", "reduce to one server rank (root, default 0), then broadcast",
        param_server.build_param_server, {C.ALL_REDUCE: "steps: 2; bytes per rank: (n-1) S (at the server)"},
        {C.ALL_REDUCE: lambda n, s, ch: _cf(2 if n > 1 else 0, n - 1)}),
    AlgorithmInfo(
        "sharded_ps", "param_server", "sharded parameter servers: rank j serves block j (two-shot)",
        param_server.build_sharded, {C.ALL_REDUCE: "steps: 2; bytes per rank: 2(n-1)/n S"},
        {C.ALL_REDUCE: lambda n, s, ch: _cf(2 if n > 1 else 0, F(2 * (n - 1), n))}),
    AlgorithmInfo(
        "p2p", "p2p", "one message from root to peer", p2p.build_p2p, {C.SENDRECV: "steps: 1; bytes per rank: S"},
        {C.SENDRECV: lambda n, s, ch: _cf(1 if n > 1 else 0, 1 if n > 1 else 0)}),
    AlgorithmInfo(
        "dissemination", "p2p", "dissemination: round k, r sends to r+2^k (barrier; all-reduce of whole vectors "
        "summed in rank order; broadcast by binomial doubling), nothing in OUT before the last round",
        dissemination.build,
        {C.BARRIER: "steps: K; bytes per rank: 0",
         C.ALL_REDUCE: "steps: K; bytes per rank: (n-1) S",
         C.BROADCAST: "steps: K; bytes per rank: K S (the root sends K times)"},
        {C.BARRIER: lambda n, s, ch: _cf(ceil_log2(n), 0),
         C.ALL_REDUCE: lambda n, s, ch: _cf(ceil_log2(n), n - 1),
         C.BROADCAST: lambda n, s, ch: _cf(ceil_log2(n), ceil_log2(n))}),
]

ALGORITHMS: dict[str, AlgorithmInfo] = {a.name: a for a in _ALGOS}


def _groups_of(n: int) -> tuple[int, int]:
    """(servers H, GPUs per server m) of hierarchical's default host groups."""
    g = hierarchical.default_host_groups(n)
    return len(g), len(g[0])


def _nvls_tree_cf(n: int, segs: int, _ch: int) -> ClosedForm:
    if n == 1:
        return _cf(0, 0)
    H, m = _groups_of(n)
    up, final = nccl_nvls.tree_times(H, 2)
    kids = [sum(1 for k in (2 * h + 1, 2 * h + 2) if k < H) for h in range(H)]
    # per GPU: NVLS reduce-scatter (S out, S/m in) + all-gather (S/m out, S in) + tree (up once, down to kids)
    per = [F(1) + F(1, m) + F(kids[h] + (h > 0), m) for h in range(H)]
    return _cf(segs + max(final) + 1, max(per))


def _collnet_direct_cf(n: int, segs: int, _ch: int) -> ClosedForm:
    if n == 1:
        return _cf(0, 0)
    _H, m = _groups_of(n)
    return _cf(segs + 3 if m > 1 else segs + 1, F(2 * m - 1, m))


def _collnet_chain_cf(n: int, segs: int, _ch: int) -> ClosedForm:
    if n == 1:
        return _cf(0, 0)
    _H, m = _groups_of(n)
    return _cf(segs + 2 * m - 1 if m > 1 else segs + 1, 2 if m > 1 else 1)


def _pxn_cf(n: int, _segs: int, _ch: int) -> ClosedForm:
    if n == 1:
        return _cf(0, 0)
    H, m = _groups_of(n)
    return _cf((m > 1) + (H > 1), F((m - 1) * H + (H - 1) * m, n))


# NCCL's GPU algorithms (docs/algorithms.md "NCCL's GPU algorithms"): verified like the others, simulated, chosen by
# `sim.nccl_tuner`; never offered to the CPU runtime (not in ALGORITHMS / algorithms_for).
_NCCL: list[AlgorithmInfo] = [
    AlgorithmInfo(
        "nvls", "nccl", "NVLink SHARP: the NVSwitch sums and multicasts (one switch participant)",
        nccl_nvls.build_nvls,
        {C.ALL_REDUCE: "steps: segs+3; bytes per rank: (n+1)/n S",
         C.REDUCE_SCATTER: "steps: segs+1; bytes per rank: S (sent), S/n received",
         C.ALL_GATHER: "steps: segs+1; bytes per rank: S (received), S/n sent"},
        {C.ALL_REDUCE: lambda n, s, ch: _cf(s + 3 if n > 1 else 0, F(n + 1, n) if n > 1 else 0),
         C.REDUCE_SCATTER: lambda n, s, ch: _cf(s + 1 if n > 1 else 0, 1 if n > 1 else 0),
         C.ALL_GATHER: lambda n, s, ch: _cf(s + 1 if n > 1 else 0, 1 if n > 1 else 0)},
        pipelined=(C.ALL_REDUCE, C.REDUCE_SCATTER, C.ALL_GATHER), gpu_only=True),
    AlgorithmInfo(
        "nvls_tree", "nccl", "NVLS inside each server + binary tree of servers per block (one switch per server)",
        nccl_nvls.build_nvls_tree,
        {C.ALL_REDUCE: "steps: segs + 2 + tree up and down depth; bytes per rank: (m+1)/m S + (children + 1)/m S"},
        {C.ALL_REDUCE: _nvls_tree_cf}, pipelined=(C.ALL_REDUCE,), grouped=True, gpu_only=True),
    AlgorithmInfo(
        "collnet_direct", "nccl", "IB SHARP, CollNet Direct: NVLink reduce-scatter to heads, switch sums, heads copy",
        nccl_collnet.build_collnet_direct,
        {C.ALL_REDUCE: "steps: segs+3 (segs+1 for m = 1); bytes per rank: (2m-1)/m S"},
        {C.ALL_REDUCE: _collnet_direct_cf},
        pipelined=(C.ALL_REDUCE,), grouped=True, gpu_only=True),
    AlgorithmInfo(
        "collnet_chain", "nccl", "IB SHARP, CollNet Chain: chain up the server, switch sums, chain down",
        nccl_collnet.build_collnet_chain,
        {C.ALL_REDUCE: "steps: segs+2m-1; bytes per rank: 2S (S with one GPU per server)"},
        {C.ALL_REDUCE: _collnet_chain_cf}, pipelined=(C.ALL_REDUCE,), grouped=True, gpu_only=True),
    AlgorithmInfo(
        "pat", "nccl", "PAT (NCCL 2.23+): Bruck-pattern all-gather, reversed for reduce-scatter",
        nccl_pat.build_pat,
        {C.ALL_GATHER: "steps: K; bytes per rank: (n-1)/n S", C.REDUCE_SCATTER: "steps: K; bytes per rank: (n-1)/n S"},
        {c: (lambda n, s, ch: _cf(ceil_log2(n), F(n - 1, n))) for c in (C.ALL_GATHER, C.REDUCE_SCATTER)},
        gpu_only=True),
    AlgorithmInfo(
        "pxn", "nccl", "PXN all-to-all: NVLink to the peer on the destination's rail, then its NIC",
        nccl_pxn.build_pxn,
        {C.ALL_TO_ALL: "steps: 2; bytes per rank: ((m-1)H + (H-1)m)/n S"},
        {C.ALL_TO_ALL: _pxn_cf}, grouped=True, gpu_only=True),
]

NCCL_ALGORITHMS: dict[str, AlgorithmInfo] = {a.name: a for a in _NCCL}


def info(name: str) -> AlgorithmInfo:
    """The AlgorithmInfo of `name` (runtime or NCCL GPU algorithm); UnknownAlgorithm lists the valid names."""
    key = str(name).lower().replace("-", "_")
    a = ALGORITHMS.get(key) or NCCL_ALGORITHMS.get(key)
    if a is None:
        raise UnknownAlgorithm(f"unknown algorithm {name!r}",
                               f"valid algorithms: {', '.join(ALGORITHMS)}; GPU-only: {', '.join(NCCL_ALGORITHMS)}")
    return a


def gpu_algorithms_for(collective: Collective | str) -> list[str]:
    """Names of NCCL's GPU-only algorithms that implement `collective` (not offered to the runtime)."""
    c = Collective.parse(collective)
    return [a.name for a in _NCCL if c in a.cost_lines]


def algorithms_for(collective: Collective | str) -> list[str]:
    """Names of the algorithms that implement `collective`."""
    c = Collective.parse(collective)
    return [a.name for a in _ALGOS if c in a.cost_lines]


def _tuplify(x: Sequence[Sequence[int]] | None) -> tuple[tuple[int, ...], ...] | None:
    return None if not x else tuple(tuple(int(v) for v in r) for r in x)


def get_schedule(collective: Collective | str, algorithm: str, nranks: int, *, root: int | None = None,
                 nsegs: int = 1, nchannels: int = 1, rings: Sequence[Sequence[int]] | None = None,
                 host_groups: Sequence[Sequence[int]] | None = None, peer: int | None = None) -> Schedule:
    """The (cached, frozen) schedule of `algorithm` for `collective` on `nranks` ranks.

    Ring orders: `rings` (one per channel, cycled), else RINGFLOW_RINGS, else the default orders.
    """
    c = Collective.parse(collective)
    a = info(algorithm)
    if c not in a.cost_lines:
        raise UnknownAlgorithm(f"algorithm {a.name!r} does not implement {c.value}",
                               f"algorithms for {c.value}: {', '.join(algorithms_for(c))}")
    if not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"nranks={nranks!r}", "need an int >= 1")
    if nsegs < 1 or nchannels < 1:
        raise InvalidArgument(f"nsegs={nsegs}, nchannels={nchannels}", "both must be >= 1")
    if not (c.has_root or c == C.SENDRECV or a.name == "param_server"):
        root = None
    if not a.multichannel:
        nchannels, rings = 1, None
    elif not rings and config.get("RINGS"):
        from ..topology import parse_rings  # NCCL_RINGS-style explicit orders (TopologyError if malformed)
        rings = parse_rings(config.get("RINGS"), nranks)
    if a.name != "hierarchical" and not a.grouped:
        host_groups = None
    return _build_cached(c, a.name, nranks, root, nsegs, nchannels, _tuplify(rings), _tuplify(host_groups), peer)


@lru_cache(maxsize=512)
def _build_cached(c: Collective, name: str, nranks: int, root: int | None, nsegs: int, nchannels: int,
                  rings: tuple[tuple[int, ...], ...] | None, host_groups: tuple[tuple[int, ...], ...] | None,
                  peer: int | None) -> Schedule:
    kw: dict[str, Any] = dict(root=root, nsegs=nsegs, nchannels=nchannels, rings=rings, host_groups=host_groups)
    if peer is not None:
        kw["peer"] = peer
    return info(name).builder(c, nranks, **kw)


def collective_bytes(collective: Collective | str, nranks: int, count: int, itemsize: int = 4) -> int:
    """S of the closed forms for a call with `count` (CallShape convention)."""
    c = Collective.parse(collective)
    if c in (C.ALL_GATHER, C.GATHER, C.REDUCE_SCATTER, C.SCATTER, C.ALL_TO_ALL, C.ALL_TO_ALLV):
        return nranks * count * itemsize
    if c == C.BARRIER:
        return 0
    return count * itemsize


def granule(nranks: int, nsegs: int = 1, nchannels: int = 1) -> int:
    """A count that every algorithm's blocks and segments divide evenly (for exact closed-form checks)."""
    from math import lcm
    return lcm(nranks, 2, pow2_floor(nranks)) * nsegs * nchannels
