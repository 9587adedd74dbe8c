"""NCCL's tree all-reduce across servers: a chain through each server's GPUs, a double binary tree of servers.

NCCL builds its trees per channel: inside a server the GPUs form a chain whose head talks to the network
through its NIC, and the chain heads of the servers form a double binary tree (every server a leaf in one of
the two trees, an inner node in the other), each tree carrying half of a channel's data (NVIDIA technical blog,
Massively Scale Your Deep Learning Training with NCCL 2.4,
https://developer.nvidia.com/blog/massively-scale-deep-learning-training-nccl-2-4/). Across servers NCCL's tree
graph has one channel per NIC (https://github.com/NVIDIA/nccl/issues/1302, as `nccl_tuner` reads it), so
here channel c's chains start at each server's local GPU c, next to NIC c (rail-local), and run through the
server's other GPUs in order; every channel holds both trees, 2 x NICs trees in all, each with an equal share
of the buffer. The reduction goes up each tree and the result comes down it, pipelined in segments (the
registry's `algorithms.tree` operations on these parent arrays); the segment count is chosen per call like
NVLS's chunks (the fastest of `nvls.NVLS_CHUNKS` up to 32).

The registry's own "tree" is a flat double binary tree over all ranks on 2 channels (what NCCL runs inside one
server, and the runtime's schedule); this is NCCL's tree where ranks sit on several servers.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms._common import new_builder, std_layouts
from ..algorithms.schedule import Buffer, Collective, Schedule
from ..algorithms.tree import _heights, _max_same_step, tree_bcast_ops, tree_reduce_ops
from ..errors import InvalidArgument
from .transfers import TransferTable


def tree_parents(groups: Sequence[Sequence[int]], channels: int) -> list[list[int]]:
    """Parent of every rank (-1 at a root) in each of NCCL's 2 x `channels` trees over the host `groups`."""
    from ..topology import double_binary_tree
    n = sum(len(g) for g in groups)
    host_trees = double_binary_tree(len(groups))
    out: list[list[int]] = []
    for c in range(channels):
        chains = [list(g[c % len(g):]) + list(g[:c % len(g)]) for g in groups]
        for ht in host_trees:
            parent = [-1] * n
            for h, chain in enumerate(chains):
                for up, down in zip(chain, chain[1:], strict=False):
                    parent[down] = up
                parent[chain[0]] = -1 if ht[h] < 0 else chains[ht[h]][0]
            out.append(parent)
    return out


def build_nccl_tree(groups: Sequence[Sequence[int]], channels: int, nsegs: int = 1) -> Schedule:
    """The all-reduce schedule of NCCL's trees over the host `groups`, each tree one block of the buffer."""
    if len(groups) < 2 or channels < 1 or nsegs < 1:
        raise InvalidArgument(f"NCCL's tree across servers needs 2 or more servers, 1 or more channels and segments "
                              f"(got {len(groups)}, {channels}, {nsegs})", "place the ranks on several servers")
    trees = tree_parents(groups, channels)
    n = len(trees[0])
    nodes = list(range(n))
    extra = max(_max_same_step(t, nodes) for t in trees) - 1
    c = Collective.ALL_REDUCE
    lay = std_layouts(c, n, len(trees), nsegs, scratch=(Buffer.OUT, extra) if extra else None)
    b = new_builder(c, n, "tree", lay, None, len(trees), nsegs=nsegs)
    for t, par in enumerate(trees):
        h = _heights(par, nodes)
        tree_reduce_ops(b, par, nodes, t, nsegs, 0, t)
        tree_bcast_ops(b, par, nodes, t, nsegs, h[par.index(-1)], t, Buffer.OUT)
    return b.build()


