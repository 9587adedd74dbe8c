"""Vendor systems behind the topology presets: the audited figures of each server or rack, with sources.

One SystemSpec per preset: GPU model and count, NVLink generation and links per GPU, NVSwitch chips,
CPU sockets, host PCIe generation, compute (scale-out) NICs and storage / in-band NICs (not used for
compute, so not wired into the cluster fabric). `sources` names the document (title + URL) behind
each group of figures; `assumed` lists what no source states and the preset fills in.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument

# The documents, cited by every entry that uses them.
DGX1_WP = ("NVIDIA DGX-1 System Architecture white paper (WP-08437-001), "
           "https://images.nvidia.com/content/pdf/dgx1-system-architecture-whitepaper1.pdf")
DGX1V_WP = ("NVIDIA DGX-1 With Tesla V100 System Architecture white paper (WP-08437-002), "
            "https://images.nvidia.com/content/pdf/dgx1-v100-system-architecture-whitepaper.pdf")
DGX2_UG = "NVIDIA DGX-2 System User Guide, hardware overview, https://docs.nvidia.com/dgx/dgx2-user-guide/"
DGXA100_WP = ("NVIDIA DGX A100 System Architecture white paper (WP-10083-001), https://images.nvidia.com/aem-dam/"
              "en-zz/Solutions/data-center/dgx-a100/dgxa100-system-architecture-white-paper.pdf")
DGXA100_UG = ("NVIDIA DGX A100 User Guide, hardware overview and network ports, "
              "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html")
DGXA100_DS = ("NVIDIA DGX A100 datasheet (320GB and 640GB columns), https://www.nvidia.com/content/dam/en-zz/"
              "Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf")
DGXH100_UG = ("NVIDIA DGX H100/H200 User Guide, hardware overview, "
              "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html")
H100_WP = "NVIDIA H100 Tensor Core GPU Architecture white paper, https://resources.nvidia.com/en-us-tensor-core"
DEEPSEEK_HW = ("Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware for AI Architectures "
               "(arXiv:2505.09343), Sec. 2 and 5, https://arxiv.org/abs/2505.09343")
H20_SPEC = ("vendor spec listings of the NVIDIA H20 (no public NVIDIA datasheet), e.g. "
            "https://willitrunai.com/es/gpus/h20-96gb")
DGXB200_UG = ("NVIDIA DGX B200 User Guide, hardware overview, "
              "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html")
HGX_PAGE = "NVIDIA HGX platform spec table (HGX B300 / B200 / H200), https://www.nvidia.com/en-us/data-center/hgx/"
DGXB300_PAGE = "NVIDIA DGX B300 datasheet / product page, https://www.nvidia.com/en-us/data-center/dgx-b300/"
CX8_BLOG = ("NVIDIA technical blog, NVIDIA ConnectX-8 SuperNICs Advance AI Platform Architecture with PCIe Gen6 "
            "Connectivity, https://developer.nvidia.com/blog/nvidia-connectx-8-supernics-advance-ai-platform-"
            "architecture-with-pcie-gen6-connectivity/")
GB200_PAGE = "NVIDIA GB200 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
GB300_PAGE = "NVIDIA GB300 NVL72 spec table, https://www.nvidia.com/en-us/data-center/gb300-nvl72/"


@dataclass(frozen=True)
class SystemSpec:
    """The audited figures of one preset machine (per server, or per rack for NVL72)."""

    name: str                    # the preset name
    title: str
    gpu: str                     # a GPU_MODELS key
    gpus: int
    nvlink_gen: int
    nvlinks_per_gpu: int
    nvswitch_gen: int | None     # NVSWITCH_GENERATIONS key; None: direct NVLinks (DGX-1)
    nvswitch_chips: int
    cpu: str
    sockets: int
    cores_per_socket: int
    socket_link: str | None      # SOCKET_LINKS key; None: no coherent link between sockets (Grace trays)
    socket_links: int
    pcie_gen: int                # GPU <-> NIC PCIe generation
    nics: int                    # compute (scale-out) NICs, one port each
    nic_gbps: float
    nic_model: str
    storage_nics: int            # storage / in-band adapters, not part of the compute fabric
    storage_nic_gbps: float
    storage_nic_model: str
    trays: int = 1               # compute trays (NVL72 racks: 18)
    sources: tuple[tuple[str, str], ...] = ()   # (figures, "document title, URL")
    assumed: str = ""            # figures no source states, and what the preset uses

    def source(self, figure: str) -> str:
        """The document behind a group of figures ('gpus', 'nvlink', 'nvswitch', 'cpu', 'pcie', 'nics', 'storage')."""
        for key, doc in self.sources:
            if key == figure:
                return doc
        raise InvalidArgument(f"{self.name}: no source recorded for {figure!r}",
                              f"use one of {', '.join(k for k, _ in self.sources)}")


def _src(**docs: str) -> tuple[tuple[str, str], ...]:
    return tuple(docs.items())


_FIGS = ("gpus", "nvlink", "nvswitch", "cpu", "pcie", "nics", "storage")


def _same(doc: str, **over: str) -> tuple[tuple[str, str], ...]:
    return tuple((k, over.get(k, doc)) for k in _FIGS)


SYSTEMS: dict[str, SystemSpec] = {s.name: s for s in [
    # DGX-1: 8 P100 SXM2 in a hybrid cube-mesh (4 NVLink1 each), 2 x Xeon E5-2698 v4, 4 PLX PCIe Gen3 switches each
    # with 2 GPUs and 1 EDR IB NIC (4 x 100 Gb/s); dual 10GbE for storage / in-band.
    SystemSpec("dgx1-p100", "NVIDIA DGX-1 (P100)", "P100", 8, 1, 4, None, 0, "Xeon E5-2698 v4", 2, 20, "QPI-9.6", 2,
               3, 4, 100, "ConnectX-4 EDR", 2, 10, "10GBASE-T", sources=_same(DGX1_WP)),
    SystemSpec("dgx1-v100", "NVIDIA DGX-1 (V100)", "V100", 8, 2, 6, None, 0, "Xeon E5-2698 v4", 2, 20, "QPI-9.6", 2,
               3, 4, 100, "ConnectX-4 EDR", 2, 10, "10GBASE-T", sources=_same(DGX1V_WP)),
    # DGX-2: 16 V100 on two baseboards of 6 NVSwitches, 2 x Xeon Platinum 8168 (3 UPI), 8 x 100 Gb/s EDR / 100GbE
    # (ConnectX-5), dual 10/25/40/50/100GbE for storage.
    SystemSpec("dgx2", "NVIDIA DGX-2", "V100", 16, 2, 6, 1, 12, "Xeon Platinum 8168", 2, 24, "UPI-10.4", 3, 3,
               8, 100, "ConnectX-5 EDR / 100GbE", 2, 100, "ConnectX-5 dual-port 100GbE", sources=_same(DGX2_UG)),
    # DGX A100 640GB: 8 A100 80GB, 6 NVSwitch gen2 (12 NVLink3 per GPU), 2 x EPYC 7742, 4 PCIe Gen4 switch complexes
    # each with 2 GPUs and 2 single-port ConnectX-6 HDR, every device on its own x16; 2 dual-port ConnectX-6
    # (storage / in-band, up to 200 Gb/s) outside the compute fabric.
    SystemSpec("dgx-a100", "NVIDIA DGX A100 640GB", "A100", 8, 3, 12, 2, 6, "EPYC 7742", 2, 64, "xGMI-2", 4, 4,
               8, 200, "ConnectX-6 HDR (single-port)", 2, 200, "ConnectX-6 dual-port",
               sources=_same(DGXA100_UG, pcie=DGXA100_WP, nvswitch=DGXA100_WP, storage=DGXA100_DS),
               assumed="xGMI link count between the EPYC sockets (4) is not in the NVIDIA documents"),
    # DGX A100 320GB: the same system with A100 40GB and one dual-port storage ConnectX-6 (a second is optional).
    SystemSpec("a100-40gb", "NVIDIA DGX A100 320GB", "A100-40GB", 8, 3, 12, 2, 6, "EPYC 7742", 2, 64, "xGMI-2", 4, 4,
               8, 200, "ConnectX-6 HDR (single-port)", 1, 200, "ConnectX-6 dual-port",
               sources=_same(DGXA100_UG, pcie=DGXA100_WP, nvswitch=DGXA100_WP, storage=DGXA100_DS),
               assumed="xGMI link count between the EPYC sockets (4) is not in the NVIDIA documents"),
    # DGX H100 / H200: 8 GPUs, 4 NVSwitch gen3 (18 NVLink4 per GPU), 2 x Xeon Platinum 8480C, 8 single-port
    # ConnectX-7 400 Gb/s behind 4 OSFP cages; 2 dual-port ConnectX-7 (storage / in-band, up to 400 Gb/s).
    SystemSpec("dgx-h100", "NVIDIA DGX H100", "H100", 8, 4, 18, 3, 4, "Xeon Platinum 8480C", 2, 56, "UPI-16", 4, 5,
               8, 400, "ConnectX-7 (single-port)", 2, 400, "ConnectX-7 dual-port",
               sources=_same(DGXH100_UG, nvswitch=H100_WP)),
    SystemSpec("dgx-h200", "NVIDIA DGX H200", "H200", 8, 4, 18, 3, 4, "Xeon Platinum 8480C", 2, 56, "UPI-16", 4, 5,
               8, 400, "ConnectX-7 (single-port)", 2, 400, "ConnectX-7 dual-port",
               sources=_same(DGXH100_UG, nvswitch=H100_WP)),
    # HGX H800: the HGX H100 baseboard (4 NVSwitch gen3) with H800s, each on 8 NVLink4 links (400 GB/s both
    # directions); 8 x 400 Gb/s ConnectX-7 per node as DeepSeek runs it.
    SystemSpec("h800", "NVIDIA HGX H800 (8 GPUs)", "H800", 8, 4, 8, 3, 4, "Xeon Platinum 8480C", 2, 56, "UPI-16", 4, 5,
               8, 400, "ConnectX-7 InfiniBand", 0, 0, "",
               sources=_same(DEEPSEEK_HW, nvswitch=H100_WP, cpu=DGXH100_UG, pcie=DGXH100_UG, storage=DEEPSEEK_HW),
               assumed="host (CPUs, PCIe switches) as DGX H100; storage NICs not stated, none modelled"),
    # HGX H20: H20 GPUs on the HGX Hopper baseboard (18 NVLink4 links, 900 GB/s), PCIe Gen5.
    SystemSpec("h20", "NVIDIA HGX H20 (8 GPUs)", "H20", 8, 4, 18, 3, 4, "Xeon Platinum 8480C", 2, 56, "UPI-16", 4, 5,
               8, 400, "ConnectX-7 (single-port)", 0, 0, "",
               sources=_same(H20_SPEC, nvswitch=H100_WP, cpu=DGXH100_UG, pcie=H20_SPEC, nics=DGXH100_UG,
                             storage=H20_SPEC),
               assumed="host and 8 x 400G NICs as a typical HGX build (DGX H100); storage NICs none modelled"),
    # DGX B200: 8 B200, 2 NVLink5 switch chips (18 links per GPU, 1.8 TB/s), 2 x Xeon Platinum 8570, 8 single-port
    # ConnectX-7 400 Gb/s behind 4 OSFP cages; 2 dual-port BlueField-3 DPUs (storage / in-band, up to 400 Gb/s).
    SystemSpec("dgx-b200", "NVIDIA DGX B200", "B200", 8, 5, 18, 4, 2, "Xeon Platinum 8570", 2, 56, "UPI-20", 4, 5,
               8, 400, "ConnectX-7 (single-port)", 2, 400, "BlueField-3 dual-port",
               sources=_same(DGXB200_UG, nvswitch=HGX_PAGE)),
    # HGX B300: 8 B300, 2 NVLink5 switch chips, 8 ConnectX-8 SuperNICs (800 Gb/s) on the baseboard, each with its
    # integrated PCIe Gen6 switch joining its GPU; host as DGX B300 (2 x Xeon 6776P, 2 BlueField-3 for storage).
    SystemSpec("hgx-b300", "NVIDIA HGX B300 (as in DGX B300)", "B300", 8, 5, 18, 4, 2, "Xeon 6776P", 2, 64, "UPI-24",
               4, 6, 8, 800, "ConnectX-8 SuperNIC", 2, 400, "BlueField-3 dual-port",
               sources=_same(HGX_PAGE, cpu=DGXB300_PAGE, pcie=CX8_BLOG, storage=DGXB300_PAGE),
               assumed="4 UPI links between the Xeon 6776P sockets"),
    # GB200 NVL72: 18 compute trays of 2 Grace + 4 B200 (NVLink-C2C), 9 switch trays x 2 NVLink5 switch chips,
    # 4 ConnectX-7 400 Gb/s per tray (one per GPU) and a BlueField-3 DPU per tray for storage.
    SystemSpec("gb200-nvl72", "NVIDIA GB200 NVL72 rack", "GB200", 72, 5, 18, 4, 18, "Grace", 36, 72, None, 0, 5,
               72, 400, "ConnectX-7", 18, 400, "BlueField-3", trays=18, sources=_same(GB200_PAGE),
               assumed="NIC on its Grace's PCIe Gen5 x16 (GPU reaches it over NVLink-C2C)"),
    # GB300 NVL72: as GB200 NVL72 with B300 (288 GB HBM3e) and one ConnectX-8 SuperNIC 800 Gb/s per GPU whose
    # integrated PCIe Gen6 switch joins the GPU and its Grace.
    SystemSpec("gb300-nvl72", "NVIDIA GB300 NVL72 rack", "GB300", 72, 5, 18, 4, 18, "Grace", 36, 72, None, 0, 6,
               72, 800, "ConnectX-8 SuperNIC", 18, 400, "BlueField-3", trays=18,
               sources=_same(GB300_PAGE, pcie=CX8_BLOG)),
]}


def system_spec(name: str) -> SystemSpec:
    """The audited figures of preset `name` (see SYSTEMS)."""
    if name not in SYSTEMS:
        raise InvalidArgument(f"no vendor system is recorded for preset {name!r}",
                              f"use one of {', '.join(SYSTEMS)}")
    return SYSTEMS[name]
