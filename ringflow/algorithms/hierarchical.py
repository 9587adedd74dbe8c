"""Hierarchical two-level all-reduce from host groups (H hosts of m ranks each).

The buffer is cut into m shards of H blocks. (1) Inside each host, a ring scatter-reduce over
shards (m-1 steps): host position j ends with shard (j+1)%m summed over the host. (2) Across
hosts, for every shard, a ring all-reduce of that shard among the H ranks (one per host)
that hold it (2(H-1) steps, all shards at once). (3) Inside each host,
a ring all-gather of the shards (m-1 steps). Only S/m bytes per rank cross hosts.

Host groups come from the topology (`Topology.host_groups()`); without them, ranks are
grouped consecutively in groups of g = the largest divisor of n that is <= sqrt(n) (primes
give g = 1: one rank per host, i.e. a flat ring).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import InvalidArgument
from ._common import blk, new_builder, std_layouts
from .ring import ring_ag_ops, ring_allreduce_ops, ring_rs_ops
from .schedule import Buffer, Collective, Schedule

IN, OUT = Buffer.IN, Buffer.OUT


def default_host_groups(n: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive groups of the largest divisor of n not above sqrt(n)."""
    g = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return tuple(tuple(range(h * g, (h + 1) * g)) for h in range(n // g))


def check_host_groups(groups: Sequence[Sequence[int]], n: int) -> tuple[tuple[int, ...], ...]:
    """Validate host groups: a partition of 0..n-1 into groups of equal size."""
    gs = tuple(tuple(int(x) for x in g) for g in groups)
    flat = sorted(x for g in gs for x in g)
    if flat != list(range(n)):
        raise InvalidArgument(f"host groups {gs} are not a partition of ranks 0..{n - 1}",
                              "give every rank in exactly one group")
    if len({len(g) for g in gs}) != 1:
        raise InvalidArgument(f"hierarchical needs hosts with equal rank counts, got sizes {[len(g) for g in gs]}",
                              "use ring or tree for uneven hosts, or pass equal host_groups")
    return gs


def build(collective: Collective | str, nranks: int, *, nsegs: int = 1,
          host_groups: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """Two-level all_reduce: intra-host reduce-scatter, inter-host all-reduce per shard, intra-host all-gather."""
    c = Collective.parse(collective)
    n = nranks
    groups = check_host_groups(host_groups, n) if host_groups else default_host_groups(n)
    H, m = len(groups), len(groups[0])
    lay = std_layouts(c, n, m * H, nsegs)
    b = new_builder(c, n, "hierarchical", lay, None, nsegs=nsegs, host_groups=[list(g) for g in groups])
    if n == 1:
        b.copy(0, 0, blk(OUT, lay[OUT], 0, m * H), blk(IN, lay[IN], 0, m * H))
        return b.build()
    shard = [local * H for local in range(m)]
    step = 0
    for g in groups:
        ring_rs_ops(b, g, shard, nsegs, 0, 0, span_blocks=H)
    step = m - 1
    for local in range(m):
        order = [g[(local - 1) % m] for g in groups]
        ring_allreduce_ops(b, order, [local * H + q for q in range(H)], nsegs, step, 0,
                           first_buf=OUT if m > 1 else IN)
    step += 2 * (H - 1)
    for g in groups:
        ring_ag_ops(b, g, shard, nsegs, step, 0, span_blocks=H)
    return b.build()
