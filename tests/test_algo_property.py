"""Property tests: the verifier proves every (collective, algorithm) pair for rank counts 1..33,
segment counts, roots and uneven counts; every schedule's counts equal its closed form."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringflow.algorithms import registry, verifier
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Collective, Schedule

PAIRS = [(c, a.name) for a in registry.ALGORITHMS.values() for c in a.collectives]
ROOTED = lambda c: c.has_root or c == Collective.SENDRECV  # noqa: E731


def test_every_collective_has_an_algorithm() -> None:
    for c in Collective:
        assert registry.algorithms_for(c), c


def _shapes(c: Collective, n: int, counts: list[int], splits_seed: int) -> list[CallShape]:
    if c == Collective.ALL_TO_ALLV:
        return [CallShape(c, n, 0, splits=tuple(tuple((splits_seed + 7 * i + 3 * j * j) % 5 for j in range(n))
                                                for i in range(n)))]
    if c == Collective.BARRIER:
        return [CallShape(c, n, 0)]
    return [CallShape(c, n, k) for k in counts]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), n=st.integers(1, 33), nsegs=st.integers(1, 3), root_seed=st.integers(0, 1000),
       extra=st.integers(0, 200), nchannels=st.integers(1, 3))
def test_verifier_proves_every_pair(pair: tuple[Collective, str], n: int, nsegs: int, root_seed: int, extra: int,
                                    nchannels: int) -> None:
    c, name = pair
    root = root_seed % n if ROOTED(c) else None
    if c == Collective.SENDRECV and n > 1 and (root + 1) % n == root:
        return
    s: Schedule = registry.get_schedule(c, name, n, root=root, nsegs=nsegs, nchannels=nchannels)
    counts = sorted({0, 1, max(n - 1, 0), n * 3 + 1 + extra})   # 0, 1, n-1, not divisible by n
    verifier.verify(s, _shapes(c, n, counts, extra))


CF_RANKS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 32, 33]


@pytest.mark.parametrize("c,name", PAIRS, ids=[f"{c.value}-{a}" for c, a in PAIRS])
def test_counts_match_closed_form(c: Collective, name: str) -> None:
    for n in CF_RANKS:
        for nsegs in ((1, 2) if n <= 9 else (1 + n % 2,)):
            out = verifier.check_algorithm(c, name, n, nsegs=nsegs)
            assert out["in_place_checked"] == (c in verifier.IN_PLACE)


def test_hierarchical_with_topology_style_groups() -> None:
    groups = [[0, 2, 4], [1, 3, 5], [6, 7, 8]]
    s = registry.get_schedule("all_reduce", "hierarchical", 9, host_groups=groups)
    verifier.verify(s, [CallShape(Collective.ALL_REDUCE, 9, k) for k in (0, 1, 8, 100)])
    with pytest.raises(Exception, match="equal rank counts"):
        registry.get_schedule("all_reduce", "hierarchical", 5, host_groups=[[0, 1, 2], [3, 4]])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), H=st.integers(1, 5), m=st.integers(1, 6), nsegs=st.integers(1, 3))
def test_hierarchical_any_equal_host_groups(data: st.DataObject, H: int, m: int, nsegs: int) -> None:
    n = H * m
    perm = data.draw(st.permutations(list(range(n))))
    groups = [perm[h * m:(h + 1) * m] for h in range(H)]
    s = registry.get_schedule("all_reduce", "hierarchical", n, host_groups=groups, nsegs=nsegs)
    verifier.verify(s, [CallShape(Collective.ALL_REDUCE, n, k) for k in (0, 1, n - 1, 5 * n + 2)])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), nchannels=st.integers(1, 3), nsegs=st.integers(1, 3),
       coll=st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"]))
def test_ring_any_ring_orders(data: st.DataObject, n: int, nchannels: int, nsegs: int, coll: str) -> None:
    rings = [data.draw(st.permutations(list(range(n)))) for _ in range(nchannels)]
    root = data.draw(st.integers(0, n - 1))
    s = registry.get_schedule(coll, "ring", n, root=root, nsegs=nsegs, nchannels=nchannels, rings=rings)
    c = Collective.parse(coll)
    verifier.verify(s, [CallShape(c, n, k) for k in (0, 1, n + 1)])


def test_every_schedule_roundtrips_through_json() -> None:
    for c, name in PAIRS:
        s = registry.get_schedule(c, name, 5, root=2 if ROOTED(c) else None, nsegs=2)
        back = Schedule.from_json(s.dumps())
        assert back.to_json() == s.to_json() and back.layouts == s.layouts and back.programs == s.programs
