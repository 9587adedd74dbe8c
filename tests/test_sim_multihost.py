"""Multi-host validation machinery on emulated hosts (skips without network namespaces)."""
from __future__ import annotations

import pytest

from ringflow.testing import netns

REASON = netns.available()


@pytest.mark.netns
@pytest.mark.long
@pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}")
def test_ring_and_hierarchical_measured_and_predicted_on_two_emulated_hosts() -> None:
    from ringflow.hostmodel import multihost
    from ringflow.topology import load_topology
    host = load_topology("host-cpu:2")
    rows, why = multihost.run(host, nhosts=2, per_host=2, rate_mbit=1000.0, sizes=(2**20,))
    assert why is None and rows is not None
    assert sorted(r["algorithm"] for r in rows) == ["hierarchical", "ring"]
    for r in rows:
        assert r["nranks"] == 4 and r["measured_us"] > 0 and r["predicted_us"] > 0
    # the prediction runs on the cluster the namespaces emulate: NIC links at 1 Gbit/s carry bytes
    topo = multihost.cluster_for(host, 2, 1000.0)
    assert {topo.host_of(e) for e in topo.endpoints()} == {0, 1}
