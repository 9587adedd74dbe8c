"""`ringflow calibrate` and `ringflow validate`: fit the host cost model, check it out of sample."""
from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.core

from ..errors import InvalidArgument
from .common import check_plot_path, console, err_console, print_json, print_table, write_json


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


def _command_line(report: bool = False) -> str:
    """This command line; for a report, in the subcommand form and without the options that only choose where the
    results go (-o, --json), so that the same check reproduces the same report wherever its JSON went."""
    args = sys.argv[1:]
    if report:
        if args[:1] == ["validate"]:
            modes = [a for a in args if a in LEGACY_MODES]
            if modes and args[1:2] != [LEGACY_MODES[modes[0]]]:
                args = ["validate", LEGACY_MODES[modes[0]], *[a for a in args[1:] if a != modes[0]]]
        kept: list[str] = []
        skip = False
        for a in args:
            if skip or a == "--json" or a.startswith(("--out=", "-o=")):
                skip = False
                continue
            skip = a in ("-o", "--out")
            if not skip:
                kept.append(a)
        args = kept
    return "ringflow " + " ".join(shlex.quote(a) for a in args)


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


LEGACY_MODES = {"--host": "host", "--gpu": "gpu", "--multihost": "multihost", "--published": "published"}


def legacy_validate_args(args: list[str]) -> list[str]:
    """`validate --gpu ...` (the one-command form, kept for one release) as `validate gpu ...`, with a warning."""
    modes = [a for a in args if a in LEGACY_MODES]
    if not modes or (args and args[0] in LEGACY_MODES.values()):
        return args
    if len(set(modes)) > 1:
        raise InvalidArgument(f"{' and '.join(sorted(set(modes)))} are separate checks",
                              f"run one at a time, e.g. ringflow validate {LEGACY_MODES[modes[0]]}")
    sub = LEGACY_MODES[modes[0]]
    rest = [a for a in args if a != modes[0]]
    sys.stderr.write(f"warning: `ringflow validate {modes[0]}` is deprecated and goes in the next release: use "
                     f"`ringflow validate {' '.join([sub, *rest])}`\n")
    return [sub, *rest]


