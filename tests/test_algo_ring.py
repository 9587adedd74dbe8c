"""Ring: the seed's exact indices (n=5 table), the seed's all-gather typo, pipelining, channels."""
from __future__ import annotations

import pytest

from ringflow import config
from ringflow.algorithms import cost, registry, ring, verifier
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Collective, OpKind
from ringflow.errors import InvalidArgument, TopologyError, VerificationError
from ringflow.topology import parse_rings


def _blocks(s, step: int, rank: int) -> tuple[int, int]:
    ops = s.programs[rank][step]
    snd = next(o for o in ops if o.kind == OpKind.SEND).src.index
    rcv = next(o for o in ops if o.kind.is_recv).dst.index
    return snd, rcv


def test_seed_ring_allreduce_table_n5(capsys: pytest.CaptureFixture) -> None:
    n = 5
    s = registry.get_schedule("all_reduce", "ring", n)
    lines = ["phase           step  " + "  ".join(f"GPU{j} send/recv" for j in range(n))]
    for phase, offset in (("scatter_reduce", 0), ("all_gather", n - 1)):
        for i in range(n - 1):
            row = [_blocks(s, offset + i, j) for j in range(n)]
            lines.append(f"{phase:15s} {i:4d}  " + "  ".join(f"{a:>9d}/{b:<5d}" for a, b in row))
            for j, (snd, rcv) in enumerate(row):
                if phase == "scatter_reduce":   # the seed's formulas, exactly
                    assert (snd, rcv) == ((j - i) % n, (j - i - 1) % n)
                    assert s.programs[j][i][0].kind in (OpKind.SEND, OpKind.RECV_REDUCE)
                else:                           # corrected all-gather indices (the seed's are off by two)
                    assert (snd, rcv) == ((j - i + 1) % n, (j - i) % n)
                    assert ring.seed_allreduce_blocks(n, i, j, "all_gather") == (snd, rcv)
    print("\n".join(lines))
    assert "scatter_reduce" in capsys.readouterr().out
    verifier.verify(s, [CallShape(Collective.ALL_REDUCE, n, c) for c in (0, 1, 4, 38)])


def test_seed_literal_allgather_indices_are_wrong() -> None:
    # the seed's "(j-i-1)%n send, (j-i-2)%n receive" all-gather sends blocks not yet complete
    with pytest.raises(VerificationError, match="expected position"):
        verifier.verify(ring.build_seed_literal(5))


@pytest.mark.parametrize("n,segs", [(2, 1), (4, 3), (7, 8)])
def test_pipelined_broadcast_matches_seed_formula(n: int, segs: int) -> None:
    # seed: broadcast of N bytes over K nodes split into S chunks takes N(S+K-2)/(S B)
    s = registry.get_schedule("broadcast", "ring", n, root=1 % n, nsegs=segs)
    verifier.verify(s)
    N = segs * (1 << 16)  # divisible, so every segment is N/S bytes
    shape = CallShape(Collective.BROADCAST, n, N // 4)
    tr = cost.traffic(s, shape)
    assert tr.steps == segs + n - 2
    beta = 10.0
    c = cost.schedule_cost(s, shape, alpha_us=0.0, beta_GBps=beta, msg_us=0.0)
    assert c.time_s == pytest.approx(N * (segs + n - 2) / (segs * beta * 1e9))


def test_multichannel_rings_from_ring_orders() -> None:
    rings = parse_rings("0 2 4 6 1 3 5 7 | 0 7 6 5 4 3 2 1", 8)
    s = registry.get_schedule("all_reduce", "ring", 8, nchannels=2, rings=rings)
    assert s.nchannels == 2
    verifier.verify(s, [CallShape(Collective.ALL_REDUCE, 8, c) for c in (0, 5, 101)])
    # channel 0 follows the first ring order: rank 0 sends to 2, channel 1 follows the second: 0 -> 7
    peers = {(o.channel, o.peer) for o in s.programs[0][0] if o.kind == OpKind.SEND}
    assert peers == {(0, 2), (1, 7)}
    for c in ("reduce_scatter", "all_gather", "broadcast", "reduce"):
        verifier.verify(registry.get_schedule(c, "ring", 8, root=3, nchannels=2, nsegs=2, rings=rings))


def test_rings_knob_feeds_ring_orders() -> None:
    with config.override(RINGS="0 3 1 2|0 2 1 3"):
        s = registry.get_schedule("all_gather", "ring", 4)
        two = registry.get_schedule("all_reduce", "ring", 4, nchannels=2)
        with pytest.raises(TopologyError, match="does not exist"):
            registry.get_schedule("all_reduce", "ring", 3)
    assert {o.peer for o in s.programs[0][0] if o.kind == OpKind.SEND} == {3}
    assert {(o.channel, o.peer) for o in two.programs[0][0] if o.kind == OpKind.SEND} == {(0, 3), (1, 2)}
    verifier.verify(s)
    verifier.verify(two)
    plain = registry.get_schedule("all_gather", "ring", 4)  # knob unset again: default order 0 1 2 3
    assert {o.peer for o in plain.programs[0][0] if o.kind == OpKind.SEND} == {1}


def test_bad_ring_order_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgument, match="permutation"):
        registry.get_schedule("all_reduce", "ring", 4, rings=[(0, 1, 1, 2)])
