"""One rank of `ringflow calibrate`: times tiny hand-built schedules on the real runtime.

Run under the launcher (`python -m ringflow.sim._calib_worker OUT.json [quick]`); rank 0 writes
the times as JSON, taken the way `ringflow bench` takes them (`runtime.bench.median_call_s`).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import numpy as np


def _schedules(n: int):
    from ..algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
    lay = {Buffer.IN: BufferLayout(1), Buffer.OUT: BufferLayout(1)}
    IN0, OUT0 = ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0)

    every = [(a, a + 1) for a in range(0, n - 1, 2)]   # every rank busy, as in a collective's step

    def build(name: str, steps: int, reduce: bool = False, exchange: bool = False,
              pairs: list[tuple[int, int]] = every):  # noqa: ANN202
        """`steps` steps of a -> b on every pair (and b -> a with exchange), receiving or reducing."""
        b = ScheduleBuilder("all_reduce", n, name, layouts=lay)
        for s in range(steps):
            for lo, hi in pairs:
                b.transfer(s, lo, hi, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
                if exchange:
                    b.transfer(s, hi, lo, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
        return b.build()

    cp = ScheduleBuilder("all_reduce", n, "cal-copy", layouts=lay)
    for r in range(n):
        cp.copy(r, 0, OUT0, IN0)
    SC0 = ChunkRef(Buffer.SCRATCH, 0)

    def copy_and_exchange(name: str, fresh: bool):  # noqa: ANN202
        """Every rank copies IN to scratch in step 0; every pair exchanges the scratch in step 1 (`fresh`)
        or IN in step 0."""
        b = ScheduleBuilder("all_reduce", n, name, layouts={**lay, Buffer.SCRATCH: BufferLayout(1, like=Buffer.IN)})
        for lo, hi in every:
            b.copy(lo, 0, SC0, IN0)
            b.copy(hi, 0, SC0, IN0)
            b.transfer(int(fresh), lo, hi, SC0 if fresh else IN0, OUT0)
            b.transfer(int(fresh), hi, lo, SC0 if fresh else IN0, OUT0)
        return b.build()
    # the exchange of bytes each rank has just written (forwarding, a reduction's result); the exchange
    # and a copy of as many bytes in one step (an all-gather's own block, a gather's root): both buffers
    # together can overflow a core's cache, where apart they fit
    fr = copy_and_exchange("cal-exchange-fresh", fresh=True)
    xc = copy_and_exchange("cal-exchange-copy", fresh=False)
    blocks = {Buffer.IN: BufferLayout(n), Buffer.OUT: BufferLayout(n)}

    def blocks_step(name: str, pairs: list[tuple[int, int]]):  # noqa: ANN202
        """One step: each src sends block dst of its buffer into block src of dst's (1/n each)."""
        b = ScheduleBuilder("all_to_all", n, name, layouts=blocks)
        for src, dst in pairs:
            b.transfer(0, src, dst, ChunkRef(Buffer.IN, dst), ChunkRef(Buffer.OUT, src))
        return b.build()
    # every rank to every peer (sharded_ps's step: what a rank's messages cost with several peers at
    # once), and one rank receiving from every peer (fan-in, a direct gather) or sending to each
    # (fan-out, a direct scatter): the root's n - 1 messages measured as a whole
    halves = {Buffer.IN: BufferLayout(2), Buffer.OUT: BufferLayout(2)}
    # the one-way of one block of a two-block buffer and the sender's copy of the other block in one step,
    # as a scatter's root sends its peer's block and copies its own (over TCP its core also copies each
    # message into the socket; a copy of the block just sent would read it from the cache)
    oc = ScheduleBuilder("all_reduce", n, "cal-oneway-copy", layouts=halves)
    for lo, hi in every:
        oc.copy(lo, 0, ChunkRef(Buffer.OUT, 0), ChunkRef(Buffer.IN, 0))
        oc.transfer(0, lo, hi, ChunkRef(Buffer.IN, 1), ChunkRef(Buffer.OUT, 1))
    split = ScheduleBuilder("all_reduce", n, "cal-exchange-reduce-split", layouts=halves)
    for lo, hi in every:
        for a, z in ((lo, hi), (hi, lo)):
            split.transfer(0, a, z, ChunkRef(Buffer.IN, 1), ChunkRef(Buffer.OUT, 0), reduce=True,
                           local=ChunkRef(Buffer.IN, 0))
    block_steps = {"alltoall": blocks_step("cal-alltoall", [(a, b) for a in range(n) for b in range(n) if a != b]),
           "fanin": blocks_step("cal-fanin", [(q, 0) for q in range(1, n)]),
           "fanout": blocks_step("cal-fanout", [(0, q) for q in range(1, n)])}
    return {**block_steps, "copy": cp.build(), "exchange_fresh": fr, "exchange_copy": xc,
            "oneway_copy": oc.build(), "oneway": build("cal-oneway", 1),
            "exchange": build("cal-exchange", 1, exchange=True),
            # the same exchange three times in a row: what a step costs once the ranks are running
            "exchange3": build("cal-exchange3", 3, exchange=True),
            "exchange_reduce": build("cal-exchange-reduce", 1, reduce=True, exchange=True),
            # the same with the block sent and the block reduced two halves of one buffer, as in a
            # collective's reducing step (halving-doubling, ring): the operand is not the bytes just sent,
            # so the step touches one block more (2 shm ranks, 512 KiB messages: 115 us against 93 with
            # the operand the block sent; the bench's 1 MiB reduce-scatter 117)
            "exchange_reduce_split": split.build(),
            "oneway_reduce": build("cal-oneway-reduce", 1, reduce=True),
            # timed in place, into the lower rank of each pair (1 -> 0, 3 -> 2): the side a rooted reduce's
            # root (rank 0 by default, and in `ringflow bench`) is on. Over TCP the core ranks 0 runs on
            # receives and reduces slower (2 pinned TCP ranks, 1 MiB: 243-251 us into rank 0, 197-204 into
            # rank 1; with the pins swapped the slow side swaps; plain one-ways and shm are symmetric)
            "oneway_reduce_inplace": build("cal-oneway-reduce-down", 1, reduce=True,
                                           pairs=[(hi, lo) for lo, hi in every]),
            "oneway_solo": build("cal-oneway-solo", 1, pairs=every[:1]),
            # a ring step: every rank sends to the next and receives from the one before (it relays, where
            # the exchange pairs ranks: on 4 TCP ranks sharing 2 cores 1.2-1.5x slower from 512 KiB)
            "shift": build("cal-shift", 1, pairs=[(r, (r + 1) % n) for r in range(n)]),
            "steps1": build("cal-steps1", 1), "steps8": build("cal-steps8", 8)}


