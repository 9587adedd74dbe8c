"""Default one-way latency per link hop (microseconds), the starting point before calibration.

NCCL's tuning model (src/graph/tuning.cc, hwLat, Ring/LL) charges 0.4 us per step over NVLink,
1.0 us over PCIe and 0.9 us (+ base) over the network; we split those per-step figures over the hops a
step crosses (GPU-switch-GPU = 2 NVLink hops; GPU-switch-CPU-switch-GPU = 4 PCIe hops). Network
figures: NVIDIA ConnectX-6/7 datasheets (sub-600 ns adapter latency), Quantum/Quantum-2 datasheets
(~130 ns port-to-port), Spectrum Ethernet switches (~0.5 us cut-through). SHM and loopback are
UNCALIBRATED placeholders for `host-cpu`; `ringflow calibrate` measures this machine's figures.
"""
from __future__ import annotations

LATENCY_US: dict[str, float] = {
    "nvlink": 0.2,        # NCCL hwLat NVLink 0.4 us per GPU->switch->GPU step / 2 hops
    "pcie": 0.25,         # NCCL hwLat PCI 1.0 us per GPU->sw->CPU->sw->GPU step / 4 hops
    "qpi": 0.3,           # one socket hop; order of a remote-NUMA access (uncalibrated model default)
    "nic": 0.6,           # adapter + cable: ConnectX-6/7 datasheets, "sub-600ns" latency
    "ib_switch": 0.13,    # NVIDIA Quantum / Quantum-2 datasheets, port-to-port latency ~130 ns
    "eth_switch": 0.5,    # NVIDIA Spectrum / merchant cut-through switches, ~0.5 us (uncalibrated)
    "shm": 0.5,           # host shared memory hop, UNCALIBRATED default (calibration replaces it)
    "loopback": 10.0,     # TCP over loopback, UNCALIBRATED default (calibration replaces it)
}

# Host memory copy bandwidth per direction used by `host-cpu` before calibration: UNCALIBRATED defaults,
# chosen as one DDR4-3200 channel (25.6 GB/s, JEDEC JESD79-4) for SHM and ~1/4 of it for loopback TCP.
HOST_SHM_GBPS_DEFAULT = 25.6
HOST_LOOPBACK_GBPS_DEFAULT = 6.4
