"""Analytic engine: the tighter of two bounds, latency along the data's path or lock-step, on bytes per step.

Model::

    T(B)  = min over protocols p of  base_p + min(path_p(B), lockstep_p(B))
    path_p(B)     = L_p + B x sum over steps s of (max over transfers t in s of c_t / bw_fraction_p + local_s)
    lockstep_p(B) = sum over steps s of (max over t in s of (a_t + B x c_t / bw_fraction_p) + B x local_s)
    c_t   = max over links l on t's (sub-)paths of busy_ls
    busy_ls = (bytes per byte of B that step s puts on link l, each transfer's weighted by
               `Fabric.transfer_work`; the rows of one NVLS switch operation count once on the
               link they share) / achievable capacity of l
    a_t   = nmsg_t x overhead_p[class_t] + nserial_t x latency_t
    local_s = max over ranks r of local_rs
    L_p   = the critical path of fixed costs: per (rank, channel) a start time S; a transfer t of step s
            from u to v on channel c arrives at S(u, c) + a_t; after step s, S(v, c) = max(S(v, c) + issue,
            arrivals at v on c), issue = the largest issue cost of v's own sends in s (`params.issue_overhead_us`;
            the rows of one step leave side by side, as in the lock-step bound)

B is the call's count * itemsize.  Transfers that share a link in the same step share its bandwidth, a
transfer alone on its path gets bytes / bottleneck.  The path bound follows the data: a rank's step can start
once the messages it receives in the step before have arrived, so a chunk that crosses the network 2 (nodes - 1)
times pays the network's message cost that often, not in every step in which some channel crosses it (NCCL's
ring latency, src/graph/tuning.cc).  The lock-step bound makes every step wait for its slowest row; it is the
tighter one where a step's slowest fixed cost and its bottleneck bytes are on the same row (pipelined trees at
mid sizes).  Everything except B is precomputed once per (schedule, fabric) and cached, so a size sweep is a
few vector operations.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .columns import column_keys
from .fabric import Fabric, Flows, route_table
from .params import LINK_CLASSES, SimParams, issue_overhead_us
from .transfers import TransferTable


@dataclass
class AnalyticModel:
    """Precomputed per-step latency increments and bandwidth slopes of one schedule on one fabric."""

    table: TransferTable
    routed: Flows | None          # the table's flows; None: routed on first use (`flows`)
    protocols: list[str]
    base_us: np.ndarray           # [Pr]
    line_step: np.ndarray         # [U] step of each unique lock-step cost line (sorted)
    line_a: np.ndarray            # [Pr, U] fixed microseconds
    line_c: np.ndarray            # [Pr, U] microseconds per byte of B
    step_starts: np.ndarray       # [S'] reduceat offsets into the lines
    steps_present: np.ndarray     # [S'] the steps those groups belong to
    step_lat: np.ndarray          # [Pr, nsteps] growth of the critical path of fixed costs in each step (us)
    step_c: np.ndarray            # [nsteps] max over the step's transfers of c_t (us per byte of B, Simple's rate)
    bw_fraction: np.ndarray       # [Pr] share of the achievable bandwidth each protocol delivers
    issue_min_us: np.ndarray      # [Pr] cheapest issue cost of one row (the segment bound of `nccl_tree`)
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

    @property
    def latency_us(self) -> np.ndarray:
        """[Pr] the critical path of fixed costs, base excluded."""
        return self.step_lat.sum(axis=1)

    def slope_us_per_byte(self, proto: int) -> float:
        """Microseconds per byte of B under protocol `proto` (the bandwidth term)."""
        return float(self.step_c.sum() / self.bw_fraction[proto] + self.local_c.sum())

    def lockstep_times_us(self, count_bytes: float, proto: int) -> np.ndarray:
        """Every step (length nsteps) at the pace of its slowest row, fixed costs included (the lock-step bound)."""
        out = self.local_c * count_bytes
        if self.line_step.size:
            v = self.line_a[proto] + self.line_c[proto] * count_bytes
            out[self.steps_present] += np.maximum.reduceat(v, self.step_starts)
        return out

    def path_times_us(self, count_bytes: float, proto: int) -> np.ndarray:
        """Every step's growth of the critical path plus its bytes at the step's bottleneck (the path bound)."""
        out = self.local_c * count_bytes
        n = self.step_c.size
        out[:n] += self.step_lat[proto] + self.step_c * (count_bytes / self.bw_fraction[proto])
        return out

    def step_times_us(self, count_bytes: float, proto: int) -> np.ndarray:
        """Duration of every step (length nsteps) under the tighter bound; they add up to the call less base."""
        path = self.path_times_us(count_bytes, proto)
        lock = self.lockstep_times_us(count_bytes, proto)
        return path if path.sum() <= lock.sum() else lock

    def _lockstep_us(self, B: np.ndarray, p: int) -> np.ndarray:
        tot = self.local_c.sum() * B
        if self.line_step.size:
            step = max(1, 4_000_000 // max(1, self.line_step.size))   # chunk over sizes to bound memory
            for i in range(0, B.size, step):
                b = B[i:i + step]
                v = self.line_a[p][:, None] + self.line_c[p][:, None] * b[None, :]
                tot[i:i + step] += np.maximum.reduceat(v, self.step_starts, axis=0).sum(axis=0)
        return tot

    def times_us(self, count_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time of the call, chosen protocol index) for each size in `count_bytes`."""
        B = np.atleast_1d(np.asarray(count_bytes, dtype=np.float64))
        best = np.full(B.size, np.inf)
        pick = np.zeros(B.size, dtype=np.int64)
        lat = self.latency_us
        for p in range(len(self.protocols)):
            tot = self.base_us[p] + np.minimum(lat[p] + self.slope_us_per_byte(p) * B, self._lockstep_us(B, p))
            better = tot < best
            best[better] = tot[better]
            pick[better] = p
        return best, pick