SIZES = [2**12, 2**14] + [2**k for k in range(16, 25)]    # 4 KiB .. 16 MiB: the curves the simulator reads
QUICK_SIZES = [2**12, 2**16, 2**20, 2**24]
# the check timed apart before the fan-out step at these sizes: the root's messages overlap its peers'
# check, more as they grow (4 TCP ranks: 500 us at 64 KiB, 270-370 us at 1-4 MiB)
ROOTED_CHECK_SIZES = [2**16, 2**18, 2**20, 2**22]
QUICK_ROOTED_CHECK_SIZES = [2**16, 2**20]
# with more than one pair, the check is also timed apart before the exchange step of messages this size:
# a call whose first step has every rank sending and receiving overlaps the check's tail with it (4 TCP
# ranks on 2 cores: 325-360 us before exchanges, ring shifts and the bench's all-gathers, reduce-scatters
# and all-to-alls of 64 KiB, 526-540 before the 4-byte step and a 64 KiB one-way)
CHECK_BUSY_BYTES = 2**16


# An exchange this much slower than the same exchange beside a copy, less the copy's work, is timed again
OUTLIER_RATIO = 1.1


# Warm-up calls before a step's batch where not the bench's (`runtime.bench.WARMUP_CALLS`, 5): the lone
# one-way on 4 shm ranks over 2 cores has two modes, the pair with a core each (512 KiB: 52-66 us) or
# beside the idle ranks still spinning (100-170), which a binomial tree's lone first step meets. Its batch
# size follows the last warm-up call, and after 5 calls it is often the fast one: 31 of rec101-rec102's
# 45 sweeps took the fast mode (1 of rec97-rec99's 45 with 2 calls; in one calibration run each,
# [119, 67, 125, 115, 120] us with 2, [65, 56, 65, 59, 95] with 5), and 4-shm-rank binomial
# broadcasts of 512 KiB-1 MiB, priced by it, came out -0.16..-0.21.
STEP_WARMUP_CALLS = {"oneway_solo": 2}
# Times the all-to-all step is taken again at every size (its slow mode, `measure`)
ALLTOALL_RETIMES = 2
# timed batches per calibration point (their median counts), and the sweeps a validation job's rows are timed
# in between them: with the same samples in 5 sweeps instead of 3 a burst of host noise meets a fifth of a
# point or a row (rec92-rec93, kept apart per sweep and pass: all 5 put 231 and 252 rows within 15 %, any 3
# of them 207-233 and 233-254)
BATCHES = 5
# samples per calibration point, split over its batches (`measure`; a quick calibration takes half)
POINT_SAMPLES = 30
# the steps timed at every size (`measure`): on any rank count, and on more than one pair of ranks
CURVE_STEPS = ("copy", "oneway", "oneway_reduce", "oneway_reduce_inplace", "exchange", "exchange_reduce",
               "exchange_reduce_split", "exchange_fresh", "exchange_copy", "oneway_copy")
