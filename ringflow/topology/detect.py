"""Detect the topology of this machine: CPUs/NUMA nodes and NICs from sysfs, GPUs from `nvidia-smi topo -m`.

Without nvidia-smi (or without GPUs) detection still succeeds: the topology then has CPU and NIC nodes
only, and meta["detected"]["note"] says so. NIC speeds come from /sys/class/net/<if>/speed (Mb/s) or
/sys/class/infiniband/<dev>/ports/1/rate; an interface whose speed cannot be read (virtual, down) is
marked `speed_known: false` and assumed to run at ASSUMED_NIC_GBPS (10 Gb/s).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from typing import Any

from ..errors import TopologyError
from ..hardware import LATENCY_US, pcie_GBps, socket_link
from ..units import gbps_to_GBps
from .graph import LinkType, NodeKind, Topology
from .smi_parser import cpulist_count, topology_from_smi

SMI_TIMEOUT_S = 15.0
ASSUMED_NIC_GBPS = 10.0
_SYS = "/sys"


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def numa_nodes(sys_root: str = _SYS) -> dict[int, str]:
    """NUMA node id -> cpulist ('0-19,40-59'); one node with all CPUs when sysfs has none."""
    base = os.path.join(sys_root, "devices/system/node")
    out: dict[int, str] = {}
    if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
            m = re.match(r"^node(\d+)$", name)
            if m:
                cl = _read(os.path.join(base, name, "cpulist"))
                if cl:
                    out[int(m.group(1))] = cl
    if not out:
        out[0] = f"0-{(os.cpu_count() or 1) - 1}"
    return out


def socket_of(cpulist: str, sys_root: str = _SYS) -> int | None:
    """Physical package (socket) id of the first CPU of a cpulist, from sysfs."""
    first = re.match(r"^(\d+)", cpulist)
    if not first:
        return None
    raw = _read(os.path.join(sys_root, f"devices/system/cpu/cpu{first.group(1)}/topology/physical_package_id"))
    return int(raw) if raw and raw.isdigit() else None


def _pcie_of(dev_dir: str) -> tuple[int, int] | None:
    speed = _read(os.path.join(dev_dir, "current_link_speed")) or ""
    width = _read(os.path.join(dev_dir, "current_link_width")) or ""
    m = re.match(r"^([\d.]+)\s*GT/s", speed)
    if not m or not width.isdigit():
        return None
    gen = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}.get(float(m.group(1)))
    if gen is None or int(width) not in (1, 2, 4, 8, 16, 32):
        return None
    return gen, int(width)


def net_interfaces(sys_root: str = _SYS) -> list[dict[str, Any]]:
    """Network interfaces except loopback: name, speed_gbps (None if unknown), numa, virtual, pcie (gen, lanes)."""
    base = os.path.join(sys_root, "class/net")
    out: list[dict[str, Any]] = []
    if not os.path.isdir(base):
        return out
    for name in sorted(os.listdir(base)):
        if name == "lo":
            continue
        d = os.path.join(base, name)
        raw = _read(os.path.join(d, "speed"))
        speed = None
        if raw and raw.lstrip("-").isdigit() and int(raw) > 0:
            speed = int(raw) / 1000.0
        dev = os.path.join(d, "device")
        numa_raw = _read(os.path.join(dev, "numa_node"))
        numa = int(numa_raw) if numa_raw and numa_raw.lstrip("-").isdigit() and int(numa_raw) >= 0 else None
        out.append({"name": name, "speed_gbps": speed, "numa": numa, "virtual": not os.path.isdir(dev),
                    "pcie": _pcie_of(dev) if os.path.isdir(dev) else None})
    return out


def ib_rates(sys_root: str = _SYS) -> dict[str, float]:
    """InfiniBand device -> port 1 rate in Gb/s (from '/sys/class/infiniband/<dev>/ports/1/rate')."""
    base = os.path.join(sys_root, "class/infiniband")
    out: dict[str, float] = {}
    if os.path.isdir(base):
        for dev in sorted(os.listdir(base)):
            rate = _read(os.path.join(base, dev, "ports/1/rate")) or ""
            m = re.match(r"^([\d.]+)\s*Gb/sec", rate)
            if m:
                out[dev] = float(m.group(1))
    return out


def run_nvidia_smi(args: list[str], timeout_s: float = SMI_TIMEOUT_S) -> str | None:
    """Output of `nvidia-smi <args>`, or None when it is absent or fails (never hangs: timeout)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 and res.stdout.strip() else None


