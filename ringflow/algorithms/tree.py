"""Tree algorithms: NCCL's double binary tree (pipelined) and the binomial tree.

Double binary tree ("tree"): two binary trees in which every rank is a leaf in one and an
inner node in the other (NCCL's ncclGetDtree, `ringflow.topology.double_binary_tree`);
each tree carries half of the data on its own channel and pipelines it in segments: a node
at height h sends segment s up at step s+h, the root sends segment s down at step s+H and a
node at depth d forwards it at s+H+d.
All-reduce overlaps the two phases. For rooted reduce / broadcast the trees are built over
the n-1 other ranks and both tree roots hang under the real root.

Binomial tree ("binomial"), on ranks relative to the root v=(r-root)%n: reduce / gather in
round k: v with v%2^(k+1)==2^k sends (its subtree's data) to v-2^k; broadcast / scatter run
the rounds in reverse. ceil(log2 n) steps each; all-reduce = reduce + broadcast.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..topology.search import tree_children
from ._common import blk, ceil_log2, need_root, new_builder, seg, std_layouts, wrapped
from .schedule import Buffer, BufferLayout, Collective, Schedule, ScheduleBuilder

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def _heights(parent: Sequence[int], nodes: Sequence[int]) -> dict[int, int]:
    ch = tree_children(parent)
    h: dict[int, int] = {}

    def height(v: int) -> int:
        if v not in h:
            h[v] = 1 + max((height(c) for c in ch[v]), default=-1)
        return h[v]
    for v in nodes:
        height(v)
    return h


def tree_reduce_ops(b: ScheduleBuilder, parent: Sequence[int], nodes: Sequence[int], block: int, nsegs: int,
                    step0: int, channel: int) -> int:
    """Pipelined reduction up a tree (parent[v] < 0 at the root); partial sums in OUT.

    Returns the step at which the root's last segment is complete (exclusive).
    Children arriving in the same step beyond the first go through scratch copies.
    """
    lay, ch, h = b.layouts[OUT], tree_children(parent), _heights(parent, nodes)
    for v in nodes:
        kids = sorted(ch[v], key=lambda c: (h[c], c))
        for s in range(nsegs):
            dst = seg(OUT, lay, block, s)
            got_any = False
            by_step: dict[int, list[int]] = {}
            for c in kids:
                by_step.setdefault(step0 + s + h[c], []).append(c)
            for st in sorted(by_step):
                for k, c in enumerate(by_step[st]):
                    src = seg(IN if not ch[c] else OUT, lay, block, s)
                    if k == 0:
                        b.transfer(st, c, v, src, dst, reduce=True, local=dst if got_any else seg(IN, lay, block, s),
                                   channel=channel)
                    else:
                        tmp = seg(SCR, b.layouts[SCR], block, s, copy=k - 1)
                        b.transfer(st, c, v, src, tmp, channel=channel)
                        b.reduce(v, st, dst, tmp)
                got_any = True
    root = next(v for v in nodes if parent[v] < 0)
    return step0 + nsegs + h[root] - 1


def tree_bcast_ops(b: ScheduleBuilder, parent: Sequence[int], nodes: Sequence[int], block: int, nsegs: int,
                   step0: int, channel: int, root_buf: Buffer) -> int:
    """Pipelined broadcast down a tree: root sends segment s at step0+s, depth d forwards at step0+s+d."""
    lay, ch = b.layouts[OUT], tree_children(parent)
    root = next(v for v in nodes if parent[v] < 0)
    depth, last = {root: 0}, step0
    frontier = [root]
    while frontier:
        nxt = []
        for v in frontier:
            for c in ch[v]:
                depth[c] = depth[v] + 1
                nxt.append(c)
                for s in range(nsegs):
                    st = step0 + s + depth[v]
                    b.transfer(st, v, c, seg(root_buf if v == root else OUT, lay, block, s), seg(OUT, lay, block, s),
                               channel=channel)
                    last = max(last, st + 1)
        frontier = nxt
    return last


def _max_same_step(parent: Sequence[int], nodes: Sequence[int]) -> int:
    ch, h = tree_children(parent), _heights(parent, nodes)
    worst = 1
    for v in nodes:
        cnt: dict[int, int] = {}
        for c in ch[v]:
            cnt[h[c]] = cnt.get(h[c], 0) + 1
        worst = max([worst, *cnt.values()])
    return worst


def _dbtree_parents(collective: Collective, n: int, root: int | None) -> list[list[int]]:
    from ..topology import double_binary_tree  # lazy: keeps `import ringflow.algorithms` light
    if collective == Collective.ALL_REDUCE:
        return [list(t) for t in double_binary_tree(n)]
    assert root is not None
    others = [(root + 1 + k) % n for k in range(n - 1)]
    out = []
    for t in double_binary_tree(n - 1):
        par = [-1] * n
        for k, p in enumerate(t):
            par[others[k]] = root if p < 0 else others[p]
        out.append(par)
    return out


def build_dbtree(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
                 **_: object) -> Schedule:
    """Double binary tree for all_reduce, reduce, broadcast (2 channels, one half of the data each)."""
    c = Collective.parse(collective)
    n = nranks
    if c != Collective.ALL_REDUCE:
        root = need_root(root, n)
    if n == 1:
        lay = std_layouts(c, n, 2, nsegs)
        b = new_builder(c, n, "tree", lay, root, 2, nsegs=nsegs)
        b.copy(0, 0, blk(OUT, lay[OUT], 0, 2), blk(IN, lay[IN], 0, 2))
        return b.build()
    trees = _dbtree_parents(c, n, root)
    nodes = list(range(n))
    extra = max(_max_same_step(t, nodes) for t in trees) - 1 if c != Collective.BROADCAST else 0
    lay = std_layouts(c, n, 2, nsegs, scratch=(OUT, extra) if extra else None)
    b = new_builder(c, n, "tree", lay, root, 2, nsegs=nsegs)
    if c == Collective.BROADCAST:
        assert root is not None
        b.copy(root, 0, blk(OUT, lay[OUT], 0, 2), blk(IN, lay[IN], 0, 2))
    for t, par in enumerate(trees):
        if c == Collective.BROADCAST:
            tree_bcast_ops(b, par, nodes, t, nsegs, 0, t, IN)
        elif c == Collective.REDUCE:
            tree_reduce_ops(b, par, nodes, t, nsegs, 0, t)
        else:
            h = _heights(par, nodes)
            troot = par.index(-1)
            tree_reduce_ops(b, par, nodes, t, nsegs, 0, t)
            tree_bcast_ops(b, par, nodes, t, nsegs, h[troot], t, OUT)
    return b.build()


def _rel_pieces(root: int, n: int, start: int, length: int) -> list[tuple[int, int]]:
    """Relative rank range [start, start+length) as absolute contiguous (first rank, count) pieces."""
    return wrapped(root + start, length, n)


def build_binomial(collective: Collective | str, nranks: int, *, root: int | None = None, nsegs: int = 1,
                   **_: object) -> Schedule:
    """Binomial tree for reduce, broadcast, all_reduce, gather and scatter."""
    c = Collective.parse(collective)
    n = nranks
    root = 0 if c == Collective.ALL_REDUCE else need_root(root, n)
    if c in (Collective.GATHER, Collective.SCATTER):
        like = OUT if c == Collective.GATHER else IN
        lay = std_layouts(c, n, 1, nsegs, scratch=(like, 1) if n > 2 else None)
    else:
        lay = std_layouts(c, n, 1, nsegs)
    b = new_builder(c, n, "binomial", lay, root if c != Collective.ALL_REDUCE else None, 1, nsegs=nsegs)
    if c in (Collective.REDUCE, Collective.ALL_REDUCE, Collective.BROADCAST):
        _binomial_reduce_broadcast(b, c, lay, n, root)
    elif c == Collective.GATHER:
        _binomial_gather(b, lay, n, root)
    else:
        _binomial_scatter(b, lay, n, root)
    return b.build()


def _binomial_reduce_broadcast(b: ScheduleBuilder, c: Collective, lay: dict[Buffer, BufferLayout], n: int,
                               root: int) -> None:
    """Reduce up the tree (reduce, all_reduce), then broadcast down it (broadcast, all_reduce)."""
    K = ceil_log2(n)

    def absr(v: int) -> int:
        return (root + v) % n

    whole_in, whole_out = blk(IN, lay[IN], 0), blk(OUT, lay[OUT], 0)
    step = 0
    if c != Collective.BROADCAST:
        received = set()
        for k in range(K):
            for v in range(n):
                if v % (2 << k) == (1 << k):
                    dst = absr(v - (1 << k))
                    src = whole_in if v not in received else whole_out
                    b.transfer(step, absr(v), dst, src, whole_out, reduce=True,
                               local=whole_out if (v - (1 << k)) in received else whole_in)
                    received.add(v - (1 << k))
            step += 1
        if n == 1:
            b.copy(root, 0, whole_out, whole_in)
    if c == Collective.BROADCAST:
        b.copy(root, 0, whole_out, whole_in)
    if c != Collective.REDUCE:
        for k in reversed(range(K)):
            for v in range(0, n, 2 << k):
                if v + (1 << k) < n:
                    src = whole_in if (v == 0 and c == Collective.BROADCAST) else whole_out
                    b.transfer(step, absr(v), absr(v + (1 << k)), src, whole_out)
            step += 1


def _binomial_gather(b: ScheduleBuilder, lay: dict[Buffer, BufferLayout], n: int, root: int) -> None:
    """Gather: subtrees collect in scratch and send up in rounds of doubling size."""
    K = ceil_log2(n)
    li, lo = lay[IN], lay[OUT]

    def absr(v: int) -> int:
        return (root + v) % n

    b.copy(root, 0, blk(OUT, lo, root), blk(IN, li, 0))
    for v in range(1, n):
        low = v & -v
        if low > 1 and n > 2:  # inner node: own block joins its subtree in scratch
            b.copy(absr(v), 0, blk(SCR, lay[SCR], absr(v)), blk(IN, li, 0))
    for k in range(K):
        for v in range(n):
            if v % (2 << k) == (1 << k):
                p = v - (1 << k)
                length = min(1 << k, n - v)
                for first, cnt in _rel_pieces(root, n, v, length):
                    src = blk(IN, li, 0) if k == 0 else blk(SCR, lay[SCR], first, cnt)
                    dst = blk(OUT, lo, first, cnt) if p == 0 else blk(SCR, lay[SCR], first, cnt)
                    b.transfer(k, absr(v), absr(p), src, dst)


def _binomial_scatter(b: ScheduleBuilder, lay: dict[Buffer, BufferLayout], n: int, root: int) -> None:
    """Scatter: rounds from the top; the receiver's own part goes straight to OUT."""
    K = ceil_log2(n)
    li, lo = lay[IN], lay[OUT]

    def absr(v: int) -> int:
        return (root + v) % n

    b.copy(root, 0, blk(OUT, lo, 0), blk(IN, li, root))
    step = 0
    for k in reversed(range(K)):
        for v in range(0, n, 2 << k):
            w = v + (1 << k)
            if w >= n:
                continue
            length = min(1 << k, n - w)
            for first, cnt in _rel_pieces(root, n, w, length):
                src_buf, src_lay = (IN, li) if v == 0 else (SCR, lay[SCR])
                pieces: list[tuple[int, int, Buffer]] = []
                own = absr(w)
                if first == own:
                    pieces.append((first, 1, OUT))
                    if cnt > 1:
                        pieces.append((first + 1, cnt - 1, SCR))
                else:
                    pieces.append((first, cnt, SCR))
                for f, cn, dbuf in pieces:
                    src = blk(src_buf, src_lay, f, cn)
                    dst = blk(OUT, lo, 0) if dbuf == OUT else blk(SCR, lay[SCR], f, cn)
                    b.transfer(step, absr(v), absr(w), src, dst)
        step += 1
