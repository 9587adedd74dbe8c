"""Memory of published runs: a registry case's layout and model with the memory settings its source states
(`memory_runs.yaml`, or the case's own ``memory:`` mapping), and published memory readings set against ours
(`memory_measured.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import ConfigError
from .layout import Layout
from .memory import MemoryBreakdown, MemoryPolicy, peak_memory
from .models import load_model

if TYPE_CHECKING:
    from .compute import GpuSpec

_DATA = Path(__file__).resolve().parents[1] / "data"
GIB = 2 ** 30


@lru_cache(maxsize=1)
def _runs() -> dict[str, Any]:
    return dict(yaml.safe_load((_DATA / "memory_runs.yaml").read_text())["runs"])


def run_policy(case: dict[str, Any]) -> MemoryPolicy:
    """The memory settings of a registry case: its own ``memory:`` mapping, else its `memory_runs.yaml` entry,
    else the defaults."""
    return MemoryPolicy.from_dict(case.get("memory") or _runs().get(str(case.get("id"))))


def case_layout(case: dict[str, Any]) -> Layout:
    """The case's layout with dp = gpus / (tp pp cp), as the registry's predictions build it."""
    lay = dict(case.get("layout") or {})
    if not lay:
        raise ConfigError(f"case {case.get('id')!r} has no layout", "give the case a layout in published.yaml")
    per_replica = lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)
    gpus = int(case["gpus"])
    if gpus % per_replica:
        raise ConfigError(f"case {case.get('id')!r}: {gpus} GPUs is not a multiple of tp x pp x cp = {per_replica}",
                          "fix the case's gpus or layout")
    return Layout(dp=gpus // per_replica, **lay)


def case_gpu(case: dict[str, Any], gpu: GpuSpec) -> GpuSpec:
    """`gpu` (its topology preset's) with the figures the case's source states where they differ from the preset's:
    memory bandwidth (hbm_GBps), capacity (hbm_GB), dense tensor peaks (peak_tflops) and the board power limit the
    run held (power_limit_W: its compute-bound rates at that limit's sustained clock, `GpuSpec.at_power_limit`)."""
    if case.get("hbm_GBps"):
        gpu = replace(gpu, hbm_GBps=float(case["hbm_GBps"]))
    if case.get("hbm_GB"):
        gpu = replace(gpu, memory_bytes=float(case["hbm_GB"]) * 1e9)
    if case.get("peak_tflops"):
        pk = case["peak_tflops"]
        gpu = replace(gpu, bf16_flops=float(pk["bf16"]) * 1e12, fp8_flops=float(pk.get("fp8", pk["bf16"])) * 1e12)
    if case.get("power_limit_W"):
        gpu = gpu.at_power_limit(float(case["power_limit_W"]))
    return gpu


def case_memory(case: dict[str, Any], gpu: GpuSpec | None = None) -> MemoryBreakdown:
    """Memory per GPU of a registry training case on `gpu` (default: its topology's GPU with the case's stated
    figures, `case_gpu`), under its run's memory settings."""
    from ..sim.references import build_topology
    from .compute import gpu_of_topology
    if gpu is None:
        gpu = case_gpu(case, gpu_of_topology(build_topology(case["topology"], int(case["gpus"]))[0]))
    return peak_memory(load_model(case["model"]), case_layout(case), gpu.memory_bytes,
                       policy=run_policy(case), gpu=gpu.name)


@dataclass(frozen=True)
class MeasuredMemory:
    """One published peak-memory reading and our prediction for the same run."""

    id: str
    published_bytes: float
    predicted_bytes: float
    source: str
    note: str

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_bytes / self.published_bytes - 1.0


def measured_memory() -> list[MeasuredMemory]:
    """Every reading of `memory_measured.yaml` with the prediction for its layout and settings."""
    from .compute import gpu_spec
    data = yaml.safe_load((_DATA / "memory_measured.yaml").read_text())
    out = []
    for r in data["runs"]:
        gpu = gpu_spec(r["gpu"])
        lay = Layout(**r["layout"])
        m = peak_memory(load_model(r["model"]), lay, float(r.get("capacity_gib", 0)) * GIB or gpu.memory_bytes,
                           policy=MemoryPolicy.from_dict(r.get("memory")), gpu=gpu.name)
        out.append(MeasuredMemory(r["id"], float(r["published_gib"]) * GIB, m.total_bytes, r["source"],
                                  r.get("note", "")))
    return out
