"""The one place that parses and converts units (bytes, bandwidth, time).

Conventions: `GBps` = 1e9 bytes/s, `Gbps` = 1e9 bits/s, `GiB` = 2**30 bytes.
Bandwidths in ringflow are per direction unless a name says `bidir`.
"""
from __future__ import annotations

import re

from .errors import InvalidArgument

_SIZE_SUFFIX = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Parse '64MiB', '1KiB', '8', '1e9', '4GB' into bytes (binary suffixes are 2**10 based)."""
    if isinstance(text, (int, float)):
        if text < 0:
            raise InvalidArgument(f"size {text} is negative", "give a size >= 0")
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _SIZE_SUFFIX:
        raise InvalidArgument(f"cannot parse size {text!r}",
                              "use a number with an optional suffix: B, KB, MB, GB, KiB, MiB, GiB, TiB")
    return int(float(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()])


def format_size(nbytes: float) -> str:
    """Format a byte count with binary suffixes (1024 -> '1KiB')."""
    for suffix, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            v = nbytes / factor
            return f"{v:g}{suffix}" if v == int(v) else f"{v:.2f}{suffix}"
    return f"{int(nbytes)}B"


def gbps_to_GBps(gbps: float) -> float:
    """Gigabits per second to gigabytes per second."""
    return gbps / 8.0


def GBps_to_Bps(GBps: float) -> float:
    """Gigabytes per second to bytes per second."""
    return GBps * 1e9


def parse_rate_gbps(text: str | float) -> float:
    """Parse a link speed such as '400G', '400Gbps', '100' (Gb/s) into Gb/s."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*(g|gb|gbps|gbit|gbit/s|gb/s|t|tbps)?\s*$", str(text).lower())
    if not m:
        raise InvalidArgument(f"cannot parse link rate {text!r}", "use e.g. 400G, 200Gbps or 1.6T")
    value = float(m.group(1))
    return value * 1000.0 if (m.group(2) or "").startswith("t") else value


def size_range(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes from min to max multiplying by factor, as nccl-tests' -b/-e/-f."""
    if min_bytes <= 0 or max_bytes < min_bytes or factor < 2:
        raise InvalidArgument(f"bad size range {min_bytes}..{max_bytes} x{factor}",
                              "need 0 < min <= max and factor >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out
