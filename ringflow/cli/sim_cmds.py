"""`ringflow sim`, and the simulator's checks that `ringflow validate gpu / multihost` run."""
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
    check_plot_path,
    console,
    err_console,
    fabric_options,
    print_json,
    print_table,
    report_plot,
    write_json,
)


def _topology(topo: str, nodes: int, fab: FabricOptions, nic: str | None) -> Any:
    from ..topology import load_topology
    base = load_topology(topo)
    if nodes > 1:
        from ..units import parse_rate_gbps
        return fab.build(base, nodes, nic_gbps=parse_rate_gbps(nic) if nic else None)
    return base


def _job_ranks(t: Any, topo: str, gpus: int | None) -> int:
    """The ranks of a job on the cluster's first `gpus` endpoints (all of them when None), or a typed error."""
    have = len(t.endpoints())
    if gpus is not None and gpus > have:
        raise InvalidArgument(f"--gpus {gpus}, but {getattr(t, 'name', topo)} has {have} GPUs",
                              f"use --gpus {have} or fewer, or more servers (--nodes)")
    return gpus or have


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
    nranks: int | None = typer.Option(None, "--gpus", "--nranks", "-n", min=1, help="ranks: a job on the "
                                      "cluster's first N GPUs, servers filled in order (default: every endpoint)"),
    min_size: str = typer.Option("8", "--min", "-b", help="smallest size (nccl-tests -b)"),
    max_size: str | None = typer.Option(None, "--max", "-e", help="largest size (nccl-tests -e); default: "
                                        "from 128MiB on, grow by --factor until busbw gains under 2% x (factor-1) "
                                        "per step, i.e. is within 2% of its asymptote, at most 64GiB"),
    factor: int = typer.Option(2, "--factor", "-f", min=2, help="size multiplier (nccl-tests -f)"),
    engine: str = typer.Option("analytic", "--engine", help="analytic or flow"),
    dtype: str = typer.Option("float32", "--dtype"),
    root: int = typer.Option(0, "--root", min=0),
    nchannels: int | None = typer.Option(None, "--nchannels", min=1, help="channels (rings) for ring algorithms"),
    param: list[str] = typer.Option([], "--param", help="simulator parameter override key=value (repeatable)"),
    json_out: bool = typer.Option(False, "--json", help="print the rows (ringflow bench keys + algorithm) as JSON"),
    out: str | None = typer.Option(None, "-o", "--out", help="also write the rows as JSON to this file"),
    plot: str | None = typer.Option(None, "--plot", help="draw busbw vs size into this image (.png, .svg, .pdf)"),
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
    from ..sim.nccl_tuner import nccl_has
    from ..sim.params import params_for
    from ..sim.size_sweep import AUTO_FROM_BYTES, sweep
    from ..units import format_size, parse_size, size_range

    if plot:
        check_plot_path(plot)
    coll = Collective.parse(collective)
    t = _topology(topo, nodes, fabric_options(fabric, tiers, radix, oversub, planes), nic)
    prm = params_for(t, _parse_params(param))
    lo = max(1, parse_size(min_size))
    sizes = size_range(lo, parse_size(max_size) if max_size else max(lo, AUTO_FROM_BYTES), factor)
    n = _job_ranks(t, topo, nranks)
    if nccl:
        if algo:
            raise InvalidArgument("--nccl picks the algorithm per size; --algo fixes it", "give one of them")
        _nccl_table(t, topo, coll, sizes, n, dtype, engine, prm, sharp, json_out, out, plot, max_size is None,
                    factor)
        return
    with Progress(console=err_console, transient=True, disable=json_out) as bar:
        task = bar.add_task(f"simulating {coll.value} on {n} ranks ({engine})", total=None if max_size is None
                            else len(sizes))
        inner = bar.add_task("  flow engine: ranks' progress", total=1.0, visible=engine == "flow")

        def run(size: int, timeline: bool = False) -> Any:
            bar.update(inner, completed=0.0)
            res = simulate(t, coll, size, algorithm=algo, nranks=n, engine=engine, dtype=dtype, root=root,
                           nchannels=nchannels, params=prm, timeline=timeline,
                           progress=lambda f: bar.update(inner, completed=min(1.0, f)))
            bar.advance(task)
            return res
        results, flat = sweep(sizes, factor, run, lambda r: r.row()["busbw_GBps"], grow=max_size is None)
        if trace:
            results[-1] = run(results[-1].size_bytes, timeline=True)
    rows = [{**r.row(), "in_nccl": nccl_has(coll, r.row()["algorithm"])} for r in results]
    if out:
        write_json(out, rows)
    if plot:
        from ..sim.plot import plot_busbw
        plot_busbw({f"{engine}": rows}, plot, title=f"{coll.value} on {getattr(t, 'name', topo)} ({n} ranks)")
    if json_out:
        print_json(rows)
        if plot:
            report_plot(plot, json_out=True)
        return
    console.print(f"# {coll.value} on {getattr(t, 'name', topo)}: {n} ranks, engine {engine}, dtype {dtype}")
    print_table(None, ["size", "count", "type", "algorithm", "in NCCL", "proto", "time(us)", "algbw(GB/s)",
                       "busbw(GB/s)"],
                [[format_size(r["size_bytes"]), r["count"], r["dtype"], r["algorithm"],
                  "yes" if r["in_nccl"] else "no", r["protocol"], f"{r['time_us']:.2f}", f"{r['algbw_GBps']:.2f}",
                  f"{r['busbw_GBps']:.2f}"] for r in rows])
    _legend(rows, max_size is None, flat, factor)
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
        report_plot(plot)


