"""GPU models: dense tensor-core peak FLOP/s, memory size and bandwidth, NVLink and PCIe, exponential rate.

All TFLOP/s are DENSE (the datasheets' "with sparsity" figures are 2x). Sources are the NVIDIA
datasheets named per entry (SXM variants).

``exp_per_s`` is the rate of the special-function units' base-2 exponential (MUFU.EX2), which softmax needs
once per attention score: the CUDA C++ Programming Guide's arithmetic-instruction throughput table gives 16
results per clock per SM on compute capability 6.0, 7.x, 8.x and 9.0, times the SMs and the boost clock of the
whitepaper (FlashAttention-3, arXiv:2407.08608, section 3.1, footnote 5: "We multiply 16 by 132 SMs and 1830
MHz clock speed to get 3.9 TFLOPS of special functions" on H100 SXM5). Blackwell's come from NVIDIA's own
table ("Attention acceleration (SFU EX2)": Blackwell 5, Blackwell Ultra 10.7 TeraExponentials/s). ``async_mma``:
the tensor cores run asynchronously to the warps that issue them (Hopper's WGMMA and later), which lets a
warp-specialised attention kernel compute one tile's softmax while another tile's GEMMs run.
``nccl_sm_share``: NCCL runs each collective as a kernel whose CTAs (one per channel) hold SMs for the whole
collective, so compute overlapped with it runs on the rest (measured where a source gives the CTA count).

``power_limit_W`` is the board power limit a GPU runs at by default (the datasheet's TDP): the measured GEMM and
attention tables (``ringflow/data/gemm_tables.yaml``, ``attention_kernels.yaml``) were taken there. Under a lower
limit the GPU holds a lower SM clock through tensor-core-bound work, and its tensor and special-function rates
fall with it; ``sustained_clock_MHz`` is that clock per power limit where a source measured it
(`GpuModel.clock_ratio`). HBM bandwidth is not scaled: the memory clock stays at its rate under a power cap.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..errors import InvalidArgument


@dataclass(frozen=True)
class GpuModel:
    """Peak figures of one GPU model."""

    name: str
    bf16_tflops: float | None    # dense BF16 tensor; None when the GPU has no BF16
    fp16_tflops: float           # dense FP16 (tensor core where present)
    fp8_tflops: float | None     # dense FP8 tensor; None when absent
    memory_GB: float             # 1e9 bytes as the datasheets count
    memory_GBps: float
    nvlink_gen: int
    nvlinks: int
    pcie_gen: int
    source: str
    exp_per_s: float = 0.0       # base-2 exponentials per second (MUFU.EX2); 0 = not known
    async_mma: bool = False      # asynchronous tensor-core MMA (Hopper WGMMA, Blackwell tcgen05)
    exp_source: str = ""
    nccl_sm_share: float = 0.0   # share of the SMs a running NCCL collective holds (its CTAs); 0 = not known
    nccl_sm_source: str = ""
    power_limit_W: float = 0.0   # default board power limit (datasheet TDP); 0 = not known
    # (power limit in W, average SM clock in MHz) under a tensor-core-bound load, ascending; () = not measured
    sustained_clock_MHz: tuple[tuple[float, float], ...] = ()
    sustained_clock_source: str = ""

    def clock_ratio(self, power_limit_W: float, reference_W: float | None = None) -> float:
        """Sustained SM clock under a `power_limit_W` board limit over that under `reference_W` (default: the GPU's
        default limit), linear in the limit between the measured ones."""
        ref = self.power_limit_W if reference_W is None else reference_W
        for w in (power_limit_W, reference_W):
            if w is not None and not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
                raise InvalidArgument(f"{self.name}: power limit {w!r} W", "give a positive power limit in watts")
        if not ref:
            raise InvalidArgument(f"{self.name}: its default power limit is not known",
                                  "add its power_limit_W (the datasheet TDP) to ringflow/hardware/gpus.py")
        if power_limit_W == ref:
            return 1.0
        if not self.sustained_clock_MHz:
            raise InvalidArgument(f"{self.name} at a {power_limit_W:g} W power limit (its default is "
                                  f"{self.power_limit_W:g} W): no measured sustained clock under a power limit",
                                  "state the run at the GPU's default power limit, or add the GPU's "
                                  "sustained_clock_MHz with its source to ringflow/hardware/gpus.py")
        return self._clock_at(power_limit_W) / self._clock_at(ref)

    def _clock_at(self, watts: float) -> float:
        """The sustained SM clock in MHz under a `watts` limit, interpolated between the measured limits."""
        pts = self.sustained_clock_MHz
        lo, hi = pts[0][0], pts[-1][0]
        if not lo <= watts <= hi:
            raise InvalidArgument(f"{self.name} at a {watts:g} W power limit: its sustained clock is measured "
                                  f"from {lo:g} to {hi:g} W", f"give a power limit within {lo:g}-{hi:g} W")
        j = bisect.bisect_left([w for w, _ in pts], watts)
        if pts[j][0] == watts:
            return pts[j][1]
        (w0, f0), (w1, f1) = pts[j - 1], pts[j]
        return f0 + (f1 - f0) * (watts - w0) / (w1 - w0)


_GUIDE = ("CUDA C++ Programming Guide, Arithmetic Instructions throughput table: 16 base-2 exponentials per clock "
          "per SM")


def _sfu_rate(sms: int, boost_GHz: float) -> float:
    """Exponentials per second of `sms` SMs at 16 a clock (the CUDA guide's figure) at `boost_GHz`."""
    return 16.0 * sms * boost_GHz * 1e9


_BLACKWELL_ULTRA_BLOG = ("NVIDIA Technical Blog, 'Inside NVIDIA Blackwell Ultra: The Chip Powering the AI Factory "
                         "Era' (2025), https://developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-"
                         "powering-the-ai-factory-era/, table row 'Attention acceleration (SFU EX2)'")


_A100_EXP = f"{_GUIDE} (compute capability 8.0) x 108 SMs x 1.41 GHz boost (NVIDIA A100 Tensor Core GPU whitepaper)"
_GH100_EXP = ("arXiv:2407.08608 (FlashAttention-3) section 3.1 'Pingpong scheduling': 'the H100 SXM5 GPU has 989 "
              "TFLOPS of FP16 matmul but only 3.9 TFLOPS of special functions such as exponential'; footnote 5: 16 "
              "per SM per clock (CUDA programming guide) x 132 SMs x 1830 MHz; H800 and H200 are the same GH100 part")
_BLACKWELL_EXP = f"{_BLACKWELL_ULTRA_BLOG}: Blackwell 5 TeraExponentials/s"
_GH100_NCCL = ("NVIDIA Developer Forums, 'Compute-Communication Overlap Causes Severe GEMM Performance Degradation "
               "because of Tail Effect' (2025), https://forums.developer.nvidia.com/t/compute-communication-overlap-"
               "causes-severe-gemm-performance-degradation-because-of-tail-effect/337991: Nsight Systems on an H100 "
               "(132 SMs) under FSDP prefetch: 'the concurrent ncclAllGather kernel launches 24 blocks'")
_H100_POWER = ("arXiv:2604.11391v2 (Ujeniya, Eitzinger, Hager, Wellein, 'Architectural Trade-offs in the "
               "Energy-Efficient Era: A Comparative Study of power-capping NVIDIA H100 and H200', 2026), Fig. 6b: "
               "average SM clock of an H100 SXM (94 GiB HBM2e, 700 W TDP; NHR@FAU Helma) running ViT-L/16 "
               "inference (batch 256, TF32 tensor cores) under power caps of 200, 300, 400, 500, 600 and 700 W: "
               "625, 1132, 1501, 1731, 1889 and 1969 MHz (the values printed in the figure). The HBM2e part is the "
               "one torchtitan's Grand Teton H100s are; the catalog H100 (HBM3) has the same GH100 die and SMs")
_H100_CLOCKS = ((200.0, 625.0), (300.0, 1132.0), (400.0, 1501.0), (500.0, 1731.0), (600.0, 1889.0),
                (700.0, 1969.0))
_ULTRA_EXP = (f"{_BLACKWELL_ULTRA_BLOG}: Blackwell Ultra 10.7 TeraExponentials/s (2x Blackwell's SFU throughput for "
              "attention)")

GPU_MODELS: dict[str, GpuModel] = {g.name: g for g in [
    # Tesla P100 SXM2 datasheet: FP16 21.2 TFLOPS, 16 GB HBM2 at 732 GB/s, NVLink 4 links, PCIe 3.0.
    GpuModel("P100", None, 21.2, None, 16, 732, 1, 4, 3,
             "NVIDIA Tesla P100 datasheet, https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf",
             exp_per_s=_sfu_rate(56, 1.48),
             exp_source=f"{_GUIDE} (compute capability 6.0) x 56 SMs x 1.48 GHz boost (Tesla P100 whitepaper)"),
    # Tesla V100 SXM2 datasheet: tensor 125 TFLOPS (FP16), 32 GB HBM2 at 900 GB/s, 6 NVLinks, PCIe 3.0.
    GpuModel("V100", None, 125.0, None, 32, 900, 2, 6, 3,
             "NVIDIA V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
             "volta-v100-datasheet-update-us-1165301-r5.pdf",
             exp_per_s=_sfu_rate(80, 1.53),
             exp_source=f"{_GUIDE} (compute capability 7.0) x 80 SMs x 1.53 GHz boost (Tesla V100 whitepaper)"),
    # A100 80GB SXM datasheet: BF16/FP16 tensor 312 TFLOPS dense, 80 GB HBM2e at 2,039 GB/s, 12 NVLinks, PCIe 4.0.
    GpuModel("A100", 312.0, 312.0, None, 80, 2039, 3, 12, 4,
             "NVIDIA A100 datasheet (A100 80GB SXM column), https://www.nvidia.com/content/dam/en-zz/Solutions/"
             "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
             exp_per_s=_sfu_rate(108, 1.41), exp_source=_A100_EXP),
    # A100 40GB SXM (DGX A100 320GB): same compute as the 80 GB part; 40 GB HBM2 at 1,555 GB/s.
    GpuModel("A100-40GB", 312.0, 312.0, None, 40, 1555, 3, 12, 4,
             "NVIDIA A100 datasheet (A100 40GB SXM column), https://www.nvidia.com/content/dam/en-zz/Solutions/"
             "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
             exp_per_s=_sfu_rate(108, 1.41), exp_source=_A100_EXP),
    # H100 SXM5 datasheet: BF16 1,979 / FP8 3,958 TFLOPS with sparsity -> 989.5 / 1,979 dense; 80 GB HBM3 3.35 TB/s.
    GpuModel("H100", 989.5, 989.5, 1979.0, 80, 3350, 4, 18, 5,
             "NVIDIA H100 datasheet (H100 SXM column; max TDP 700 W, configurable), "
             "https://www.nvidia.com/en-us/data-center/h100/",
             exp_per_s=_sfu_rate(132, 1.83), async_mma=True, exp_source=_GH100_EXP,
             nccl_sm_share=24 / 132, nccl_sm_source=_GH100_NCCL, power_limit_W=700.0,
             sustained_clock_MHz=_H100_CLOCKS, sustained_clock_source=_H100_POWER),
    # H800 SXM5: H100 compute and memory; NVLink cut to 8 NVLink4 links = 400 GB/s both directions
    # (DeepSeek, "Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware", Sec. 4).
    GpuModel("H800", 989.5, 989.5, 1979.0, 80, 3350, 4, 8, 5,
             "arXiv:2505.09343 (DeepSeek-V3 hardware paper), https://arxiv.org/abs/2505.09343; compute as H100 SXM",
             exp_per_s=_sfu_rate(132, 1.83), async_mma=True, exp_source=_GH100_EXP,
             nccl_sm_share=24 / 132, nccl_sm_source=_GH100_NCCL),
    # H200 SXM datasheet: same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s.
    GpuModel("H200", 989.5, 989.5, 1979.0, 141, 4800, 4, 18, 5,
             "NVIDIA H200 datasheet (H200 SXM column; max TDP 700 W, configurable), "
             "https://www.nvidia.com/en-us/data-center/h200/",
             exp_per_s=_sfu_rate(132, 1.83), async_mma=True, exp_source=_GH100_EXP,
             nccl_sm_share=24 / 132, nccl_sm_source=_GH100_NCCL, power_limit_W=700.0),
    # H20 (Hopper, export part): 148 TFLOPS BF16/FP16 and 296 TFLOPS FP8 dense, 96 GB HBM3 at 4.0 TB/s, NVLink4
    # 900 GB/s (18 links), PCIe Gen5 x16. NVIDIA publishes no public datasheet; figures as vendors list them.
    GpuModel("H20", 148.0, 148.0, 296.0, 96, 4000, 4, 18, 5,
             "vendor spec listings of the NVIDIA H20 (no public NVIDIA datasheet), e.g. "
             "https://willitrunai.com/es/gpus/h20-96gb",
             exp_per_s=_sfu_rate(78, 1.83), async_mma=True,
             exp_source=f"assumed: {_GUIDE} (compute capability 9.0) x 78 SMs (vendor listings) x 1.83 GHz (H100 "
                        "SXM5's; no public NVIDIA figure)"),
    # HGX/DGX B200 datasheet: 8 GPUs = 36 PF BF16 and 72 PF FP8 with sparsity -> 2.25 / 4.5 PF dense per GPU;
    # 1,440 GB HBM3e and 64 TB/s per 8 GPUs -> 180 GB and 8 TB/s per GPU.
    GpuModel("B200", 2250.0, 2250.0, 4500.0, 180, 8000, 5, 18, 6,
             "NVIDIA DGX B200 datasheet, https://www.nvidia.com/en-us/data-center/dgx-b200/",
             exp_per_s=5.0e12, async_mma=True, exp_source=_BLACKWELL_EXP),
    # HGX B300 spec table: 8 GPUs = 36 PF BF16, 72 PF FP8 with sparsity -> 2.25 / 4.5 PF dense per GPU;
    # up to 2.3 TB HBM3e per 8 GPUs (288 GB per GPU), 8 TB/s per GPU; PCIe Gen6 host interface.
    GpuModel("B300", 2250.0, 2250.0, 4500.0, 288, 8000, 5, 18, 6,
             "NVIDIA HGX platform spec table (HGX B300), https://www.nvidia.com/en-us/data-center/hgx/",
             exp_per_s=10.7e12, async_mma=True, exp_source=_ULTRA_EXP),
    # GB200 NVL72 datasheet: 72 GPUs = 360 PF BF16, 720 PF FP8 with sparsity -> 2.5 / 5 PF dense per GPU;
    # 13.4 TB HBM3e (186 GB per GPU) at 576 TB/s (8 TB/s per GPU).
    GpuModel("GB200", 2500.0, 2500.0, 5000.0, 186, 8000, 5, 18, 6,
             "NVIDIA GB200 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
             exp_per_s=5.0e12, async_mma=True, exp_source=_BLACKWELL_EXP),
    # GB300 NVL72 spec table: 72 GPUs = 360 PF BF16, 720 PF FP8 with sparsity -> 2.5 / 5 PF dense per GPU;
    # up to 21 TB HBM3e (288 GB per GPU) at up to 576 TB/s (8 TB/s per GPU).
    GpuModel("GB300", 2500.0, 2500.0, 5000.0, 288, 8000, 5, 18, 6,
             "NVIDIA GB300 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb300-nvl72/",
             exp_per_s=10.7e12, async_mma=True, exp_source=_ULTRA_EXP),
]}


def gpu_model(name: str) -> GpuModel:
    """A GPU model by name (see GPU_MODELS)."""
    key = name.upper()
    if key not in GPU_MODELS:
        raise InvalidArgument(f"GPU model {name!r} is not known", f"use one of {', '.join(GPU_MODELS)}")
    return GPU_MODELS[key]