def detect_topology(nvidia_smi_text: str | None = None, sys_root: str = _SYS, use_nvidia_smi: bool = True,
                    gpu_model: str | None = None) -> Topology:
    """Build this machine's topology (or the one described by a saved `nvidia-smi topo -m` text)."""
    host = socket.gethostname()
    numa = numa_nodes(sys_root)
    note = ""
    smi_text = nvidia_smi_text
    if smi_text is None and use_nvidia_smi:
        smi_text = run_nvidia_smi(["topo", "-m"])
        names = run_nvidia_smi(["--query-gpu=name", "--format=csv,noheader"])
        if names and gpu_model is None:
            gpu_model = _model_from_name(names.splitlines()[0])
    if smi_text:
        topo = topology_from_smi(smi_text, gpu_model=gpu_model,
                                 name=f"detected-{host}" if nvidia_smi_text is None else "nvidia-smi-text")
        # a saved text describes another machine: only a locally run nvidia-smi is combined with this sysfs
        for n in (topo.nodes(NodeKind.CPU) if nvidia_smi_text is None else []):
            d = topo.graph.nodes[n]
            if d["index"] in numa:
                d["cpulist"] = numa[d["index"]]
                d["cores"] = cpulist_count(numa[d["index"]])
                d["socket"] = socket_of(numa[d["index"]], sys_root)
        rates = ib_rates(sys_root) if nvidia_smi_text is None else {}
        for n in topo.nics():
            d = topo.graph.nodes[n]
            if d.get("name") in rates:
                d["speed_gbps"] = rates[d["name"]]
        ngpu = len(topo.gpus())
        note = f"{ngpu} GPUs from nvidia-smi topo -m" + (" (saved text)" if nvidia_smi_text else "")
    else:
        topo = Topology(f"detected-{host}")
        ngpu = 0
        note = ("no GPUs found: nvidia-smi is not installed or reports no GPU; "
                "the topology holds CPUs and NICs only (use host-cpu:N for CPU ranks)")
        cpus = {}
        for i, cl in sorted(numa.items()):
            cpus[i] = topo.add_node(f"h0/cpu{i}", NodeKind.CPU, 0, i, model="CPU", numa=i, cpulist=cl,
                                    cores=cpulist_count(cl), socket=socket_of(cl, sys_root))
        ids = sorted(cpus)
        for a_i, a in enumerate(ids):
            for b in ids[a_i + 1:]:
                # the socket link type cannot be read from sysfs: assume UPI 10.4 GT/s x2 (documented)
                topo.add_link(cpus[a], cpus[b], LinkType.QPI, 2 * socket_link("UPI-10.4").link_GBps,
                              LATENCY_US["qpi"], nlinks=2, tier="qpi", tech="UPI-10.4 (assumed)")
        k = 0
        for itf in net_interfaces(sys_root):
            speed = itf["speed_gbps"]
            nid = topo.add_node(f"h0/nic{k}", NodeKind.NIC, 0, k, name=itf["name"],
                                speed_gbps=float(speed or ASSUMED_NIC_GBPS), speed_known=speed is not None,
                                numa=itf["numa"] if itf["numa"] in cpus else ids[0], virtual=itf["virtual"],
                                fabric="ethernet", rail=k)
            cpu = cpus[itf["numa"] if itf["numa"] in cpus else ids[0]]
            if itf["pcie"]:
                gen, lanes = itf["pcie"]
                topo.add_link(nid, cpu, LinkType.PCIE, pcie_GBps(gen, lanes), LATENCY_US["pcie"], tier="pcie",
                              gen=gen, lanes=lanes, root=k)
            else:
                topo.add_link(nid, cpu, LinkType.PCIE, gbps_to_GBps(speed or ASSUMED_NIC_GBPS), LATENCY_US["pcie"],
                              tier="pcie", root=k, virtual=True)
            k += 1
    sockets = {socket_of(cl, sys_root) for cl in numa.values()} - {None}
    topo.meta["detected"] = {"hostname": host, "gpus": ngpu, "numa_nodes": len(numa), "sockets": len(sockets) or None,
                             "note": note,
                             "nvidia_smi": smi_text is not None}
    return topo


def _model_from_name(name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'H100' when the catalog knows it."""
    from ..hardware import GPU_MODELS
    for key in sorted(GPU_MODELS, key=len, reverse=True):
        if key in name.upper():
            return key
    return None


def load_smi_file(path: str) -> str:
    """Read a saved `nvidia-smi topo -m` text file."""
    try:
        with open(path) as fh:
            return fh.read()
    except OSError as exc:
        raise TopologyError(f"cannot read nvidia-smi text {path!r}: {exc.strerror}",
                            "save the output of `nvidia-smi topo -m` to a file and pass its path") from None
