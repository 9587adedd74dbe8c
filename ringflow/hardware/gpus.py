"""GPU models: dense tensor-core peak FLOP/s, memory size and bandwidth, NVLink and PCIe.

All TFLOP/s are DENSE (the datasheets' "with sparsity" figures are 2x). Sources are the NVIDIA
datasheets named per entry (SXM variants).
"""
from __future__ import annotations

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


GPU_MODELS: dict[str, GpuModel] = {g.name: g for g in [
    # Tesla P100 SXM2 datasheet: FP16 21.2 TFLOPS, 16 GB HBM2 at 732 GB/s, NVLink 4 links, PCIe 3.0.
    GpuModel("P100", None, 21.2, None, 16, 732, 1, 4, 3,
             "NVIDIA Tesla P100 datasheet, https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf"),
    # Tesla V100 SXM2 datasheet: tensor 125 TFLOPS (FP16), 32 GB HBM2 at 900 GB/s, 6 NVLinks, PCIe 3.0.
    GpuModel("V100", None, 125.0, None, 32, 900, 2, 6, 3,
             "NVIDIA V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
             "volta-v100-datasheet-update-us-1165301-r5.pdf"),
    # A100 80GB SXM datasheet: BF16/FP16 tensor 312 TFLOPS dense, 80 GB HBM2e at 2,039 GB/s, 12 NVLinks, PCIe 4.0.
    GpuModel("A100", 312.0, 312.0, None, 80, 2039, 3, 12, 4,
             "NVIDIA A100 datasheet (A100 80GB SXM column), https://www.nvidia.com/content/dam/en-zz/Solutions/"
             "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    # A100 40GB SXM (DGX A100 320GB): same compute as the 80 GB part; 40 GB HBM2 at 1,555 GB/s.
    GpuModel("A100-40GB", 312.0, 312.0, None, 40, 1555, 3, 12, 4,
             "NVIDIA A100 datasheet (A100 40GB SXM column), https://www.nvidia.com/content/dam/en-zz/Solutions/"
             "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    # H100 SXM5 datasheet: BF16 1,979 / FP8 3,958 TFLOPS with sparsity -> 989.5 / 1,979 dense; 80 GB HBM3 3.35 TB/s.
    GpuModel("H100", 989.5, 989.5, 1979.0, 80, 3350, 4, 18, 5,
             "NVIDIA H100 datasheet (H100 SXM column), https://www.nvidia.com/en-us/data-center/h100/"),
    # H800 SXM5: H100 compute and memory; NVLink cut to 8 NVLink4 links = 400 GB/s both directions
    # (DeepSeek, "Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware", Sec. 4).
    GpuModel("H800", 989.5, 989.5, 1979.0, 80, 3350, 4, 8, 5,
             "arXiv:2505.09343 (DeepSeek-V3 hardware paper), https://arxiv.org/abs/2505.09343; compute as H100 SXM"),
    # H200 SXM datasheet: same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s.
    GpuModel("H200", 989.5, 989.5, 1979.0, 141, 4800, 4, 18, 5,
             "NVIDIA H200 datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/"),
    # H20 (Hopper, export part): 148 TFLOPS BF16/FP16 and 296 TFLOPS FP8 dense, 96 GB HBM3 at 4.0 TB/s, NVLink4
    # 900 GB/s (18 links), PCIe Gen5 x16. NVIDIA publishes no public datasheet; figures as vendors list them.
    GpuModel("H20", 148.0, 148.0, 296.0, 96, 4000, 4, 18, 5,
             "vendor spec listings of the NVIDIA H20 (no public NVIDIA datasheet), e.g. "
             "https://willitrunai.com/es/gpus/h20-96gb"),
    # HGX/DGX B200 datasheet: 8 GPUs = 36 PF BF16 and 72 PF FP8 with sparsity -> 2.25 / 4.5 PF dense per GPU;
    # 1,440 GB HBM3e and 64 TB/s per 8 GPUs -> 180 GB and 8 TB/s per GPU.
    GpuModel("B200", 2250.0, 2250.0, 4500.0, 180, 8000, 5, 18, 6,
             "NVIDIA DGX B200 datasheet, https://www.nvidia.com/en-us/data-center/dgx-b200/"),
    # HGX B300 spec table: 8 GPUs = 36 PF BF16, 72 PF FP8 with sparsity -> 2.25 / 4.5 PF dense per GPU;
    # up to 2.3 TB HBM3e per 8 GPUs (288 GB per GPU), 8 TB/s per GPU; PCIe Gen6 host interface.
    GpuModel("B300", 2250.0, 2250.0, 4500.0, 288, 8000, 5, 18, 6,
             "NVIDIA HGX platform spec table (HGX B300), https://www.nvidia.com/en-us/data-center/hgx/"),
    # GB200 NVL72 datasheet: 72 GPUs = 360 PF BF16, 720 PF FP8 with sparsity -> 2.5 / 5 PF dense per GPU;
    # 13.4 TB HBM3e (186 GB per GPU) at 576 TB/s (8 TB/s per GPU).
    GpuModel("GB200", 2500.0, 2500.0, 5000.0, 186, 8000, 5, 18, 6,
             "NVIDIA GB200 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb200-nvl72/"),
    # GB300 NVL72 spec table: 72 GPUs = 360 PF BF16, 720 PF FP8 with sparsity -> 2.5 / 5 PF dense per GPU;
    # up to 21 TB HBM3e (288 GB per GPU) at up to 576 TB/s (8 TB/s per GPU).
    GpuModel("GB300", 2500.0, 2500.0, 5000.0, 288, 8000, 5, 18, 6,
             "NVIDIA GB300 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb300-nvl72/"),
]}


def gpu_model(name: str) -> GpuModel:
    """A GPU model by name (see GPU_MODELS)."""
    key = name.upper()
    if key not in GPU_MODELS:
        raise InvalidArgument(f"GPU model {name!r} is not known", f"use one of {', '.join(GPU_MODELS)}")
    return GPU_MODELS[key]
