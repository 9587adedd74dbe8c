"""The simulator's quicker builds give exactly what the plain builds give: the link arrays read in one pass, and
ring tables written from their step pattern in the schedule's row order."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.hardware.nvlink import edge_efficiency_scale
from ringflow.sim.fabric import _read_links
from ringflow.topology import build_cluster, build_preset


def _val(x: object) -> str:
    return str(getattr(x, "value", x))


@pytest.mark.parametrize("make", [lambda: build_cluster("dgx-h100", 4), lambda: build_cluster("gb200-nvl72", 2),
                                  lambda: build_preset("dgx1-v100"), lambda: build_preset("host-cpu:4"),
                                  lambda: build_cluster("dgx-a100", 3, fabric="fat-tree", planes=2)])
def test_links_read_in_one_pass_equal_the_edge_by_edge_reading(make: object) -> None:
    g = make().graph  # type: ignore[operator]
    links, scale, types, code = _read_links(g)
    edges = list(g.edges(data=True))
    assert links.edges == [(u, v) for u, v, _ in edges]
    assert links.edge_index == {(u, v): i for i, (u, v, _) in enumerate(edges)}
    assert links.link_type == [_val(d.get("type", "")) for _, _, d in edges]
    assert links.link_tier == [_val(d.get("tier") or d.get("type", "")) for _, _, d in edges]
    assert np.array_equal(links.line_Bpus, [float(d["bw_GBps"]) * 1e3 for _, _, d in edges])
    assert np.array_equal(links.lat_us, [float(d["latency_us"]) for _, _, d in edges])
    assert np.array_equal(scale, [edge_efficiency_scale(d) for _, _, d in edges])
    assert types == sorted(set(links.link_type))
    assert [types[c] for c in code] == links.link_type
