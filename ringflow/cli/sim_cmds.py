"""`ringflow sim`, `ringflow calibrate`, `ringflow validate`: the simulator's commands."""
from __future__ import annotations

from typing import Any, Optional

import typer

from ..errors import InvalidArgument
from .common import console, print_table, write_json


def _topology(topo: str, nodes: int, fabric: str, nic: Optional[str], oversub: float) -> Any:
    from ..topology import build_cluster, load_topology
    base = load_topology(topo)
    if nodes > 1:
        from ..units import parse_rate_gbps
        return build_cluster(base, nodes, fabric=fabric, nic_gbps=parse_rate_gbps(nic) if nic else None,
                             oversubscription=oversub)
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
    nodes: int = typer.Option(1, "--nodes", help="replicate the topology into a cluster of N servers"),
    fabric: str = typer.Option("rail", "--fabric", help="cluster fabric: rail or fat-tree"),
    nic: Optional[str] = typer.Option(None, "--nic", help="NIC speed for the cluster, e.g. 400G"),
    oversub: float = typer.Option(1.0, "--oversub", help="leaf-spine oversubscription of the cluster fabric"),
    algo: Optional[str] = typer.Option(None, "--algo", help="algorithm (default: the tuner's choice per size; "
                                       "nvls: in-switch reduction, all_reduce / reduce_scatter / "
                                       "all_gather on one Hopper+ NVSwitch)"),
    nranks: Optional[int] = typer.Option(None, "--nranks", "-n", help="ranks (default: every endpoint)"),
    min_size: str = typer.Option("8", "--min", "-b", help="smallest size (nccl-tests -b)"),
    max_size: str = typer.Option("128MiB", "--max", "-e", help="largest size (nccl-tests -e)"),
    factor: int = typer.Option(2, "--factor", "-f", help="size multiplier (nccl-tests -f)"),
    engine: str = typer.Option("analytic", "--engine", help="analytic or flow"),
    dtype: str = typer.Option("float32", "--dtype"),
    root: int = typer.Option(0, "--root"),
    nchannels: Optional[int] = typer.Option(None, "--nchannels", help="channels (rings) for ring algorithms"),
    param: list[str] = typer.Option([], "--param", help="simulator parameter override key=value (repeatable)"),
    json_out: Optional[str] = typer.Option(None, "--json", help="write rows (ringflow bench keys + algorithm)"),
    plot: Optional[str] = typer.Option(None, "--plot", help="draw busbw vs size into this PNG"),
    trace: Optional[str] = typer.Option(None, "--trace", help="Chrome trace JSON of the largest size"),
    details: bool = typer.Option(False, "--details", help="per-tier traffic and busiest links of the largest size"),
    tuner: str = typer.Option("flat", "--tuner", help="flat: the runtime's alpha-beta tuner (or --algo); "
                              "calibrated: what RINGFLOW_TUNER_TOPO=--topo runs (a `ringflow calibrate` file), "
                              "beside the flat choice, both priced on that host"),
    transport: str = typer.Option("shm", "--transport", help="--tuner calibrated: the ranks' transport, shm or tcp"),
    in_place: Optional[bool] = typer.Option(None, "--in-place/--out-of-place", help="--tuner calibrated: the "
                                            "calls' buffers (default: as ringflow bench calls them)"),
) -> None:
    """Predict nccl-tests style results of a collective on a modelled machine or cluster."""
    from rich.progress import Progress

    from ..algorithms.schedule import Collective
    from ..sim.api import simulate
    from ..sim.params import params_for
    from ..units import format_size, parse_size, size_range

    coll = Collective.parse(collective)
    if tuner not in ("flat", "calibrated"):
        raise InvalidArgument(f"--tuner {tuner!r} is unknown", "use flat or calibrated")
    if tuner == "calibrated":
        others = [flag for flag, on in (("--nodes", nodes > 1), ("--algo", algo is not None), ("--engine flow", engine != "analytic"),
                                        ("--nchannels", nchannels is not None), ("--param", bool(param)),
                                        ("--trace", trace is not None), ("--details", details)) if on]
        if others:
            raise InvalidArgument(f"--tuner calibrated prices the runtime's own choices on one calibrated host; "
                                  f"{', '.join(others)} do not apply", "drop them, or use --tuner flat")
        _calibrated_sweep(coll, topo, transport, nranks, parse_size(min_size), parse_size(max_size), factor, dtype,
                          in_place, json_out, plot)
        return
    t = _topology(topo, nodes, fabric, nic, oversub)
    prm = params_for(t, _parse_params(param))
    sizes = size_range(max(1, parse_size(min_size)), parse_size(max_size), factor)
    n = nranks or len(t.endpoints())
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
    if json_out:
        write_json(json_out, rows)
        console.print(f"wrote {len(rows)} rows to {json_out}")
    if trace:
        from ..sim.trace import write_chrome_trace
        nev = write_chrome_trace(last, trace)
        console.print(f"wrote {nev} trace events to {trace} (open in chrome://tracing or ui.perfetto.dev)")
    if plot:
        from ..sim.plot import plot_busbw
        plot_busbw({f"{engine}": rows}, plot, title=f"{coll.value} on {getattr(t, 'name', topo)} ({n} ranks)")
        console.print(f"wrote {plot}")


