"""Analytic engine: per-step latency plus bytes over the shared bottleneck of each path.

Model (steps are bulk-synchronous here; the flow engine relaxes that)::

    T(B) = min over protocols p of
           base_p + sum over steps s of [ max over transfers t in s of
                (nmsg_t * overhead_p[class_t] + nserial_t * latency_t + B * c_t / bw_fraction_p)
              + B * max over ranks r of local_rs ]
    c_t  = max over links l on t's (sub-)paths of busy_ls
    busy_ls = (bytes per byte of B that step s puts on link l, each transfer's weighted by
               `Fabric.transfer_work`; the rows of one NVLS switch operation count once on the
               link they share) / achievable capacity of l

B is the call's count * itemsize.  `busy` makes transfers that share a link in the same
step share its bandwidth; a transfer alone on its path gets bytes / bottleneck.  Everything
except B is precomputed once per (schedule, fabric) and cached, so a size sweep is a few
vector operations.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .columns import column_keys
from .fabric import Fabric, Flows, ragged, route_table
from .params import LINK_CLASSES, SimParams
from .transfers import TransferTable


@dataclass
class AnalyticModel:
    """Precomputed per-step cost lines of one schedule on one fabric."""

    table: TransferTable
    routed: Flows | None          # the table's flows; None: routed on first use (`flows`)
    protocols: list[str]
    base_us: np.ndarray           # [Pr]
    line_step: np.ndarray         # [U] step of each unique cost line (sorted)
    line_a: np.ndarray            # [Pr, U] fixed microseconds
    line_c: np.ndarray            # [Pr, U] microseconds per byte of B
    step_starts: np.ndarray       # [S'] reduceat offsets into the lines
    steps_present: np.ndarray     # [S'] the steps those groups belong to
    local_c: np.ndarray           # [nsteps] max local work per step, microseconds per byte of B
    link_frac: np.ndarray         # [L] bytes per byte of B on each link
    rank_last_step: np.ndarray    # [nranks] last step a rank takes part in (-1: none)
    fabric: Fabric | None = None  # where `flows` routes the table when `routed` is None

    @property
    def flows(self) -> Flows:
        """The table's transfers routed on the fabric (sub-flows and their links)."""
        if self.routed is None:
            assert self.fabric is not None
            self.routed = route_table(self.table, self.fabric)
        return self.routed

    def step_times_us(self, count_bytes: float, proto: int) -> np.ndarray:
        """Duration of every step (length nsteps) for one size and protocol."""
        out = self.local_c * count_bytes
        if self.line_step.size:
            v = self.line_a[proto] + self.line_c[proto] * count_bytes
            out[self.steps_present] += np.maximum.reduceat(v, self.step_starts)
        return out

    def times_us(self, count_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time of the call, chosen protocol index) for each size in `count_bytes`."""
        B = np.atleast_1d(np.asarray(count_bytes, dtype=np.float64))
        local = float(self.local_c.sum())
        best = np.full(B.size, np.inf)
        pick = np.zeros(B.size, dtype=np.int64)
        for p in range(len(self.protocols)):
            tot = self.base_us[p] + local * B
            if self.line_step.size:
                # chunk over sizes to bound memory: U x chunk
                step = max(1, 4_000_000 // max(1, self.line_step.size))
                for i in range(0, B.size, step):
                    b = B[i:i + step]
                    v = self.line_a[p][:, None] + self.line_c[p][:, None] * b[None, :]
                    tot[i:i + step] += np.maximum.reduceat(v, self.step_starts, axis=0).sum(axis=0)
            better = tot < best
            best[better] = tot[better]
            pick[better] = p
        return best, pick


def build_model(table: TransferTable, fab: Fabric, params: SimParams) -> AnalyticModel:
    """Precompute the cost lines (see module docstring); a table whose consecutive steps repeat the same rows
    from the lines of its distinct steps (`repeated_steps`)."""
    rep = repeated_steps(table)
    if rep is not None:
        return _build_repeated(table, fab, params, *rep)
    return _build_full(table, fab, params)


def _build_full(table: TransferTable, fab: Fabric, params: SimParams) -> AnalyticModel:
    flows = route_table(table, fab)
    T = table.ntransfers
    L = fab.nlinks
    p_step = table.step[flows.f_transfer[flows.p_flow]]
    p_bytes = flows.pair_frac()
    link_frac = np.bincount(flows.p_link, weights=p_bytes, minlength=L)
    if T:
        key = p_step * L + flows.p_link
        ukey, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        p_work = p_bytes * fab.transfer_work(table)[flows.f_transfer[flows.p_flow]]
        busy = np.bincount(inv, weights=p_work / fab.cap_Bpus[flows.p_link], minlength=ukey.size)
        pair_busy = busy[inv]
        f_c = np.maximum.reduceat(pair_busy, flows.f_pair_ptr[:-1]) if pair_busy.size else np.zeros(0)
        t_c = np.maximum.reduceat(f_c, flows.t_flow_ptr[:-1])
    else:
        t_c = np.zeros(0)
    nprot = len(params.protocols)
    ovh = np.array([[p.msg_overhead_us.get(c, 0.0) for c in LINK_CLASSES] for p in params.protocols])
    frac = np.array([p.bw_fraction for p in params.protocols])
    a = table.nmsg[None, :] * ovh[:, flows.t_class] + (table.serial() * flows.t_lat_us)[None, :]  # [Pr, T]
    c = t_c[None, :] / frac[:, None]                                               # [Pr, T]
    # deduplicate lines per step (identical (a, c) for all protocols)
    if T:
        rows = np.concatenate([table.step[None, :].astype(np.float64), np.round(a, 9), c * 0 + np.round(c, 15)])
        _, first = np.unique(column_keys(rows), return_index=True)
        order = np.argsort(table.step[first], kind="stable")
        first = first[order]
        line_step = table.step[first]
        line_a, line_c = a[:, first], c[:, first]
        steps_present, starts = np.unique(line_step, return_index=True)
    else:
        line_step = np.zeros(0, dtype=np.int64)
        line_a = line_c = np.zeros((nprot, 0))
        steps_present = starts = np.zeros(0, dtype=np.int64)
    local_c, last = _local_and_last(table, fab)
    return AnalyticModel(table, flows, [p.name for p in params.protocols],
                         np.array([p.base_us + params.cpu.call_overhead_per_peer_us * (table.nranks - 1)
                                   for p in params.protocols]), line_step, line_a, line_c,
                         starts, steps_present, local_c, link_frac, last, fab)


REPEAT_MIN_ROWS = 4096   # below, a table is built row by row (finding its repeats would cost what they save)


def repeated_steps(table: TransferTable) -> tuple[np.ndarray, np.ndarray] | None:
    """(the steps that have rows, ascending; each one's pattern: 0, 1, ... numbered in order) where the rows are
    in step order and some step moves exactly the rows of the step before it (every field equal, row for row),
    as the macro steps of a ring or hierarchical table (`fastpath`) do; None otherwise."""
    T = table.ntransfers
    if T < REPEAT_MIN_ROWS or table.in_switch is not None or np.any(table.step[1:] < table.step[:-1]):
        return None
    cnt_all = np.bincount(table.step, minlength=table.nsteps)
    present = np.flatnonzero(cnt_all)
    cnt = cnt_all[present]
    if present.size < 2:
        return None
    # each row against the row one step above it, where the two steps have as many rows
    prev_cnt = np.concatenate([[0], np.where(cnt[1:] == cnt[:-1], cnt[:-1], 0)])
    back = np.repeat(prev_cnt, cnt)
    rows = np.flatnonzero(back)
    eq = np.zeros(T, dtype=bool)
    if rows.size:
        above = rows - back[rows]
        ok = np.ones(rows.size, dtype=bool)
        for col in (table.src, table.dst, table.chan, table.nmsg, table.serial(), table.frac.view(np.int64)):
            ok &= col[rows] == col[above]
        eq[rows] = ok
    starts = np.cumsum(cnt) - cnt
    same = np.logical_and.reduceat(eq, starts) & (prev_cnt > 0)
    if not same.any():
        return None
    return present, np.cumsum(~same) - 1


def _build_repeated(table: TransferTable, fab: Fabric, params: SimParams, present: np.ndarray,
                    pattern: np.ndarray) -> AnalyticModel:
    """`_build_full`'s model of `table` from a table of one step per pattern: each step's cost lines are its
    pattern's (the same rows on the same links give the same sums, in the same order), the per-link bytes add
    every step's pairs in `_build_full`'s order; the full table is routed on first use of `flows`."""
    cnt = np.bincount(table.step, minlength=table.nsteps)[present]
    starts = np.cumsum(cnt) - cnt
    leader = np.concatenate([[True], pattern[1:] != pattern[:-1]])
    rows, owner = ragged(starts[leader], cnt[leader])
    none_i, none_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    tpl = TransferTable(table.collective, table.algorithm, table.nranks, int(leader.sum()),
                        pattern[leader][owner], table.src[rows], table.dst[rows], table.chan[rows], table.frac[rows],
                        table.nmsg[rows], none_i, none_i, none_f, none_f, nserial=table.serial()[rows],
                        coarsened=table.coarsened)
    tm = _build_full(tpl, fab, params)
    npat = tpl.nsteps
    line_cnt = np.bincount(tm.line_step, minlength=npat)
    line_start = np.cumsum(line_cnt) - line_cnt
    idx, line_owner = ragged(line_start[pattern], line_cnt[pattern])
    line_step = present[line_owner]
    steps_present, step_starts = np.unique(line_step, return_index=True)
    flows = tm.flows
    row_end = np.cumsum(cnt[leader])
    pair_end = flows.f_pair_ptr[flows.t_flow_ptr[row_end]]
    pair_cnt = np.diff(np.concatenate([[0], pair_end]))
    pidx, _ = ragged(pair_end[pattern] - pair_cnt[pattern], pair_cnt[pattern])
    link_frac = np.bincount(flows.p_link[pidx], weights=flows.pair_frac()[pidx], minlength=fab.nlinks)
    local_c, last = _local_and_last(table, fab)
    return AnalyticModel(table, None, tm.protocols, tm.base_us, line_step, tm.line_a[:, idx], tm.line_c[:, idx],
                         step_starts, steps_present, local_c, link_frac, last, fab)


def _local_and_last(table: TransferTable, fab: Fabric) -> tuple[np.ndarray, np.ndarray]:
    """Per step the largest local work (microseconds per byte of B); per rank its last step (-1: none)."""
    local_c = np.zeros(max(table.nsteps, 1))
    if table.lrank.size:
        np.maximum.at(local_c, table.lstep, fab.local_us_per_byte(table))
    last = np.full(table.nranks, -1, dtype=np.int64)
    np.maximum.at(last, table.src, table.step)
    np.maximum.at(last, table.dst, table.step)
    if table.lrank.size:
        np.maximum.at(last, table.lrank, table.lstep)
    return local_c, last


_MODELS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def expand_model(template: AnalyticModel, table: TransferTable, step_map: np.ndarray, scale: float,
                 fab: Fabric) -> AnalyticModel:
    """The model of `table` from that of a `template` table whose step step_map[s] moves the same rows as step s
    of `table`, each row's bytes times `scale` (a power of two, so every cost line scales exactly)."""
    nsteps = int(step_map.size)
    counts = np.diff(np.searchsorted(template.line_step, np.arange(template.table.nsteps + 1)))
    starts = np.searchsorted(template.line_step, np.arange(template.table.nsteps))
    from .fabric import ragged
    idx, owner = ragged(starts[step_map], counts[step_map])
    line_step = np.arange(nsteps, dtype=np.int64)[owner]
    steps_present, step_starts = np.unique(line_step, return_index=True)
    flows = template.flows
    p_step = template.table.step[flows.f_transfer[flows.p_flow]]
    per_step = np.bincount(step_map, minlength=template.table.nsteps).astype(np.float64)
    link_frac = np.bincount(flows.p_link, weights=flows.pair_frac() * per_step[p_step] * scale,
                            minlength=fab.nlinks)
    last_of = np.full(template.table.nsteps, -1, dtype=np.int64)
    np.maximum.at(last_of, step_map, np.arange(nsteps, dtype=np.int64))
    last = np.where(template.rank_last_step >= 0, last_of[np.clip(template.rank_last_step, 0, None)], -1)
    local_c = np.zeros(max(nsteps, 1))
    local_c[:nsteps] = template.local_c[step_map] * scale
    return AnalyticModel(table, None, template.protocols, template.base_us, line_step, template.line_a[:, idx],
                         template.line_c[:, idx] * scale, step_starts, steps_present, local_c, link_frac, last, fab)


def model_for(table: TransferTable, fab: Fabric, params: SimParams) -> AnalyticModel:
    """Cached `build_model` per (fabric, table); an NVLS table's from its few-step template (`nvls.template`)."""
    per = _MODELS.setdefault(fab, {})
    hit = per.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    from .nvls import template
    tpl = template(table)
    if tpl is not None:
        model = expand_model(model_for(tpl[0], fab, params), table, tpl[1], tpl[2], fab)
    else:
        model = build_model(table, fab, params)
    per[id(table)] = (table, model)
    if len(per) > 64:
        per.pop(next(iter(per)))
    return model


def rank_finish_us(model: AnalyticModel, count_bytes: float, proto: int) -> np.ndarray:
    """Per-rank finish time under the bulk-synchronous step model."""
    base = model.base_us[proto]
    ends = base + np.cumsum(model.step_times_us(count_bytes, proto))
    last = model.rank_last_step
    return np.where(last >= 0, ends[np.clip(last, 0, None)], base)