# steps whose buffers hold two messages (the sizes timed are the message's)
TWO_BLOCK_STEPS = ("exchange_reduce_split", "oneway_copy")


def buffer_bytes(name: str, message_bytes: int) -> int:
    """The buffer a calibration step `name` is called with for messages of `message_bytes`."""
    return message_bytes * (2 if name in TWO_BLOCK_STEPS else 1)
MANY_RANK_STEPS = ("oneway_solo", "shift", "alltoall", "fanin", "fanout", "exchange3")


def exchange_outliers(results: dict, sizes: list[int]) -> list[int]:
    """Sizes whose plain exchange took longer than OUTLIER_RATIO x (the exchange beside a copy - the copy's
    work): the first 2-rank TCP job of a validation run measures the exchange 2-3x slow from 512 KiB for a
    few seconds, while its other schedules and its bench are not (docs/simulator.md)."""
    from .calibrate import copy_bound, step_costs
    t1, alpha = step_costs(results)
    keys = [str(b) for b in sizes]
    bound = copy_bound([results["exchange_copy"][k] for k in keys], [results["copy"][k] for k in keys], t1 - alpha)
    return [b for b, k, lim in zip(sizes, keys, bound) if results["exchange"][k] > OUTLIER_RATIO * lim]


def measure(comm: Any, quick: bool = False, between_sweeps: Callable[[], Any] | None = None) -> dict:
    """Time every calibration schedule on `comm` (every rank calls it; rank 0's result counts);
    `between_sweeps` runs after each sweep of the curves' batches (the bench's passes, `ringflow validate`)."""
    n = comm.size
    scheds = _schedules(n)
    sizes = QUICK_SIZES if quick else SIZES
    res: dict = {"nranks": n, "results": {}}

    timer = np.zeros(1)

    def slowest(seconds: float) -> float:
        timer[0] = seconds
        comm.all_reduce(timer, "max")
        return float(timer[0])

    def batch(name: str, nbytes: int) -> float:
        """One batch timed like `ringflow bench` (runtime.bench.median_call_s), seconds per call.
        A name ending in `_inplace` runs that schedule with IN and OUT the same array."""
        from ..runtime.bench import WARMUP_CALLS, median_call_s
        count = max(1, buffer_bytes(name, nbytes) // 4)
        sched = scheds[name]
        # in place, the one array is written first: never-written pages map the kernel's zero page, which a
        # peer reads 1.6-1.7x faster than written data (2 shm ranks' one-way at 1-2 MiB), unlike the bench
        inplace = name.endswith("_inplace")
        y = np.ones(count, dtype=np.float32) if inplace else np.zeros(count, dtype=np.float32)
        x = y if inplace else np.ones(count, dtype=np.float32)
        with np.errstate(all="ignore"):
            return median_call_s(lambda: comm.execute(sched, x, y), comm.barrier, slowest,
                                 warmup=STEP_WARMUP_CALLS.get(name, WARMUP_CALLS),
                                 iters=max(3, (POINT_SAMPLES // (2 if quick else 1)) // BATCHES))[0]

    def timed(name: str, nbytes: int) -> float:
        """The median of BATCHES batches in a row."""
        return float(np.median([batch(name, nbytes) for _ in range(BATCHES)]))

    # the runtime's cross-rank argument check (a CHECK exchange before schedules that cannot check
    # themselves) is timed apart: once with it, once without; every curve is measured without it
    # the check's cost is the noisiest figure here (waking every peer): the median of interleaved pairs
    def check_cost(name: str, nbytes: int) -> float:
        diffs = []
        for _ in range(3 if quick else 5):
            with_check = timed(name, nbytes)
            comm._checks = False
            diffs.append(with_check - timed(name, nbytes))
            comm._checks = True
        return float(np.median(diffs))
    check_s = check_cost("steps1", 4)
    # before a rooted step (the root sends, its peers wait for one message each) the check is timed
    # apart, on the fan-out step at a few sizes
    rooted = {str(b): 1e6 * check_cost("fanout", b)
              for b in (QUICK_ROOTED_CHECK_SIZES if quick else ROOTED_CHECK_SIZES)}
    # (2 ranks' exchange checks itself: its first step exchanges with every peer)
    busy_check = {str(CHECK_BUSY_BYTES): 1e6 * check_cost("exchange", CHECK_BUSY_BYTES)} if n > 2 else None
    comm._checks = False
    try:
        for name in ("steps1", "steps8"):
            res["results"][name] = {"4": 1e6 * timed(name, 4)}
        res["results"]["steps1_checked"] = {"4": res["results"]["steps1"]["4"] + 1e6 * check_s}
        res["results"]["check_rooted"] = rooted
        if busy_check is not None:
            res["results"]["check_busy"] = busy_check
        # with more ranks than one pair: one transfer alone (its receiver has a core to itself)
        # a reduction into its own operand (in-place all-reduce and reduce) streams one buffer fewer
        names = CURVE_STEPS + (MANY_RANK_STEPS if n > 2 else ())
        # a curve point's batches are spread over the whole sweep, not timed in a row: the host's noise
        # comes in bursts of seconds (2 TCP ranks: one job's one-way at 1-4 MiB 1.4-2.5x another's, where
        # the bench's scatters of the same messages agreed within 3 %), which then meet one batch of a
        # point, not all of them
        spread_out: dict[str, dict[int, list[float]]] = {name: {s: [] for s in sizes} for name in names}
        for _ in range(BATCHES):
            for name in names:
                for s in sizes:
                    spread_out[name][s].append(batch(name, s))
            if between_sweeps is not None:   # with the runtime's checks, as `ringflow bench` runs
                comm._checks = True
                between_sweeps()
                comm._checks = False
                res["interleaved_sweeps"] = res.get("interleaved_sweeps", 0) + 1
        for name in names:
            res["results"][name] = {str(s): 1e6 * float(np.median(v)) for s, v in spread_out[name].items()}
        # every sweep's batch apart (us), on record: statistics over sweeps are judged on recordings offline
        res["sweeps"] = {name: {str(s): [1e6 * t for t in v] for s, v in by_size.items()}
                         for name, by_size in spread_out.items()}
        def retime(name: str, again: list[int], rounds: int = 1) -> None:
            """Time `name` at sizes `again` once more per round and keep the fastest (the first times are
            kept for the record under NAME_retimed)."""
            if not again:
                return
            curve = res["results"][name]
            res["results"][f"{name}_retimed"] = {str(b): curve[str(b)] for b in again}
            for _ in range(rounds):
                for b in again:
                    curve[str(b)] = min(curve[str(b)], 1e6 * timed(name, b))
        # the plain exchange's slow mode (calibrate.curves): such sizes are timed again now
        retime("exchange", exchange_outliers(res["results"], sizes))
        if n > 2:
            # the all-to-all step of 4 ranks on 2 cores has a slow mode too, 1.7-1.8x at 4-64 KiB in 13
            # shm jobs of 21 and gone seconds later (the bench's sharded all-reduces never show it): it is
            # timed twice more, after everything else
            retime("alltoall", list(sizes), rounds=ALLTOALL_RETIMES)
    finally:
        comm._checks = True
    from ..runtime import executor
    from ..runtime.transport import cma, shm
    # how long a rank polls its sockets before sleeping, on record only (recordings before it ran with 50 us;
    # the model's asleep rule does not read it: docs/simulator.md, thirty-third session)
    res["socket_spin_us"] = 1e6 * executor.SOCKET_SPIN_S
    if cma.reads:   # large messages went by single copy: from which size the sender is free
        res["single_copy_min_bytes"] = shm.CMA_COPY_MIN_BYTES
        res["single_copy_fresh_min_bytes"] = shm.CMA_MIN_BYTES   # ... and from which a just-written source
    return res


def main() -> None:
    """Time every calibration schedule and write rank 0's results."""
    import ringflow
    out_path = sys.argv[1]
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"
    comm = ringflow.init()
    res = measure(comm, quick)
    if comm.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(res, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
