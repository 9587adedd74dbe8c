"""`ringflow sim`, and the simulator's checks that `ringflow validate --gpu / --multihost` run."""
from __future__ import annotations

from typing import Any

import typer

from ..errors import InvalidArgument
from .common import (
    FABRIC_OPT,
    OVERSUB_OPT,
    PLANES_OPT,
    RADIX_OPT,
    TIERS_OPT,
    FabricOptions,
    console,
    fabric_options,
    print_json,
    print_table,
    write_json,
)


def _topology(topo: str, nodes: int, fab: FabricOptions, nic: str | None) -> Any:
    from ..topology import load_topology
    base = load_topology(topo)
    if nodes > 1:
        from ..units import parse_rate_gbps
        return fab.build(base, nodes, nic_gbps=parse_rate_gbps(nic) if nic else None)
    return base


def _parse_params(items: list[str]) -> dict[str, Any]:
    import yaml
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgument(f"--param {item!r} is not key=value", "e.g. --param reduce_GBps=5")
        out[key.strip()] = yaml.safe_load(value)
    return out


def sim_command(
    collective: str = typer.Argument(..., help="all_reduce, all_gather, reduce_scatter, broadcast, ..."),
    topo: str = typer.Option("detect", "--topo", help="preset name, topology file, or 'detect'"),
    nodes: int = typer.Option(1, "--nodes", min=1, help="replicate the topology into a cluster of N servers"),
    fabric: str = FABRIC_OPT,
    nic: str | None = typer.Option(None, "--nic", help="NIC speed for the cluster, e.g. 400G"),
    oversub: str = OVERSUB_OPT,
    tiers: int | None = TIERS_OPT,
    radix: int = RADIX_OPT,
    planes: int = PLANES_OPT,
    algo: str | None = typer.Option(None, "--algo", help="algorithm (default: the tuner's choice per size; "
                                       "nvls: in-switch reduction, all_reduce / reduce_scatter / "
                                       "all_gather on one Hopper+ NVSwitch)"),
    nranks: int | None = typer.Option(None, "--nranks", "-n", min=1, help="ranks (default: every endpoint)"),
    min_size: str = typer.Option("8", "--min", "-b", help="smallest size (nccl-tests -b)"),
    max_size: str = typer.Option("128MiB", "--max", "-e", help="largest size (nccl-tests -e)"),
    factor: int = typer.Option(2, "--factor", "-f", min=2, help="size multiplier (nccl-tests -f)"),
    engine: str = typer.Option("analytic", "--engine", help="analytic or flow"),
    dtype: str = typer.Option("float32", "--dtype"),
    root: int = typer.Option(0, "--root", min=0),
    nchannels: int | None = typer.Option(None, "--nchannels", min=1, help="channels (rings) for ring algorithms"),
    param: list[str] = typer.Option([], "--param", help="simulator parameter override key=value (repeatable)"),
    json_out: bool = typer.Option(False, "--json", help="print the rows (ringflow bench keys + algorithm) as JSON"),
    out: str | None = typer.Option(None, "-o", "--out", help="also write the rows as JSON to this file"),
    plot: str | None = typer.Option(None, "--plot", help="draw busbw vs size into this PNG"),
    trace: str | None = typer.Option(None, "--trace", help="Chrome trace JSON of the largest size"),
    details: bool = typer.Option(False, "--details", help="per-tier traffic and busiest links of the largest size"),
    nccl: bool = typer.Option(False, "--nccl", help="pick per size what NCCL's tuning model picks (algorithm x "
                              "protocol; src/graph/tuning.cc) and print its predicted time, as nccl-tests would"),
    sharp: bool = typer.Option(False, "--sharp", help="with --nccl: the fabric has IB SHARP switches "
                               "(NCCL_COLLNET_ENABLE=1: CollNet, NVLS across servers)"),
) -> None:
    """Predict nccl-tests style results of a collective on a modelled machine or cluster."""
    from rich.progress import Progress

    from ..algorithms.schedule import Collective
    from ..sim.api import simulate
    from ..sim.params import params_for
    from ..units import format_size, parse_size, size_range

    coll = Collective.parse(collective)
    t = _topology(topo, nodes, fabric_options(fabric, tiers, radix, oversub, planes), nic)
    prm = params_for(t, _parse_params(param))
    sizes = size_range(max(1, parse_size(min_size)), parse_size(max_size), factor)
    n = nranks or len(t.endpoints())
    if nccl:
        if algo:
            raise InvalidArgument("--nccl picks the algorithm per size; --algo fixes it", "give one of them")
        _nccl_table(t, topo, coll, sizes, n, dtype, engine, prm, sharp, json_out, out)
        return
    results = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"simulating {coll.value} on {n} ranks ({engine})", total=len(sizes))
        inner = bar.add_task("  flow engine: ranks' progress", total=1.0, visible=engine == "flow")
        for i, size in enumerate(sizes):
            want_tl = bool(trace) and i == len(sizes) - 1
            bar.update(inner, completed=0.0)
            res = simulate(t, coll, size, algorithm=algo, nranks=n, engine=engine, dtype=dtype, root=root,
                           nchannels=nchannels, params=prm, timeline=want_tl,
                           progress=lambda f: bar.update(inner, completed=min(1.0, f)))
            results.append(res)
            bar.advance(task)
    rows = [r.row() for r in results]
    if out:
        write_json(out, rows)
    if json_out:
        print_json(rows)
        return
    console.print(f"# {coll.value} on {getattr(t, 'name', topo)}: {n} ranks, engine {engine}, dtype {dtype}")
    print_table(None, ["size", "count", "type", "algorithm", "proto", "time(us)", "algbw(GB/s)", "busbw(GB/s)"],
                [[format_size(r["size_bytes"]), r["count"], r["dtype"], r["algorithm"], r["protocol"],
                  f"{r['time_us']:.2f}", f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}"] for r in rows])
    for note in sorted({nt for r in results for nt in r.notes}):
        console.print(f"[yellow]note:[/] {note}")
    last = results[-1]
    if details:
        print_table(f"traffic per tier at {format_size(last.size_bytes)}", ["tier", "links", "busy", "bytes", "util"],
                    [[d["tier"], d["links"], d["busy_links"], format_size(d["bytes"]), f"{d['util']:.1%}"]
                     for d in last.tiers()])
        print_table("busiest links", ["link", "tier", "bytes", "util"],
                    [[d["link"], d["tier"], format_size(d["bytes"]), f"{d['util']:.1%}"] for d in last.top_links()])
    if out:
        console.print(f"wrote {len(rows)} rows to {out}")
    if trace:
        from ..sim.trace import write_chrome_trace
        nev = write_chrome_trace(last, trace)
        console.print(f"wrote {nev} trace events to {trace} (open in chrome://tracing or ui.perfetto.dev)")
    if plot:
        from ..sim.plot import plot_busbw
        plot_busbw({f"{engine}": rows}, plot, title=f"{coll.value} on {getattr(t, 'name', topo)} ({n} ranks)")
        console.print(f"wrote {plot}")


def _nccl_table(t: Any, topo: str, coll: Any, sizes: list[int], n: int, dtype: str, engine: str, prm: Any,
                sharp: bool, json_out: bool, out: str | None) -> None:
    """`ringflow sim --nccl`: NCCL's choice and predicted time per size, ringflow's simulation beside it."""
    from ..sim.nccl_tuner import NCCL_TUNING_SOURCE, nccl_rows
    from ..units import format_size
    rows = nccl_rows(t, coll, sizes, n, dtype=dtype, engine=engine, params=prm, collnet=sharp)
    if out:
        write_json(out, rows)
    if json_out:
        print_json(rows)
        return
    console.print(f"# {coll.value} on {getattr(t, 'name', topo)}: {n} ranks, NCCL's tuning model "
                  f"({NCCL_TUNING_SOURCE}), dtype {dtype}")
    print_table(None, ["size", "count", "type", "algorithm", "proto", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                       f"sim {engine}(us)"],
                [[format_size(r["size_bytes"]), r["count"], r["dtype"], r["algorithm"], r["protocol"],
                  f"{r['time_us']:.2f}", f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}",
                  "-" if r["sim_time_us"] is None else f"{r['sim_time_us']:.2f}"] for r in rows])
    console.print("time: NCCL's own prediction (latency + size / bandwidth); sim: ringflow's simulator running the "
                  "same algorithm and protocol where it models it (ring, tree, nvls)")


def validate_multihost(topo: str | None, hosts: int, per_host: int, rate_mbit: float,
                       json_out: str | None) -> None:
    """`ringflow validate --multihost`: flat ring vs hierarchical all-reduce on emulated hosts, measured and
    predicted on a cluster of `topo` (default: the host-cpu preset with `per_host` ranks)."""
    from ..hostmodel import multihost
    from ..topology import load_topology
    from ..units import format_size
    host_topo = load_topology(topo or f"host-cpu:{per_host}")
    rows, why = multihost.run(host_topo, hosts, per_host, rate_mbit)
    if rows is None:
        console.print(f"[yellow]skipped:[/] {why}")
        return
    print_table(f"flat ring vs hierarchical all-reduce, {hosts} hosts x {per_host} ranks, {rate_mbit:g} Mbit/s links",
                ["algorithm", "size", "measured(us)", "predicted(us)", "error"],
                [[r["algorithm"], format_size(r["size_bytes"]), f"{r['measured_us']:.0f}", f"{r['predicted_us']:.0f}",
                  f"{r['error']:+.1%}"] for r in rows])
    by: dict[int, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["size_bytes"], {})[r["algorithm"]] = r
    for size, d in sorted(by.items()):
        if len(d) == 2:
            m = min(d, key=lambda a: d[a]["measured_us"])
            p = min(d, key=lambda a: d[a]["predicted_us"])
            console.print(f"{format_size(size)}: measured winner {m}, predicted winner {p}"
                          + ("" if m == p else "  [red](ranking differs)[/]"))
    if json_out:
        write_json(json_out, rows)


def validate_gpu(json_out: str | None, plot: str | None = None) -> None:
    """`ringflow validate --gpu`: published NCCL results on GPU servers next to the simulator's prediction."""
    from ..sim.references import evaluate
    from ..units import format_size
    rows = evaluate()
    print_table("published NCCL busbw vs simulator (all_reduce)",
                ["reference", "size", "published GB/s", "predicted GB/s", "error", "algorithm", "kind"],
                [[r["name"], format_size(r["size_bytes"]), f"{r['reference_GBps']:.1f}", f"{r['predicted_GBps']:.1f}",
                  f"{r['error']:+.1%}", f"{r['algorithm']}/{r['protocol']}",
                  "fitted" if r["fitted"] else ("not modelled" if not r["modelled"] else "check")] for r in rows])
    for r in rows:
        console.print(f"- {r['name']}: {r['what']}; source: {r['source']}" + (f" ({r['note']})" if r["note"] else ""))
    if json_out:
        write_json(json_out, rows)
    if plot:
        from ..sim.plot import plot_references
        plot_references(rows, plot)
        console.print(f"wrote {plot}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("sim")(sim_command)
