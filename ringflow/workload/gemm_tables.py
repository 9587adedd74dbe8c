"""Measured GEMM throughput per GPU, by the GEMM's (M, N, K) and dtype, for the compute model's linear layers.

``ringflow/data/gemm_tables.yaml`` holds, per measured GPU, the TFLOP/s of ``(M x K) @ (K x N)`` in BF16 and FP8
(per-tensor scaled) over a grid of powers of two (`benchmarks/gpu_tables.py`, which writes the block with the GPU,
driver, CUDA, cuDNN and torch versions and the command). A GEMM's rate is read:

- trilinearly in log2 M, log2 N, log2 K between the grid's points, with wave quantization taken out of the
  measured corners and put back at the GEMM's own shape: the output is cut into ``tile`` tiles (M x N), run in
  waves of one tile per SM, and a last wave that is not full leaves SMs idle, so a GEMM reaches
  tiles / (waves x SMs) of its unquantized rate (on the grid's powers of two that share is about 0.97 at 132 SMs;
  a TP-split width of 768 or 1,280 columns falls to 0.73-0.81);
- at a grid corner the grid leaves out (M N K above the measured limit, where the rate has levelled off), at the
  nearest measured corner reached by halving its largest dimension;
- beyond the largest grid value, at the largest (the rate is flat there); below the smallest, at the smallest
  times the dimension over it (a tile then computes that fraction of its work);
- scaled by the GPU's dense peak over the table GPU's, for the catalog GPUs `applies_to` lists (the table GPU's
  SMs and clocks). The tables were measured at those GPUs' default 700 W power limit; a run under a lower limit
  passes a peak already scaled by the sustained SM clock there (`compute.GpuSpec.at_power_limit`).

A GPU no table covers keeps the efficiency curve of `compute.EfficiencyModel`.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import yaml

from ..errors import InvalidArgument

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "gemm_tables.yaml"
DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class GemmTable:
    """One GPU's measured GEMM TFLOP/s over a grid of (M, N, K) (module docstring)."""

    gpu: str
    peak_tflops: dict[str, float]
    applies_to: tuple[str, ...]
    source: str
    dims: tuple[int, ...]
    rates: dict[str, dict[tuple[int, int, int], float]]   # dtype -> (m, n, k) -> TFLOP/s
    sms: int                     # streaming multiprocessors: one output tile each per wave
    tile: tuple[int, int]        # output tile (rows of M, columns of N) of the GPU's GEMM kernels

    def wave_share(self, m: float, n: float) -> float:
        """Share of the SMs' wave slots a GEMM's output tiles fill (1: every wave full)."""
        tiles = math.ceil(m / self.tile[0]) * math.ceil(n / self.tile[1])
        return tiles / (math.ceil(tiles / self.sms) * self.sms)


@cache
def tables(path: str = str(DATA_PATH)) -> tuple[GemmTable, ...]:
    """The tables of the data file, checked: one positive rate per dtype and measured shape, on one grid."""
    doc = yaml.safe_load(Path(path).read_text())
    out = []
    for t in doc["tables"]:
        cols = list(t["columns"])
        if cols[:3] != ["m", "n", "k"]:
            raise InvalidArgument(f"GEMM table {t['gpu']}: columns {cols}", "start the columns with m, n, k")
        rates: dict[str, dict[tuple[int, int, int], float]] = {d: {} for d in DTYPES}
        for row in t["rows"]:
            shape = (int(row[0]), int(row[1]), int(row[2]))
            for col, v in zip(cols[3:], row[3:], strict=True):
                if v is None:
                    continue
                if v <= 0:
                    raise InvalidArgument(f"GEMM table {t['gpu']} {shape} {col}: {v}", "give positive TFLOP/s")
                rates[col.removesuffix("_tflops")][shape] = float(v)
        dims = tuple(sorted({d for s in rates["bf16"] for d in s}))
        out.append(GemmTable(str(t["gpu"]), {k: float(v) for k, v in t["peak_tflops"].items()},
                             tuple(t["applies_to"]), " ".join(str(t["source"]).split()), dims, rates,
                             int(t["sms"]), (int(t["tile"][0]), int(t["tile"][1]))))
    return tuple(out)