def row_costs(table: TransferTable, flows: Flows, params: SimParams) -> tuple[np.ndarray, np.ndarray]:
    """([Pr, T] fixed cost of each row on its way, [Pr, T] its issue cost on the sender), microseconds."""
    ovh = np.array([[p.msg_overhead_us.get(c, 0.0) for c in LINK_CLASSES] for p in params.protocols])
    issue = np.array([[issue_overhead_us(p).get(c, 0.0) for c in LINK_CLASSES] for p in params.protocols])
    a = table.nmsg[None, :] * ovh[:, flows.t_class] + (table.serial() * flows.t_lat_us)[None, :]
    return a, table.nmsg[None, :] * issue[:, flows.t_class]


def critical_path(table: TransferTable, a: np.ndarray, issue: np.ndarray,
                  step_map: np.ndarray | None = None) -> np.ndarray:
    """[Pr, nsteps]: how much step s lengthens the critical path of fixed costs (module docstring). With
    `step_map`, step s of the result runs the rows of `table`'s step step_map[s] (a template's expansion)."""
    Pr = a.shape[0]
    nsteps = table.nsteps if step_map is None else int(step_map.size)
    out = np.zeros((Pr, max(nsteps, 1)))
    if not table.ntransfers:
        return out
    chans, ch = np.unique(table.chan, return_inverse=True)
    nodes = int(max(table.src.max(), table.dst.max()) + 1) * chans.size
    u_all = table.src * chans.size + ch.reshape(-1)
    v_all = table.dst * chans.size + ch.reshape(-1)
    order = np.argsort(table.step, kind="stable")
    bounds = np.searchsorted(table.step[order], np.arange(table.nsteps + 1))
    S = np.zeros(Pr * nodes)
    off = (np.arange(Pr) * nodes)[:, None]
    M = np.zeros(Pr)
    for s in range(nsteps):
        ts = s if step_map is None else int(step_map[s])
        rows = order[bounds[ts]:bounds[ts + 1]]
        if not rows.size:
            continue
        u = (off + u_all[rows][None, :]).ravel()
        v = (off + v_all[rows][None, :]).ravel()
        arr = S[u] + a[:, rows].ravel()
        senders, which = np.unique(u, return_inverse=True)
        cost = np.zeros(senders.size)
        np.maximum.at(cost, which.reshape(-1), issue[:, rows].ravel())   # a step's rows leave side by side
        S[senders] += cost
        np.maximum.at(S, v, arr)
        top = np.maximum(arr.reshape(Pr, -1).max(axis=1), S[u].reshape(Pr, -1).max(axis=1))
        new = np.maximum(M, top)
        out[:, s] = new - M
        M = new
    return out


