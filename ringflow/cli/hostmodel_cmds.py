"""`ringflow calibrate` and `ringflow validate`: fit the host cost model, check it out of sample."""
from __future__ import annotations

import shlex
import sys

import typer

from ..errors import InvalidArgument
from .common import console, print_json, print_table, write_json


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgument(f"{what} {text!r} is not a comma list of integers", f"e.g. {what} 2,4") from None
    if not out or min(out) < 2:
        raise InvalidArgument(f"{what} {text!r}: need rank counts of 2 or more", f"e.g. {what} 2,4")
    return out


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    out = [x.strip().replace("-", "_") for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise InvalidArgument(f"{what} {text!r}", f"choose from {', '.join(allowed)}")
    return out


def _command_line() -> str:
    return "ringflow " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def calibrate_command(
    ranks: str = typer.Option("2,4", "--ranks", help="rank counts to measure"),
    transports: str = typer.Option("shm,tcp", "--transports", help="shm (shared memory) and/or tcp"),
    out: str = typer.Option("host-model.json", "-o", "--out", help="host-model file to write"),
    quick: bool = typer.Option(False, "--quick", help="two sizes only (a smoke test, not a usable model)"),
    collectives: str = typer.Option("all", "--collectives", help="comma list or 'all'"),
    refit_from: str | None = typer.Option(None, "--refit", help="measure nothing: fit again from the "
                                             "calibration rows this host-model file stores"),
) -> None:
    """Measure every algorithm on local ranks (shm and TCP) and fit this host's cost model."""
    from ..hostmodel.features import TRANSPORTS
    from ..hostmodel.model import PARAM_MEANINGS, HostCostModel, read_file, write_file
    from ..hostmodel.sweep import COLLECTIVES, calibrate, refit
    if refit_from:
        doc = refit(read_file(refit_from), progress=console.print, command=_command_line())
        trs = list(doc["transports"])
    else:
        colls = list(COLLECTIVES) if collectives == "all" else _names(collectives, COLLECTIVES, "--collectives")
        trs = _names(transports, TRANSPORTS, "--transports")
        doc = calibrate(_ints(ranks, "--ranks"), trs, quick=quick, collectives=colls, progress=console.print,
                        command=_command_line())
    write_file(out, doc)
    models = {tr: HostCostModel.from_dict(tr, doc["transports"][tr]) for tr in trs}
    print_table("host cost model", ["parameter", *trs, "meaning"],
                [[k, *(f"{getattr(m.params, k):.4g}" for m in models.values()), v] for k, v in PARAM_MEANINGS.items()]
                + [["margin", *(f"{m.margin:.3f}" for m in models.values()), "1 + p90 cross-validated error"]])
    console.print(f"measured in {doc['meta']['measure_s']:.0f} s, {doc['meta'].get('total_s', 0):.0f} s in all"
                  + (f" (fitted again from {refit_from})" if refit_from else "")
                  + f"; wrote {out} (use it with RINGFLOW_TUNER_MODEL={out})")


def validate_command(
    host: bool = typer.Option(False, "--host", help="the host cost model vs `ringflow bench`, out of sample"),
    model: str | None = typer.Option(None, "--model", help="--host: host-model file (default: calibrate first)"),
    ranks: str = typer.Option("2,3,4,6,8", "--ranks", help="--host: rank counts to validate"),
    transports: str = typer.Option("shm,tcp", "--transports", help="--host: shm and/or tcp"),
    calibrate_ranks: str = typer.Option("2,4", "--calibrate-ranks", help="--host without --model: ranks to "
                                        "calibrate at"),
    report: str | None = typer.Option(None, "--report", help="--host, --published: write the markdown report here"),
    json_print: bool = typer.Option(False, "--json", help="print the results as JSON"),
    out: str | None = typer.Option(None, "-o", "--out", help="write the results (JSON) to this file"),
    gpu: bool = typer.Option(False, "--gpu", help="published NCCL results on DGX servers vs the simulator"),
    plot: str | None = typer.Option(None, "--plot", help="--gpu: published vs predicted busbw as bars in this PNG"),
    multihost: bool = typer.Option(False, "--multihost", help="flat ring vs hierarchical all-reduce on emulated "
                                   "hosts (network namespaces, tbf-limited links) vs the simulator"),
    topo: str | None = typer.Option(None, "--topo", help="--multihost: the host topology (default host-cpu)"),
    hosts: int = typer.Option(2, "--hosts", help="--multihost: emulated hosts"),
    per_host: int = typer.Option(2, "--per-host", help="--multihost: ranks per host"),
    rate_mbit: float = typer.Option(1000.0, "--rate-mbit", help="--multihost: link rate (tbf) in Mbit/s"),
    published: bool = typer.Option(False, "--published", help="published nccl-tests and training throughputs vs "
                                   "the simulator and the training model (fitted on half, checked on the rest)"),
    data: str | None = typer.Option(None, "--data", help="--published: cases file (default: the packaged one)"),
    nccl: bool = typer.Option(False, "--nccl", help="--published: collectives without a forced algorithm take "
                              "NCCL's own choice (as ringflow sim --nccl) instead of the simulator's"),
) -> None:
    """Check a model against measurements: --host (this host's cost model), --gpu or --multihost (the simulator),
    --published (published measurements, held out)."""
    if sum((host, gpu, multihost, published)) != 1:
        raise InvalidArgument("choose one of --host, --gpu, --multihost, --published", "e.g. ringflow validate --host")
    if plot and not gpu:
        raise InvalidArgument("--plot draws the --gpu references", "add --gpu")
    if (data or nccl) and not published:
        raise InvalidArgument("--data and --nccl go with --published", "add --published")
    if published:
        _validate_published(data, report, json_print, out, "nccl" if nccl else "sim")
        return
    from . import sim_cmds
    if gpu:
        sim_cmds.validate_gpu(out, plot)
        return
    if multihost:
        sim_cmds.validate_multihost(topo, hosts, per_host, rate_mbit, out)
        return
    _validate_host(model, _ints(ranks, "--ranks"), transports, calibrate_ranks, report, json_print, out)


def _validate_host(model_path: str | None, ranks: list[int], transports: str, calibrate_ranks: str,
                   report: str | None, json_print: bool, out: str | None) -> None:
    from ..hostmodel.features import TRANSPORTS
    from ..hostmodel.model import HostCostModel, read_file, write_file
    from ..hostmodel.report import write_report
    from ..hostmodel.sweep import calibrate
    from ..hostmodel.validate import validate
    from ..units import format_size
    command = _command_line()
    trs = _names(transports, TRANSPORTS, "--transports")
    if model_path is None:
        model_path = "host-model.json"
        console.print(f"calibrating first (ringflow calibrate -o {model_path}) ...")
        write_file(model_path, calibrate(_ints(calibrate_ranks, "--calibrate-ranks"), trs, progress=console.print,
                                         command=command))
    doc = read_file(model_path)
    models = {tr: HostCostModel.load(model_path, tr) for tr in trs}
    res = validate(models, ranks=ranks, progress=console.print)
    res["command"], res["model"] = command, model_path
    for tr in trs:
        print_table(f"host model vs ringflow bench, {tr}",
                    ["ranks", "calibrated", "sizes", "median error", "p90 error", "noise floor"],
                    [[s["nranks"], "yes" if s["calibrated"] else "no", s["n"], f"{s['median']:.1%}", f"{s['p90']:.1%}",
                      f"{s['noise_floor']:.0%}"] for s in res["summary"] if s["transport"] == tr])
    cs = res["choice_summary"]
    if cs["switched"]:
        print_table("model choice vs flat choice (timed interleaved in one job)",
                    ["transport", "ranks", "collective", "size", "flat", "model", "flat (us)", "model (us)"],
                    [[c["transport"], c["nranks"], c["collective"], format_size(c["size_bytes"]), c["flat"],
                      c["model"], f"{c['flat_us']:.1f}", f"{c['model_us']:.1f}"] for c in res["choice"]])
        console.print(f"the model's choice was at least as fast on {cs['at_least_as_fast']} of {cs['switched']} calls")
    else:
        console.print("the model kept the flat choice on every validated call")
    if report:
        write_report(report, res, models, command, model_path, doc.get("meta"))
        console.print(f"wrote {report}")
    if out:
        write_json(out, res)
    if json_print:
        print_json(res)


def _validate_published(data: str | None, report: str | None, json_print: bool, out: str | None,
                        chooser: str) -> None:
    from rich.markup import escape

    from ..workload import published_report as pr
    from ..workload.published import evaluate
    res = evaluate(data, chooser=chooser)

    def table(title: str, header: list[str], rows: list[list[str]]) -> None:
        print_table(title, header, [[escape(str(x)) for x in r] for r in rows])
    table("fitted constants (fitting set only)", pr.CONST_HEADER, pr.constant_rows(res))
    for which in ("fit", "held_out"):
        table(f"{which.replace('_', '-')} set: predicted vs published", pr.CASE_HEADER, pr.case_rows(res, which))
    table("summary per set and GPU generation", pr.GROUP_HEADER, pr.group_rows(res))
    table("targets", ["target", "this run", "status", "cases missing it"], pr.target_rows(res))
    table("fitted constants vs library defaults", pr.COMPARE_HEADER, pr.compare_rows(res))
    if report:
        pr.write_markdown(report, res, _command_line())
        console.print(f"wrote {report}")
    if out:
        write_json(out, res)
    if json_print:
        print_json(res)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("calibrate")(calibrate_command)
    app.command("validate")(validate_command)
