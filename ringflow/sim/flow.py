"""Flow-level engine: transfers as flows on routed paths, sharing links by max-min fairness.

Semantics (like the runtime, steps are *not* global barriers in time):

- each rank walks its own steps in order; rank r enters its next step when every transfer it
  takes part in during the current step has completed and its local work is done;
- a transfer of step s from a to b starts when both a and b have entered step s (the
  sender's data is ready and the receiver is ready), then waits the per-message overhead
  (``nmsg * overhead + (nserial - 1) * latency``: segments of one step pay the overhead each,
  merged steps also their latencies);
- its bytes then flow along its (sub-)paths; all flows in flight share every link by
  max-min fairness (progressive filling, vectorised with numpy);
- it completes one path latency after its last byte left.

The loop advances event by event (flow start, flow end, transfer completion).  Cost per
event is O(P_active * k) where P_active is the number of (flow, link) pairs in flight and k
the number of distinct bottleneck levels (usually 1-3); the number of events is about
3 x (distinct completion times), i.e. ~3 x steps for symmetric schedules.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .fabric import Fabric, Flows, ragged
from .params import LINK_CLASSES, Protocol, SimParams
from .transfers import TransferTable

_REL = 1e-9


@dataclass
class FlowOutcome:
    """What the flow engine measured."""

    time_us: float
    rank_finish_us: np.ndarray
    link_bytes: np.ndarray
    t_start_us: np.ndarray   # per transfer: when both sides were ready
    t_end_us: np.ndarray     # per transfer: completion (arrival of the last byte)
    events: int
    rate_solves: int
    notes: list[str] = field(default_factory=list)


def maxmin_rates(pf: np.ndarray, plink: np.ndarray, cap: np.ndarray, nflows: int,
                 pweight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rates of `nflows` flows; pair i says flow pf[i] crosses link plink[i], using
    pweight[i] (default 1) of its rate there (the rows of one switch operation share their bytes)."""
    rate = np.zeros(nflows)
    if nflows == 0:
        return rate
    ul, linv = np.unique(plink, return_inverse=True)
    linv = linv.reshape(-1)
    rem = cap[ul].astype(np.float64).copy()
    tol = rem * 1e-12
    live_pair = np.ones(pf.size, dtype=bool)
    frozen = np.zeros(nflows, dtype=bool)
    for _ in range(nflows + 1):
        n = np.bincount(linv[live_pair], weights=None if pweight is None else pweight[live_pair], minlength=ul.size)
        used = n > 0
        if not used.any():
            break
        inc = float(np.min(rem[used] / n[used]))
        rate[~frozen] += inc
        rem -= inc * n
        sat = used & (rem <= tol + 1e-12 * inc * n)
        hit = np.unique(pf[live_pair & sat[linv]])
        frozen[hit] = True
        live_pair &= ~frozen[pf]
        if frozen.all():
            break
    return rate


def simulate(table: TransferTable, fab: Fabric, flows: Flows, params: SimParams, count_bytes: float,
             protocol: Protocol, *, progress: Callable[[float], None] | None = None) -> FlowOutcome:
    """Run the flow engine for one call of `count_bytes` (= count * itemsize) bytes."""
    run = _FlowRun(table, fab, flows, count_bytes, protocol)
    run.run(progress)
    notes = []
    if np.isnan(run.t_end).any():
        notes.append(f"{int(np.isnan(run.t_end).sum())} transfers never ran (unmatched send/receive?)")
    base = float(protocol.base_us) + params.cpu.call_overhead_per_peer_us * (table.nranks - 1)
    return FlowOutcome(float(max(run.rank_finish.max(initial=0.0), run.now)) + base, run.rank_finish + base,
                       run.link_bytes, run.t_start + base, run.t_end + base, run.events, run.solves, notes)


_Heap = list[tuple[float, int, np.ndarray]]   # (time, seq, transfers)