def _calibrated_sweep(coll: Any, topo: str, transport: str, nranks: Optional[int], lo: int, hi: int, factor: int,
                      dtype: str, in_place: Optional[bool], json_out: Optional[str], plot: Optional[str]) -> None:
    """`ringflow sim --tuner calibrated`: per size, what calibrated tuning runs and what the flat tuner would."""
    from rich.progress import Progress

    from ..sim.api import itemsize_of
    from ..sim.tuning import load_host_model, sweep
    from ..units import format_size, size_range
    host = load_host_model(topo, transport)
    n = nranks or len(host.topo.endpoints())
    sizes = size_range(max(1, lo), hi, factor)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"pricing {coll.value} candidates on {n} ranks ({transport})", total=len(sizes))
        rows = sweep(host, coll, n, sizes, itemsize_of(dtype), in_place, progress=lambda: bar.advance(task))
    console.print(f"# {coll.value} on the calibrated host {topo}: {n} ranks over {transport}, dtype {dtype}, "
                  f"{'in place' if rows and rows[0]['in_place'] else 'out of place'}; calibrated tuning beside the flat tuner")
    print_table(None, ["size", "algorithm", "segs", "time(us)", "busbw(GB/s)", "flat algo", "segs", "flat(us)", "gain"],
                [[format_size(r["size_bytes"]), r["algorithm"], r["nsegs"], f"{r['time_us']:.1f}", f"{r['busbw_GBps']:.3f}",
                  r["flat_algorithm"], r["flat_nsegs"], f"{r['flat_time_us']:.1f}", f"{r['gain']:.2f}x"] for r in rows])
    changed = sum(r["changed"] for r in rows)
    console.print(f"calibrated tuning changes the choice at {changed} of {len(rows)} sizes")
    if json_out:
        write_json(json_out, rows)
        console.print(f"wrote {len(rows)} rows to {json_out}")
    if plot:
        from ..sim.plot import plot_busbw
        flat = [{"size_bytes": r["size_bytes"], "busbw_GBps": r["flat_busbw_GBps"]} for r in rows]
        plot_busbw({"calibrated tuner": rows, "flat tuner": flat}, plot,
                   title=f"{coll.value} on {n} ranks over {transport} (calibrated host)")
        console.print(f"wrote {plot}")


