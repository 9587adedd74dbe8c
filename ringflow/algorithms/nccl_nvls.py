"""NVLink SHARP (NVLS) and NVLS-Tree as schedules with a switch participant (NCCL 2.17+ on Hopper and later).

NVLS inside one NVSwitch domain (one switch participant, ``r{n}``): every GPU owns 1/n of the buffer
(block j on GPU j). Segment s of the pipeline (C = ``nsegs`` segments):

- step s: every GPU sends its copy of block j, segment s, to the switch (all j); the switch sums the n
  copies (``multimem.ld_reduce``: the switch reads from every GPU and adds);
- step s+1: the switch returns the sum of block j to GPU j;
- step s+2: GPU j writes it once to the switch (``multimem.st``);
- step s+3: the switch copies it to all n GPUs (multicast; GPU j too, as NCCL's store does).

Per GPU and direction that is (n + 1) / n x S (the bytes `sim.nvls` charges). Reduce-scatter is the
first half (steps s, s+1), all-gather the multicast half (GPU j to the switch, the switch to all).

NVLS-Tree (all-reduce across servers, NCCL's NVLS_TREE): per server an NVLS reduce-scatter over the
server's m GPUs (block j to local GPU j), then GPU j of every server joins a binary tree over the
servers (reduce up, broadcast down, pipelined by segment), then an NVLS all-gather inside each server.
Switch h (``r{n + h}``) serves server h. The final sum of each block is made once, at the tree root, and
copied, so every rank holds bitwise-identical results.
"""
from __future__ import annotations

from collections.abc import Sequence

from ._common import seg, single_rank_copy, std_layouts
from .hierarchical import check_host_groups, default_host_groups
from .schedule import Buffer, BufferLayout, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH
C = Collective


def _builder(c: Collective, n: int, name: str, lay: dict[Buffer, BufferLayout], nswitches: int,
             nsegs: int) -> ScheduleBuilder:
    return ScheduleBuilder(c, n, name, layouts=lay, nswitches=nswitches, nsegs=nsegs)


def switch_reduce(b: ScheduleBuilder, step: int, switch: int, members: Sequence[int], block: int, s: int,
                  src_of: dict[int, Buffer]) -> None:
    """`members` send (block, s) to `switch`, which sums them into its scratch copy 0 in member order."""
    ls, lay = b.layouts[SCR], b.layouts[IN]
    for q, r in enumerate(members):
        b.transfer(step, r, switch, seg(src_of.get(r, IN), lay, block, s), seg(SCR, ls, block, s, copy=q))
    for q in range(1, len(members)):
        b.reduce(switch, step, seg(SCR, ls, block, s, copy=0), seg(SCR, ls, block, s, copy=q))


def _all_reduce(n: int, nsegs: int) -> Schedule:
    c = C.ALL_REDUCE
    lay = std_layouts(c, n, n, nsegs, scratch=(IN, n))
    b = _builder(c, n, "nvls", lay, 1, nsegs)
    sw, ls, lo = n, lay[SCR], lay[OUT]
    ranks = list(range(n))
    for s in range(nsegs):
        for j in ranks:
            switch_reduce(b, s, sw, ranks, j, s, {})
        for j in ranks:
            b.transfer(s + 1, sw, j, seg(SCR, ls, j, s), seg(OUT, lo, j, s))
            b.transfer(s + 2, j, sw, seg(OUT, lo, j, s), seg(SCR, ls, j, s, copy=1))
            for i in ranks:
                b.transfer(s + 3, sw, i, seg(SCR, ls, j, s, copy=1), seg(OUT, lo, j, s))
    return b.build()


def _reduce_scatter(n: int, nsegs: int) -> Schedule:
    c = C.REDUCE_SCATTER
    lay = std_layouts(c, n, 1, nsegs, scratch=(IN, n))
    b = _builder(c, n, "nvls", lay, 1, nsegs)
    sw, ls, lo = n, lay[SCR], lay[OUT]
    ranks = list(range(n))
    for s in range(nsegs):
        for j in ranks:
            switch_reduce(b, s, sw, ranks, j, s, {})
            b.transfer(s + 1, sw, j, seg(SCR, ls, j, s), seg(OUT, lo, 0, s))
    return b.build()


