"""Published attention-kernel throughput per GPU, kernel generation, head dimension, pass and sequence length.

The FlashAttention-3 paper measured FlashAttention-2, cuDNN and FlashAttention-3 on an H100 SXM5, and
`benchmarks/gpu_tables.py` measured PyTorch SDPA's FlashAttention-2 and cuDNN backends on an H200
(``ringflow/data/attention_kernels.yaml``, its source per table; the first table that lists a GPU and the kernel
is used). Where a table covers the GPU and the kernel, an attention pass runs at the table's rate:

- log-linear in the sequence length between its points, flat beyond them (its rates level off by 8k);
- linear in the head dimension between the tables' head dimensions, the nearest table outside them;
- scaled by the GPU's dense BF16 peak over the table GPU's (a GPU listed with the table GPU's SMs and clocks; the
  tables were measured at the default power limit, and a run under a lower one passes a peak scaled by its
  sustained clock there, `compute.GpuSpec.at_power_limit`);
- a causal backward at its measured rate where the table has one; where it has none (the paper shows no causal
  backward) at the non-causal backward rate times the causal over non-causal forward rate at the same length:
  the masked diagonal tiles cost the backward what they cost the forward (an assumption).

Elsewhere (another GPU, another kernel) the mechanism of `kernels.attention_pass_s` prices the pass.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from ..errors import InvalidArgument

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "attention_kernels.yaml"
SERIES = ("forward", "forward_causal", "backward")
OPTIONAL_SERIES = ("backward_causal",)   # measured where a table has it; else the module docstring's assumption


@dataclass(frozen=True)
class KernelTable:
    """One GPU's measured TFLOP/s of the kernel generations it covers (module docstring)."""

    gpu: str
    peak_tflops: float
    applies_to: tuple[str, ...]
    source: str
    seq_len: tuple[int, ...]
    # kernel -> series (forward, forward_causal, backward) -> head dim -> TFLOP/s per sequence length
    rates: dict[str, dict[str, dict[int, tuple[float, ...]]]]


@cache
def tables(path: str = str(DATA_PATH)) -> tuple[KernelTable, ...]:
    """The tables of the data file, checked: every series of every kernel has one rate per sequence length."""
    doc = yaml.safe_load(Path(path).read_text())
    out = []
    for t in doc["tables"]:
        seqs = tuple(int(s) for s in t["seq_len"])
        rates: dict[str, dict[str, dict[int, tuple[float, ...]]]] = {}
        for kernel, series in t["kernels"].items():
            if not set(SERIES) <= set(series) <= set(SERIES + OPTIONAL_SERIES):
                raise InvalidArgument(f"attention table {t['gpu']}/{kernel}: series {sorted(series)}",
                                      f"give {', '.join(SERIES)} and optionally {', '.join(OPTIONAL_SERIES)}")
            rates[kernel] = {}
            for name, by_dim in series.items():
                rates[kernel][name] = {}
                for dim, row in by_dim.items():
                    if len(row) != len(seqs) or min(row) <= 0:
                        raise InvalidArgument(f"attention table {t['gpu']}/{kernel}/{name}/{dim}: {row}",
                                              f"give {len(seqs)} positive rates, one per sequence length")
                    rates[kernel][name][int(dim)] = tuple(float(v) for v in row)
        out.append(KernelTable(str(t["gpu"]), float(t["peak_tflops"]), tuple(t["applies_to"]),
                               " ".join(str(t["source"]).split()), seqs, rates))
    return tuple(out)


def _along_seq(seqs: tuple[int, ...], row: tuple[float, ...], seq_len: float) -> float:
    """The row's rate at seq_len: log-linear between points, flat outside them."""
    if seq_len <= seqs[0]:
        return row[0]
    if seq_len >= seqs[-1]:
        return row[-1]
    j = bisect.bisect_right(seqs, seq_len)
    lo, hi = seqs[j - 1], seqs[j]
    w = (math.log2(seq_len) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return row[j - 1] + w * (row[j] - row[j - 1])


def _along_dim(by_dim: dict[int, tuple[float, ...]], seqs: tuple[int, ...], head_dim: float,
               seq_len: float) -> float:
    """The series' rate at head_dim and seq_len: linear between the tables' head dimensions, the nearest outside."""
    dims = sorted(by_dim)
    if head_dim <= dims[0] or head_dim >= dims[-1]:
        return _along_seq(seqs, by_dim[dims[0] if head_dim <= dims[0] else dims[-1]], seq_len)
    j = bisect.bisect_right(dims, head_dim)
    lo, hi = dims[j - 1], dims[j]
    w = (head_dim - lo) / (hi - lo)
    a, b = (_along_seq(seqs, by_dim[d], seq_len) for d in (lo, hi))
    return a + w * (b - a)


def table_for(gpu: str, kernel: str) -> KernelTable | None:
    """The table measuring `kernel` on `gpu` (a catalog name), or None."""
    for t in tables():
        if gpu in t.applies_to and kernel in t.rates:
            return t
    return None


def measured_flops(gpu: str, peak_flops: float, kernel: str, pass_: str, head_dim: float, seq_len: float,
                   causal: bool = True) -> float | None:
    """FLOP/s (the FlashAttention papers' count) of one pass ('forward' or 'backward') of `kernel` on `gpu` with
    dense BF16 peak `peak_flops`, or None where no table covers them (module docstring)."""
    if pass_ not in ("forward", "backward"):
        raise InvalidArgument(f"pass {pass_!r}", "use forward or backward")
    if head_dim <= 0 or seq_len <= 0 or peak_flops <= 0:
        raise InvalidArgument(f"head_dim={head_dim}, seq_len={seq_len}, peak_flops={peak_flops}",
                              "give positive sizes and a positive peak")
    t = table_for(gpu, kernel)
    if t is None:
        return None
    r = t.rates[kernel]

    def at(series: str) -> float:
        return _along_dim(r[series], t.seq_len, head_dim, seq_len)

    if pass_ == "forward":
        tflops = at("forward_causal" if causal else "forward")
    elif causal and "backward_causal" in r:
        tflops = at("backward_causal")
    else:
        tflops = at("backward") * (at("forward_causal") / at("forward") if causal else 1.0)
    return tflops * 1e12 * peak_flops / (t.peak_tflops * 1e12)
