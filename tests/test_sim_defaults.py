"""The default `ringflow sim` (no --algo) works for every collective, preset and node count, and `--gpus` runs a
job on part of a cluster in `sim` and `train`."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ringflow.algorithms.schedule import Collective
from ringflow.cli import build_app
from ringflow.errors import InvalidArgument
from ringflow.sim import simulate
from ringflow.topology import build_cluster, load_topology, preset_names


@pytest.fixture(scope="module")
def app():
    return build_app()


BIG_PRESETS = ("gb200-nvl72", "gb300-nvl72")   # 72 GPUs a server: the same checks, minutes instead of seconds


def _topology(preset: str, nodes: int):
    spec = "host-cpu:4" if preset == "host-cpu" else preset
    return load_topology(spec) if nodes == 1 else build_cluster(spec, nodes)


@pytest.mark.parametrize("preset", [pytest.param(p, marks=pytest.mark.long) if p in BIG_PRESETS else p
                                    for p in preset_names()])
def test_default_algorithm_simulates_every_collective_with_progress(preset: str) -> None:
    for nodes in (1, 2):
        topo = _topology(preset, nodes)
        n = len(topo.endpoints())
        for coll in Collective:
            seen: list[float] = []
            res = simulate(topo, coll, 1 << 16, nranks=n, progress=seen.append)   # as `ringflow sim` calls it
            assert res.time_us > 0 and res.busbw_GBps >= 0, (preset, nodes, coll)
            assert res.collective == coll and res.nranks == n


@pytest.mark.parametrize("preset", [pytest.param("dgx-h100", marks=pytest.mark.long), "dgx-b200", "h800"])
def test_default_all_reduce_on_nvswitch_servers_at_several_node_counts(preset: str) -> None:
    picked = set()
    for nodes in (2, 3, 4, 16):
        topo = build_cluster(preset, nodes)
        for size in (1 << 20, 1 << 30):
            res = simulate(topo, "all_reduce", size, progress=lambda f: None, timeline=True)
            assert res.time_us > 0 and res.timeline, (preset, nodes, size)
            picked.add(res.algorithm)
    if preset == "dgx-h100":
        assert "nvls_tree" in picked   # NCCL's default across Hopper servers for large buffers


def test_nvls_tree_timeline_names_its_switches_and_matches_the_untimed_run() -> None:
    topo = build_cluster("dgx-h100", 2)
    plain = simulate(topo, "all_reduce", 1 << 30, algorithm="nvls_tree")
    timed = simulate(topo, "all_reduce", 1 << 30, algorithm="nvls_tree", timeline=True, progress=lambda f: None)
    assert timed.time_us == plain.time_us
    assert timed.switches == ["h0/nvsw0", "h1/nvsw0"]
    assert max(max(src, dst) for _, src, dst, *_ in timed.timeline) == 16 + 1   # ranks 0-15, switches 16-17
    with pytest.raises(InvalidArgument, match="all_reduce algorithm"):
        simulate(topo, "all_gather", 1 << 20, algorithm="nvls_tree")


def test_all_to_allv_without_splits_is_the_uniform_all_to_all() -> None:
    topo = build_cluster("dgx-h100", 2)
    v = simulate(topo, "all_to_allv", 1 << 22)
    a = simulate(topo, "all_to_all", 1 << 22, algorithm="pairwise")
    assert v.collective == Collective.ALL_TO_ALLV and v.time_us == a.time_us and v.busbw_GBps == a.busbw_GBps
    with pytest.raises(InvalidArgument, match="not an all_to_allv algorithm"):
        simulate(topo, "all_to_allv", 1 << 22, algorithm="bruck")


def test_sim_cli_default_on_two_hopper_servers_writes_a_trace(app, tmp_path) -> None:
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(app, ["sim", "all_reduce", "--topo", "dgx-h100", "--nodes", "2", "--min", "512MiB",
                                   "--max", "1GiB", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "nvls_tree" in res.output
    names = [e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "M"]
    assert "switch h1/nvsw0" in names and "rank 15" in names


def test_sim_gpus_runs_a_job_on_the_first_gpus_of_a_rack(app) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["sim", "all_reduce", "--topo", "gb200-nvl72", "--gpus", "64", "--min", "1MiB",
                              "--max", "1MiB", "--algo", "ring", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output[res.output.index("["):])
    assert [r["nranks"] for r in rows] == [64]
    full = simulate(load_topology("gb200-nvl72"), "all_reduce", 1 << 20, algorithm="ring", nranks=64)
    assert rows[0]["time_us"] == pytest.approx(full.time_us, rel=1e-6)
    bad = runner.invoke(app, ["sim", "all_reduce", "--topo", "gb200-nvl72", "--gpus", "73"])
    assert isinstance(bad.exception, InvalidArgument)
    assert "--gpus 73" in str(bad.exception) and "72 GPUs" in str(bad.exception)


def test_train_gpus_places_the_job_on_the_first_servers(app) -> None:
    runner = CliRunner()
    args = ["train", "--model", "llama3-8b", "--topo", "dgx-h100", "--tp", "8", "--pp", "1", "--global-batch", "64",
            "--comm", "alpha-beta", "--json"]
    part = runner.invoke(app, args + ["--nodes", "4", "--gpus", "16"])
    alone = runner.invoke(app, args + ["--nodes", "2"])
    assert part.exit_code == 0 and alone.exit_code == 0, part.output + alone.output
    p, a = json.loads(part.output), json.loads(alone.output)
    assert p["gpus"] == 16 and p["layout"]["dp"] == 2
    assert p["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-12)   # two of four servers: as two alone
    bad = runner.invoke(app, args + ["--nodes", "2", "--gpus", "24"])
    assert isinstance(bad.exception, InvalidArgument)
    assert "--gpus 24" in str(bad.exception) and "16 GPUs" in str(bad.exception)


def test_default_collectives_on_one_nvl72_rack_pick_nvls_with_a_chunk_count() -> None:
    topo = load_topology("gb200-nvl72")
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        res = simulate(topo, coll, 1 << 24, progress=lambda f: None)   # as `ringflow sim` calls it, 72 ranks
        assert res.nranks == 72 and res.algorithm == "nvls" and res.protocol == "simple", coll
        assert any("pipeline segments" in n for n in res.notes), res.notes
        assert 0 < res.busbw_GBps < 900, (coll, res.busbw_GBps)   # under NVLink5's 900 GB/s per direction


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "all_gather"])
def test_nvls_model_from_its_few_step_template_equals_the_full_table(coll: str) -> None:
    from ringflow.sim import analytic
    from ringflow.sim.fabric import fabric_for
    from ringflow.sim.nvls import nvls_table, template
    from ringflow.sim.params import params_for
    topo = load_topology("dgx-h100")
    prm = params_for(topo)
    fab = fabric_for(topo, prm, topo.endpoints()[:8])
    sizes = np.array([8.0, 1 << 16, 1 << 24, 1 << 33])
    for chunks in (4, 16, 64):
        tab = nvls_table(8, chunks, Collective.parse(coll))
        assert template(tab) is not None
        fast = analytic.model_for(tab, fab, prm)
        full = analytic.build_model(tab, fab, prm)
        assert fast.routed is None                      # built without routing the full table
        for p in range(len(prm.protocols)):
            assert np.array_equal(np.sort(np.unique(fast.line_step)), np.sort(np.unique(full.line_step)))
            for b in sizes:
                assert fast.step_times_us(b, p) == pytest.approx(full.step_times_us(b, p), rel=1e-12)
        assert np.array_equal(fast.times_us(sizes)[0], full.times_us(sizes)[0])
        assert np.array_equal(fast.rank_last_step, full.rank_last_step)
        assert fast.link_frac == pytest.approx(full.link_frac, rel=1e-12)
        assert np.array_equal(fast.flows.p_link, full.flows.p_link)   # routed on first use
    odd = nvls_table(8, 3, Collective.parse(coll))                    # not a power of two: built in full
    assert template(odd) is None


@pytest.mark.parametrize("coll,algo", [("broadcast", "ring"), ("broadcast", "tree"), ("reduce", "ring"),
                                       ("all_reduce", "tree")])
def test_a_pipelined_algorithm_is_priced_at_its_fastest_segment_count(coll: str, algo: str) -> None:
    topo = load_topology("dgx-h100")
    size = 1 << 30
    res = simulate(topo, coll, size, algorithm=algo)
    fixed = {s: simulate(topo, coll, size, algorithm=algo, nsegs=s).time_us for s in (1, 2, 4, 8, 16, 32, 64)}
    assert res.time_us == min(fixed.values())
    assert any(f"{algo}: {min(fixed, key=fixed.__getitem__)} pipeline segments" in n for n in res.notes), res.notes
    # store-and-forward (one segment) pays the chain's or tree's depth in whole-buffer hops
    assert res.time_us < fixed[1] / 2
