"""Shared CLI plumbing: JSON output, rich tables, typed-error reporting, the cluster-fabric options."""
from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass
from typing import Any

import typer

from ..errors import InvalidArgument, RingflowError, Terminated, raise_terminated
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


# What matplotlib's Agg canvas writes (FigureCanvasBase.get_supported_filetypes), without importing it here.
PLOT_SUFFIXES = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff",
                 "webp")


def check_plot_path(path: str, option: str = "--plot") -> str:
    """Check an image path before any work: a suffix matplotlib writes, in a writable directory."""
    import os
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in PLOT_SUFFIXES:
        kind = f"a .{suffix}" if suffix else "a suffix-less"
        raise InvalidArgument(f"{option} {path!r}: matplotlib cannot write {kind} file",
                              f"end the {option} file name in .png, .svg or .pdf")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"{option} {path!r}: the directory {folder} does not exist",
                              f"create it first, or give {option} a path in an existing directory")
    if not os.access(folder, os.W_OK):
        raise InvalidArgument(f"{option} {path!r}: the directory {folder} is not writable",
                              f"give {option} a path in a directory you can write to")
    if os.path.exists(path) and (os.path.isdir(path) or not os.access(path, os.W_OK)):
        raise InvalidArgument(f"{option} {path!r} exists and cannot be overwritten",
                              f"give {option} another file name")
    from ..plotting import pyplot
    pyplot()   # matplotlib installed, or a ConfigError naming the install, before the command computes anything
    return path


def report_plot(path: str, json_out: bool = False) -> None:
    """Say where a plot went (on stderr under --json, so that stdout stays JSON alone)."""
    (err_console if json_out else console).print(f"wrote plot to {path}", soft_wrap=True, highlight=False,
                                                 markup=False)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ----------------------------------------------------------------------------- cluster fabric options
# The fabric options `sim`, `train` and `topo cluster` share; parsed and validated by `fabric_options`.
FABRIC_OPT = typer.Option("rail", "--fabric", help="cluster fabric: rail (rail-optimised) or fat-tree")
TIERS_OPT = typer.Option(None, "--tiers", help="switch tiers: 2 (leaf-spine) or 3 (leaf-spine-core); "
                         "default 2 when the cluster fits, else 3")
RADIX_OPT = typer.Option(64, "--radix", help="ports per switch (64 = Quantum-2 QM9700)")
OVERSUB_OPT = typer.Option("1", "--oversub", help="down:up oversubscription per tier below the top, "
                           "e.g. 2 (leaf) or 1,2 (leaf,spine; 3 tiers); 1 = non-blocking")
PLANES_OPT = typer.Option(1, "--planes", help="parallel independent fabrics; NIC i joins plane i % N")


@dataclass(frozen=True)
class FabricOptions:
    """Validated cluster-fabric options from the command line."""

    fabric: str = "rail"
    tiers: int | None = None          # None: 2 when the cluster fits, else 3
    radix: int = 64
    oversub: tuple[float, ...] = (1.0,)
    planes: int = 1

    def is_default(self) -> bool:
        """True when only the fabric kind was chosen (the callers' cached default clusters apply)."""
        return self == FabricOptions(self.fabric)

    def build(self, base: Any, nodes: int, nic_gbps: float | None = None) -> Any:
        """`nodes` servers of `base` (preset name or one-server Topology) on this fabric."""
        from ..errors import TopologyError
        from ..topology import build_cluster

        def build(tiers: int) -> Any:
            return build_cluster(base, nodes, fabric=self.fabric, nic_gbps=nic_gbps, oversubscription=self.oversub,
                                 tiers=tiers, radix=self.radix, planes=self.planes)
        if self.tiers is not None:
            return build(self.tiers)
        if len(self.oversub) > 1:
            return build(3)
        try:
            return build(2)
        except TopologyError as exc:
            if "holds at most" not in str(exc):
                raise
            return build(3)


def parse_oversub(text: str) -> tuple[float, ...]:
    """'2' -> (2.0,), '1,2' -> (1.0, 2.0); InvalidArgument says what is wrong."""
    try:
        vals = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise InvalidArgument(f"--oversub {text!r} is not a number or a comma-separated list of numbers",
                              "e.g. --oversub 2 (leaf 2:1) or --oversub 1,2 (leaf 1:1, spine 2:1)") from None
    if not vals:
        raise InvalidArgument("--oversub is empty", "e.g. --oversub 1")
    return vals


def fabric_options(fabric: str = "rail", tiers: int | None = None, radix: int = 64, oversub: str = "1",
                   planes: int = 1) -> FabricOptions:
    """The fabric options as given on the command line, checked now (before any cluster is built)."""
    from ..topology.fabric_plan import FabricSpec
    over = parse_oversub(oversub)
    FabricSpec.make(fabric, tiers or (3 if len(over) > 1 else 2), radix, over, planes)
    return FabricOptions(fabric, tiers, radix, over, planes)
