"""`ringflow record` (record a run, merge a recording) and `ringflow diagnose` (who holds everyone up)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..errors import InvalidArgument, Terminated
from .common import check_plot_path, console, err_console, print_json, report_plot, write_json

if TYPE_CHECKING:
    from ..workload.replay import Replay

MERGE_USAGE = "ringflow record merge DIR [-o TRACE.json]"
CHAKRA_USAGE = "ringflow record chakra TRACE -o DIR [--name NAME]"


def _option(args: list[str], names: tuple[str, ...], usage: str) -> tuple[str | None, list[str]]:
    """Take `--opt VALUE` out of args."""
    for n in names:
        if n in args:
            i = args.index(n)
            if i + 1 >= len(args):
                raise InvalidArgument(f"{n} needs a value", usage)
            return args[i + 1], args[:i] + args[i + 2:]
    return None, args


def _chakra(args: list[str]) -> None:
    """`record chakra TRACE -o DIR`: the trace as Chakra execution traces, one `<name>.<rank>.et` per rank."""
    from ..workload.chakra import export
    from ..workload.recorded import load
    out, args = _option(args, ("-o", "--out"), CHAKRA_USAGE)
    name, args = _option(args, ("--name",), CHAKRA_USAGE)
    if out is None or len(args) != 1:
        raise InvalidArgument(f"record chakra takes one trace and -o DIR, got {args}", CHAKRA_USAGE)
    paths = export(load(args[0]), out, name or "ringflow")
    console.print(f"wrote {len(paths)} Chakra files ({paths[0].name} ...) into {out}")


def _merge(args: list[str]) -> None:
    """`record merge DIR [-o FILE]`: one trace from a recording (default DIR/trace.json)."""
    from ..workload.recorded import merge
    out, args = _option(args, ("-o", "--out"), MERGE_USAGE)
    if len(args) != 1:
        raise InvalidArgument(f"record merge takes one directory, got {args}", MERGE_USAGE)
    trace = merge(args[0])
    path = out or str(Path(args[0]) / "trace.json")
    write_json(path, trace)
    ops = len({(c["comm"], c["lane"], c["seq"]) for c in trace["calls"] if c["lane"] == "coll"})
    console.print(f"merged {len(trace['ranks'])} ranks, {len(trace['calls'])} calls ({ops} collectives, "
                  f"{len(trace['groups'])} groups, clock: {trace['clock']}) into {path}")


def register(app: typer.Typer) -> None:
    """Add record / diagnose to the app."""

    @app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                            "allow_interspersed_args": False})
    def record_cmd(
        out: str | None = typer.Option(None, "-o", "--out", help="Directory the ranks write their records to."),
        program: list[str] = typer.Argument(..., help="the launcher command (e.g. ringflow run -n 4 python "
                                            "train.py), `merge DIR [-o FILE]`, or `chakra TRACE -o DIR`"),
    ) -> None:
        """Record every call of every rank of a launcher command into DIR (RINGFLOW_RECORD); `record merge DIR`
        joins the ranks' files into one trace; `record chakra TRACE -o DIR` exports it as Chakra files."""
        if program and program[0] in ("merge", "chakra"):
            (_merge if program[0] == "merge" else _chakra)(program[1:])
            return
        if not out:
            raise InvalidArgument("ringflow record needs -o DIR", "ringflow record -o DIR -- <launcher command>")
        d = Path(out).resolve()
        d.mkdir(parents=True, exist_ok=True)
        stale = list(d.glob("rank*.jsonl")) + list(d.glob("flight-rank*.json"))
        if stale:
            raise InvalidArgument(f"{d} already holds a recording ({stale[0].name})",
                                  "record into an empty directory")
        env = dict(os.environ, RINGFLOW_RECORD=str(d))
        cmd = program[1:] if program[0] == "--" else program
        try:
            child = subprocess.Popen(cmd, env=env)
        except FileNotFoundError:
            raise InvalidArgument(f"cannot run {cmd[0]!r}", "give the launcher command after --") from None
        try:
            code = child.wait()
        except (Terminated, KeyboardInterrupt) as exc:   # the launcher stops its ranks (SIGINT reached it too)
            if isinstance(exc, Terminated):
                child.send_signal(exc.signum)
            try:
                code = child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
        files = sorted(d.glob("rank*.jsonl"))
        print(f"ringflow record: {len(files)} rank files in {d} (exit code {code})", file=sys.stderr)
        raise typer.Exit(code)

    @app.command("diagnose")
    def diagnose_cmd(
        path: str = typer.Argument(..., help="A record or dump directory (RINGFLOW_RECORD / RINGFLOW_DUMP_DIR, or "
                                   "the job directory `ringflow run` printed), or a trace from `ringflow record "
                                   "merge`."),
        json_out: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
    ) -> None:
        """Say what each rank left on record, and name the ranks that never entered a collective others wait in,
        ranks that entered it after the others gave up, sequence mismatches, and stragglers."""
        from ..workload.diagnose import diagnose, render
        report = diagnose(path)
        if json_out:
            print_json(report)
        else:
            print(render(report))

    @app.command("replay")
    def replay_cmd(
        trace_path: str = typer.Argument(..., metavar="TRACE", help="A trace (`ringflow record merge`), a record "
                                         "directory, or Chakra files (a .et file or a directory of them)."),
        topo: str = typer.Option("dgx-h100", "--topo", help="A preset (replicated over --nodes) or a topology file."),
        nodes: int = typer.Option(1, "--nodes", min=1, help="Servers of the preset."),
        fabric: str = typer.Option("rail", "--fabric", help="Cluster fabric: rail or fat-tree."),
        mapping: str = typer.Option("block", "--map", help="Rank placement: block, round-robin, or a JSON file "
                                    "listing one endpoint per rank."),
        compute_scale: float = typer.Option(1.0, "--compute-scale", min=0.0, help="Factor on every recorded "
                                            "compute gap."),
        engine: str = typer.Option("flow", "--engine", help="Simulator engine: flow or analytic."),
        grow_dp: int = typer.Option(1, "--grow", min=1, help="Replay N data-parallel copies of the recorded job: "
                                    "world collectives span all copies, everything else stays in its copy."),
        step_site: str | None = typer.Option(None, "--step", help="Part of the file:line that starts a step "
                                             "(default: the world collective repeated most often)."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        plot: str | None = typer.Option(None, "--plot", help="Write a per-rank timeline image here (PNG/SVG)."),
        chrome: str | None = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace here."),
        contention: bool = typer.Option(True, "--contention/--no-contention", help="Simulate overlapping "
                                        "operations of the same kind together (flow engine) and replay again."),
        host_model: str | None = typer.Option(None, "--host-model", help="Instead of a cluster: price the "
                                              "collectives with this `ringflow calibrate` file and compare the "
                                              "communication time with the recorded one."),
        compute_model: str | None = typer.Option(None, "--compute-model", help="The model the recorded job trains "
                                                 "(a preset of `ringflow train` or a model file): each step's "
                                                 "compute becomes the model's on the topology's GPU."),
        model_layout: str = typer.Option("", "--model-layout", help="With --compute-model: the job's layout as "
                                         "key=value pairs (tp, pp, micro_batch, global_batch, seq_len, precision, "
                                         "recompute, ...); dp defaults to the replayed ranks / (tp x pp x cp)."),
        software: str | None = typer.Option(None, "--software", help="With --compute-model: the software "
                                            "profile (see `ringflow train --help`)."),
    ) -> None:
        """Predict a recorded job's step time on a modelled cluster: its compute gaps (scaled) and every call
        simulated on the GPUs its ranks are placed on."""
        from ..workload.recorded import load
        from ..workload.replay_sim import grow
        if plot:
            check_plot_path(plot)
        trace = grow(load(trace_path), grow_dp)
        if host_model:
            _same_host(trace, host_model, json_out)
            return
        t = _cluster(topo, nodes, fabric)
        gaps, from_model = None, None
        if compute_model:
            gaps, from_model = _model_gaps(trace, t, compute_model, model_layout, software, step_site,
                                           compute_scale)
        _replay_out(trace, t, dict(mapping=mapping, hosts=nodes, compute_scale=compute_scale, engine=engine,
                                   step_site=step_site, contention=contention, gaps=gaps), from_model,
                    chrome, plot, json_out, f"replay of {trace_path} on {topo} x {nodes} (map {mapping})")


def _cluster(topo: str, nodes: int, fabric: str) -> Any:
    """A preset replicated over `nodes` servers, or a topology file."""
    from ..topology import PRESETS, load_topology
    from ..workload.validation import cluster_for
    if topo.partition(":")[0] in PRESETS:
        return cluster_for(topo, nodes, None, fabric)
    return load_topology(topo)


def _replay_out(trace: dict, t: Any, kw: dict[str, Any], from_model: dict[str, Any] | None, chrome: str | None,
                plot: str | None, json_out: bool, title: str) -> None:
    """Run the replay and write what was asked: Chrome trace, plot, JSON or the table."""
    from ..workload.replay_sim import chrome_trace, replay_on
    res = replay_on(trace, t, **kw)
    if from_model:
        res["compute_model"] = from_model
    rep = res.pop("replay")
    for w in res["warnings"]:
        err_console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    if chrome:
        write_json(chrome, chrome_trace(rep))
    if plot:
        _plot(rep, plot)
    if json_out:
        print_json(res)
    else:
        _print_replay(res, f"{title}, {len(res['placement'])} ranks")
    if plot:
        report_plot(plot, json_out)


def _print_replay(res: dict[str, Any], title: str) -> None:
    """The replay's table: per step, then totals, contention and the busiest links."""
    from .common import print_table
    from_model = res.get("compute_model")
    if from_model:
        f = from_model["step_factors"]
        console.print(f"compute from {from_model['model']}: {from_model['step_compute_s'] * 1e3:.3f} ms per GPU "
                      f"per step (recorded compute scaled x{min(f):.3g} to x{max(f):.3g} per step)")
    print_table(title, ["step", "time (ms)", "comm share", "exposed comm (ms)"],
                [[r["step"], f"{r['time_s'] * 1e3:.3f}", f"{r['comm_share']:.0%}",
                  f"{r['exposed_comm_s'] * 1e3:.3f}"] for r in res["steps"]])
    cont = res["contention"]
    warm, steady, steps = res.get("warmup_step_s"), res["steady_steps"], res["steps"]
    left = ([f"warm-up step 0 ({warm * 1e3:.3f} ms)"] if warm is not None else []) + \
        ([f"step {steps[-1]['step']} (from the last step mark to the end of the recording)"]
         if len(steps) >= 3 else [])
    which = f"steps {steady[0]}-{steady[-1]}" if len(steady) > 1 else f"step {steady[0]}" if steady else "the run"
    console.print(f"steady-state step {res['step_s'] * 1e3:.3f} ms (mean of {which}"
                  + (f"; left out: {' and '.join(left)}" if left else "") + ")")
    console.print(f"whole replay {res['makespan_s'] * 1e3:.3f} ms; "
                  f"contention slowed {cont['operations_slowed']} operations (at most x{cont['max_factor']:.2f})")
    if res["busiest_links"]:
        print_table("busiest links", ["link", "tier", "bytes", "mean util"],
                    [[r["link"], r["tier"], f"{r['bytes']:.3g}", f"{r['util'] * 100:.3g}%"]
                     for r in res["busiest_links"]])


def _model_gaps(trace: dict, topo: Any, model_name: str, layout_text: str, software: str | None,
                step_site: str | None, compute_scale: float) -> tuple[dict[int, list[float]], dict[str, Any]]:
    """`replay --compute-model`: the trace's compute gaps rescaled per step to the model's compute on topo's GPU."""
    from ..workload.compute import gpu_of_topology, in_training
    from ..workload.models import load_model
    from ..workload.replay import nranks_of
    from ..workload.replay_compute import model_gaps, model_step_compute_s, parse_layout
    if compute_scale != 1.0:
        raise InvalidArgument("--compute-scale and --compute-model both set the compute time",
                              "give one of them")
    lay = parse_layout(layout_text, nranks_of(trace))
    model = load_model(model_name)
    step_s = model_step_compute_s(model, lay, in_training(gpu_of_topology(topo)), software)
    gaps, factors = model_gaps(trace, step_s, step_site)
    return gaps, {"model": model.name, "layout": lay.to_dict(), "step_compute_s": step_s,
                  "step_factors": factors}


def _same_host(trace: dict, path: str, json_out: bool) -> None:
    """`replay --host-model`: recorded vs modelled communication time, and the replayed run length."""
    from ..runtime.job.plugins import load_cost_model
    from ..workload.replay import replay
    from ..workload.replay_host import HostDurations, communication_time, exposed_time
    shm = len({v.get("hostname") for v in trace["ranks"].values()}) <= 1
    dur = HostDurations(load_cost_model(path, "shm" if shm else "tcp"), trace)
    rec, pred = communication_time(trace), communication_time(trace, dur)
    rep = replay(trace, dur)
    rec_exp, pred_exp = exposed_time(trace), sum(rep.comm_s.values()) / max(1, len(rep.comm_s))
    out = {"recorded_comm_s": rec, "predicted_comm_s": pred, "error": pred / rec - 1 if rec > 0 else None,
           "recorded_exposed_s": rec_exp, "predicted_exposed_s": pred_exp,
           "exposed_error": pred_exp / rec_exp - 1 if rec_exp > 0 else None, "replayed_s": rep.makespan_s}
    if json_out:
        print_json(out)
    else:
        def err(p: float, r: float) -> str:
            return f"{(p / r - 1) * 100:+.1f} %" if r > 0 else "-"
        console.print(f"communication: recorded {rec * 1e3:.3f} ms, host model {pred * 1e3:.3f} ms ({err(pred, rec)})"
                      f"; exposed per rank: recorded {rec_exp * 1e3:.3f} ms, replayed {pred_exp * 1e3:.3f} ms "
                      f"({err(pred_exp, rec_exp)}); replayed run {rep.makespan_s * 1e3:.3f} ms")


def _plot(rep: Replay, path: str) -> None:
    """A per-rank timeline of the replay (blocking calls dark, asynchronous ones light)."""
    from ..plotting import pyplot
    plt = pyplot()
    issues, ops = rep.issues, rep.ops
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(issues) + 1.5))
    for r, iss in issues.items():
        for k, _t, blocking in iss:
            s, e = ops[k]
            ax.barh(r, max(e - s, 1e-9) * 1e3, left=s * 1e3, color="tab:blue" if blocking else "tab:cyan")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("rank")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

