"""Named non-physics parameters of the simulator, each with its source.

Physics (link bandwidth per direction, link latency, who is wired to whom) lives in the
topology.  What is *not* physics lives here: how much of a link's bandwidth software
actually gets, what each message costs on top of the wire, which protocols exist, how
fast a rank copies and reduces memory, and how traffic is routed across equal-cost paths.

Every default below cites where it comes from.  A topology overrides any of them with a
``meta["sim"]`` dict using the same field names, e.g.::

    meta:
      sim:
        link_efficiency: {shm: 1.0}
        msg_overhead_us: {shm: 18.5}
        reduce_GBps: 3.2

`params_for(topo)` merges defaults, the topology's ``meta["sim"]`` and explicit overrides.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError

# --- link classes -------------------------------------------------------------------------
# The per-message overhead depends on the kind of path a message takes (NCCL's "hw" axis:
# NVLink, PCI, network) plus, for ringflow's own CPU runtime, "shm" and "tcp" (loopback TCP).
LINK_CLASSES = ("nvlink", "pci", "net", "shm", "tcp")

# Achievable fraction of a link's per-direction line rate, by LinkType value.
# - nvlink 0.822: NCCL's effective NVLink4 bandwidth is ~370 GB/s of the 450 GB/s line rate
#   ("with the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s"),
#   S. Jeaugey (NVIDIA), https://github.com/NVIDIA/nccl-tests/issues/212 ; 370/450 = 0.822.
# - ib / ethernet 0.94: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA),
#   https://github.com/NVIDIA/nccl-tests/issues/290 ; 47/50 = 0.94 (RoCE assumed alike).
# - pcie 0.837: H100 device-to-host over PCIe Gen5 x16 measured with NVIDIA's nvbandwidth at
#   52.77 GB/s (https://github.com/NVIDIA/nvbandwidth/issues/24) of 63.015 GB/s payload rate
#   (ringflow.hardware.pcie_GBps(5, 16)): 52.77 / 63.015 = 0.837.  (Older figures are lower:
#   seed 002's Gen3 GPU-to-GPU copy, 10.59 of 15.754 GB/s = 0.672; A100 Gen4 ~25 of 31.5 = 0.79,
#   https://github.com/ZaidQureshi/bam/issues/54.)
# - qpi 1.0: the socket link is never the bottleneck of the seed's cross-socket figure
#   (9.15 GB/s < the PCIe legs); the PCIe efficiency applies on those paths.
# - shm / loopback 1.0: host-cpu topologies carry *measured* effective rates (calibrate).
DEFAULT_LINK_EFFICIENCY: dict[str, float] = {
    "nvlink": 0.822, "ib": 0.94, "ethernet": 0.94, "pcie": 0.837, "qpi": 1.0,
    "shm": 1.0, "loopback": 1.0,
}


@dataclass(frozen=True)
class Protocol:
    """A wire protocol: the share of bandwidth it delivers and its fixed costs (microseconds)."""

    name: str
    bw_fraction: float
    base_us: float                      # once per collective call
    msg_overhead_us: dict[str, float]   # per message (one schedule transfer), by link class


# NCCL's ring protocols, from NVIDIA/nccl src/graph/tuning.cc (commit 01afd20a, NCCL 2.8):
#   baseLat Ring {LL 3.6, LL128 10.0, Simple 8.4} us; hwLat Ring NVLink {.47, 1.9, 3.4},
#   PCI {1.0, 2.5, 5.7}, NET {2.7, 4.0, 9.6} us per step; bus bandwidth x 1/4 for LL
#   (ring all-reduce) and x 0.92 for LL128 ("120.0/128.0").  Simple gets the full
#   achievable bandwidth (the link efficiencies above were measured with Simple).
#   "shm" / "tcp" (ringflow's CPU runtime) have no NCCL figure: 0 until `ringflow calibrate` measures them.
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("simple", 1.0, 8.4, {"nvlink": 3.4, "pci": 5.7, "net": 9.6, "shm": 0.0, "tcp": 0.0}),
    Protocol("ll128", 0.92, 10.0, {"nvlink": 1.9, "pci": 2.5, "net": 4.0, "shm": 0.0, "tcp": 0.0}),
    Protocol("ll", 0.25, 3.6, {"nvlink": 0.47, "pci": 1.0, "net": 2.7, "shm": 0.0, "tcp": 0.0}),
)

ROUTING_MODES = ("fixed", "ecmp", "spray")


# A copy's calibrated extra beside a transfer counts where it is at least this fraction of the exchange
# at the message size: a smaller difference of three timings is this VM's run-to-run noise (2 TCP
# ranks at 8-16 MiB: +1 % of the exchange, which put gathers +15..+20 %; replays of rec15 and rec16:
# 440 rows within 15 % counting every extra, 446 with a floor of 0.15). At 0.15 it also dropped 2 TCP
# ranks' 43 us at 1 MiB (0.147 of the exchange), whose binomial gathers of 2 MiB (a 1 MiB message and a
# 1 MiB copy of the root's block in one step) were then -13..-20 % in 11 recordings of 11; replays of 22
# recordings: 5,413 rows within 15 % at 0.15, 5,424 at 0.10, 5,425 with no floor (rec16 loses 8 there).
BESIDE_MIN_FRACTION = 0.10

# Where a host's ranks outnumber its cores the copy's extra beside a transfer counts from this message size
# (`SimParams.beside_shares_cores`). Below it a 4-rank step on 2 cores is wake-ups, not bytes (4 TCP ranks'
# exchange: 120-260 us from 4 KiB to 128 KiB), the extra is a difference of noisy times, and the fitted
# model already prices those copies 0.4-1.7x over the calibration's (`ringflow calibrate`'s residuals).
# Replays of rec55-rec60, rows within 15 %: 1,630 without the extra on shared cores; 1,632 from any size,
# 1,655 from 64 KiB, 1,657 from 128 KiB, 1,649 from 256 KiB
BESIDE_SHARED_MIN_BYTES = 2**17

# Relay steps pay the calibrated shift step's slowdown over the exchange from this message size
# (`SimParams.relay_step_slowdown`): replays of the three recordings with shift steps (sixteenth session),
# rows within 15 %: 444 without it, 444 from 256 KiB, 448 from 1 MiB, 445 from 2 MiB
RELAY_MIN_BYTES = 2**20

# The chained step factor's floor: a quarter of the first step (the three-step timing is a difference of
# two noisy times at small sizes)
CHAINED_MIN_FACTOR = 0.25

# The slot-path reduction factor's floor (`SimParams.slot_reduce_factor`): half a plain transfer
SLOT_REDUCE_MIN = 0.5


@dataclass(frozen=True)
class SimParams:
    """All tunable, non-physics simulator parameters (see module docstring for sources)."""

    link_efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LINK_EFFICIENCY))
    protocols: tuple[Protocol, ...] = NCCL_PROTOCOLS
    # Local memory work of a rank (GB/s of bytes touched).  None = free: on GPUs NCCL fuses the
    # reduction into the copy kernel, so it costs no extra time beyond the transfer.  ringflow's
    # CPU runtime reduces with numpy after receiving: `ringflow calibrate` measures both.
    copy_GBps: float | None = None
    # Extra work per byte a rank sends that it wrote earlier in the same call (forwarded or reduced
    # data) and its receiver copies: ringflow's runtime sends such sources through the shm slots below
    # 1 MiB (a kernel single copy from a source dirty in the sender's cache crosses cores slowly),
    # untouched sources by single copy from 256 KiB. Measured by `ringflow calibrate` (exchange_fresh,
    # whose source a copy wrote); None: free.  `fresh_send_scope` says which bytes pay it: "all" fresh
    # bytes (256 KiB .. 1 MiB messages on hosts with a core per rank: the slot path), or only those a
    # local copy of the rank wrote ("copied": every other size from 256 KiB, and hosts with fewer cores
    # than ranks; `TransferTable.lfresh_copied`).
    fresh_send_GBps: float | None = None
    fresh_send_scope: str = "all"
    # Where ranks share cores, the sender's copy into the shm slots of the other fresh bytes it sends (received
    # or reduced earlier in the call, forwarded) below the single-copy size of fresh sources: the runtime
    # sends those through the slots (runtime.transport.shm.CMA_MIN_BYTES), so the sender copies each
    # message once, from its cache, at the calibrated copy rate of a message that size. 4 shm ranks on 2
    # cores, pipelined tree broadcasts of 512 KiB segments (4-8 MiB) were -0.09..-0.13 on average without
    # it (`_from_curves`); None: free (the sender does no copy: single copies, or a core of its own, where
    # `fresh_send_scope` "all" prices every fresh byte from the calibration's fresh exchange).
    fresh_slot_GBps: float | None = None
    # Extra work per byte a rank copies locally in a step where it also receives: the step's buffers
    # together can overflow the core's cache where each alone fits (2 shm ranks at 512 KiB-1 MiB: the
    # exchange and the copy in one step take 40-60 us more than apart). Measured by `ringflow calibrate`
    # (exchange_copy), from BESIDE_MIN_FRACTION of the exchange; None: free.
    copy_beside_transfer_GBps: float | None = None
    # True where the host's ranks outnumber its cores: the calibration copied beside the exchange on every
    # rank at once, and that extra is their time-sharing as much as the cache, so a step pays it in
    # proportion to its ranks copying beside a receive (a gather's root alone: a quarter of it on 4 ranks;
    # 4 ranks on 2 cores paying it in full priced gathers and scatters +20-50 %; in proportion, pairwise
    # all-to-alls and Bruck all-gathers at 512 KiB-2 MiB, -0.15..-0.21 in 6 recordings of 6, came to
    # -0.15..-0.05). False: every rank has a core and pays it in full.
    beside_shares_cores: bool = False
    # The share of that extra a rank pays where it receives but does not send in the step (a gather's
    # root): over TCP with a core per rank the receiver's own work partly hides behind its socket receive,
    # as much as its reduction does beside a one-way (`SimParams._from_curves`); 1.0: all of it.
    beside_receive_share: float = 1.0
    # A copy's extra cost per byte where its rank sends in the step and receives nothing (a scatter's root):
    # over TCP its core copies each message into its socket beside the copy; measured by the calibration's
    # one-way with the sender copying (`oneway_copy`) on hosts with a core per rank; None: no extra (over
    # shm the receiver reads the root's buffer by single copy).
    copy_beside_send_GBps: float | None = None
    reduce_GBps: float | None = None
    # A reduction into its own operand (dst is also the local input: in-place all-reduce, reduce)
    # reads and writes one buffer instead of reading one and writing another; None: reduce_GBps.
    reduce_inplace_GBps: float | None = None
    # Routing across equal-cost paths: "spray" splits a message evenly over all of them (NVLink
    # striping over NVSwitch planes; IB adaptive routing), "ecmp" hashes (src, dst, channel) to
    # one path, "fixed" always takes topo.path().  Intra-host and inter-host separately.
    routing_intra: str = "spray"
    routing_inter: str = "ecmp"
    # Between two PROC ranks of one host (ringflow's CPU runtime): "auto" = the topology's route,
    # "shm" = through shared memory, "tcp" = over loopback TCP (RINGFLOW_SHM_DISABLE=1).
    host_transport: str = "auto"
    # ringflow's CPU runtime moves every byte with the CPU of the ranks at both ends (the sender
    # copies into a shm slot / socket, the receiver copies or reduces out of it), one progress
    # thread per rank.  `endpoint_GBps[transport]` is that per-rank copy engine: everything a
    # rank sends *and* receives shares it.  `host_cores` caps a host's CPUs (a pool of
    # host_cores x endpoint rate that every byte crosses once at each end): 4 ranks on 2 cores
    # share 2 cores.  None = no such limit (GPUs: DMA engines and NVLink do the moving).
    # Measured by `ringflow calibrate`; no default figure.
    endpoint_GBps: dict[str, float] | None = None
    # Fixed cost per collective call and per peer on top of the protocol's base_us: ringflow's
    # runtime exchanges the call's description with every peer before data moves (argument check).
    call_overhead_per_peer_us: float = 0.0
    # Overrides applied when `host_transport` is the key (calibration measures shm and TCP apart).
    per_transport: dict[str, dict] | None = None
    # CPU hosts: when a call's working set (2 x count bytes x ranks on the host) exceeds the last-level
    # cache, every CPU-moved rate (endpoint, shm / loopback links, reduction) is `dram_factor` slower.
    # Both measured by `ringflow calibrate` (cache size from sysfs, factor from the 16 MiB points).
    cache_bytes: int | None = None
    dram_factor: float = 1.0

    def for_call(self, count_bytes: float, ranks_per_host: int, msg_bytes: float | None = None,
                 footprint_bytes: float | None = None, peers_per_step: int = 1,
                 step_pattern: str = "all", footprint_by_reference_bytes: float | None = None) -> "SimParams":
        """These parameters for one call: the measured host curves at its largest message
        (`msg_bytes`; local copies where the calibration's copy touched `footprint_bytes`, the call's
        working set, or `footprint_by_reference_bytes` where its messages go by single copy; when a rank
        has several peers in one step, `peers_per_step`, the host's rate from the calibration step of that
        `step_pattern`: fan-in, fan-out or all-to-all), else the DRAM variant above the cache size."""
        curves = self.host_curves_for(ranks_per_host)
        if curves is not None:
            m = float(msg_bytes if msg_bytes is not None else count_bytes)
            by_ref = None if footprint_by_reference_bytes is None else max(m, float(footprint_by_reference_bytes) / 2)
            return self._from_curves(curves, m, max(m, float(footprint_bytes or 0.0) / 2), peers_per_step,
                                     step_pattern, by_ref)
        if not self.cache_bytes or self.dram_factor <= 1.0 or 2 * count_bytes * ranks_per_host <= self.cache_bytes:
            return self
        f = float(self.dram_factor)
        eff = dict(self.link_efficiency)
        for k in ("shm", "loopback"):
            eff[k] = eff.get(k, 1.0) / f
        return dataclasses.replace(
            self, link_efficiency=eff, cache_bytes=None,
            endpoint_GBps={k: v / f for k, v in self.endpoint_GBps.items()} if self.endpoint_GBps else None,
            reduce_GBps=self.reduce_GBps / f if self.reduce_GBps else None,
            reduce_inplace_GBps=self.reduce_inplace_GBps / f if self.reduce_inplace_GBps else None,
            copy_GBps=self.copy_GBps / f if self.copy_GBps else None)
    host_cores: int | None = None
    # Measured cost curves of ringflow's CPU runtime (`ringflow calibrate`), per host transport and
    # per number of ranks on the host: {transport: {str(ranks): {"sizes": [bytes...], "alpha_us",
    # "base_us", "oneway_us": [...], "exchange_us": [...], "exchange_reduce_us": [...], "copy_us":
    # [...], "t1_us"}}}.  When present they replace the scalar rates above for every call:
    # `for_call` reads, at the call's largest message, the rates the calibration schedules ran at
    # (one-way -> link efficiency, exchange -> per-rank engine, reduce and copy rates).  A CPU's
    # rates depend on the message size (caches, the single-copy threshold, DRAM) and on how many
    # ranks share its cores, so one line per transport cannot hold them (docs/simulator.md).
    host_curves: dict[str, dict[str, dict[str, Any]]] | None = None
    # ringflow's runtime checks a call's arguments across ranks with a CHECK exchange before any data
    # moves, unless the schedule's first step already exchanges with every peer (self-checking):
    # microseconds that exchange costs (measured by `ringflow calibrate`; 0 elsewhere).
    check_us: float = 0.0
    # A checked rooted call whose ranks end its last step more than `asleep_lag_us` apart (the root still
    # copying or reducing what it received) costs `asleep_check_us` more: its peer's next messages cannot go
    # ahead while the root works on, so the next call's check waits on the root (2 TCP ranks, checked -
    # unchecked at 512 KiB-2 MiB: gathers 37-43 us, reduces 43-67, broadcasts 29-31). `asleep_check_us`: the
    # calibrated check on TCP with a core per rank, 0 elsewhere (on shm the rule priced 2-rank gathers and
    # reduces worse); `asleep_lag_us`: fitted, 30 us of the root's modelled local work, which leaves out the
    # tail of its receive. Its history (the wake-up it first priced, the spin that removed the sleep, the
    # replays that kept it): docs/simulator.md, twelfth and thirty-third sessions.
    asleep_check_us: float = 0.0
    asleep_lag_us: float = 30.0
    # The check's visible cost before a rooted collective (broadcast, reduce, gather, scatter), measured
    # before a fan-out step; None: check_us.
    check_rooted_us: float | None = None
    # The check's visible cost before a call whose first step has every rank sending and receiving
    # (`TransferTable.first_step_busy`: exchanges, ring shifts, all-to-all steps), measured before the
    # exchange step at 64 KiB; None: check_us. The check's last messages overlap that step's: 4 TCP ranks on
    # 2 cores, 325-360 us before it and before the bench's all-gathers, reduce-scatters and all-to-alls of
    # 64 KiB, 526-540 before the 4-byte step `check_us` is timed on (4 shm ranks: 72-74 against 84)
    check_busy_us: float | None = None
    # True when the sender spends no CPU on a message: ringflow's single-copy transfers (the receiver
    # reads the sender's buffer, runtime.transport.cma) from `single_copy_min_bytes` up.  The per-rank
    # engine then carries only what a rank receives.
    sender_free: bool = False
    # Total rate of a host's CPU-moved bytes (all its ranks' engines together); None: host_cores x
    # the per-rank rate.  Calibrated hosts measure it with every rank busy (oversubscription included).
    host_pool_GBps: float | None = None
    # Where a host's ranks outnumber its cores and receivers do the copying (`sender_free`): its cores.
    # A rank's copies in a step then run on one core, not spread over all: where more ranks than
    # cores copy in one step, the host pool takes the longest-processing-time packing of their work on
    # these cores (`analytic.lpt_busy`), not their sum over all of them (None: the sum).
    pool_cores: int | None = None
    # Where a calibrated host's ranks outnumber its cores and receivers do the copying: its cores. The
    # calibration's local copy ran on every rank at once (each with cores / ranks of a core); a rank
    # runs its step's copies once its messages are through, and with single copies its peers are done
    # with them by then, so a step where fewer ranks copy gives each up to a core (a scatter's root
    # copying its own block: 4 shm ranks on 2 cores, direct scatters at 2-8 MiB went +0.11..+0.16 ->
    # +0.02..+0.07 in 13 recordings). Over TCP a send is done once the socket has the bytes, while the
    # peers still read them, and the copy shares the cores (the same rule there lost 8 rows in 7).
    # None: every copy at the calibrated rate.
    shared_cores: int | None = None
    # How much slower a reduction runs when every rank of the host reduces at once than when one rank
    # does (they share the memory bus); steps in between scale linearly with the ranks reducing.
    reduce_busy_slowdown: float = 1.0
    # Same-host transfers between CPU ranks each get a private link at the one-way rate instead of
    # sharing the topology's shared-memory / loopback hops: set from calibrated curves, where the
    # cores a host's ranks share are modelled by the engine and pool links (a rank sending to three
    # peers at once is not three times slower when the receivers do the copying).
    pair_links: bool = False
    # A pair link's transfer that is the only one on its host's pair links (in its step, or in flight
    # in the flow engine) moves this much faster: the calibrated lone one-way rate (oneway_solo) over
    # the every-pair one-way rate the pair links carry; on a host with fewer cores than ranks a lone
    # transfer has the cores and the memory bus to itself (a binomial tree's first step).
    lone_pair_speedup: float = 1.0
    # ... and its host pool this much: the pool is calibrated with every rank busy (the exchange), and
    # a lone transfer's bytes cross it at the lone one-way rate (2 TCP ranks: a one-way message is
    # 2.5x faster than an exchange, not 2x)
    lone_pool_speedup: float = 1.0
    # How much longer a relay step's transfers take than a pair exchange's of the same messages: ranks that
    # receive from one peer and send to another (`TransferTable.in_relay_step`: ring steps, pipelined
    # chains) cannot finish in pairs, so where they share cores each waits on a peer that is not running
    # (4 TCP ranks on 2 cores: 1.2-1.5x from 512 KiB). The calibrated shift step over the exchange
    # (`_from_curves`, from RELAY_MIN_BYTES messages); 1: no effect.
    relay_step_slowdown: float = 1.0
    # The same slowdown below RELAY_MIN_BYTES, on shift steps alone (`TransferTable.in_shift_step`: every
    # rank sends one message and receives one, not in pairs; a pairwise all-to-all's shifts by 1 and n - 1,
    # a Bruck step, a ring step), over TCP with ranks sharing cores (4 TCP ranks on 2 cores, 64-256 KiB
    # messages: one shift 250-380 us against an exchange's 160-240; pairwise all-to-alls of 128 KiB-2 MiB
    # -0.07..-0.13 on average over rec96-rec106 priced as exchanges). Pipelined chains, where only some
    # ranks relay, keep the exchange's price below RELAY_MIN_BYTES (4 TCP ranks' tree broadcasts of 2-8 MiB
    # went +0.14..+0.23 with it); 1: no effect.
    shift_step_slowdown: float = 1.0
    # Over TCP with ranks sharing cores a relay step that opens the call (its step 0, right after the
    # argument check, whose tail it overlaps: `check_busy_us` was timed before an exchange) is priced as the
    # exchange, without either slowdown: 4 TCP ranks' Bruck all-gathers, whose only shift opens the call,
    # were within ±0.05 on average at every size over rec96-rec106 as exchanges and +0.10..+0.11 at
    # 64-512 KiB with the shift's price, while the pairwise all-to-all's later shift, and the Bruck
    # all-to-all's after its rotation, pay it (`Fabric.transfer_work`)
    relay_skips_opening_step: bool = False
    # What a transfer step right after another transfer step (no local work between them, so the ranks
    # are still running) costs over the first: ranks that share cores pay a wake-up in the first step that
    # the next do not (4 shm ranks on 2 cores, 16-64 KiB: one exchange 94-96 us, three in a row 183-203;
    # 256 KiB-1 MiB: the next steps 0.5-0.8 of the first). With single copies only where no rank both
    # sends and receives in the step (`Fabric.transfer_work`). From the calibration's three-exchange
    # step (`_from_curves`); 1: no effect.
    chained_step_factor: float = 1.0
    # What a transfer into an in-place reduction costs, at most, over a plain one where the two take different
    # paths: over shm the runtime's reductions stay on the slot path up to 1 MiB, where plain messages go by
    # single copy from 256 KiB (runtime.transport.shm), and with ranks sharing cores the slot path is the
    # faster (4 shm ranks on 2 cores, 256 KiB: the in-place one-way reduction 0.77-0.88 of the plain
    # one-way, where 2 ranks and 128 KiB measure 1.0). The calibrated in-place one-way reduction, less the
    # reduction priced on top, over the plain one-way (`_from_curves`); 1: no effect.
    slot_reduce_factor: float = 1.0
    # Where ranks share cores over TCP a step's fixed costs (waking ranks the scheduler put to sleep: 4 TCP
    # ranks on 2 cores, one exchange of 4-16 KiB 130-150 us, of 64-128 KiB 210-230) do not shrink with its
    # messages, so a step whose messages are smaller than the call's largest (halving-doubling's later
    # steps, Bruck's first) pays per byte what the calibration's exchange of its own messages did, over what
    # the largest message's did (with reduction where the step reduces; never less: `Fabric.step_size_factor`).
    # (sizes, exchange us per byte, exchange-with-reduction us per byte, the call's largest message);
    # None: every step at the largest message's rates (over shm that priced 4-rank steps dearer than they
    # are: slot copies of small messages chain; replays of rec55-rec63: -34 rows).
    small_step_costs: tuple | None = None
    # NVLS switch operations (`sim.nvls`) move their bytes at this fraction of the NVLink rate the other
    # algorithms get; None: NCCL's own figure for the NVSwitch generation (`nvls.NVLS_EFFICIENCY`).
    nvls_efficiency: float | None = None
    # Flow engine: above this many transfers, consecutive steps with the same (sender, receiver,
    # channel) pattern are merged into one (bytes added, per-message costs multiplied): exact
    # without contention, an approximation of the timeline with it (docs/simulator.md).
    max_transfers: int = 400_000

    def host_curves_for(self, ranks_per_host: int) -> dict[str, Any] | None:
        """The calibrated curves of this host transport for the nearest measured rank count."""
        if not self.host_curves:
            return None
        by_n = self.host_curves.get("tcp" if self.host_transport == "tcp" else "shm")
        if not by_n:
            return None
        n = min(by_n, key=lambda k: (abs(int(k) - ranks_per_host), -int(k)))
        return by_n[n]

    def _from_curves(self, c: Mapping[str, Any], msg_bytes: float, copy_bytes: float,
                     peers_per_step: int = 1, step_pattern: str = "all",
                     copy_bytes_by_reference: float | None = None) -> "SimParams":
        sizes = np.asarray(c["sizes"], dtype=np.float64)
        # the curves were measured with plain copies (single copy from this size): the runtime's
        # reductions keep slot copies up to 1 MiB, but that cost is in the reduction curves
        single = c.get("single_copy_min_bytes")
        sender_free = single is not None and msg_bytes >= float(single)
        if sender_free and copy_bytes_by_reference is not None:
            copy_bytes = copy_bytes_by_reference
        m = float(np.clip(msg_bytes, sizes[0], sizes[-1]))

        def at(key: str, x: float = m) -> float:   # log-log interpolation of a measured time curve
            return float(np.exp(np.interp(np.log(x), np.log(sizes), np.log(np.maximum(c[key], 1e-9)))))
        t1 = float(c["t1_us"])
        tiny = 1e-6   # us per byte: the floor of a cost that noise made vanish
        def window(x: float) -> np.ndarray:   # the measured sizes within x/2 .. 2x, and x
            return np.union1d(sizes[(sizes >= x / 2) & (sizes <= 2 * x)], [x])
        near = window(m)
        # the call's working set as the calibration size that touched as much (its copy and exchange of x
        # touch 2x per rank)
        mc = float(np.clip(copy_bytes, sizes[0], sizes[-1]))

        n = int(c.get("nranks", 2))
        own_core = self.host_cores is None or n <= int(self.host_cores)

        # past every message-size regime of the curves (over shm: slot copies, then single copy, then single
        # copy of a just-written source, up to 1 MiB; TCP where ranks share cores has none) a transfer's bytes
        # cost at least what they cost at the call's working set: they are copied from the cache level it
        # fits in (4 TCP ranks, three exchanges of 4 MiB messages: 7.9 ms from one 4 MiB buffer, 10.2 ms
        # rotating through a 16 MiB one; 4 shm ranks: 2.6 and 3.1 ms). 4-rank pairwise all-to-alls at 16 MiB
        # were -0.22 over TCP in 14 of 17 recordings. Below the regimes the curve would be read on another
        # path (2-rank shm scatters at 1 MiB, 512 KiB messages: 10 -> 3 of 15 within 15 %). With a core per
        # TCP rank the exchange's 8 -> 16 MiB cliff (2.5-2.7x) is the socket's flow control, a message-size
        # regime (2 ranks rotating through 16 MiB measured 1.08x): read there it priced 16 MiB
        # halving-doubling reduce-scatters and all-to-alls +0.15..+0.25 (replays of rec55-rec65: +11 rows).
        # A message of the last regime's first size (1 MiB over shm, where fresh sources switch to single
        # copy) is measured on the new path by its own point: 2-rank shm all-gathers and all-to-alls of 2 MiB
        # (1 MiB messages) read at their 2 MiB working set were +0.10..+0.12 on average (replays of rec55-rec71:
        # 4,743 -> 4,747 from past it)
        fresh_min = float(c.get("single_copy_fresh_min_bytes") or 0)
        regimes_end = (np.inf if own_core else 0.0) if self.host_transport == "tcp" else (fresh_min or np.inf)

        def cost_per_byte(key: str, x: float = m) -> float:   # us per byte of a curve's step at x, its call aside
            return max(at(key, x) - t1, tiny * x) / x

        def per_byte_at(key: str) -> float:
            v = cost_per_byte(key)
            if mc > m > regimes_end:
                v = max(v, cost_per_byte(key, mc))
            return v
        oneway = per_byte_at("oneway_us")
        exch = per_byte_at("exchange_us")
        solo = per_byte_at("oneway_solo_us") if "oneway_solo_us" in c else oneway
        # a rank's engine carries its receive, and its send too unless the receiver does the copy;
        # alone on a core it runs at the solo rate, and all ranks together at most at the host's total
        per_byte = 1e-3 if sender_free else 2e-3
        # (and at least as fast as the exchange showed it: a one-way slower than half the exchange is
        # latency-bound, loopback TCP at 128-512 KiB in one job in three)
        engine_GBps = max(1e-3 / solo, per_byte / exch)
        busy = int(c.get("busy_ranks", 2))
        pool_GBps = per_byte / exch * busy
        pair = oneway
        step_key = {"in": "fanin_us", "out": "fanout_us"}.get(step_pattern)
        if step_key not in c:   # "all", or a calibration without fan steps
            step_key = "alltoall_us"
        if peers_per_step > 1 and step_key in c:
            # a rank with several peers in a step: the host moves the calibration step's messages of m
            # (its buffer is n m: n (n - 1) of them all-to-all, n - 1 to or from the root), per-message
            # costs included, in the time that step took
            msgs = n * (n - 1) if step_key == "alltoall_us" else n - 1
            t_step = max(at(step_key, n * m) - t1, tiny * m)
            pool_GBps = per_byte * msgs * m / t_step
            if step_key != "alltoall_us":
                # the root's engine moved all of them and each pair ran as fast as a lone one-way
                engine_GBps = max(engine_GBps, 1e-3 * msgs * m / t_step)
                pair = solo

        def extra(hi: str, lo: str, less: str | None = None, point: bool = False, mean: bool = False,
                  x0: float | None = None) -> float:
            # us per byte that curve `hi` adds to `lo` (and to `less`'s work, its call overhead aside) over
            # the measured sizes within m/2 .. 2m, not one difference of two nearly equal noisy times: the
            # least-squares slope through the origin, or with `less` or `mean` (an effect that comes and goes
            # within a factor of 2 of size) the mean per byte, which the largest size does not dominate;
            # `point`: the difference at m itself; `x0`: the window around that size instead of m
            if point:
                return max((at(hi) - at(lo) - (at(less) - float(c["base_us"]) if less else 0.0)) / m, tiny)
            xs = near if x0 is None else window(x0)
            d = np.array([at(hi, x) - at(lo, x) - (at(less, x) - float(c["base_us"]) if less else 0.0) for x in xs])
            slope = float(np.mean(d / xs)) if less or mean else float(np.dot(d, xs) / np.dot(xs, xs))
            return max(slope, tiny)

        def copy_extra(hi: str, lo: str) -> float:
            # what a copy beside the transfer of step `lo` added in step `hi`, per byte: the window's mean,
            # no more than the figure at m itself
            return min(extra(hi, lo, "copy_us"), extra(hi, lo, "copy_us", point=True))
        # one rank reducing alone (one-way with reduction) and every rank at once (the exchange's). With a
        # core per rank over shm the latter is read at the call's size: the slope through m/2 .. 2m took 2
        # ranks' 256 KiB jump (6 us at 128 KiB, 29 at 256 KiB) into 128 KiB messages
        at_size = self.host_transport != "tcp" and own_core   # reductions read at the message size itself
        # every rank reducing is read from the exchange with reduction of one block into another of its
        # buffer, as a collective's reducing step does (calibrations before the twenty-second session: of
        # the block sent), as the mean per byte: the largest size's step touches 3x its message (at 16 MiB
        # 1.16-1.36x the reduction of the block sent, shm), a regime past the call's
        xr_key = "exchange_reduce_split_us" if "exchange_reduce_split_us" in c else "exchange_reduce_us"
        red_busy = extra(xr_key, "exchange_us", point=at_size, mean=True)
        red = min(extra("oneway_reduce_us", "oneway_us"), red_busy) if "oneway_reduce_us" in c else red_busy
        # an in-place reduction over shm changes rate where its operand leaves a cache level (2 ranks: 15
        # us/MiB at 512 KiB, 40 at 1 MiB, 45 at 8 MiB, 60 at 16 MiB), so with a core per rank it is read
        # at the call's size, not from a slope the next size's regime dominates (2-rank reduces at 1 MiB
        # -13..-21 % and at 8 MiB +14..+18 % with the slope). Where ranks share cores the one-way pair's
        # point is noise (4 ranks on 2 cores: in-place minus plain one-way -340..+940 us at 8-16 MiB,
        # which priced a 16 MiB tree reduce at 2.7 ms against 6.7 measured); over TCP with ranks sharing
        # cores the staged reduction overlaps the socket (4 ranks' tree reduces 4-8 MiB outside 15 % with
        # the point), while with a core per rank the point holds there too (2 TCP ranks: in-place minus
        # plain one-way 12-18 us at 512 KiB, 44-55 at 1 MiB, where the slope through 512 KiB-2 MiB read 27-38
        # and priced 1 MiB binomial reduces -0.15..-0.27 in 4 recordings of 4; -0.08..-0.09 with the point)
        red_ip = extra("oneway_reduce_inplace_us", "oneway_us", point=own_core) \
            if "oneway_reduce_inplace_us" in c else red
        # a one-way transfer into an in-place reduction takes the reductions' slot path while plain messages of
        # its size go by single copy (`slot_reduce` below prices the two together)
        slot_path = sender_free and bool(fresh_min) and m < fresh_min
        if not own_core and not slot_path:
            # where ranks share cores that figure is a slope through differences of nearly equal times, so
            # an in-place reduction is priced at least at one rank's out-of-place reduction alone: with the
            # slope alone the in-place reduces and all-reduces of 4 ranks on 2 cores were -0.05..-0.09 on
            # average (shm and TCP) and 16 MiB shm tree reduces -0.23..-0.47 in 9 recordings of 9 (replays
            # of rec55-rec63: 2,473 -> 2,487 rows within 15 %; 4-rank shm reduces -0.084 -> -0.001 on average)
            red_ip = max(red_ip, red)
        if not own_core and sender_free and mc > m and self.host_transport != "tcp":
            # and like its transfers (the working-set floor above) a reduction of single-copy messages runs
            # from the cache level the call's working set fits in, read from the same curves there: a 16 MiB
            # tree reduce of 4 shm ranks on 2 cores streams 1 MiB segments through 16 MiB buffers, and read
            # at 1 MiB it was -0.21 on average (12 recordings of 17 outside 15 %; +0.06 and 5 read at the
            # working set; replays of rec55-rec71: 4,747 -> 4,752 rows). With a core per rank the reduction
            # is read at the message size (above): there the 16 MiB regime priced 2-rank reduce-scatters of
            # 16 MiB +0.11 against -0.07
            red_ws = extra(xr_key, "exchange_us", mean=True, x0=mc)
            if "oneway_reduce_us" in c:
                red_ws = min(extra("oneway_reduce_us", "oneway_us", x0=mc), red_ws)
            red_ip, red = max(red_ip, red_ws), max(red, red_ws)
        # a local copy runs from the cache level the call's working set fits in (the calibration's copy
        # of x bytes touches 2x)
        def copy_per_byte(x: float) -> float:   # us per byte of the calibration's local copy of x, its call aside
            return max(at("copy_us", x) - float(c["base_us"]), tiny * x) / x
        cpy = copy_per_byte(mc)
        # The fresh-send and copy-beside steps below have every rank copying beside its exchange: where
        # ranks outnumber cores that adds their time-sharing, which a collective's step with one copying
        # or forwarding rank does not pay (4 ranks on 2 cores: +100 us at 512 KiB, gathers and scatters
        # then predicted +20-50 %; the fresh step's 4-rank noise priced tree broadcasts +55-125 %): the
        # copy's extra is paid there in proportion to the ranks copying (`beside_shares_cores`), and
        # fresh sends not at all
        # sending what the rank just wrote costs more where it takes another path than an untouched
        # source (the slots, not a single copy: from the single-copy size up to the fresh one's) and at
        # the fresh single-copy size itself (the kernel copy reads lines dirty in the sender's cache).
        # Elsewhere from the single-copy size, and wherever ranks share cores, only bytes a local copy
        # wrote pay it, as the calibration's source did: received or reduced bytes forwarded cost what
        # untouched ones do (4 shm ranks on 2 cores, 4-16 MiB: a shift then an exchange of the received
        # bytes within 3 % of the two apart; halving-doubling all-reduces 8-16 MiB +24..+39 % and 2-rank
        # all-reduces at 16 MiB +16 % more when every fresh byte paid), while a Bruck all-gather's own
        # block, copied and then sent, took 16-26 % longer than priced without it.
        # Its price: the fresh exchange over its copy and the plain exchange
        fresh_path = own_core and single is not None and float(single) <= msg_bytes <= fresh_min
        fresh = (at("exchange_fresh_us") - (at("copy_us") - float(c["base_us"])) - at("exchange_us")) / m \
            if sender_free and "exchange_fresh_us" in c else 0.0
        # where ranks share cores the fresh exchange's figure is their time-sharing as much as the sources
        # (above), so the fresh bytes a local copy did not write pay only the sender's copy into the slots,
        # where the runtime sends them so: from the single-copy size to the fresh sources' (shm)
        fresh_slot = not own_core and single is not None and float(single) <= msg_bytes < fresh_min
        slot_copy = copy_per_byte(m) if fresh_slot else 0.0
        # a copy beside a transfer in one step: what the two together took beyond each apart
        beside = 0.0
        if "exchange_copy_us" in c and (own_core or m >= BESIDE_SHARED_MIN_BYTES):
            # ... and no more than the calibration's own figure at m, which the window's mean exceeds where it
            # carries a neighbour's bump (2 shm ranks: +53 us at 1 MiB, +5 at 2 MiB, where all-to-alls of 2 MiB
            # messages were priced +0.16..+0.19 in 5 recordings of 10; replays of rec55-rec64: 2,764 -> 2,773)
            beside = copy_extra("exchange_copy_us", "exchange_us")
            if not own_core and mc > m and self.host_transport != "tcp":
                # where ranks share cores, and like the copy itself and the reductions above, from the cache
                # level the call's working set fits in: 4 shm ranks on 2 cores copying a 4 MiB block beside the
                # transfers of a 16 MiB all-to-all (16 MiB buffers) paid 560-940 us over the copy where the
                # 4 MiB calibration step gave 265, and the calibration's own extra per byte grows 1.6x from 4 to
                # 16 MiB. Pairwise all-to-alls at 16 MiB were -0.167 on average over rec101-rec117 (14 of 17
                # outside 15 %), -0.140 with it (4); at 512 KiB -0.131 -> -0.110 (8 -> 0); replays of all 63
                # recordings 16,745 -> 16,762 rows, of rec101-rec117 4,810 -> 4,828
                beside = max(beside, extra("exchange_copy_us", "exchange_us", "copy_us", x0=mc))
        if beside * m < BESIDE_MIN_FRACTION * at("exchange_us"):
            beside = 0.0
        # the calibration copied beside an exchange, sending too; over TCP with a core per rank a rank that
        # only receives hides work behind its socket receive, as a lone receiver's reduction shows against
        # every rank's (2 TCP ranks: binomial gathers of 2-16 MiB, a message and the root's copy of its
        # block in one step, +0.10..+0.16 on average over rec72-rec92 with the whole extra, +0.01..+0.09
        # with this share; on rec55-rec71's host, where the lone reduction was visible, unchanged)
        receive_share = red / red_busy if self.host_transport == "tcp" and own_core else 1.0   # red <= red_busy
        # over TCP a rank that sends without receiving (a scatter's root) copies each message into its
        # socket, and its own copy in that step pays for it what the calibration's one-way with the sender
        # copying took beyond the two apart (2 TCP ranks: a 1 MiB binomial scatter, a 512 KiB message and
        # the root's copy of its block, 95 us unchecked against 57 for the message alone and 13-18 for the
        # copy alone; -0.134 on average over rec100-rec124, in 15 of 25 outside 15 %). Over shm its
        # receiver reads its buffer by single copy, and calibrations without that step price no extra
        # (where ranks share cores the one-way pairs' time-sharing is in that figure, as in the exchange's)
        send_beside = 0.0
        if self.host_transport == "tcp" and own_core and "oneway_copy_us" in c:
            send_beside = copy_extra("oneway_copy_us", "oneway_us")

        def rooted_check() -> float | None:
            # a call made of the fan-out step (a direct scatter): the check before the calibration's fan-out
            # whose messages are the call's; it falls as the root's messages overlap its peers' check (4 TCP
            # ranks: 500 us at 64 KiB, 270-370 at 1-4 MiB). Other rooted calls: the figure at 64 KiB (4 TCP
            # ranks' binomial broadcasts and reduces 64 KiB-1 MiB: within 10 % with it, -11..-27 % with the
            # fan-out's per size; the calibration's fan-in measured 330-350 us at 64 KiB, the bench's direct
            # gathers 500, so a fan-in figure is not used)
            flat = float(c["check_rooted_us"]) if "check_rooted_us" in c else None
            if "check_rooted_fanout_us" not in c:
                return flat
            x, xs = n * msg_bytes, np.asarray(c["check_rooted_sizes"], dtype=np.float64)
            checks = np.asarray(c["check_rooted_fanout_us"], dtype=np.float64)
            if step_pattern != "out":
                # 2 shm ranks below the single-copy size: any rooted call is one slot message, the fan-out step
                # of twice its size, whose check was timed at 32 and 128 KiB messages (12 and 19 us on the
                # noisy host, 16 and 21 on the calm one; the bench's 64 KiB broadcast 13, its 128 KiB one 19):
                # the check steps up between them, so the figure timed before the largest such message no
                # larger than the call's counts (128 KiB binomial broadcasts and reduces were -0.19 on
                # average with the 32 KiB figure, in 13 and 9 of 17 recordings outside 15 %; rec72-rec88 4,002
                # -> 4,021 rows, rec55-rec71 4,752 -> 4,756; over TCP, or interpolated, fewer)
                one_slot_message = n == 2 and self.host_transport != "tcp" and single is not None \
                    and msg_bytes < float(single)
                if not (one_slot_message and xs[0] / n < float(single)):
                    return flat
                slot = xs / n < float(single)
                return float(checks[slot][max(0, int(np.searchsorted(xs[slot], x, side="right")) - 1)])
            if not xs[0] < x < xs[-1]:
                return float(checks[0] if x <= xs[0] else checks[-1])
            # between the measured sizes the fan-out step *with* its check is the smooth curve (4 shm ranks:
            # 174, 233 us at 256 KiB, 1 MiB); the check alone is a difference whose interpolation, added to
            # a fan-out point that lies low, priced 512 KiB direct scatters -17..-22 % in 10 recordings of 11
            step = "fanout_us" if "fanout_us" in c else "oneway_us"
            with_check = checks + np.array([at(step, s) for s in xs])
            return max(0.0, float(np.exp(np.interp(np.log(x), np.log(xs), np.log(with_check)))) - at(step, x))
        # a relay step's transfers over a pair exchange's: the calibrated shift step over the exchange,
        # both less the step's fixed cost, summed over the sizes within m/2 .. 2m (one size's ratio is
        # 0.8-1.9 from job to job on 4 TCP ranks); from RELAY_MIN_BYTES messages, below which the shift
        # step's slow modes (1.5-3x on 4 shm ranks at 4-64 KiB) are not what relay steps pay (4-rank
        # pairwise all-to-alls at 128-256 KiB were over-priced by +25..+60 % with them), except shift steps
        # over TCP with ranks sharing cores (`shift_step_slowdown`)
        shared_tcp = self.host_transport == "tcp" and not own_core
        shift_ratio = max(1.0, sum(at("shift_us", x) - t1 for x in near) / sum(
            max(at("exchange_us", x) - t1, tiny * x) for x in near)) \
            if "shift_us" in c and (m >= RELAY_MIN_BYTES or shared_tcp) else 1.0
        relay_slowdown = shift_ratio if m >= RELAY_MIN_BYTES else 1.0
        shift_slowdown = shift_ratio if m < RELAY_MIN_BYTES and shared_tcp else 1.0
        def chained_factor() -> float:
            # the next exchange step's data time over the first's, from three in a row, summed over the sizes
            # within m/2 .. 2m (at 16-64 KiB one size's figure is a difference of noisy times); over shm with
            # ranks sharing cores (over TCP the figure swings 0.2-1.8 between jobs and sizes)
            if "exchange3_us" not in c or own_core or self.host_transport == "tcp":
                return 1.0
            xs = near
            first = sum(max(at("exchange_us", x) - t1, tiny * x) for x in xs)
            nxt = sum((at("exchange3_us", x) - at("exchange_us", x)) / 2 - float(c["alpha_us"]) for x in xs)
            return float(np.clip(nxt / first, CHAINED_MIN_FACTOR, 1.0))
        def slot_reduce() -> float:
            # a transfer into an in-place reduction on the reductions' slot path while plain messages of its
            # size go by single copy: the in-place one-way reduction's time, less the reduction the model adds
            # (red_ip per byte), over the plain one-way's, at most 1
            if "oneway_reduce_inplace_us" not in c or not slot_path:
                return 1.0
            # (below fresh_min `oneway` is the curve at m: no working-set floor)
            slot = at("oneway_reduce_inplace_us") - t1 - red_ip * m
            return float(np.clip(slot / (oneway * m), SLOT_REDUCE_MIN, 1.0))
        def small_steps() -> tuple | None:
            # the exchange's cost per byte at every measured size, and the exchange with reduction's, for the
            # steps whose messages are smaller than m (TCP, ranks sharing cores)
            if self.host_transport != "tcp" or own_core:
                return None
            return (tuple(float(x) for x in sizes), tuple(cost_per_byte("exchange_us", x) for x in sizes),
                    tuple(cost_per_byte(xr_key, x) for x in sizes), float(m))
        tier = "loopback" if self.host_transport == "tcp" else "shm"
        eff = dict(self.link_efficiency)
        eff[tier] = float(min(1.0, 1e-3 / pair / float(c["link_GBps"])))
        tr = "tcp" if self.host_transport == "tcp" else "shm"
        alpha = float(c["alpha_us"])
        protos = tuple(dataclasses.replace(p, base_us=float(c["base_us"]),
                                           msg_overhead_us={**p.msg_overhead_us, "net": alpha, "shm": alpha,
                                                            "tcp": alpha})
                       for p in self.protocols)
        return dataclasses.replace(
            self, link_efficiency=eff, endpoint_GBps={tr: engine_GBps}, reduce_GBps=1e-3 / red,
            reduce_inplace_GBps=1e-3 / red_ip,
            # over TCP with ranks sharing cores n ranks reducing at once are at worst n reductions in a row;
            # over shm a lone rank's reduction hides behind its sender's slot copies, which every rank busy
            # cannot (2 ranks at 256 KiB: 5.5x, and with the 2x bound 512 KiB halving-doubling reduce-scatters
            # were -10..-26 %), and so it does over TCP with a core per rank on hosts where the sender bounds
            # a lone transfer (2 ranks: one-way with reduction within 5 % of the plain one-way at 512 KiB-4 MiB,
            # while the exchange with reduction took 40-50 us more than the exchange at 1 MiB; with the 2x bound
            # 2-rank halving-doubling reduce-scatters were -0.10..-0.21 in 10 recordings of 10, rec76-rec85)
            reduce_busy_slowdown=float(red_busy / red if tr == "shm" or own_core else min(red_busy / red, busy)),
            copy_GBps=1e-3 / cpy, fresh_send_GBps=1e-3 / fresh if fresh > tiny else None,
            fresh_send_scope="all" if fresh_path else "copied", protocols=protos,
            fresh_slot_GBps=1e-3 / slot_copy if slot_copy > 0 else None,
            copy_beside_transfer_GBps=1e-3 / beside if beside > tiny else None, beside_shares_cores=not own_core,
            beside_receive_share=float(receive_share),
            copy_beside_send_GBps=1e-3 / send_beside if send_beside > tiny else None,
            call_overhead_per_peer_us=0.0, host_cores=None,
            host_pool_GBps=pool_GBps,
            # the fan steps' pools were measured with three ranks copying on two cores: their packing is in them
            pool_cores=int(self.host_cores) if sender_free and not own_core and step_pattern == "all"
            else None,
            shared_cores=int(self.host_cores) if sender_free and not own_core else None,
            check_us=float(c.get("check_us", 0.0)), sender_free=sender_free, pair_links=True,
            asleep_check_us=float(c.get("check_us", 0.0)) if own_core and tr == "tcp" else 0.0,
            check_rooted_us=rooted_check(),
            check_busy_us=float(c["check_busy_us"]) if "check_busy_us" in c else None,
            cache_bytes=None, dram_factor=1.0, host_curves=None, per_transport=None,
            relay_step_slowdown=relay_slowdown, shift_step_slowdown=shift_slowdown,
            relay_skips_opening_step=shared_tcp,
            chained_step_factor=chained_factor(),
            slot_reduce_factor=slot_reduce(),
            lone_pair_speedup=float(max(1.0, pair / solo)),
            lone_pool_speedup=float(max(1.0, per_byte / solo / pool_GBps)),
            small_step_costs=small_steps())

    def __post_init__(self) -> None:
        for k, v in self.link_efficiency.items():
            if not 0 < float(v) <= 1.0:
                raise ConfigError(f"sim link_efficiency[{k!r}]={v} is outside (0, 1]",
                                  "give the achievable fraction of the line rate, e.g. 0.82")
        for mode in (self.routing_intra, self.routing_inter):
            if mode not in ROUTING_MODES:
                raise ConfigError(f"sim routing {mode!r} is unknown", f"use one of {ROUTING_MODES}")
        if self.host_transport not in ("auto", "shm", "tcp"):
            raise ConfigError(f"sim host_transport {self.host_transport!r} is unknown", "use auto, shm or tcp")
        if self.fresh_send_scope not in ("all", "copied"):
            raise ConfigError(f"sim fresh_send_scope {self.fresh_send_scope!r} is unknown", "use all or copied")
        if not self.protocols:
            raise ConfigError("sim protocols list is empty", "give at least one protocol")
        for k, v in (self.endpoint_GBps or {}).items():
            if not float(v) > 0:
                raise ConfigError(f"sim endpoint_GBps[{k!r}]={v} must be > 0", "give a measured GB/s")
        for name in ("lone_pair_speedup", "lone_pool_speedup"):
            if not float(getattr(self, name)) >= 1.0:
                raise ConfigError(f"sim {name}={getattr(self, name)} must be >= 1",
                                  "give the lone one-way rate over the rate with every rank busy (1: no effect)")
        if not 0.0 <= float(self.beside_receive_share) <= 1.0:
            raise ConfigError(f"sim beside_receive_share={self.beside_receive_share} must be within 0..1",
                              "give the share of the copy-beside extra a receive-only rank pays (1: all of it)")
        if self.host_cores is not None and int(self.host_cores) < 1:
            raise ConfigError(f"sim host_cores={self.host_cores} must be >= 1", "or null for no limit")
        for rate, name in ((self.copy_GBps, "copy_GBps"), (self.reduce_GBps, "reduce_GBps"),
                           (self.fresh_send_GBps, "fresh_send_GBps"), (self.fresh_slot_GBps, "fresh_slot_GBps"),
                           (self.copy_beside_transfer_GBps, "copy_beside_transfer_GBps"),
                           (self.copy_beside_send_GBps, "copy_beside_send_GBps"),
                           (self.reduce_inplace_GBps, "reduce_inplace_GBps")):
            if rate is not None and rate <= 0:
                raise ConfigError(f"sim {name}={rate} must be > 0", "or null for 'free'")

    def protocol(self, name: str) -> Protocol:
        """The protocol called `name`."""
        for p in self.protocols:
            if p.name == name:
                return p
        raise ConfigError(f"unknown protocol {name!r}", f"known: {[p.name for p in self.protocols]}")

    def to_dict(self) -> dict[str, Any]:
        """A YAML/JSON-ready dict (the form `meta['sim']` takes)."""
        d = dataclasses.asdict(self)
        d["protocols"] = [dataclasses.asdict(p) for p in self.protocols]
        return d


def _protocol_from(d: Mapping[str, Any]) -> Protocol:
    try:
        return Protocol(str(d["name"]), float(d["bw_fraction"]), float(d.get("base_us", 0.0)),
                        {str(k): float(v) for k, v in dict(d.get("msg_overhead_us", {})).items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad sim protocol entry {dict(d)!r}: {exc}",
                          "each protocol needs name, bw_fraction, base_us, msg_overhead_us") from None


def merge_params(base: SimParams, overrides: Mapping[str, Any] | None) -> SimParams:
    """`base` with fields replaced from a meta['sim']-style dict (dicts merged key by key).

    Shorthands: ``msg_overhead_us: {class: us}`` and ``base_us: us`` apply to every protocol.
    """
    if not overrides:
        return base
    known = {f.name for f in dataclasses.fields(SimParams)}
    shorthands = {"msg_overhead_us", "base_us"}
    info = {"calibration", "source", "notes"}   # informational entries written by `ringflow calibrate`
    kwargs: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in info or key in shorthands:
            continue
        if key not in known:
            raise ConfigError(f"unknown simulator parameter {key!r} in meta['sim']",
                              f"known parameters: {', '.join(sorted(known | shorthands))}")
        if key == "link_efficiency":
            kwargs[key] = {**base.link_efficiency, **{str(k): float(v) for k, v in dict(value).items()}}
        elif key == "protocols":
            kwargs[key] = tuple(_protocol_from(p) for p in value)
        else:
            kwargs[key] = value
    protos = kwargs.get("protocols", base.protocols)
    if "msg_overhead_us" in overrides:
        extra = {str(k): float(v) for k, v in dict(overrides["msg_overhead_us"]).items()}
        protos = tuple(dataclasses.replace(p, msg_overhead_us={**p.msg_overhead_us, **extra}) for p in protos)
    if "base_us" in overrides:
        protos = tuple(dataclasses.replace(p, base_us=float(overrides["base_us"])) for p in protos)
    kwargs["protocols"] = tuple(protos)
    return dataclasses.replace(base, **kwargs)


def params_for(topo: Any, overrides: Mapping[str, Any] | None = None) -> SimParams:
    """Defaults, then the topology's meta['sim'], then explicit `overrides`, then the
    `per_transport` entry of the chosen host transport (if any)."""
    meta = getattr(topo, "meta", None) or {}
    p = merge_params(merge_params(SimParams(), meta.get("sim")), overrides)
    extra = (p.per_transport or {}).get(p.host_transport)
    return merge_params(p, extra) if extra else p
