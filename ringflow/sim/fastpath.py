"""Transfer tables of ring and hierarchical all-reduce (and ring reduce-scatter and all-gather) built
straight from their step pattern.

A flat ring all-reduce on n ranks has n * 2(n-1) transfers per channel: 16.8 M for 1,024 GPUs x 8
channels, 134 M for 4,096 — more Python objects than a Schedule can hold in memory or build in a
minute.  Its steps, however, all repeat one *pattern* (every position sends one block to the next),
and the hierarchical all-reduce is three such phases.  This module writes those patterns as numpy
arrays and merges repeated steps into macro steps (the same merge `transfers.coarsen` does), so
the engines get a compact table in milliseconds.

It reproduces the traffic of `algorithms.ring` / `algorithms.hierarchical` exactly (bytes per
(step, sender, receiver, channel), reductions per (rank, step)); `tests/test_sim_fastpath.py`
checks that against the registry's schedules.  `api.simulate` uses it above FASTPATH_MIN_TRANSFERS;
below, only where its table equals the schedule's array for array (`schedule_equal_table`), else it
flattens the real schedule.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..algorithms.schedule import Collective
from .transfers import TransferTable

FASTPATH_MIN_TRANSFERS = 50_000


@dataclass(frozen=True)
class Phase:
    """One step pattern repeated `repeats` times: rows (src, dst, chan, frac, nmsg), reductions."""

    src: np.ndarray
    dst: np.ndarray
    chan: np.ndarray
    frac: np.ndarray
    nmsg: np.ndarray
    reduce: bool          # receivers reduce what they get (scatter-reduce phases)
    repeats: int


def _ring_pairs(orders: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    src = np.concatenate([np.asarray(o, dtype=np.int64) for o in orders])
    dst = np.concatenate([np.roll(np.asarray(o, dtype=np.int64), -1) for o in orders])
    return src, dst


def ring_allreduce_phases(nranks: int, rings: Sequence[Sequence[int]], nsegs: int = 1) -> list[Phase]:
    """algorithms.ring all-reduce: C rings, each 2(n-1) steps of one block (1/(n C)) per position."""
    C, n = len(rings), nranks
    src, dst = _ring_pairs(rings)
    chan = np.repeat(np.arange(C, dtype=np.int64), n)
    frac = np.full(src.size, 1.0 / (n * C))
    nmsg = np.full(src.size, nsegs, dtype=np.int64)
    return [Phase(src, dst, chan, frac, nmsg, True, n - 1), Phase(src, dst, chan, frac, nmsg, False, n - 1)]


def hierarchical_allreduce_phases(nranks: int, groups: Sequence[Sequence[int]], nsegs: int = 1) -> list[Phase]:
    """algorithms.hierarchical: intra-host ring scatter-reduce, per-shard inter-host rings, all-gather."""
    H, m = len(groups), len(groups[0])
    phases: list[Phase] = []
    intra_msgs = 1 if H > 1 else nsegs     # a shard of H > 1 blocks goes as one message
    if m > 1:
        s, d = _ring_pairs(groups)
        z = np.zeros(s.size, dtype=np.int64)
        f = np.full(s.size, 1.0 / m)
        k = np.full(s.size, intra_msgs, dtype=np.int64)
        phases.append(Phase(s, d, z, f, k, True, m - 1))
    if H > 1:
        orders = [[g[(local - 1) % m] for g in groups] for local in range(m)]
        s, d = _ring_pairs(orders)
        z = np.zeros(s.size, dtype=np.int64)
        f = np.full(s.size, 1.0 / (m * H))
        k = np.full(s.size, nsegs, dtype=np.int64)
        phases += [Phase(s, d, z, f, k, True, H - 1), Phase(s, d, z, f, k, False, H - 1)]
    if m > 1:
        s, d = _ring_pairs(groups)
        z = np.zeros(s.size, dtype=np.int64)
        f = np.full(s.size, 1.0 / m)
        k = np.full(s.size, intra_msgs, dtype=np.int64)
        phases.append(Phase(s, d, z, f, k, False, m - 1))
    return phases


def _ring_half(collective: Collective, nranks: int, rings: Sequence[Sequence[int]], nsegs: int,
               max_transfers: int | None) -> TransferTable:
    """algorithms.ring reduce-scatter (the all-reduce's reducing half) or all-gather (its other half, after
    each rank copies its own block into place); fractions of the per-rank count, so n x the all-reduce's."""
    reducing, gathering = ring_allreduce_phases(nranks, rings, nsegs)
    p = reducing if collective == Collective.REDUCE_SCATTER else gathering
    tab = table_from_phases(collective, "ring", nranks, [replace(p, frac=p.frac * nranks)], max_transfers)
    if collective == Collective.REDUCE_SCATTER:
        return tab
    own = np.arange(nranks, dtype=np.int64)
    return replace(tab, lrank=np.concatenate([own, tab.lrank]), lstep=np.concatenate([0 * own, tab.lstep]),
                   lcopy=np.concatenate([np.ones(nranks), tab.lcopy]),
                   lreduce=np.concatenate([np.zeros(nranks), tab.lreduce]))


