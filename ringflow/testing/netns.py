"""Emulated hosts: Linux network namespaces joined by veth pairs through a bridge.

Used by the multi-host tests and by `ringflow validate`. Addresses come from
the documentation range 192.0.2.0/24 and traffic only goes to namespaces made
here. Needs root and iproute2; `available()` says why not when it cannot.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

from ..errors import RingflowSystemError as RfSystemError

SUBNET = "192.0.2"


def _run(*args: str, check: bool = True, timeout_s: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=timeout_s)


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"rfprobe{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", probe)
    except (subprocess.SubprocessError, OSError) as exc:
        return f"cannot create a network namespace: {exc}"
    _run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class NetnsCluster:
    """`nhosts` namespaces, each with one veth into a shared bridge namespace.

    Host h has address 192.0.2.(h+1) on interface `eth0`. `rate_mbit` puts a
    tbf qdisc on every host's egress (the link's bandwidth per direction).
    """

    nhosts: int
    rate_mbit: float | None = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    names: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"rfbr{self.tag}"

    def address(self, host: int) -> str:
        """IPv4 address of host `host`."""
        return f"{SUBNET}.{host + 1}"

    def __enter__(self) -> NetnsCluster:
        try:
            self._create()
        except (subprocess.SubprocessError, OSError) as exc:
            self.close()
            raise RfSystemError(f"creating {self.nhosts} network namespaces failed: {exc}",
                                "run as root with iproute2 installed") from exc
        return self

    def _create(self) -> None:
        br = self.bridge_ns
        _run("ip", "netns", "add", br)
        _run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", br, "link", "set", "br0", "up")
        for h in range(self.nhosts):
            ns = f"rfh{h}{self.tag}"
            _run("ip", "netns", "add", ns)
            self.names.append(ns)
            a, b = f"rfa{h}{self.tag}", f"rfb{h}{self.tag}"
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _run("ip", "link", "set", a, "netns", ns)
            _run("ip", "link", "set", b, "netns", br)
            _run("ip", "-n", ns, "link", "set", a, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", br, "link", "set", b, "master", "br0")
            _run("ip", "-n", br, "link", "set", b, "up")
            if self.rate_mbit:
                self.set_rate(h, self.rate_mbit)

    def set_rate(self, host: int, rate_mbit: float) -> None:
        """Limit host `host`'s egress to `rate_mbit` with a tbf qdisc."""
        burst_kb = max(32, int(rate_mbit / 8))  # >= rate/HZ-ish so tbf reaches its rate
        _run("ip", "netns", "exec", self.names[host], "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
             "rate", f"{rate_mbit}mbit", "burst", f"{burst_kb}kb", "latency", "100ms")

    def link(self, host: int, up: bool) -> None:
        """Bring host `host`'s link down or up."""
        _run("ip", "-n", self.names[host], "link", "set", "eth0", "up" if up else "down")

    def set_loss(self, host: int, percent: float) -> None:
        """Drop `percent`% of host `host`'s outgoing packets at random on its link (nftables).

        The rule sits in the bridge namespace, on the host's bridge port: a drop in the host's own
        output hook would be reported to its TCP as a local send error (resent at once, no loss
        recovery), so only a drop on the wire emulates packet loss."""
        if shutil.which("nft") is None:
            raise RfSystemError("nft is not installed", "apt-get install nftables")
        br = self.bridge_ns
        _run("ip", "netns", "exec", br, "nft", "add", "table", "bridge", "rfloss")
        _run("ip", "netns", "exec", br, "nft", "add", "chain", "bridge", "rfloss", "lossfw",
             "{ type filter hook forward priority 0; }")
        per_10k = int(round(percent * 100))
        _run("ip", "netns", "exec", br, "nft", "add", "rule", "bridge", "rfloss", "lossfw", "iifname",
             f"rfb{host}{self.tag}", "numgen", "random", "mod", "10000", "<", str(per_10k), "counter", "drop")

    def command(self, host: int, argv: list[str]) -> list[str]:
        """argv wrapped to run inside host `host`'s namespace."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def close(self) -> None:
        """Delete every namespace made (their veths go with them)."""
        for ns in [*self.names, self.bridge_ns]:
            _run("ip", "netns", "del", ns, check=False)
        self.names.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()