class _ValidateGroup(typer.core.TyperGroup):
    """`ringflow validate`: subcommands, and the deprecated one-command flags rewritten to them."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, legacy_validate_args(list(args)))


validate_app = typer.Typer(cls=_ValidateGroup, no_args_is_help=True,
                           help="Check a model against measurements: host (this host's cost model), gpu or multihost "
                           "(the simulator), published (published measurements, held out).")

JSON_OPT = typer.Option(False, "--json", help="print the results as JSON (JSON alone on stdout)")
OUT_OPT = typer.Option(None, "-o", "--out", help="write the results (JSON) to this file")


@validate_app.command("host")
def validate_host_command(
    model: str | None = typer.Option(None, "--model", help="host-model file (default: calibrate first)"),
    ranks: str = typer.Option("2,3,4,6,8", "--ranks", help="rank counts to validate"),
    transports: str = typer.Option("shm,tcp", "--transports", help="shm and/or tcp"),
    calibrate_ranks: str = typer.Option("2,4", "--calibrate-ranks", help="without --model: ranks to calibrate at"),
    report: str | None = typer.Option(None, "--report", help="write the markdown report here"),
    json_print: bool = JSON_OPT,
    out: str | None = OUT_OPT,
) -> None:
    """The host cost model vs `ringflow bench`, out of sample."""
    _validate_host(model, _ints(ranks, "--ranks"), transports, calibrate_ranks, report, json_print, out)


@validate_app.command("gpu")
def validate_gpu_command(
    json_print: bool = JSON_OPT,
    out: str | None = OUT_OPT,
    plot: str | None = typer.Option(None, "--plot", help="published vs predicted busbw as bars in this image"),
) -> None:
    """Published NCCL results on DGX servers vs the simulator."""
    from . import sim_cmds
    if plot:
        check_plot_path(plot)
    sim_cmds.validate_gpu(out, plot, json_print)


@validate_app.command("multihost")
def validate_multihost_command(
    topo: str | None = typer.Option(None, "--topo", help="the host topology (default host-cpu)"),
    hosts: int = typer.Option(2, "--hosts", min=2, help="emulated hosts"),
    per_host: int = typer.Option(2, "--per-host", min=1, help="ranks per host"),
    rate_mbit: float = typer.Option(1000.0, "--rate-mbit", min=1, help="link rate (tbf) in Mbit/s"),
    json_print: bool = JSON_OPT,
    out: str | None = OUT_OPT,
) -> None:
    """Flat ring vs hierarchical all-reduce on emulated hosts (namespaces, tbf-limited links) vs the simulator."""
    from . import sim_cmds
    sim_cmds.validate_multihost(topo, hosts, per_host, rate_mbit, out, json_print)


@validate_app.command("published")
def validate_published_command(
    data: str | None = typer.Option(None, "--data", help="cases file (default: the packaged one)"),
    nccl: bool = typer.Option(False, "--nccl", help="collectives without a forced algorithm take NCCL's own "
                              "choice (as ringflow sim --nccl) instead of the simulator's"),
    report: str | None = typer.Option(None, "--report", help="write the markdown report here"),
    json_print: bool = JSON_OPT,
    out: str | None = OUT_OPT,
) -> None:
    """Published nccl-tests and training throughputs vs the simulator and training model, half of them held out."""
    _validate_published(data, report, json_print, out, "nccl" if nccl else "sim")


def _results_only(res: Any, json_print: bool, out: str | None, report: str | None,
                  write_report: Callable[[], None]) -> bool:
    """Write the report and the -o file; under --json print the results and say so (True: no tables)."""
    say = (err_console if json_print else console).print
    if report:
        write_report()
        say(f"wrote {report}")
    if out:
        write_json(out, res)
        say(f"wrote {out}")
    if json_print:
        print_json(res)
    return json_print


def _validate_host(model_path: str | None, ranks: list[int], transports: str, calibrate_ranks: str,
                   report: str | None, json_print: bool, out: str | None) -> None:
    from ..hostmodel.features import TRANSPORTS
    from ..hostmodel.model import HostCostModel, read_file, write_file
    from ..hostmodel.report import write_report
    from ..hostmodel.sweep import calibrate
    from ..hostmodel.validate import validate
    from ..units import format_size
    command = _command_line(report=True)
    trs = _names(transports, TRANSPORTS, "--transports")
    say = (err_console if json_print else console).print   # under --json, stdout holds the JSON alone
    if model_path is None:
        model_path = "host-model.json"
        say(f"calibrating first (ringflow calibrate -o {model_path}) ...")
        write_file(model_path, calibrate(_ints(calibrate_ranks, "--calibrate-ranks"), trs, progress=say,
                                         command=command))
    doc = read_file(model_path)
    models = {tr: HostCostModel.load(model_path, tr) for tr in trs}
    res = validate(models, ranks=ranks, progress=say)
    res["command"], res["model"] = command, model_path
    if _results_only(res, json_print, out, report,
                     lambda: write_report(str(report), res, models, command, model_path, doc.get("meta"))):
        return
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


def _validate_published(data: str | None, report: str | None, json_print: bool, out: str | None,
                        chooser: str) -> None:
    from rich.markup import escape

    from ..workload import published_report as pr
    from ..workload.published import evaluate
    res = evaluate(data, chooser=chooser)
    if _results_only(res, json_print, out, report,
                     lambda: pr.write_markdown(str(report), res, _command_line(report=True))):
        return

    def table(title: str, header: list[str], rows: list[list[str]]) -> None:
        print_table(title, header, [[escape(str(x)) for x in r] for r in rows])
    table("fitted constants (fitting set only)", pr.CONST_HEADER, pr.constant_rows(res))
    for which in ("fit", "held_out"):
        table(f"{which.replace('_', '-')} set: predicted vs published", pr.CASE_HEADER, pr.case_rows(res, which))
    table("summary per set and GPU generation", pr.GROUP_HEADER, pr.group_rows(res))
    table("targets", ["target", "this run", "status", "cases missing it"], pr.target_rows(res))
    table("fitted constants vs library defaults", pr.COMPARE_HEADER, pr.compare_rows(res))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("calibrate")(calibrate_command)
    app.add_typer(validate_app, name="validate")