def calibrate_command(
    out: str = typer.Option("host-calibrated.yaml", "--out", "-o", help="topology file to write"),
    nprocs: int = typer.Option(4, "--nprocs", help="PROC endpoints in the written host-cpu topology"),
    quick: bool = typer.Option(False, "--quick", help="fewer sizes and iterations"),
    repeats: int = typer.Option(1, "--repeats", help="calibration jobs per transport and rank count; every "
                                "time is their median (a steadier file for RINGFLOW_TUNER_TOPO)"),
    residuals_json: Optional[str] = typer.Option(None, "--residuals", help="also write every calibration step "
                                                 "predicted back from the fit (measured, predicted, error) as JSON"),
) -> None:
    """Measure this machine's shm / TCP bandwidth and latency with the runtime; write a host-cpu topology."""
    from ..sim.calibrate import busy_warning, calibrate
    from ..sim.residuals import calibration_residuals, summarize
    from ..units import format_size
    warn = busy_warning()
    if warn:
        console.print(f"[yellow]warning:[/] {warn}")
    topo, report = calibrate(nprocs=nprocs, quick=quick, repeats=repeats)
    topo.save(out)
    print_table("calibration (measured with ringflow's runtime)", ["parameter", "value", "from"],
                [[k, "none" if v["value"] is None else f"{v['value']:.4g}", v["from"]] for k, v in report.items()])
    rows = calibration_residuals(topo, topo.meta["sim"]["calibration"]["raw"])
    print_table("the fitted model on the calibration's own steps (predicted - measured) / measured",
                ["transport", "ranks", "step", "median |error|", "worst size", "worst error"],
                [[s["transport"], s["nranks"], s["step"], f"{s['median_abs_error']:.1%}",
                  format_size(s["worst_size_bytes"]), f"{s['worst_error']:+.1%}"] for s in summarize(rows)])
    if residuals_json:
        write_json(residuals_json, rows)
    console.print(f"wrote {out}: use it with --topo {out}")


def validate_command(
    topo: Optional[str] = typer.Option(None, "--topo", help="calibrated topology (default: every bench job "
                                       "calibrates first, with the same processes)"),
    ranks: str = typer.Option("2,4", "--ranks", help="rank counts"),
    collectives: str = typer.Option("all", "--collectives", help="comma list or 'all'"),
    min_size: str = typer.Option("64KiB", "--min"),
    max_size: str = typer.Option("16MiB", "--max"),
    tolerance: float = typer.Option(0.15, "--tolerance", help="allowed relative error per size"),
    json_out: Optional[str] = typer.Option(None, "--json"),
    quick: bool = typer.Option(False, "--quick"),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="bench jobs per configuration (medians are "
                                          "compared; default 6, validate.DEFAULT_REPEATS)"),
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats", help="more jobs, up to this many, for a "
                                              "configuration whose jobs disagree by more than the tolerance on "
                                              "over a fifth of its sizes (default: --repeats, no more)"),
    passes: Optional[int] = typer.Option(None, "--passes", help="sweeps each job's rows are timed in, interleaved "
                                         "with its calibration's (default: as many as its sweeps, 5; a burst of "
                                         "host noise meets one of them)"),
    transports: str = typer.Option("shm,tcp", "--transports"),
    gpu: bool = typer.Option(False, "--gpu", help="instead: published NCCL results on DGX servers vs predicted"),
    multihost: bool = typer.Option(False, "--multihost", help="instead: flat ring vs hierarchical all-reduce on "
                                   "emulated hosts (network namespaces, tbf-limited links)"),
    hosts: int = typer.Option(2, "--hosts", help="--multihost: emulated hosts"),
    per_host: int = typer.Option(2, "--per-host", help="--multihost: ranks per host"),
    rate_mbit: float = typer.Option(1000.0, "--rate-mbit", help="--multihost: link rate (tbf) in Mbit/s"),
    record: Optional[str] = typer.Option(None, "--record", help="also write every bench job (calibration and "
                                         "rows) to this file (gzip-compressed where it ends in .gz)"),
    replay_file: Optional[str] = typer.Option(None, "--replay", help="measure nothing: predict the jobs a "
                                              "--record file holds with this code's model"),
    tuned: bool = typer.Option(False, "--tuned", help="the bench jobs pick algorithms with the simulator on "
                               "the calibrated host (RINGFLOW_TUNER_TOPO), so the model is checked on its "
                               "own choices"),
    plot: Optional[str] = typer.Option(None, "--plot", help="--gpu: published vs predicted busbw as bars in this PNG"),
) -> None:
    """Run `ringflow bench` (shm and TCP-only) and show predicted vs measured side by side."""
    if plot and not gpu:
        raise InvalidArgument("--plot draws the --gpu references", "add --gpu, or use --json for the table")
    if gpu:
        _gpu_references(json_out, plot)
        return
    if multihost:
        _multihost(topo, hosts, per_host, rate_mbit, tolerance, json_out, quick)
        return
    from ..sim.calibrate import busy_warning
    from ..sim.validate import DEFAULT_REPEATS, replay, validate
    repeats = DEFAULT_REPEATS if repeats is None else repeats
    if replay_file:
        rows, ok = replay(replay_file, topo, tolerance)
    else:
        warn = busy_warning()
        if warn:
            console.print(f"[yellow]warning:[/] {warn}")
        rows, ok = validate(topo=topo, ranks=[int(x) for x in ranks.split(",") if x],
                            collectives=None if collectives == "all" else collectives.split(","),
                            min_size=min_size, max_size=max_size, tolerance=tolerance, quick=quick,
                            console=console, repeats=repeats, transports=tuple(transports.split(",")),
                            record=record, tuned=tuned, max_repeats=max(repeats, max_repeats or repeats),
                            passes=passes)
    from ..units import format_size
    print_table("predicted vs measured (ringflow bench)",
                ["transport", "n", "collective", "algorithm", "size", "measured(us)", "run spread", "predicted(us)",
                 "error", ""],
                [[r["transport"], r["nranks"], r["collective"], r["algorithm"], format_size(r["size_bytes"]),
                  f"{r['measured_us']:.1f}", f"{r.get('spread', 0.0):+.0%}", f"{r['predicted_us']:.1f}",
                  f"{r['error']:+.1%}", "ok" if abs(r["error"]) <= tolerance else "OFF"] for r in rows])
    console.print(noise_summary(rows, tolerance))
    if json_out:
        write_json(json_out, rows)
    if not ok:
        raise typer.Exit(1)


