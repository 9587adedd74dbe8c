"""Shared CLI plumbing: JSON output, rich tables, typed-error reporting."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Sequence

import typer
from rich.console import Console
from rich.table import Table

from ..errors import RingflowError

# Piped into a file or a CI log, rich would wrap at 80 columns and cut the tables' cells; COLUMNS still rules.
PIPED_WIDTH = 160


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty()) and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


console = _console()
err_console = _console(stderr=True)


def run_app(app: typer.Typer, argv: list[str]) -> None:
    """Run the app; a RingflowError becomes a one-line message and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except RingflowError as exc:
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        sys.exit(2)


def print_json(obj: Any) -> None:
    """Print an object as JSON on stdout (numpy scalars converted)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def write_json(path: str, obj: Any) -> None:
    """Write an object as JSON to a file."""
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, default=_json_default)
        fh.write("\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                justify_right: bool = True) -> None:
    """Print rows as a rich table."""
    table = Table(title=title, show_lines=False)
    for i, c in enumerate(columns):
        table.add_column(str(c), justify="right" if (justify_right and i > 0) else "left")
    for r in rows:
        table.add_row(*[str(x) for x in r])
    console.print(table)
