"""`ringflow record` (record a run, merge a recording) and `ringflow diagnose` (who holds everyone up)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from ..errors import InvalidArgument
from .common import console, print_json, write_json

MERGE_USAGE = "ringflow record merge DIR [-o TRACE.json]"


def _merge(args: list[str]) -> None:
    """`record merge DIR [-o FILE]`: one trace from a recording (default DIR/trace.json)."""
    from ..workload.recorded import merge
    out = None
    if "-o" in args or "--out" in args:
        i = args.index("-o") if "-o" in args else args.index("--out")
        if i + 1 >= len(args):
            raise InvalidArgument("-o needs a file name", MERGE_USAGE)
        out = args[i + 1]
        args = args[:i] + args[i + 2:]
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
                                            "train.py), or `merge DIR [-o FILE]`"),
    ) -> None:
        """Record every call of every rank of a launcher command into DIR (RINGFLOW_RECORD); `record merge DIR`
        joins the ranks' files into one trace."""
        if program and program[0] == "merge":
            _merge(program[1:])
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
            code = subprocess.call(cmd, env=env)
        except FileNotFoundError:
            raise InvalidArgument(f"cannot run {cmd[0]!r}", "give the launcher command after --") from None
        files = sorted(d.glob("rank*.jsonl"))
        print(f"ringflow record: {len(files)} rank files in {d} (exit code {code})", file=sys.stderr)
        raise typer.Exit(code)

    @app.command("diagnose")
    def diagnose_cmd(
        path: str = typer.Argument(..., help="A record or dump directory (RINGFLOW_RECORD / RINGFLOW_DUMP_DIR), "
                                   "or a trace from `ringflow record merge`."),
        json_out: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
    ) -> None:
        """Name the ranks that never entered a collective others wait in, sequence mismatches, and stragglers."""
        from ..workload.diagnose import diagnose, render
        report = diagnose(path)
        if json_out:
            print_json(report)
        else:
            print(render(report))
