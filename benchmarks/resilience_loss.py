"""The seed's "zero packet loss" requirement, quantified: all-reduce between two emulated hosts
(network namespaces, one rank each, TCP between them) with 0% and 1% random packet loss.

    python benchmarks/resilience_loss.py --sizes 4KiB,64KiB,1MiB,16MiB,64MiB --json out.json

Loss is an nftables rule on each host's link (`NetnsCluster.set_loss`, in the bridge namespace, so
the sender's TCP sees real loss) dropping that share of packets at random; hosts send MTU-sized
packets (gso_max_segs 1, at 0% and at 1%) so the rule drops real packets, not 64 KiB GSO bundles.
Every all-reduce is checked against a NumPy reference (`wrong` counts mismatches). time = the
slower rank's median over iterations; busbw = size / time x 2(n-1)/n (nccl-tests' all-reduce
factor). The rule's drop counter and the TCP retransmissions (/proc/net/snmp in the namespaces)
show the loss really happened. Needs root, iproute2 and nft. MTU-sized packets cost a veth pair
on this 2-core VM most of its speed (about 80 MB/s instead of about 750 MB/s with GSO, measured
with a plain socket stream), so the absolute figures are low; the ratio is the result.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resilience_ranks import Job, dropped_packets, mtu_packets, tcp_retransmits  # noqa: E402

from ringflow.testing import netns  # noqa: E402
from ringflow.units import format_size, parse_size  # noqa: E402


def run(loss_pct: float, sizes: list[int], iters: int, rate_mbit: float | None, port: int, out: Path) -> dict:
    """One loss level in a fresh pair of namespaces: rows per size plus the retransmission count."""
    with netns.NetnsCluster(2, rate_mbit=rate_mbit) as cl:
        mtu_packets(cl)
        if loss_pct > 0:
            for h in range(2):
                cl.set_loss(h, loss_pct)
        before = tcp_retransmits(cl)
        with Job(2, "lossbench", out, ["--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--warm", "1",
                                       "--timeout", "300"],
                 store_addr=f"{cl.address(0)}:{port}", wrap=lambda r, a: cl.command(r, a)) as job:
            codes = job.wait(1800)
            if codes != [0, 0]:
                raise RuntimeError(f"ranks exited with {codes}\n{job.logs()}")
            per_rank = [job.result(r)["rows"] for r in range(2)]
        rows = []
        for i, size in enumerate(sizes):
            slow = max((pr[i] for pr in per_rank), key=lambda row: row["time_us"])
            rows.append({**slow, "wrong": sum(pr[i]["wrong"] for pr in per_rank)})
        return {"loss_pct": loss_pct, "rows": rows, "retransmits": tcp_retransmits(cl) - before,
                "dropped": dropped_packets(cl) if loss_pct > 0 else 0}


def main(argv: list[str] | None = None) -> int:
    """Measure both loss levels and print the slowdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--iters", type=int, default=0, help="iterations per size (0: ringflow bench's default)")
    ap.add_argument("--loss", type=float, default=1.0, help="percent of packets dropped in the lossy run")
    ap.add_argument("--rate-mbit", type=float, default=None, help="also limit each host's egress (tbf)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    reason = netns.available()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    sizes = [int(parse_size(s)) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        clean = run(0.0, sizes, a.iters, a.rate_mbit, 29631, Path(tmp) / "clean")
        lossy = run(a.loss, sizes, a.iters, a.rate_mbit, 29632, Path(tmp) / "lossy")
    print(f"all_reduce, 2 ranks on 2 namespace hosts (TCP, MTU packets), float32; packets dropped by the "
          f"{a.loss:g}% rule: {lossy['dropped']}; TCP retransmissions: {clean['retransmits']} at 0%, "
          f"{lossy['retransmits']} at {a.loss:g}%")
    hdr = f"{'size':>9} {'time 0% us':>12} {'busbw 0% GB/s':>14} {f'time {a.loss:g}% us':>12} " \
          f"{f'busbw {a.loss:g}% GB/s':>15} {'slowdown':>9} {'wrong':>6}"
    print(hdr)
    table = []
    for c, l in zip(clean["rows"], lossy["rows"]):
        slow = l["time_us"] / c["time_us"]
        table.append({"size_bytes": c["size_bytes"], "time_us_0": c["time_us"], "busbw_GBps_0": c["busbw_GBps"],
                      "time_us_loss": l["time_us"], "busbw_GBps_loss": l["busbw_GBps"], "slowdown": slow,
                      "wrong": c["wrong"] + l["wrong"]})
        print(f"{format_size(c['size_bytes']):>9} {c['time_us']:12.1f} {c['busbw_GBps']:14.3f} {l['time_us']:12.1f} "
              f"{l['busbw_GBps']:15.3f} {slow:8.2f}x {c['wrong'] + l['wrong']:6d}")
    if a.json:
        Path(a.json).write_text(json.dumps({"loss_pct": a.loss, "rate_mbit": a.rate_mbit, "table": table,
                                            "retransmits": [clean["retransmits"], lossy["retransmits"]],
                                            "dropped": lossy["dropped"]}, indent=1))
    return 0 if all(t["wrong"] == 0 for t in table) else 1


if __name__ == "__main__":
    sys.exit(main())