def table_for(gpu: str) -> GemmTable | None:
    """The GEMM table measured on `gpu` or on a GPU with its SMs and clocks, or None."""
    for t in tables():
        if gpu in t.applies_to:
            return t
    return None


def _corner(t: GemmTable, dtype: str, shape: tuple[int, int, int]) -> float:
    """The measured rate at a grid corner (or at the nearest measured one by halving the largest dimension) over
    its wave share: the rate without wave quantization."""
    r = t.rates[dtype]
    s = list(shape)
    while tuple(s) not in r:
        i = s.index(max(s))
        if s[i] <= t.dims[0]:
            raise InvalidArgument(f"GEMM table {t.gpu} {dtype}: no rate at or below {shape}",
                                  "measure the grid's smallest shapes")
        s[i] //= 2
    return r[(s[0], s[1], s[2])] / t.wave_share(s[0], s[1])


def _axis(dims: tuple[int, ...], x: float) -> tuple[int, int, float, float]:
    """(lower point, upper point, weight of the upper, scale below the grid) of x along one axis."""
    if x <= dims[0]:
        return dims[0], dims[0], 0.0, x / dims[0]
    if x >= dims[-1]:
        return dims[-1], dims[-1], 0.0, 1.0
    j = bisect.bisect_right(dims, x)
    lo, hi = dims[j - 1], dims[j]
    return lo, hi, (math.log2(x) - math.log2(lo)) / (math.log2(hi) - math.log2(lo)), 1.0


@lru_cache(maxsize=1 << 16)   # a pure function of its arguments: the packaged tables never change in a process
def gemm_flops_per_s(gpu: str, peak_flops: float, dtype: str, m: float, n: float, k: float) -> float | None:
    """FLOP/s of one (M x K) @ (K x N) GEMM in `dtype` on `gpu` (dense peak `peak_flops` in that dtype), or None
    where no table covers the GPU (module docstring)."""
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    if min(m, n, k) <= 0 or peak_flops <= 0:
        raise InvalidArgument(f"GEMM {m} x {n} x {k}, peak {peak_flops}", "give positive sizes and a positive peak")
    t = table_for(gpu)
    if t is None or not t.rates[dtype]:
        return None
    axes = [_axis(t.dims, v) for v in (m, n, k)]
    tflops = 0.0
    for bits in range(8):
        w, shape = 1.0, []
        for i, (lo, hi, up, _) in enumerate(axes):
            high = bits >> i & 1
            w *= up if high else 1.0 - up
            shape.append(hi if high else lo)
        if w:
            tflops += w * _corner(t, dtype, (shape[0], shape[1], shape[2]))
    for _, _, _, scale in axes:
        tflops *= scale
    tflops *= t.wave_share(m, n)
    return tflops * 1e12 * peak_flops / (t.peak_tflops[dtype] * 1e12)


def max_flops_per_s(gpu: str, peak_flops: float, dtype: str) -> float | None:
    """The most FLOP/s `gemm_flops_per_s` can return for any GEMM in `dtype` on `gpu` (a bound for searches), or
    None without a table: the largest unquantized corner rate, since a rate is a weighted mean of those scaled by
    shares of at most 1."""
    t = table_for(gpu)
    if t is None or not t.rates[dtype]:
        return None
    top = max(r / t.wave_share(s[0], s[1]) for s, r in t.rates[dtype].items())
    return top * 1e12 * peak_flops / (t.peak_tflops[dtype] * 1e12)


Shape = tuple[float, float, float]


def passes_of(gemms: list[Shape]) -> tuple[list[Shape], list[Shape]]:
    """The forward GEMMs (M, N, K) and the backward's: the input gradient (M, K, N) and the weight gradient
    (K, N, M) of each."""
    return gemms, [g for m, n, k in gemms for g in ((m, k, n), (k, n, m))]


def sequence_flops_per_s(gpu: str, peak_flops: float, dtype: str, gemms: list[Shape]) -> float | None:
    """FLOP/s of GEMMs run one after another (their FLOPs over their summed times), or None without a table."""
    times, flops = 0.0, 0.0
    for m, n, k in gemms:
        rate = gemm_flops_per_s(gpu, peak_flops, dtype, m, n, k)
        if rate is None:
            return None
        flops += 2.0 * m * n * k
        times += 2.0 * m * n * k / rate
    return flops / times if times else None
