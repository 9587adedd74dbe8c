"""`ringflow hw`: the hardware catalog and the PCIe bandwidth arithmetic."""
from __future__ import annotations

import typer

from .common import console, print_json, print_table

hw_app = typer.Typer(help="Hardware catalog: PCIe, NVLink, NVSwitch, QPI/UPI, InfiniBand, Ethernet, GPUs.",
                     no_args_is_help=True)


@hw_app.command("pcie")
def pcie_command(
    gen: int = typer.Option(..., "--gen", min=1, help="PCIe generation 1..6"),
    lanes: int = typer.Option(16, "--lanes", min=1, help="link width: 1, 2, 4, 8, 16 or 32"),
    json_out: bool = typer.Option(False, "--json", help="print the arithmetic as JSON"),
) -> None:
    """Compute PCIe throughput: GT/s x encoding x lanes / 8, per direction and both directions."""
    from ..hardware import pcie_arithmetic
    r = pcie_arithmetic(gen, lanes)
    if json_out:
        print_json(r)
        return
    console.print(f"PCIe Gen{gen} x{lanes}: {r['rate_GTps']:g} GT/s per lane, {r['encoding']} encoding", soft_wrap=True)
    console.print(f"  per lane : {r['rate_GTps']:g} GT/s x {r['efficiency']} = {r['lane_gbps']:.4f} Gb/s "
                  f"= {r['lane_gbps'] / 8 * 1000:.1f} MB/s", soft_wrap=True)
    console.print(f"  x{lanes:<7} : {r['lane_gbps']:.4f} x {lanes} = {r['total_gbps']:.3f} Gb/s", soft_wrap=True)
    console.print(f"  result   : {r['total_gbps']:.3f} / 8 = [bold]{r['per_direction_GBps']:.3f} GB/s per direction[/]"
                  f" ({r['per_direction_MBps']:.1f} MB/s); {r['bidirectional_GBps']:.3f} GB/s both directions",
                  soft_wrap=True)
    console.print(f"  source   : {r['source']}", soft_wrap=True)


@hw_app.command("list")
def list_command(
    kind: str = typer.Option("", "--kind", help="only this kind: pcie, nvlink, nvswitch, socket, ib, ethernet, gpu"),
    sources: bool = typer.Option(False, "--sources", help="also print where every figure comes from"),
    json_out: bool = typer.Option(False, "--json", help="print the catalog (with sources) as JSON"),
) -> None:
    """Print the hardware catalog (per-direction and bidirectional GB/s, details; sources with --sources)."""
    from ..hardware import catalog_rows
    rows = [r for r in catalog_rows() if not kind or r["kind"] == kind]
    if json_out:
        print_json(rows)
        return
    print_table("ringflow hardware catalog (GB/s = 1e9 B/s)", ["kind", "name", "GB/s per dir", "GB/s bidir", "detail"],
                [[r["kind"], r["name"], "" if r["per_dir_GBps"] is None else f"{r['per_dir_GBps']:.6g}",
                  "" if r["bidir_GBps"] is None else f"{r['bidir_GBps']:.6g}", r["detail"]] for r in rows],
                justify_right=False)
    if sources:
        for r in rows:
            console.print(f"{r['name']}: {r['source']}", soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    """Add `ringflow hw ...`."""
    app.add_typer(hw_app, name="hw")