def _legend(rows: list[dict[str, Any]], grown: bool, flat: bool, factor: int) -> None:
    """The table's footnotes: ringflow-only algorithms, and where the sizes stopped."""
    from ..sim.size_sweep import AUTO_CAP_BYTES, SATURATED_WITHIN
    from ..units import format_size
    own = sorted({r["algorithm"] for r in rows if not r["in_nccl"]})
    if own:
        console.print(f"in NCCL = no: ringflow-only ({', '.join(own)}: NCCL has no such algorithm for this "
                      "collective; force NCCL's with --algo ring, or see its choice with --nccl)")
    if not grown:
        return
    last = format_size(rows[-1]["size_bytes"])
    if flat:
        console.print(f"largest size {last}: busbw saturated (gained under {SATURATED_WITHIN * (factor - 1):.0%} "
                      f"over the last x{factor}: within about {SATURATED_WITHIN:.0%} of its asymptote); --max sets "
                      "another")
    elif rows[-1]["size_bytes"] * factor > AUTO_CAP_BYTES:
        console.print(f"busbw still grows at {last} (latency-bound at this scale); give --max for larger sizes")


def _nccl_table(t: Any, topo: str, coll: Any, sizes: list[int], n: int, dtype: str, engine: str, prm: Any,
                sharp: bool, json_out: bool, out: str | None, plot: str | None, grow: bool, factor: int) -> None:
    """`ringflow sim --nccl`: NCCL's choice and predicted time per size, ringflow's simulation beside it."""
    from ..sim.nccl_tuner import NCCL_TUNING_SOURCE, nccl_rows
    from ..sim.size_sweep import sweep
    from ..units import format_size

    def run(size: int) -> dict[str, Any]:
        return nccl_rows(t, coll, [size], n, dtype=dtype, engine=engine, params=prm, collnet=sharp)[0]
    rows, flat = sweep(sizes, factor, run, lambda r: r["busbw_GBps"], grow=grow)
    if out:
        write_json(out, rows)
    if plot:
        from ..sim.plot import plot_busbw
        series = {"NCCL's tuning model": rows}
        simulated = [{**r, "busbw_GBps": r["busbw_GBps"] * r["time_us"] / r["sim_time_us"]} for r in rows
                     if r["sim_time_us"]]
        if simulated:
            series[f"ringflow sim ({engine}), same algorithm"] = simulated
        plot_busbw(series, plot, title=f"{coll.value} on {getattr(t, 'name', topo)} ({n} ranks), NCCL's choice")
    if json_out:
        print_json(rows)
        if plot:
            report_plot(plot, json_out=True)
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
    _legend([{**r, "in_nccl": True} for r in rows], grow, flat, factor)
    if out:
        console.print(f"wrote {len(rows)} rows to {out}")
    if plot:
        report_plot(plot)


def validate_multihost(topo: str | None, hosts: int, per_host: int, rate_mbit: float,
                       out: str | None, json_print: bool = False) -> None:
    """`ringflow validate multihost`: flat ring vs hierarchical all-reduce on emulated hosts, measured and
    predicted on a cluster of `topo` (default: the host-cpu preset with `per_host` ranks)."""
    from ..hostmodel import multihost
    from ..topology import load_topology
    from ..units import format_size
    host_topo = load_topology(topo or f"host-cpu:{per_host}")
    rows, why = multihost.run(host_topo, hosts, per_host, rate_mbit)
    if rows is None:
        (err_console if json_print else console).print(f"[yellow]skipped:[/] {why}")
        if json_print:
            print_json({"skipped": why, "rows": []})
        return
    if out:
        write_json(out, rows)
    if json_print:
        print_json(rows)
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


def validate_gpu(out: str | None, plot: str | None = None, json_print: bool = False) -> None:
    """`ringflow validate gpu`: published NCCL results on GPU servers next to the simulator's prediction."""
    from ..sim.references import evaluate
    from ..units import format_size
    rows = evaluate()
    if out:
        write_json(out, rows)
    if plot:
        from ..sim.plot import plot_references
        plot_references(rows, plot)
    if json_print:
        print_json(rows)
        if plot:
            report_plot(plot, json_out=True)
        return
    print_table("published NCCL busbw vs simulator (all_reduce)",
                ["reference", "size", "published GB/s", "predicted GB/s", "error", "algorithm", "kind"],
                [[r["name"], format_size(r["size_bytes"]), f"{r['reference_GBps']:.1f}", f"{r['predicted_GBps']:.1f}",
                  f"{r['error']:+.1%}", f"{r['algorithm']}/{r['protocol']}",
                  "fitted" if r["fitted"] else ("not modelled" if not r["modelled"] else "check")] for r in rows])
    for r in rows:
        console.print(f"- {r['name']}: {r['what']}; source: {r['source']}" + (f" ({r['note']})" if r["note"] else ""))
    if plot:
        report_plot(plot)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("sim")(sim_command)
