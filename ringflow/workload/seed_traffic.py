"""Closed-form per-epoch traffic formulas for DP / FSDP / TP / PP and 3-D training, plus switch sizing.

Symbols: P parameters, T tokens per epoch, L layers, H hidden size, G GPUs, N mini-batches per
epoch, 2 bytes per BF16 value. Per epoch:

| mode | pattern | backward bytes | backward syncs | forward bytes | forward transfers |
|---|---|---|---|---|---|
| DP   | all-reduce              | 2 N P G (G-1) | 1  | 0                 | 0     |
| FSDP | all-gather + all-reduce | 2 N P (G-1)   | L  | 2 N P (G-1)       | L     |
| TP   | all-reduce              | 4 N P L (G-1) | 2L | 4 L T H (G-1) G   | 2 L T |
| PP   | point-to-point          | 2 T H (G-1)   | G-1| 2 T H (G-1)       | G-1   |

3-D (Gtp x Gpp x Gdp): backward = 2 N P Gdp [2 L (Gtp-1)/Gpp + (Gdp-1)] + 2 T H (Gpp-1);
forward = 2 T H (2 L Gtp (Gtp-1) + (Gpp-1)).

The reference table these formulas reproduce (docs/workload.md) prints its figures with: P = 70e9 (the size
in the model's name, not the 70.55e9 the dimensions give), N = 364.6e6 samples / 2048 = 178,027.3 (unrounded),
T = 156e9, H = 8192, L = 80, G = 8. Its DP, FSDP and PP rows are in decimal PB (1e15 B); its two TP rows are in
units of 2^20 x 1e9 B (GB converted to "PB" by dividing by 1024^2); every printed figure is the exact value rounded
*up* (174.47 -> 175, 17.89 -> 17.9). Its "~20 days on one 51.2 Tb/s switch" divides bytes by 51.2e12 bytes/s,
i.e. reads Tb/s as TB/s; in bits the same switch needs 8x longer.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidArgument

BF16_BYTES = 2
PB = 1e15
EB = 1e18
SEED_TP_UNIT = 2**20 * 1e9  # the reference table's TP rows: GB divided by 1024^2
SECONDS_PER_DAY = 86400.0

# C4 as the reference table quotes it: ~156e9 tokens, 364.6M training samples, ~38.5 TB after cleaning.
C4_TOKENS = 156e9
C4_SAMPLES = 364.6e6
C4_BYTES = 38.5e12


@dataclass(frozen=True)
class SeedRow:
    """One row of the closed-form per-epoch table."""

    mode: str
    pattern: str
    backward_bytes: float
    backward_syncs: float
    forward_bytes: float
    forward_transfers: float
    seed_unit_bytes: float  # the unit the reference table prints this row in
    seed_printed: tuple[float, float]  # (backward, forward) in that unit as the reference table prints them

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["seed_printed"] = list(self.seed_printed)
        d["total_bytes"] = self.backward_bytes + self.forward_bytes
        return d


def _round_up(value: float) -> float:
    """Round up the way the reference table's figures are: integers from 100 up, else one decimal."""
    if value >= 100:
        return float(math.ceil(value - 1e-9))
    return math.ceil(value * 10 - 1e-9) / 10


def seed_rows(P: float, T: float, L: int, H: int, G: int, N: float, nbytes: int = BF16_BYTES) -> list[SeedRow]:
    """The four closed-form 1-D rows (nbytes = 2 for BF16)."""
    if min(P, T, L, H, G, N) <= 0:
        raise InvalidArgument("P, T, L, H, G and N must all be > 0", "check --tokens, --batch, --gpus and the model")
    b = nbytes / 2.0  # the formulas' leading factors already contain the 2 bytes of BF16
    rows = [
        ("DP", "all-reduce", 2 * N * P * G * (G - 1) * b, 1, 0.0, 0, PB),
        ("FSDP", "all-gather + all-reduce", 2 * N * P * (G - 1) * b, L, 2 * N * P * (G - 1) * b, L, PB),
        ("TP", "all-reduce", 4 * N * P * L * (G - 1) * b, 2 * L, 4 * L * T * H * (G - 1) * G * b, 2 * L * T,
         SEED_TP_UNIT),
        ("PP", "point-to-point", 2 * T * H * (G - 1) * b, G - 1, 2 * T * H * (G - 1) * b, G - 1, PB),
    ]
    return [SeedRow(m, p, bw, bs, fw, ft, u, (_round_up(bw / u), _round_up(fw / u)))
            for m, p, bw, bs, fw, ft, u in rows]


def seed_3d(P: float, T: float, L: int, H: int, N: float, tp: int, pp: int, dp: int,
            nbytes: int = BF16_BYTES) -> dict[str, float]:
    """The closed-form 3-D (Gtp x Gpp x Gdp) per-epoch backward/forward bytes."""
    if min(tp, pp, dp) < 1:
        raise InvalidArgument(f"tp={tp}, pp={pp}, dp={dp} must be >= 1")
    b = nbytes / 2.0
    backward = (2 * N * P * dp * (2 * L * (tp - 1) / pp + (dp - 1)) + 2 * T * H * (pp - 1)) * b
    forward = 2 * T * H * (2 * L * tp * (tp - 1) + (pp - 1)) * b
    return {"tp": tp, "pp": pp, "dp": dp, "gpus": tp * pp * dp, "backward_bytes": backward,
            "forward_bytes": forward, "total_bytes": backward + forward, "total_EB": (backward + forward) / EB}


def switch_sizing(total_bytes: float, switch_tbps: float = 51.2, epochs: int = 100,
                  days: float = 100.0) -> dict[str, float]:
    """Days per epoch through one switch and switches needed for `epochs` epochs in `days` days.

    Two readings: the reference table's (capacity in Tb/s used as TB/s, which gives its ~20 days) and the physical one
    (Tb/s / 8 = TB/s). Each byte is assumed to cross one switch once.
    """
    if switch_tbps <= 0 or epochs <= 0 or days <= 0:
        raise InvalidArgument("switch capacity, epochs and days must be > 0")
    seed_Bps = switch_tbps * 1e12
    real_Bps = switch_tbps * 1e12 / 8
    seed_days = total_bytes / seed_Bps / SECONDS_PER_DAY
    real_days = total_bytes / real_Bps / SECONDS_PER_DAY
    return {"switch_tbps": switch_tbps, "epochs": epochs, "days": days,
            "seed_days_per_epoch": seed_days, "seed_switches": math.ceil(seed_days * epochs / days - 1e-9),
            "days_per_epoch": real_days, "switches": math.ceil(real_days * epochs / days - 1e-9)}
