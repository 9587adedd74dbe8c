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
    T, R = table.ntransfers, table.nranks
    cls_ovh = np.array([protocol.msg_overhead_us.get(c, 0.0) for c in LINK_CLASSES])
    pre_us = table.nmsg * cls_ovh[flows.t_class] + (table.serial() - 1) * flows.t_lat_us
    post_us = flows.t_lat_us.copy()
    cap = fab.cap_Bpus * protocol.bw_fraction
    lone_speedups = fab.lone_speedups   # routes are resolved: no pair link appears during the run
    f_bytes = flows.f_frac * count_bytes
    F = f_bytes.size
    link_bytes = np.bincount(flows.p_link, weights=flows.pair_frac() * count_bytes, minlength=fab.nlinks)
    f_work = f_bytes * fab.transfer_work(table)[flows.f_transfer]   # link time, in bytes at the links' rates

    # ---- per-rank slots: the steps each rank takes part in, in order -------------------------
    local_us = np.zeros(0)
    ent_r = np.concatenate([table.src, table.dst, table.lrank])
    ent_s = np.concatenate([table.step, table.step, table.lstep])
    S1 = int(table.nsteps) + 1
    skey = np.unique(ent_r * S1 + ent_s)
    slot_rank = skey // S1
    nslots = skey.size
    rank_ptr = np.searchsorted(slot_rank, np.arange(R + 1))
    slot_of_src = np.searchsorted(skey, table.src * S1 + table.step)
    slot_of_dst = np.searchsorted(skey, table.dst * S1 + table.step)
    local_us = np.zeros(nslots)
    if table.lrank.size:
        per = fab.local_us_per_byte(table) * count_bytes
        np.add.at(local_us, np.searchsorted(skey, table.lrank * S1 + table.lstep), per)
    inc_slot = np.concatenate([slot_of_src, slot_of_dst])
    inc_tr = np.concatenate([np.arange(T), np.arange(T)])
    order = np.argsort(inc_slot, kind="stable")
    slot_tr = inc_tr[order]
    slot_tr_ptr = np.searchsorted(inc_slot[order], np.arange(nslots + 1))
    outstanding = np.diff(slot_tr_ptr).astype(np.int64)

    arrivals = np.zeros(T, dtype=np.int64)
    ready = np.zeros(T)
    t_start = np.full(T, np.nan)
    t_end = np.full(T, np.nan)
    sub_left = np.diff(flows.t_flow_ptr).astype(np.int64)
    rank_finish = np.zeros(R)
    cur_slot = rank_ptr[:-1].copy()

    act_heap: list[tuple[float, int, np.ndarray]] = []   # (time, seq, transfers)
    done_heap: list[tuple[float, int, np.ndarray]] = []
    seq = 0

    def push(heap: list, times: np.ndarray, items: np.ndarray) -> None:
        nonlocal seq
        if items.size == 0:
            return
        ut, inv = np.unique(times, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(ut.size + 1))
        for i, tm in enumerate(ut):
            seq += 1
            heapq.heappush(heap, (float(tm), seq, items[order[bounds[i]:bounds[i + 1]]]))

    def flows_done(fl: np.ndarray, now: float) -> None:
        """Flows `fl` delivered their bytes: a transfer with no flow left completes after its post latency."""
        trs = flows.f_transfer[fl]
        np.subtract.at(sub_left, trs, 1)
        trs = np.unique(trs)
        trs = trs[sub_left[trs] == 0]
        push(done_heap, now + post_us[trs], trs)

    def enter(ranks: np.ndarray, times: np.ndarray) -> None:
        """Ranks enter their current slot at `times`; cascades through transfer-less slots."""
        while ranks.size:
            has = cur_slot[ranks] < rank_ptr[ranks + 1]
            fin = ranks[~has]
            rank_finish[fin] = np.maximum(rank_finish[fin], times[~has])
            ranks, times = ranks[has], times[has]
            if not ranks.size:
                return
            slots = cur_slot[ranks]
            cnt = slot_tr_ptr[slots + 1] - slot_tr_ptr[slots]
            idx, owner = ragged(slot_tr_ptr[slots], cnt)
            trs = slot_tr[idx]
            np.add.at(arrivals, trs, 1)
            np.maximum.at(ready, trs, times[owner])
            both = trs[arrivals[trs] == 2]
            both = np.unique(both)
            if both.size:
                arrivals[both] = 3  # mark scheduled
                t_start[both] = ready[both]
                push(act_heap, ready[both] + pre_us[both], both)
            empty = cnt == 0   # local-only slots finish right away
            if not empty.any():
                return
            r2, s2 = ranks[empty], slots[empty]
            times = times[empty] + local_us[s2]
            cur_slot[r2] += 1
            ranks = r2

    enter(np.arange(R), np.zeros(R))

    active = np.zeros(0, dtype=np.int64)      # flow ids in flight
    rem = np.zeros(F)
    rate = np.zeros(F)
    now = 0.0
    events = solves = 0
    dirty = False
    total_est = None
    while act_heap or done_heap or active.size:
        events += 1
        t_fin = np.inf
        if active.size:
            if dirty:
                cnt = flows.f_pair_ptr[active + 1] - flows.f_pair_ptr[active]
                pidx, owner = ragged(flows.f_pair_ptr[active], cnt)
                plink = flows.p_link[pidx]
                now_cap = cap
                if lone_speedups:
                    boost = fab.lone_factor(np.zeros(pidx.size, dtype=np.int64), flows.f_transfer[active][owner],
                                            plink)
                    if np.any(boost > 1.0):   # a transfer alone on its host
                        now_cap = cap.copy()
                        now_cap[plink[boost > 1.0]] *= boost[boost > 1.0]
                rate[active] = maxmin_rates(owner, plink, now_cap, active.size,
                                            None if flows.p_weight is None else flows.p_weight[pidx])
                solves += 1
                dirty = False
            with np.errstate(divide="ignore"):
                t_fin = now + float(np.min(rem[active] / rate[active]))
        t_act = act_heap[0][0] if act_heap else np.inf
        t_done = done_heap[0][0] if done_heap else np.inf
        nxt = min(t_fin, t_act, t_done)
        if not np.isfinite(nxt):
            break
        dt = nxt - now
        if active.size and dt > 0:
            rem[active] -= rate[active] * dt
        now = nxt
        eps = _REL * max(1.0, now)
        # flows that finished
        if active.size:
            done_mask = rem[active] <= np.maximum(f_work[active] * 1e-9, rate[active] * eps)
            if done_mask.any():
                fin = active[done_mask]
                rem[fin] = 0.0
                active = active[~done_mask]
                dirty = True
                flows_done(fin, now)
        # transfers whose flows start now
        new: list[np.ndarray] = []
        while act_heap and act_heap[0][0] <= now + eps:
            new.append(heapq.heappop(act_heap)[2])
        if new:
            trs = np.concatenate(new)
            cnt = flows.t_flow_ptr[trs + 1] - flows.t_flow_ptr[trs]
            fl, _ = ragged(flows.t_flow_ptr[trs], cnt)
            rem[fl] = f_work[fl]
            zero = f_bytes[fl] <= 0
            if zero.any():  # empty messages: only fixed costs
                flows_done(fl[zero], now)
                fl = fl[~zero]
            if fl.size:
                active = np.concatenate([active, fl])
                dirty = True
            # transfers with no flows at all (no bytes, no route): complete after latency
            nof = trs[cnt == 0]
            if nof.size:
                push(done_heap, now + post_us[nof], nof)
        # transfers completing now
        comp: list[np.ndarray] = []
        while done_heap and done_heap[0][0] <= now + eps:
            comp.append(heapq.heappop(done_heap)[2])
        if comp:
            trs = np.concatenate(comp)
            t_end[trs] = now
            sl = np.concatenate([slot_of_src[trs], slot_of_dst[trs]])
            np.subtract.at(outstanding, sl, 1)
            sl = np.unique(sl)
            ready_slots = sl[outstanding[sl] == 0]
            if ready_slots.size:
                rks = slot_rank[ready_slots]
                tms = now + local_us[ready_slots]
                cur_slot[rks] += 1
                enter(rks, tms)
                if progress is not None and total_est is None:
                    total_est = 1
        if progress is not None and events % 256 == 0:
            progress(float(np.mean(cur_slot - rank_ptr[:-1]) / max(1.0, np.mean(np.diff(rank_ptr)))))
    notes = []
    if np.isnan(t_end).any():
        notes.append(f"{int(np.isnan(t_end).sum())} transfers never ran (unmatched send/receive?)")
    base = float(protocol.base_us) + params.call_overhead_per_peer_us * (R - 1)
    return FlowOutcome(float(max(rank_finish.max(initial=0.0), now)) + base, rank_finish + base, link_bytes,
                       t_start + base, t_end + base, events, solves, notes)