def tree_levels(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(height, depth) of every node of every tree ([T, n] parent arrays, -1 at each tree's root): a leaf has
    height 0, a root depth 0."""
    T, n = parents.shape
    flat = (parents + n * np.arange(T, dtype=np.int64)[:, None]).ravel()
    kids = np.flatnonzero(parents.ravel() >= 0)
    par = flat[kids]
    h = np.zeros(T * n, dtype=np.int64)
    d = np.zeros(T * n, dtype=np.int64)
    for _ in range(n):
        nh = np.zeros_like(h)
        np.maximum.at(nh, par, h[kids] + 1)
        nd = d.copy()
        nd[kids] = d[par] + 1
        if np.array_equal(nh, h) and np.array_equal(nd, d):
            break
        h, d = nh, nd
    return h.reshape(T, n), d.reshape(T, n)


def tree_table(groups: Sequence[Sequence[int]], channels: int, nsegs: int) -> TransferTable:
    """The table `transfers.from_schedule` makes of `build_nccl_tree(groups, channels, nsegs)`, written straight
    from the parent arrays in numpy (no schedule operations): tree t reduces block t up and broadcasts it down on
    channel t; child c sends segment s at step s + height(c), a node at depth d forwards segment s at the root's
    height + s + d. Every chunk is 1 / (T C) of the buffer (the schedule's reference count rounds uneven splits
    below 1e-6 of a chunk)."""
    gs = tuple(tuple(int(r) for r in g) for g in groups)
    if len(gs) < 2 or channels < 1 or nsegs < 1:
        raise InvalidArgument(f"NCCL's tree across servers needs 2 or more servers, 1 or more channels and segments "
                              f"(got {len(gs)}, {channels}, {nsegs})", "place the ranks on several servers")
    return _cached_table(gs, int(channels), int(nsegs))


@functools.lru_cache(maxsize=16)
def _cached_table(groups: tuple[tuple[int, ...], ...], channels: int, nsegs: int) -> TransferTable:
    P = np.asarray(tree_parents(groups, channels), dtype=np.int64)
    T, n = P.shape
    C = nsegs
    h, d = tree_levels(P)
    t_of, kid = np.nonzero(P >= 0)
    par = P[t_of, kid]
    h_root = h[np.arange(T), np.argmin(P, axis=1)]
    s = np.arange(C, dtype=np.int64)[:, None]
    up = (s + h[t_of, kid][None, :]).ravel()
    down = (h_root[t_of][None, :] + s + d[t_of, par][None, :]).ravel()
    tile = lambda a: np.tile(a, C)  # noqa: E731
    step = np.concatenate([up, down])
    src = np.concatenate([tile(kid), tile(par)])
    dst = np.concatenate([tile(par), tile(kid)])
    chan = np.concatenate([tile(t_of), tile(t_of)])
    order = np.lexsort((chan, dst, src, step))
    nsteps = int(step.max(initial=-1)) + 1
    lkey, lcount = np.unique(tile(par) * max(nsteps, 1) + up, return_counts=True)   # the receivers' adds
    chunk = 1.0 / (T * C)
    rows = step.size
    return TransferTable(Collective.ALL_REDUCE, "tree", n, nsteps, step[order], src[order], dst[order], chan[order],
                         np.full(rows, chunk), np.ones(rows, dtype=np.int64), lkey // max(nsteps, 1),
                         lkey % max(nsteps, 1), np.zeros(lkey.size), lcount * chunk)


def simulate_nccl_tree(topo: Any, nranks: int, size_bytes: int, *, endpoints: Sequence[str] | None = None,
                       params: Any = None, engine: str = "analytic", dtype: str = "float32",
                       protocol: str | None = None) -> Any:
    """NCCL's tree all-reduce of `nranks` ranks on several servers of `topo` (one channel per NIC of the first
    server, at most one per local GPU), the fastest segment count of those tried; `protocol` as NCCL chose it
    (None: the fastest). The analytic engine skips a segment count whose lower bound (`_segments_bound_us`)
    already exceeds the single segment's time, so small calls on 1,000+ ranks never build the 32-segment table."""
    from .api import endpoints_of, simulate_table
    from .nvls import NVLS_CHUNKS
    from .params import params_for
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    groups = topo.host_groups(eps[:nranks])
    first = topo.host_of(eps[groups[0][0]])
    channels = max(1, min(len(topo.nics(first)), min(len(g) for g in groups)))
    prm = params if params is not None else params_for(topo)
    best = None
    for segs in (k for k in NVLS_CHUNKS if k <= 32):   # the cap of the other pipelined trees (nvls)
        if best is not None and engine == "analytic" and \
                _segments_bound_us(topo, groups, channels, segs, size_bytes, eps[:nranks], prm, dtype,
                                   protocol) > best.time_us * (1 + 1e-9):
            continue
        res = simulate_table(topo, tree_table(groups, channels, segs), size_bytes, endpoints=eps[:nranks],
                             params=prm, engine=engine, dtype=dtype, protocol=protocol, checked=True)
        if best is None or res.time_us < best.time_us:
            best = res
    assert best is not None
    best.notes.append(f"nccl tree: {2 * channels} trees (2 per NIC), chains inside servers, pipelined")
    return best


def _segments_bound_us(topo: Any, groups: Sequence[Sequence[int]], channels: int, nsegs: int, size_bytes: int,
                       endpoints: Sequence[str], params: Any, dtype: str, protocol: str | None) -> float:
    """A lower bound on the analytic time of `nsegs` segments from the one-segment model alone. Steps 0 .. K of
    the C-segment table hold segment 0's rows at 1 / C of the one-segment bytes, sharing links with more rows,
    never fewer; its C - 1 later steps each hold a row, at least the cheapest row's fixed cost. So
    T_C(B) >= T_1(B / C) + (C - 1) x min a, per protocol."""
    from . import analytic
    from .api import itemsize_of
    from .fabric import fabric_for
    from .results import count_for_size
    item = itemsize_of(dtype)
    B = float(count_for_size(Collective.ALL_REDUCE, len(endpoints), size_bytes, item) * item)
    fab = fabric_for(topo, params, list(endpoints))
    one = analytic.model_for(tree_table(groups, channels, 1), fab, params)
    names = [p.name for p in params.protocols]
    picks = [names.index(protocol)] if protocol is not None else range(len(names))
    return min(float(one.base_us[p] + one.step_times_us(B / nsegs, p).sum())
               + (nsegs - 1) * float(one.line_a[p].min(initial=np.inf)) for p in picks)