def noise_summary(rows: list[dict], tolerance: float) -> str:
    """How many rows are within tolerance, overall and among rows the bench itself measured steadily."""
    within = sum(abs(r["error"]) <= tolerance for r in rows)
    text = f"{within}/{len(rows)} sizes within {tolerance:.0%}"
    if any(r.get("jobs", 1) > 1 for r in rows):
        steady = [r for r in rows if r.get("spread", 0.0) <= tolerance]
        ok = sum(abs(r["error"]) <= tolerance for r in steady)
        text += (f"; the bench's own jobs disagreed by more than {tolerance:.0%} on {len(rows) - len(steady)} "
                 f"sizes; of the {len(steady)} it measured steadily, {ok} are within {tolerance:.0%}")
    for key, what in (("set_aside_jobs", "jobs set aside and run again because other processes' work ran "
                                         "beside them"),
                      ("busy_jobs", "jobs that ran beside other processes' work (their times include it)")):
        counts = {(r["transport"], r["nranks"]): r.get(key, 0) for r in rows}   # per configuration
        if any(counts.values()):
            text += f"; {what}: " + ", ".join(f"{tr}{n} {k}" for (tr, n), k in counts.items() if k)
    return text


def _multihost(topo: Optional[str], hosts: int, per_host: int, rate_mbit: float, tolerance: float,
               json_out: Optional[str], quick: bool) -> None:
    from ..sim import multihost
    from ..units import format_size
    if topo is None:
        from ..sim.calibrate import calibrate
        console.print("calibrating this machine first (ringflow calibrate)...")
        host_topo, _ = calibrate(nprocs=per_host, quick=quick)
    else:
        from ..topology import load_topology
        host_topo = load_topology(topo)
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


def _gpu_references(json_out: Optional[str], plot: Optional[str] = None) -> None:
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
    app.command("calibrate")(calibrate_command)
    app.command("validate")(validate_command)
