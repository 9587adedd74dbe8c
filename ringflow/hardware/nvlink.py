"""NVLink generations, NVSwitch generations and NVLink-C2C.

Bandwidths are stored PER DIRECTION per link; the vendors' "bidirectional" figures are derived
(x2). Sources are NVIDIA architecture whitepapers / datasheets.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument


@dataclass(frozen=True)
class NvlinkGen:
    """One NVLink generation: per-link bandwidth and links per GPU."""

    gen: int
    gpu: str                     # the GPU that introduced it
    link_GBps: float             # per link, per direction
    signal_gbps: float           # per lane signalling rate (Gb/s)
    links_per_gpu: int
    source: str

    @property
    def link_bidir_GBps(self) -> float:
        """Per link, both directions (the vendors' headline figure)."""
        return 2 * self.link_GBps

    @property
    def gpu_GBps(self) -> float:
        """All links of one GPU, per direction."""
        return self.link_GBps * self.links_per_gpu

    @property
    def gpu_bidir_GBps(self) -> float:
        """All links of one GPU, both directions (P100 160, V100 300, A100 600, H100 900, B200 1800)."""
        return 2 * self.gpu_GBps


NVLINK_GENERATIONS: dict[int, NvlinkGen] = {g.gen: g for g in [
    # P100 whitepaper ("NVIDIA Tesla P100", 2016): 4 links x 40 GB/s bidirectional = 160 GB/s; 20 Gb/s lanes.
    NvlinkGen(1, "P100", 20.0, 20.0, 4, "NVIDIA Tesla P100 whitepaper (2016)"),
    # V100 whitepaper ("NVIDIA Tesla V100 GPU Architecture", 2017): 6 links x 50 GB/s = 300 GB/s; 25 Gb/s lanes.
    NvlinkGen(2, "V100", 25.0, 25.0, 6, "NVIDIA Tesla V100 architecture whitepaper (2017)"),
    # A100 whitepaper ("NVIDIA A100 Tensor Core GPU Architecture", 2020): 12 links, 600 GB/s total; 50 Gb/s lanes x4.
    NvlinkGen(3, "A100", 25.0, 50.0, 12, "NVIDIA A100 Tensor Core GPU architecture whitepaper (2020)"),
    # H100 whitepaper ("NVIDIA H100 Tensor Core GPU Architecture", 2022): 18 links, 900 GB/s total; 100 Gb/s PAM4 x2.
    NvlinkGen(4, "H100", 25.0, 100.0, 18, "NVIDIA H100 Tensor Core GPU architecture whitepaper (2022)"),
    # Blackwell datasheet (NVIDIA DGX B200 / Blackwell architecture technical brief, 2024): 18 links, 1.8 TB/s total.
    NvlinkGen(5, "B200", 50.0, 200.0, 18, "NVIDIA Blackwell architecture technical brief (2024)"),
]}


def nvlink_gen(gen: int) -> NvlinkGen:
    """The NvlinkGen for generation `gen` (1..5)."""
    if gen not in NVLINK_GENERATIONS:
        raise InvalidArgument(f"NVLink generation {gen} is not known", "use 1..5")
    return NVLINK_GENERATIONS[gen]


@dataclass(frozen=True)
class NvswitchGen:
    """One NVSwitch chip generation."""

    gen: int
    system: str                  # the system that introduced it
    nvlink_gen: int
    ports: int                   # NVLink ports per switch chip
    gpu_GBps: float              # per GPU, per direction, through the switch fabric
    source: str

    @property
    def gpu_bidir_GBps(self) -> float:
        """Per GPU, both directions."""
        return 2 * self.gpu_GBps

    @property
    def chip_GBps(self) -> float:
        """Aggregate switching bandwidth of one chip, per direction."""
        return self.ports * nvlink_gen(self.nvlink_gen).link_GBps


NVSWITCH_GENERATIONS: dict[int, NvswitchGen] = {g.gen: g for g in [
    # NVSwitch whitepaper ("NVIDIA NVSwitch", 2018): 18 NVLink2 ports per chip; DGX-2 300 GB/s per GPU bidir.
    NvswitchGen(1, "DGX-2", 2, 18, 150.0, "NVIDIA NVSwitch technical overview (2018)"),
    # A100 whitepaper: 2nd-gen NVSwitch, 36 ports, 600 GB/s per GPU bidir in DGX A100.
    NvswitchGen(2, "DGX A100", 3, 36, 300.0, "NVIDIA A100 architecture whitepaper / DGX A100 user guide (2020)"),
    # H100 whitepaper: 3rd-gen NVSwitch, 64 NVLink4 ports, 900 GB/s per GPU bidir in DGX H100.
    NvswitchGen(3, "DGX H100", 4, 64, 450.0, "NVIDIA H100 architecture whitepaper (2022)"),
    # GB200 NVL72 datasheet: NVLink5 switch chip, 72 ports, 1.8 TB/s per GPU bidir, 130 TB/s per 72 GPUs.
    NvswitchGen(4, "GB200 NVL72", 5, 72, 900.0, "NVIDIA GB200 NVL72 datasheet (2024)"),
]}

# What NCCL counts one NVLink of each generation as achieving, GB/s per direction (src/graph/topo.h,
# SM60/SM70/SM80/SM90/SM100_NVLINK_BW = 18.0 / 20.0 / 20.0 / 20.6 / 40.1, https://github.com/NVIDIA/nccl/blob/master/
# src/graph/topo.h; SM100 quoted in https://github.com/NVIDIA/nccl/issues/1807), keyed by NVLink generation.
NCCL_NVLINK_GBPS: dict[int, float] = {1: 18.0, 2: 20.0, 3: 20.0, 4: 20.6, 5: 40.1}
NVLINK_REFERENCE_GEN = 4   # the generation the simulator's NVLink efficiency is measured on (H100 ring busbw)


def nvlink_efficiency_scale(gen: int | None) -> float:
    """The achievable fraction of an NVLink of generation `gen` relative to the reference generation's, from
    NCCL's per-link figures (A100 0.800 and B200 0.802 of line rate against H100's 0.824); 1 when unknown."""
    if gen not in NCCL_NVLINK_GBPS or gen not in NVLINK_GENERATIONS:
        return 1.0
    ref = NCCL_NVLINK_GBPS[NVLINK_REFERENCE_GEN] / NVLINK_GENERATIONS[NVLINK_REFERENCE_GEN].link_GBps
    return NCCL_NVLINK_GBPS[gen] / NVLINK_GENERATIONS[gen].link_GBps / ref


def edge_efficiency_scale(edge: Mapping[str, Any]) -> float:
    """A topology edge's achievable fraction relative to the reference generation's: NVLink edges by their
    generation (`nvlink_efficiency_scale`), every other edge 1."""
    if edge.get("tier") != "nvlink" or not edge.get("gen"):
        return 1.0
    return nvlink_efficiency_scale(int(edge["gen"]))


# In-switch (NVLink SHARP) reduction rate of one NVSwitch chip, in 32-bit adds per second (x 1e9): an NVLS
# reduction of n inputs costs the switches n - 1 adds per 32-bit word. Gen 3: 400 GFLOPS FP32 per chip (Hot Chips
# 34, 2022, "The NVLink-Network Switch", A. Ishii and R. Wells, https://hc34.hotchips.org/; quoted in
# https://github.com/NVIDIA/nccl/issues/1455, description by shh2000: "SHArP ALU @nvswitch3 has 400GFLOPS@float32").
# Gen 4 (NVLink5 switch chip): no published figure; assumed equal to gen 3 (`SimParams.nvls_reduce_gflops`
# overrides it). 16-bit data is assumed to pack two values per 32-bit add, so the cap is the same in bytes.
NVSWITCH_REDUCE_GFLOPS: dict[int, float] = {3: 400.0, 4: 400.0}

# NVLink-C2C (Grace <-> Blackwell/Hopper): 900 GB/s bidirectional (NVIDIA Grace Hopper / GB200 datasheets).
NVLINK_C2C_GBPS_PER_DIR = 450.0
