"""Text tables on the terminal, for the library's reports and the CLI alike (rich, sized for pipes)."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped into a file or a CI log, rich would wrap at 80 columns and cut the tables' cells; COLUMNS still rules.
PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    """A console that keeps whole table rows when its stream is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty()) and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


console = make_console()


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                justify_right: bool = True) -> None:
    """Print rows as a table, numbers right-aligned after the first column."""
    table = Table(title=title, show_lines=False)
    for i, c in enumerate(columns):
        table.add_column(str(c), justify="right" if (justify_right and i > 0) else "left")
    for r in rows:
        table.add_row(*[str(x) for x in r])
    console.print(table)
