"""Shared CLI plumbing: JSON output, rich tables, typed-error reporting."""
from __future__ import annotations

import json
import sys
import threading
from typing import Any

import typer

from ..errors import RingflowError, Terminated, raise_terminated
from ..tables import make_console, print_table  # noqa: F401 - print_table: the commands' table helper

console = make_console()
err_console = make_console(stderr=True)


def run_app(app: typer.Typer, argv: list[str]) -> None:
    """Run the app; a RingflowError becomes a one-line message and exit code 2; SIGTERM and SIGHUP unwind the
    command (its temporary files and ranks are cleaned up) and exit with 128 + the signal's number."""
    import signal
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, raise_terminated)
    try:
        app(args=argv, standalone_mode=True)
    except RingflowError as exc:
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        sys.exit(2)
    except Terminated as exc:
        err_console.print(f"ringflow: stopped by signal {exc.signum}")
        sys.exit(128 + exc.signum)


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