class _FlowRun:
    """The state of one flow-engine run (module docstring): per-rank slots, transfers, flows in flight."""

    def __init__(self, table: TransferTable, fab: Fabric, flows: Flows, count_bytes: float,
                 protocol: Protocol) -> None:
        self.fab, self.flows = fab, flows
        T, R = table.ntransfers, table.nranks
        cls_ovh = np.array([protocol.msg_overhead_us.get(c, 0.0) for c in LINK_CLASSES])
        self.pre_us = table.nmsg * cls_ovh[flows.t_class] + (table.serial() - 1) * flows.t_lat_us
        self.post_us = flows.t_lat_us.copy()
        self.cap = fab.cap_Bpus * protocol.bw_fraction
        self.f_bytes = flows.f_frac * count_bytes
        F = self.f_bytes.size
        self.link_bytes = np.bincount(flows.p_link, weights=flows.pair_frac() * count_bytes, minlength=fab.nlinks)
        # link time, in bytes at the links' rates
        self.f_work = self.f_bytes * fab.transfer_work(table)[flows.f_transfer]
        self._build_slots(table, count_bytes)
        self.arrivals = np.zeros(T, dtype=np.int64)
        self.ready = np.zeros(T)
        self.t_start = np.full(T, np.nan)
        self.t_end = np.full(T, np.nan)
        self.sub_left = np.diff(flows.t_flow_ptr).astype(np.int64)
        self.rank_finish = np.zeros(R)
        self.cur_slot = self.rank_ptr[:-1].copy()
        self.act_heap: _Heap = []
        self.done_heap: _Heap = []
        self.seq = 0
        self.active = np.zeros(0, dtype=np.int64)      # flow ids in flight
        self.rem = np.zeros(F)
        self.rate = np.zeros(F)
        self.now = 0.0
        self.events = self.solves = 0
        self.dirty = False

    def _build_slots(self, table: TransferTable, count_bytes: float) -> None:
        """Per-rank slots: the steps each rank takes part in, in order, with their transfers and local work."""
        T, R = table.ntransfers, table.nranks
        ent_r = np.concatenate([table.src, table.dst, table.lrank])
        ent_s = np.concatenate([table.step, table.step, table.lstep])
        S1 = int(table.nsteps) + 1
        skey = np.unique(ent_r * S1 + ent_s)
        self.slot_rank = skey // S1
        nslots = skey.size
        self.rank_ptr = np.searchsorted(self.slot_rank, np.arange(R + 1))
        self.slot_of_src = np.searchsorted(skey, table.src * S1 + table.step)
        self.slot_of_dst = np.searchsorted(skey, table.dst * S1 + table.step)
        self.local_us = np.zeros(nslots)
        if table.lrank.size:
            per = self.fab.local_us_per_byte(table) * count_bytes
            np.add.at(self.local_us, np.searchsorted(skey, table.lrank * S1 + table.lstep), per)
        inc_slot = np.concatenate([self.slot_of_src, self.slot_of_dst])
        inc_tr = np.concatenate([np.arange(T), np.arange(T)])
        order = np.argsort(inc_slot, kind="stable")
        self.slot_tr = inc_tr[order]
        self.slot_tr_ptr = np.searchsorted(inc_slot[order], np.arange(nslots + 1))
        self.outstanding = np.diff(self.slot_tr_ptr).astype(np.int64)

    def push(self, heap: _Heap, times: np.ndarray, items: np.ndarray) -> None:
        if items.size == 0:
            return
        ut, inv = np.unique(times, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(ut.size + 1))
        for i, tm in enumerate(ut):
            self.seq += 1
            heapq.heappush(heap, (float(tm), self.seq, items[order[bounds[i]:bounds[i + 1]]]))

    def flows_done(self, fl: np.ndarray, now: float) -> None:
        """Flows `fl` delivered their bytes: a transfer with no flow left completes after its post latency."""
        trs = self.flows.f_transfer[fl]
        np.subtract.at(self.sub_left, trs, 1)
        trs = np.unique(trs)
        trs = trs[self.sub_left[trs] == 0]
        self.push(self.done_heap, now + self.post_us[trs], trs)

    def enter(self, ranks: np.ndarray, times: np.ndarray) -> None:
        """Ranks enter their current slot at `times`; cascades through transfer-less slots."""
        cur_slot, rank_ptr, slot_tr_ptr = self.cur_slot, self.rank_ptr, self.slot_tr_ptr
        arrivals, ready = self.arrivals, self.ready
        while ranks.size:
            has = cur_slot[ranks] < rank_ptr[ranks + 1]
            fin = ranks[~has]
            self.rank_finish[fin] = np.maximum(self.rank_finish[fin], times[~has])
            ranks, times = ranks[has], times[has]
            if not ranks.size:
                return
            slots = cur_slot[ranks]
            cnt = slot_tr_ptr[slots + 1] - slot_tr_ptr[slots]
            idx, owner = ragged(slot_tr_ptr[slots], cnt)
            trs = self.slot_tr[idx]
            np.add.at(arrivals, trs, 1)
            np.maximum.at(ready, trs, times[owner])
            both = trs[arrivals[trs] == 2]
            both = np.unique(both)
            if both.size:
                arrivals[both] = 3  # mark scheduled
                self.t_start[both] = ready[both]
                self.push(self.act_heap, ready[both] + self.pre_us[both], both)
            empty = cnt == 0   # local-only slots finish right away
            if not empty.any():
                return
            r2, s2 = ranks[empty], slots[empty]
            times = times[empty] + self.local_us[s2]
            cur_slot[r2] += 1
            ranks = r2

    def run(self, progress: Callable[[float], None] | None) -> None:
        """Advance event by event until every transfer has completed (or nothing more can happen)."""
        R = self.rank_finish.size
        self.enter(np.arange(R), np.zeros(R))
        while self.act_heap or self.done_heap or self.active.size:
            self.events += 1
            nxt = self._next_event_time()
            if not np.isfinite(nxt):
                break
            dt = nxt - self.now
            if self.active.size and dt > 0:
                self.rem[self.active] -= self.rate[self.active] * dt
            self.now = nxt
            eps = _REL * max(1.0, self.now)
            self._finish_flows(eps)
            self._start_transfers(eps)
            self._complete_transfers(eps)
            if progress is not None and self.events % 256 == 0:
                progress(float(np.mean(self.cur_slot - self.rank_ptr[:-1])
                               / max(1.0, np.mean(np.diff(self.rank_ptr)))))

    def _next_event_time(self) -> float:
        """The earliest of: a flow in flight delivering its last byte, a transfer starting, one completing."""
        t_fin = np.inf
        active = self.active
        if active.size:
            if self.dirty:
                self._solve_rates()
            with np.errstate(divide="ignore"):
                t_fin = self.now + float(np.min(self.rem[active] / self.rate[active]))
        t_act = self.act_heap[0][0] if self.act_heap else np.inf
        t_done = self.done_heap[0][0] if self.done_heap else np.inf
        return float(min(t_fin, t_act, t_done))

    def _solve_rates(self) -> None:
        """Max-min fair rates of the flows in flight."""
        flows, active = self.flows, self.active
        cnt = flows.f_pair_ptr[active + 1] - flows.f_pair_ptr[active]
        pidx, owner = ragged(flows.f_pair_ptr[active], cnt)
        self.rate[active] = maxmin_rates(owner, flows.p_link[pidx], self.cap, active.size,
                                         None if flows.p_weight is None else flows.p_weight[pidx])
        self.solves += 1
        self.dirty = False

    def _finish_flows(self, eps: float) -> None:
        """Flows that delivered their last byte by now."""
        active = self.active
        if active.size:
            done_mask = self.rem[active] <= np.maximum(self.f_work[active] * 1e-9, self.rate[active] * eps)
            if done_mask.any():
                fin = active[done_mask]
                self.rem[fin] = 0.0
                self.active = active[~done_mask]
                self.dirty = True
                self.flows_done(fin, self.now)

    def _start_transfers(self, eps: float) -> None:
        """Transfers whose flows start now."""
        flows, now = self.flows, self.now
        new: list[np.ndarray] = []
        while self.act_heap and self.act_heap[0][0] <= now + eps:
            new.append(heapq.heappop(self.act_heap)[2])
        if not new:
            return
        trs = np.concatenate(new)
        cnt = flows.t_flow_ptr[trs + 1] - flows.t_flow_ptr[trs]
        fl, _ = ragged(flows.t_flow_ptr[trs], cnt)
        self.rem[fl] = self.f_work[fl]
        zero = self.f_bytes[fl] <= 0
        if zero.any():  # empty messages: only fixed costs
            self.flows_done(fl[zero], now)
            fl = fl[~zero]
        if fl.size:
            self.active = np.concatenate([self.active, fl])
            self.dirty = True
        # transfers with no flows at all (no bytes, no route): complete after latency
        nof = trs[cnt == 0]
        if nof.size:
            self.push(self.done_heap, now + self.post_us[nof], nof)

    def _complete_transfers(self, eps: float) -> None:
        """Transfers completing now; ranks whose slot has no transfer left move on."""
        now = self.now
        comp: list[np.ndarray] = []
        while self.done_heap and self.done_heap[0][0] <= now + eps:
            comp.append(heapq.heappop(self.done_heap)[2])
        if not comp:
            return
        trs = np.concatenate(comp)
        self.t_end[trs] = now
        sl = np.concatenate([self.slot_of_src[trs], self.slot_of_dst[trs]])
        np.subtract.at(self.outstanding, sl, 1)
        sl = np.unique(sl)
        ready_slots = sl[self.outstanding[sl] == 0]
        if ready_slots.size:
            rks = self.slot_rank[ready_slots]
            tms = now + self.local_us[ready_slots]
            self.cur_slot[rks] += 1
            self.enter(rks, tms)
