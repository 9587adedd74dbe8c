"""NVLS-Tree as a transfer table written straight from its step pattern, and its few-step template.

`algorithms.nccl_nvls.build_nvls_tree` writes every message of NCCL's NVLS_TREE all-reduce as schedule
operations: m x m sends into each server's switch per segment, so 1,440 GPUs in 20 NVL72 racks make 6.6 M
operations at 32 segments. The engines read only the flattened table (`transfers.from_schedule`), whose
rows merge the messages of one step between one pair (about five rows per GPU and step). This module writes
that table directly in numpy, per segment s and server h with switch ``n + h``, tree parent p and members
``r_0 .. r_{m-1}`` (block j belongs to member j; `nccl_nvls.tree_times` gives up[h] and final[h]):

- step s: every member sends its m blocks to the switch (one row, m blocks);
- step s + 1: the switch returns the sum of block j to r_j;
- step up[h] + s: r_j sends its partial to member j of the parent server, which reduces it;
- step final[p] + s: member j of the parent sends the final block j down to r_j;
- step final[h] + s: r_j writes block j once to the switch;
- step final[h] + s + 1: the switch copies every block to every member (one row, m blocks).

Every row is one message (`nvls.switch_schedule_table`): a member's m blocks to or from its switch in one step
are one NVLS scatter or gather primitive, and rows merged in one step run in parallel warps.

Every chunk (block j, segment s) is 1 / (m C) of the buffer; `from_schedule` cuts a reference count into
chunks, so its fractions differ from these by its rounding (below 1e-6 of a chunk).

Step t of a C-segment table holds the segments whose offset t - s lies in [0, K] (K: the last offset,
final + 1 of the deepest server), so every step from K to C - 1 moves the same rows, and a table of
C = 2**k > K segments is its template's (the smallest power of two above K) with the steady step repeated
and every byte scaled by a power of two: `tree_template`, exact in floating point.
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import numpy as np

from ..algorithms.nccl_nvls import host_groups_of, tree_times
from ..algorithms.schedule import Collective
from ..errors import InvalidArgument
from .transfers import TransferTable

Groups = tuple[tuple[int, ...], ...]

# tables built by `tree_table`: id -> (the table, its groups, its segment count), to recognise them again
_BUILT: dict[int, tuple[weakref.ref, Groups, int]] = {}


def _offsets(H: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(up, final, K): the tree's per-server steps of segment 0 and the last offset of a segment."""
    up, final = tree_times(H, 2)
    return np.asarray(up, dtype=np.int64), np.asarray(final, dtype=np.int64), int(max(final)) + 1


def _segment_rows(groups: Groups) -> tuple[np.ndarray, ...]:
    """Rows of segment 0: (step, src, dst, chunks of 1 / (m C) each), and the reductions
    (rank, step, chunks) of the tree's receivers."""
    g = np.asarray(groups, dtype=np.int64)            # [H, m] rank of member j of server h
    H, m = g.shape
    n = H * m
    up, final, _ = _offsets(H)
    sw = np.repeat(n + np.arange(H, dtype=np.int64), m)   # each member's switch
    mem = g.ravel()
    hh = np.repeat(np.arange(H, dtype=np.int64), m)
    ones = np.ones(n, dtype=np.int64)
    parts = [(0 * ones, mem, sw, m * ones),                 # members -> switch: m blocks
             (ones, sw, mem, ones),                         # switch -> r_j: block j summed
             (final[hh], mem, sw, ones),                    # r_j -> switch: the final block j
             (final[hh] + 1, sw, mem, m * ones)]            # switch -> members: every block
    kid = g[1:].ravel()
    if kid.size:
        ph = np.repeat((np.arange(1, H, dtype=np.int64) - 1) // 2, m)
        par = g[ph, np.tile(np.arange(m), H - 1)]
        k1 = np.ones(kid.size, dtype=np.int64)
        kh = np.repeat(np.arange(1, H, dtype=np.int64), m)
        parts += [(up[kh], kid, par, k1), (final[ph], par, kid, k1)]
        red = (par, up[kh], k1)
    else:
        z = np.zeros(0, dtype=np.int64)
        red = (z, z, z)
    step, src, dst, chunks = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return step, src, dst, chunks, *red


def _merge(keys: Sequence[np.ndarray], *values: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows sorted by `keys` (lexicographic, first key first), equal keys merged with `values` summed."""
    order = np.lexsort(tuple(reversed(keys)))
    ks = [k[order] for k in keys]
    if not order.size:
        return ks, [v[order] for v in values]
    new = np.ones(order.size, dtype=bool)
    new[1:] = np.any([k[1:] != k[:-1] for k in ks], axis=0)
    starts = np.flatnonzero(new)
    return [k[starts] for k in ks], [np.add.reduceat(v[order], starts) for v in values]


def tree_table(groups: Sequence[Sequence[int]], nsegs: int) -> TransferTable:
    """The table `simulate_switch_schedule` makes of `build_nvls_tree` on these host groups (module docstring),
    switches as participants n .. n + H - 1, their free adds left out."""
    gs = host_groups_of(groups, sum(len(x) for x in groups))
    return _cached_table(gs, int(nsegs))


@functools.lru_cache(maxsize=32)
def _cached_table(groups: Groups, nsegs: int) -> TransferTable:
    H, m = len(groups), len(groups[0])
    n, C = H * m, nsegs
    if n < 2 or C < 1:
        raise InvalidArgument(f"nvls_tree needs 2 or more ranks and 1 or more segments (got {n}, {C})",
                              "simulate at least 2 ranks")
    step, src, dst, chunks, rrank, rstep, rchunks = _segment_rows(groups)
    _, _, K = _offsets(H)
    s = np.arange(C, dtype=np.int64)
    rep = lambda a: np.tile(a, C)  # noqa: E731
    (t_step, t_src, t_dst), (t_chunks,) = _merge([(step[None, :] + s[:, None]).ravel(), rep(src), rep(dst)],
                                                  rep(chunks))
    (l_rank, l_step), (l_chunks,) = _merge([rep(rrank), (rstep[None, :] + s[:, None]).ravel()], rep(rchunks))
    chunk = 1.0 / (m * C)
    tab = TransferTable(Collective.ALL_REDUCE, "nvls_tree", n + H, C + K, t_step, t_src, t_dst,
                        np.zeros(t_step.size, dtype=np.int64), t_chunks * chunk, np.ones_like(t_step), l_rank, l_step,
                        np.zeros(l_rank.size), l_chunks * chunk)
    if len(_BUILT) > 64:
        for k in [k for k, (r, _, _) in _BUILT.items() if r() is None]:
            del _BUILT[k]
    _BUILT[id(tab)] = (weakref.ref(tab), groups, C)
    return tab


def template_segments(nservers: int) -> int:
    """The template's segment count for a tree over `nservers` servers: the smallest power of two above K."""
    _, _, K = _offsets(nservers)
    return 1 << K.bit_length()


def tree_template(table: TransferTable) -> tuple[TransferTable, np.ndarray, float] | None:
    """(the template table, the template step each step of `table` repeats, the byte scale) where `table` came
    from `tree_table` with 2**k segments above its template's; None otherwise."""
    hit = _BUILT.get(id(table))
    if hit is None or hit[0]() is not table:
        return None
    _, groups, C = hit
    Ct = template_segments(len(groups))
    if C <= Ct or C & (C - 1):
        return None
    _, _, K = _offsets(len(groups))
    t = np.arange(C + K, dtype=np.int64)
    step_map = np.where(t < K, t, np.where(t < C, K, t - C + Ct))
    return _cached_table(groups, Ct), step_map, Ct / C