def _lines(table: TransferTable, a: np.ndarray,
           c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The lock-step bound's cost lines a + c x B, deduplicated per step and sorted by step."""
    if not table.ntransfers:
        z = np.zeros(0, dtype=np.int64)
        return z, np.zeros((a.shape[0], 0)), np.zeros((a.shape[0], 0)), z, z
    rows = np.concatenate([table.step[None, :].astype(np.float64), np.round(a, 9), np.round(c, 15)])
    _, first = np.unique(column_keys(rows), return_index=True)
    first = first[np.argsort(table.step[first], kind="stable")]
    line_step = table.step[first]
    steps_present, starts = np.unique(line_step, return_index=True)
    return line_step, a[:, first], c[:, first], starts, steps_present


def build_model(table: TransferTable, fab: Fabric, params: SimParams) -> AnalyticModel:
    """Precompute the critical path and the per-step bandwidth slopes (see module docstring)."""
    flows = route_table(table, fab)
    T = table.ntransfers
    L = fab.nlinks
    p_step = table.step[flows.f_transfer[flows.p_flow]]
    p_bytes = flows.pair_frac()
    link_frac = np.bincount(flows.p_link, weights=p_bytes, minlength=L)
    step_c = np.zeros(max(table.nsteps, 1))
    if T:
        key = p_step * L + flows.p_link
        ukey, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        p_work = p_bytes * fab.transfer_work(table)[flows.f_transfer[flows.p_flow]]
        busy = np.bincount(inv, weights=p_work / fab.cap_Bpus[flows.p_link], minlength=ukey.size)
        pair_busy = busy[inv]
        f_c = np.maximum.reduceat(pair_busy, flows.f_pair_ptr[:-1]) if pair_busy.size else np.zeros(0)
        t_c = np.maximum.reduceat(f_c, flows.t_flow_ptr[:-1])
        np.maximum.at(step_c, table.step, t_c)
    a, issue = row_costs(table, flows, params)
    frac = np.array([p.bw_fraction for p in params.protocols])
    lines = _lines(table, a, (t_c if T else np.zeros(0))[None, :] / frac[:, None])
    local_c = np.zeros(max(table.nsteps, 1))
    if table.lrank.size:
        np.maximum.at(local_c, table.lstep, fab.local_us_per_byte(table))
    last = np.full(table.nranks, -1, dtype=np.int64)
    np.maximum.at(last, table.src, table.step)
    np.maximum.at(last, table.dst, table.step)
    if table.lrank.size:
        np.maximum.at(last, table.lrank, table.lstep)
    return AnalyticModel(table, flows, [p.name for p in params.protocols],
                         np.array([p.base_us + params.cpu.call_overhead_per_peer_us * (table.nranks - 1)
                                   for p in params.protocols]), *lines, critical_path(table, a, issue), step_c, frac,
                         issue.min(axis=1, initial=np.inf) if T else np.zeros(len(frac)), local_c, link_frac,
                         last, fab)


_MODELS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def expand_model(template: AnalyticModel, table: TransferTable, step_map: np.ndarray, scale: float,
                 fab: Fabric, params: SimParams) -> AnalyticModel:
    """The model of `table` from that of a `template` table whose step step_map[s] moves the same rows as step s
    of `table`, each row's bytes times `scale` (a power of two, so every bandwidth slope scales exactly)."""
    nsteps = int(step_map.size)
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
    step_c = np.zeros(max(nsteps, 1))
    step_c[:nsteps] = template.step_c[step_map] * scale
    a, issue = row_costs(template.table, flows, params)
    counts = np.diff(np.searchsorted(template.line_step, np.arange(template.table.nsteps + 1)))
    starts = np.searchsorted(template.line_step, np.arange(template.table.nsteps))
    from .fabric import ragged
    idx, owner = ragged(starts[step_map], counts[step_map])
    line_step = np.arange(nsteps, dtype=np.int64)[owner]
    steps_present, step_starts = np.unique(line_step, return_index=True)
    return AnalyticModel(table, None, template.protocols, template.base_us, line_step, template.line_a[:, idx],
                         template.line_c[:, idx] * scale, step_starts, steps_present,
                         critical_path(template.table, a, issue, step_map), step_c, template.bw_fraction,
                         template.issue_min_us, local_c, link_frac, last, fab)


def model_for(table: TransferTable, fab: Fabric, params: SimParams) -> AnalyticModel:
    """Cached `build_model` per (fabric, table); an NVLS table's from its few-step template (`nvls.template`)."""
    per = _MODELS.setdefault(fab, {})
    hit = per.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    from .nvls import template
    tpl = template(table)
    if tpl is not None:
        model = expand_model(model_for(tpl[0], fab, params), table, tpl[1], tpl[2], fab, params)
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