def _all_gather(n: int, nsegs: int) -> Schedule:
    c = C.ALL_GATHER
    lay = std_layouts(c, n, 1, nsegs, scratch=(OUT, 1))
    b = _builder(c, n, "nvls", lay, 1, nsegs)
    sw, ls, lo, li = n, lay[SCR], lay[OUT], lay[IN]
    for s in range(nsegs):
        for j in range(n):
            b.transfer(s, j, sw, seg(IN, li, 0, s), seg(SCR, ls, j, s))
            for i in range(n):
                b.transfer(s + 1, sw, i, seg(SCR, ls, j, s), seg(OUT, lo, j, s))
    return b.build()


def build_nvls(collective: Collective, nranks: int, *, nsegs: int = 1, **_: object) -> Schedule:
    """NVLS all-reduce, reduce-scatter or all-gather on `nranks` GPUs of one NVSwitch domain."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "nvls")
    return {C.ALL_REDUCE: _all_reduce, C.REDUCE_SCATTER: _reduce_scatter,
            C.ALL_GATHER: _all_gather}[collective](nranks, nsegs)


# ---------------------------------------------------------------------------------------------- NVLS-Tree
def tree_times(H: int, first: int) -> tuple[list[int], list[int]]:
    """Binary heap tree over H servers (parent (h-1)//2): the step each server sends segment 0 up, and the
    step from which it holds the final sum of segment 0 (both + s for segment s). Two children of one
    parent send in different steps, so the parent never receives the same chunk twice in a step."""
    up = [first] * H
    for h in reversed(range(H)):
        kids = [k for k in (2 * h + 1, 2 * h + 2) if k < H]
        t = first
        sends: list[int] = []
        for k in kids:
            tk = up[k] if up[k] not in sends else up[k] + 1
            sends.append(tk)
            up[k] = tk
            t = max(t, tk + 1)
        up[h] = t
    final = [0] * H
    for h in range(H):
        final[h] = up[0] if h == 0 else final[(h - 1) // 2] + 1
    return up, final


def host_groups_of(host_groups: Sequence[Sequence[int]] | None, nranks: int) -> tuple[tuple[int, ...], ...]:
    """The servers' rank groups (equal sizes): given, else hierarchical's default split."""
    return check_host_groups(host_groups, nranks) if host_groups else default_host_groups(nranks)


def build_nvls_tree(collective: Collective, nranks: int, *, nsegs: int = 1,
                    host_groups: Sequence[Sequence[int]] | None = None, **_: object) -> Schedule:
    """NVLS inside each server, a binary tree of servers per block (module docstring)."""
    if nranks == 1:
        return single_rank_copy(collective, nsegs, "nvls_tree")
    groups = host_groups_of(host_groups, nranks)
    H, m = len(groups), len(groups[0])
    c = C.ALL_REDUCE
    lay = std_layouts(c, nranks, m, nsegs, scratch=(IN, max(m, 2)))
    b = _builder(c, nranks, "nvls_tree", lay, H, nsegs)
    ls, lo = lay[SCR], lay[OUT]
    up, final = tree_times(H, 2)
    for s in range(nsegs):
        for h, members in enumerate(groups):
            sw = nranks + h
            for j, r in enumerate(members):
                switch_reduce(b, s, sw, members, j, s, {})
                b.transfer(s + 1, sw, r, seg(SCR, ls, j, s), seg(OUT, lo, j, s))
        for j in range(m):
            for h in range(1, H):          # reduce up: node h sends its partial to its parent
                p = (h - 1) // 2
                b.transfer(up[h] + s, groups[h][j], groups[p][j], seg(OUT, lo, j, s), seg(OUT, lo, j, s),
                           reduce=True)
            for h in range(1, H):          # broadcast down the same tree
                p = (h - 1) // 2
                b.transfer(final[p] + s, groups[p][j], groups[h][j], seg(OUT, lo, j, s), seg(OUT, lo, j, s))
        for h, members in enumerate(groups):   # NVLS all-gather inside the server
            sw, t = nranks + h, final[h] + s
            for j, r in enumerate(members):
                b.transfer(t, r, sw, seg(OUT, lo, j, s), seg(SCR, ls, j, s, copy=1))
                for i in members:
                    b.transfer(t + 1, sw, i, seg(SCR, ls, j, s, copy=1), seg(OUT, lo, j, s))
    return b.build()