def table_from_phases(collective: Collective, algorithm: str, nranks: int, phases: Sequence[Phase],
                      max_transfers: int | None = None) -> TransferTable:
    """Lay the phases out step after step, merging up to `factor` repeats into one macro step."""
    rows = sum(p.src.size * p.repeats for p in phases)
    factor = 1 if not max_transfers or rows <= max_transfers else int(np.ceil(rows / max_transfers))
    while max_transfers and factor > 1 and sum(p.src.size * -(-p.repeats // factor) for p in phases) > max_transfers:
        factor += 1
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "chan", "frac", "nmsg", "nser",
                                                         "lrank", "lstep", "lred")}
    step = 0
    for p in phases:
        left = p.repeats
        while left > 0:
            k = min(factor, left)
            left -= k
            cols["step"].append(np.full(p.src.size, step, dtype=np.int64))
            cols["src"].append(p.src)
            cols["dst"].append(p.dst)
            cols["chan"].append(p.chan)
            cols["frac"].append(p.frac * k)
            cols["nmsg"].append(p.nmsg * k)
            cols["nser"].append(np.full(p.src.size, k, dtype=np.int64))
            if p.reduce:
                red = np.bincount(p.dst, weights=p.frac * k, minlength=nranks)
                who = np.flatnonzero(red)
                cols["lrank"].append(who)
                cols["lstep"].append(np.full(who.size, step, dtype=np.int64))
                cols["lred"].append(red[who])
            step += 1
    cat = lambda k, dt: np.concatenate(cols[k]).astype(dt) if cols[k] else np.zeros(0, dtype=dt)  # noqa: E731
    lred = cat("lred", np.float64)
    return TransferTable(collective, algorithm, nranks, step, cat("step", np.int64), cat("src", np.int64),
                         cat("dst", np.int64), cat("chan", np.int64), cat("frac", np.float64), cat("nmsg", np.int64),
                         cat("lrank", np.int64), cat("lstep", np.int64), np.zeros(lred.size), lred,
                         nserial=cat("nser", np.int64), coarsened=factor)


def expected_transfers(algorithm: str, nranks: int, nchannels: int, groups: Sequence[Sequence[int]] | None) -> int:
    """Rows the real schedule's table would have (to decide whether to take the fast path)."""
    n = nranks
    if algorithm == "ring":
        return nchannels * n * 2 * (n - 1)
    if algorithm == "hierarchical" and groups:
        H, m = len(groups), len(groups[0])
        return 2 * n * (m - 1) + n * 2 * (H - 1)
    return 0


def fast_table(collective: Collective, algorithm: str, nranks: int, *, rings: Sequence[Sequence[int]] | None = None,
               groups: Sequence[Sequence[int]] | None = None, nsegs: int = 1,
               max_transfers: int | None = None) -> TransferTable | None:
    """The fast-path table for (all_reduce, ring | hierarchical) and (reduce_scatter | all_gather, ring),
    or None when not covered."""
    if nranks < 2:
        return None
    rs = [tuple(r) for r in (rings or [tuple(range(nranks))])]
    if algorithm == "ring" and collective in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return _ring_half(collective, nranks, rs, nsegs, max_transfers)
    if collective != Collective.ALL_REDUCE:
        return None
    if algorithm == "ring":
        return table_from_phases(collective, "ring", nranks, ring_allreduce_phases(nranks, rs, nsegs), max_transfers)
    if algorithm == "hierarchical" and groups and len({len(g) for g in groups}) == 1:
        return table_from_phases(collective, "hierarchical", nranks,
                                 hierarchical_allreduce_phases(nranks, groups, nsegs), max_transfers)
    return None


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def schedule_equal_table(collective: Collective, algorithm: str, nranks: int, *,
                         rings: Sequence[Sequence[int]] | None = None, groups: Sequence[Sequence[int]] | None = None,
                         nsegs: int = 1) -> TransferTable | None:
    """The table `transfers.from_schedule` makes of `algorithms.ring`'s or `algorithms.hierarchical`'s schedule,
    written from its step pattern in the schedule's row order, where the two are equal array for array (the
    schedule's byte counts are then exact): ring reduce-scatter and all-gather on a power-of-two number of
    channels; ring all-reduce where ranks x channels is a power of two; hierarchical all-reduce on a power-of-two
    number of ranks in equal host groups; one segment; the rings and groups covering every rank once. Else None
    (build the schedule)."""
    n = nranks
    if nsegs != 1 or n < 2:
        return None
    if algorithm == "hierarchical":
        if collective != Collective.ALL_REDUCE or not groups or not _pow2(n) or len({len(g) for g in groups}) != 1 \
                or sorted(r for g in groups for r in g) != list(range(n)):
            return None
        tab = table_from_phases(collective, algorithm, n, hierarchical_allreduce_phases(n, groups))
    elif algorithm == "ring" and rings:
        C = len(rings)
        if not _pow2(C) or any(sorted(r) != list(range(n)) for r in rings):
            return None
        if collective == Collective.ALL_REDUCE:
            if not _pow2(n * C):
                return None
            tab = table_from_phases(collective, "ring", n, ring_allreduce_phases(n, rings))
        elif collective in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
            tab = _ring_half(collective, n, rings, 1, None)
        else:
            return None
    else:
        return None
    rows = np.lexsort((tab.chan, tab.step, tab.src))   # the schedule lists each rank's sends step by step
    work = np.lexsort((tab.lstep, tab.lrank))
    return replace(tab, step=tab.step[rows], src=tab.src[rows], dst=tab.dst[rows], chan=tab.chan[rows],
                   frac=tab.frac[rows], nmsg=tab.nmsg[rows], lrank=tab.lrank[work], lstep=tab.lstep[work],
                   lcopy=tab.lcopy[work], lreduce=tab.lreduce[work], nserial=None)
