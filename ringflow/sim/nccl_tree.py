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

from collections.abc import Sequence
from typing import Any

from ..algorithms._common import new_builder, std_layouts
from ..algorithms.schedule import Buffer, Collective, Schedule
from ..algorithms.tree import _heights, _max_same_step, tree_bcast_ops, tree_reduce_ops
from ..errors import InvalidArgument


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


def simulate_nccl_tree(topo: Any, nranks: int, size_bytes: int, *, endpoints: Sequence[str] | None = None,
                       params: Any = None, engine: str = "analytic", dtype: str = "float32",
                       protocol: str | None = None) -> Any:
    """NCCL's tree all-reduce of `nranks` ranks on several servers of `topo` (one channel per NIC of the first
    server, at most one per local GPU), the fastest segment count of those tried; `protocol` as NCCL chose it
    (None: the fastest)."""
    from .api import endpoints_of, simulate_schedule
    from .nvls import NVLS_CHUNKS
    eps = list(endpoints) if endpoints is not None else endpoints_of(topo)[:nranks]
    groups = topo.host_groups(eps[:nranks])
    first = topo.host_of(eps[groups[0][0]])
    channels = max(1, min(len(topo.nics(first)), min(len(g) for g in groups)))
    best = None
    for segs in (k for k in NVLS_CHUNKS if k <= 32):   # the cap of the other pipelined trees (nvls)
        res = simulate_schedule(topo, build_nccl_tree(groups, channels, segs), size_bytes, endpoints=eps[:nranks],
                                params=params, engine=engine, dtype=dtype, protocol=protocol)
        if best is None or res.time_us < best.time_us:
            best = res
    assert best is not None
    best.notes.append(f"nccl tree: {2 * channels} trees (2 per NIC), chains inside servers, pipelined")
    return best
