"""Read and write `nvidia-smi topo -m` matrices.

Parsing rebuilds a graph that reproduces every printed class:
- NV# between GPUs: direct NVLinks (# merged links), or an NVSwitch fabric node when a GPU's NV# sum
  exceeds the links its NVLink generation has (DGX-2 NV6, DGX A100 NV12, DGX H100 NV18); bandwidth =
  # x per-link GB/s of the generation (from the GPU model when given, else inferred: all-pairs NV6 / NV12 /
  NV18 beyond a GPU's link count -> NVSwitch gen1/2/3; direct links: the first generation with at least
  that many links per GPU: <= 4 -> NVLink1, 6 -> 2, 12 -> 3, 18 -> 4, e.g. 4 x H100 with NV6 pairs).
- PIX groups share a PCIe switch; PXB groups share a top switch above leaf switches; PHB complexes share
  a host bridge (root), NODE complexes use different roots of the same CPU; SYS crosses sockets (QPI/UPI).
- CPU sockets come from the "NUMA Affinity" column (else from the SYS structure); NICs from the columns,
  named by the "NIC Legend" (NIC0: mlx5_0) when present.
Lines starting with '#' are comments (the fixtures name their sources there).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import TopologyError
from ..hardware import GPU_MODELS, nvlink_gen
from .graph import NodeKind, Topology
from .presets import HostBuilder

_CLASS_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|N/A)$")
_GEN_DEFAULTS = {1: (3, "QPI-9.6", 2, 100.0), 2: (3, "QPI-9.6", 2, 100.0), 3: (4, "xGMI-2", 4, 200.0),
                 4: (5, "UPI-16", 4, 400.0), 5: (5, "UPI-16", 4, 400.0)}


class SmiMatrix:
    """The parsed table: device names, class per pair, GPU CPU/NUMA affinity, NIC legend."""

    def __init__(self, devices: list[str], cells: dict[tuple[str, str], str], numa: dict[str, int | None],
                 cpu_affinity: dict[str, str], legend: dict[str, str]) -> None:
        self.devices = devices
        self.cells = cells
        self.numa = numa
        self.cpu_affinity = cpu_affinity
        self.legend = legend

    @property
    def gpus(self) -> list[str]:
        """GPU column names in order."""
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        """NIC column names in order."""
        return [d for d in self.devices if not d.startswith("GPU")]

    def rel(self, a: str, b: str) -> str:
        """Printed class between a and b (symmetric fallback)."""
        return self.cells.get((a, b)) or self.cells.get((b, a)) or "SYS"


def parse_smi_text(text: str) -> SmiMatrix:
    """Parse the text of `nvidia-smi topo -m`; TopologyError names the line that is wrong."""
    lines = [ln.rstrip("\n") for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    header_i, devices = _smi_header(lines)
    cells: dict[tuple[str, str], str] = {}
    numa: dict[str, int | None] = {}
    aff: dict[str, str] = {}
    seen_rows: list[str] = []
    legend: dict[str, str] = {}
    for ln in lines[header_i + 1:]:
        toks = ln.split()
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", ln)
        if m:
            legend[m.group(1)] = m.group(2)
            continue
        if not toks or toks[0] not in devices:
            continue
        row = toks[0]
        vals = toks[1:1 + len(devices)]
        if len(vals) < len(devices):
            raise TopologyError(f"row {row}: {len(vals)} cells for {len(devices)} columns: {ln.strip()!r}",
                                "pass the complete matrix")
        for col, v in zip(devices, vals, strict=True):
            if not _CLASS_RE.match(v):
                raise TopologyError(f"row {row}, column {col}: {v!r} is not an nvidia-smi class",
                                    "cells are X, NV#, PIX, PXB, PHB, NODE or SYS")
            cells[(row, col)] = "SYS" if v == "SOC" else v
        rest = toks[1 + len(devices):]
        if row.startswith("GPU"):
            aff[row] = rest[0] if rest else ""
            numa[row] = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
        seen_rows.append(row)
    _check_smi_matrix(devices, cells, seen_rows)
    return SmiMatrix(devices, cells, numa, aff, legend)


def _smi_header(lines: list[str]) -> tuple[int, list[str]]:
    """The index of the header line and the device columns it names."""
    header_i = None
    for i, ln in enumerate(lines):
        toks = ln.split()
        # the header starts with the GPU0 column name; a data row starts with GPU0 followed by a class (X)
        if len(toks) > 1 and toks[0] == "GPU0" and not _CLASS_RE.match(toks[1]):
            header_i = i
            break
    if header_i is None:
        raise TopologyError("no 'nvidia-smi topo -m' header line (GPU0 GPU1 ... CPU Affinity) found",
                            "pass the output of `nvidia-smi topo -m` as it is printed")
    head = lines[header_i].split()
    devices: list[str] = []
    for t in head:
        if t in ("CPU", "NUMA", "GPU", "Affinity", "ID") and devices:
            break
        devices.append(t)
    if not devices or not devices[0].startswith("GPU"):
        raise TopologyError(f"header line has no GPU columns: {lines[header_i]!r}", "the first column must be GPU0")
    return header_i, devices


def _check_smi_matrix(devices: list[str], cells: dict[tuple[str, str], str], seen_rows: list[str]) -> None:
    """Every GPU has its row, the diagonal is X and the matrix is symmetric."""
    missing = [g for g in devices if g.startswith("GPU") and g not in seen_rows]
    if missing:
        raise TopologyError(f"rows missing for {', '.join(missing)}", "pass the complete matrix")
    for (a, b), v in cells.items():
        if a == b and v != "X":
            raise TopologyError(f"row {a}: the diagonal must be X, found {v!r}", "pass the matrix unchanged")
        back = cells.get((b, a))
        if back is not None and back != v:
            raise TopologyError(f"{a}/{b} is {v} but {b}/{a} is {back}: the matrix is not symmetric",
                                "pass the matrix unchanged")


class _UF:
    def __init__(self, items: list[str]) -> None:
        self.p = {x: x for x in items}

    def find(self, x: str) -> str:
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)

    def groups(self, items: list[str]) -> list[list[str]]:
        out: dict[str, list[str]] = {}
        for x in items:
            out.setdefault(self.find(x), []).append(x)
        return list(out.values())


def cpulist_count(text: str) -> int:
    """Number of CPUs in a Linux cpulist such as '0-19,40-59'."""
    n = 0
    for part in text.split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            n += int(b) - int(a) + 1
        else:
            n += 1
    return n


def _num(name: str) -> int:
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else 0


def topology_from_smi(text: str, gpu_model: str | None = None, nic_gbps: float | None = None,
                      name: str = "nvidia-smi", host: int = 0, topo: Topology | None = None) -> Topology:
    """Build a Topology from `nvidia-smi topo -m` text (GPU numbering as printed)."""
    m = parse_smi_text(text)
    gpus, nics = m.gpus, m.nics
    out = topo if topo is not None else Topology(name, meta={"source": "nvidia-smi topo -m"})
    b = HostBuilder(out, host)
    hw = _smi_generation(m, gpu_model)
    devs = gpus + nics
    numa_of = _smi_sockets(m, devs)
    sockets = sorted(set(numa_of.values()))
    cpu_ids = {}
    for s in sockets:
        affs = [m.cpu_affinity.get(g, "") for g in gpus if numa_of[g] == s]
        cl = next((a for a in affs if re.match(r"^[\d,\-]+$", a)), "")
        cpu_ids[s] = b.cpu(s, "CPU", cpulist_count(cl) if cl else 0, cpulist=cl)
    for i, s in enumerate(sockets):
        for t in sockets[i + 1:]:
            b.socket(cpu_ids[s], cpu_ids[t], hw.sock_name, hw.sock_n)
    # ---- devices
    ids: dict[str, str] = {}
    for g in gpus:
        ids[g] = b.gpu(_num(g), hw.model, numa_of[g], m.cpu_affinity.get(g, ""))
    for n in nics:
        idx = _num(n)
        ids[n] = out.add_node(b.nid("nic", idx), NodeKind.NIC, host, idx,
                              speed_gbps=float(nic_gbps or hw.default_nic), numa=numa_of[n], fabric="ib", rail=idx,
                              name=m.legend.get(n, n))
    # ---- PCIe tree per socket
    sw_count = 0
    for s in sockets:
        members = [x for x in devs if numa_of[x] == s]
        for root, pix_groups in _pcie_complexes(m, members):
            sw_count = _wire_pcie_complex(b, cpu_ids[s], pix_groups, root, ids, hw.pcie_gen, sw_count)
    _wire_nvlinks(b, gpus, ids, hw)
    out.meta.setdefault("nvlink_gen", hw.gen)
    return out


@dataclass(frozen=True)
class _SmiHardware:
    """What the matrix implies about the machine: NVLink pairs and generation, GPU model, PCIe and socket links."""

    nv: dict[tuple[str, str], int]   # (gpu, gpu) -> NVLinks printed between them (NV#)
    gen: int                         # NVLink generation
    model: str
    pcie_gen: int
    sock_name: str
    sock_n: int
    default_nic: float               # NIC Gb/s when none is given
    switched: bool                   # GPUs reach each other through NVSwitches


def _smi_generation(m: SmiMatrix, gpu_model: str | None) -> _SmiHardware:
    """The NVLink generation (from the model, else from the links per GPU), and the defaults that follow."""
    gpus = m.gpus
    nv = {(a, c): int(m.rel(a, c)[2:]) for a in gpus for c in gpus if a != c and m.rel(a, c).startswith("NV")}
    per_gpu = {g: sum(k for (a, _), k in nv.items() if a == g) for g in gpus}
    all_pairs = len(gpus) > 1 and len(nv) == len(gpus) * (len(gpus) - 1) and len(set(nv.values())) == 1
    most = max(per_gpu.values(), default=0)
    direct_gen = {4: 1, 6: 2, 12: 3, 18: 4}      # links per GPU -> first NVLink generation with that many
    if gpu_model and gpu_model.upper() in GPU_MODELS:
        gen = GPU_MODELS[gpu_model.upper()].nvlink_gen
    elif all_pairs and most not in direct_gen:  # more links than a GPU has: an NVSwitch fabric (NV6/NV12/NV18)
        gen = {6: 2, 12: 3, 18: 4}.get(next(iter(nv.values())), 4)
    else:                                         # direct links: the smallest generation with enough links
        gen = next((g for links, g in sorted(direct_gen.items()) if most <= links), 4)
    inferred = {1: "P100", 2: "V100", 3: "A100", 4: "H100", 5: "B200"}[gen] if nv else "GPU"
    model = gpu_model or inferred
    pcie_gen, sock_name, sock_n, default_nic = _GEN_DEFAULTS[gen if nv else 2]
    if gpu_model and gpu_model.upper() in GPU_MODELS:
        pcie_gen = GPU_MODELS[gpu_model.upper()].pcie_gen
    switched = bool(nv) and max(per_gpu.values()) > nvlink_gen(gen).links_per_gpu
    return _SmiHardware(nv, gen, model, pcie_gen, sock_name, sock_n, default_nic, switched)


def _smi_sockets(m: SmiMatrix, devs: list[str]) -> dict[str, int]:
    """The socket (NUMA node) of every device: the printed NUMA affinity, else one socket per group of devices
    that no SYS separates (GPUs with the same CPU affinity share a socket)."""
    gpus = m.gpus
    uf_sock = _UF(devs)
    for a in devs:
        for c in devs:
            if a < c and m.rel(a, c) not in ("SYS",) and not m.rel(a, c).startswith("NV"):
                uf_sock.union(a, c)
    by_aff: dict[str, str] = {}           # GPUs with the same CPU affinity sit on the same socket
    for g in gpus:
        aff = m.cpu_affinity.get(g, "")
        if aff and aff != "N/A":
            if aff in by_aff:
                uf_sock.union(by_aff[aff], g)
            else:
                by_aff[aff] = g
    numa_of: dict[str, int] = {}
    for g in gpus:
        numa = m.numa.get(g)
        if numa is not None:
            numa_of[g] = int(numa)
    groups = uf_sock.groups(devs)
    next_sock = max(numa_of.values(), default=-1) + 1
    for grp in groups:
        known = sorted({numa_of[x] for x in grp if x in numa_of})
        s = known[0] if known else None
        if s is None:   # no NUMA column: a new socket per SYS-separated group
            s = next_sock
            next_sock += 1
        for x in grp:
            numa_of.setdefault(x, s)
    return numa_of


def _pcie_complexes(m: SmiMatrix, members: list[str]) -> list[tuple[int, list[list[str]]]]:
    """The PCIe complexes (PXB-connected devices) of one socket, each as (root complex index, its PIX groups)."""
    uf_pix, uf_pxb = _UF(members), _UF(members)
    for a in members:
        for c in members:
            if a < c:
                r = m.rel(a, c)
                if r == "PIX":
                    uf_pix.union(a, c)
                    uf_pxb.union(a, c)
                elif r == "PXB":
                    uf_pxb.union(a, c)
    complexes = uf_pxb.groups(members)
    # PHB between complexes = same root; NODE = different roots
    uf_root = _UF([c[0] for c in complexes])
    for i, ca in enumerate(complexes):
        for cb in complexes[i + 1:]:
            if _pcie_rel(m, ca, cb) == "PHB":
                uf_root.union(ca[0], cb[0])
    roots = {r: k for k, r in enumerate(sorted({uf_root.find(c[0]) for c in complexes}))}
    return [(roots[uf_root.find(comp[0])], uf_pix.groups(comp)) for comp in complexes]


def _wire_pcie_complex(b: HostBuilder, cpu: str, pix_groups: list[list[str]], root: int, ids: dict[str, str],
                       pcie_gen: int, sw_count: int) -> int:
    """PCIe links of one complex: a device alone hangs off the CPU, a PIX group off one switch, several PIX
    groups off switches under a top switch. Returns the next free switch number."""
    if len(pix_groups) == 1:
        grp = pix_groups[0]
        if len(grp) == 1:
            b.pcie(ids[grp[0]], cpu, pcie_gen, 16, root=root)
            return sw_count
        sw = b.pcisw(sw_count)
        sw_count += 1
        b.pcie(cpu, sw, pcie_gen, 16, root=root)
        for x in grp:
            b.pcie(ids[x], sw, pcie_gen, 16)
        return sw_count
    top = b.pcisw(sw_count)
    sw_count += 1
    b.pcie(cpu, top, pcie_gen, 16, root=root)
    for grp in pix_groups:
        sw = b.pcisw(sw_count)
        sw_count += 1
        b.pcie(top, sw, pcie_gen, 16)
        for x in grp:
            b.pcie(ids[x], sw, pcie_gen, 16)
    return sw_count


def _wire_nvlinks(b: HostBuilder, gpus: list[str], ids: dict[str, str], hw: _SmiHardware) -> None:
    """NVLinks: every GPU to one NVSwitch fabric node, or the printed GPU-to-GPU links."""
    if hw.switched:
        gen = hw.gen
        fabric = b.nvsw(0, {2: 1, 3: 2, 4: 3, 5: 4}.get(gen, 3), {2: 6, 3: 6, 4: 4, 5: 18}.get(gen, 1))
        for g in gpus:
            k = max((kk for (a, _), kk in hw.nv.items() if a == g), default=0)
            if k:
                b.nvlink(ids[g], fabric, gen, k)
    else:
        for (a, c), k in hw.nv.items():
            if a < c:
                b.nvlink(ids[a], ids[c], hw.gen, k)


def _pcie_rel(m: SmiMatrix, ca: list[str], cb: list[str]) -> str:
    """The non-NVLink class printed between two complexes (from any GPU/NIC pair that shows one)."""
    for a in ca:
        for c in cb:
            r = m.rel(a, c)
            if not r.startswith("NV"):
                return r
    return "NODE"


def render_smi(topo: Topology, host: int = 0, bandwidth: bool = False) -> str:
    """A matrix like `nvidia-smi topo -m` for one host (GPUs then NICs, with CPU/NUMA affinity)."""
    gpus = topo.gpus(host) or topo.nodes(NodeKind.PROC, host)
    nics = topo.nics(host)
    devs = gpus + nics
    names = [topo.label(d).split("/")[-1] for d in devs]
    w = max(6, max((len(n) for n in names), default=4) + 2)
    lines = [" " * w + "".join(n.ljust(w) for n in names) + "CPU Affinity    NUMA Affinity"]
    for d, n in zip(devs, names, strict=True):
        cells = "".join(topo.path_class_smi(d, e).ljust(w) for e in devs)
        attrs = topo.graph.nodes[d]
        extra = ""
        if topo.kind(d) in (NodeKind.GPU, NodeKind.PROC):
            extra = f"{attrs.get('cpu_affinity', '') or 'N/A':<16}{attrs.get('numa', 'N/A')}"
        lines.append(n.ljust(w) + cells + extra)
    lines += ["", "Legend:", "  X    = Self",
              "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
              "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
              "within a NUMA node",
              "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
              "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
              "  PIX  = Connection traversing at most a single PCIe bridge",
              "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if nics:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {n}: {topo.graph.nodes[d].get('name', n)}" for d, n in zip(nics, names[len(gpus):], strict=True)]
    return "\n".join(lines) + "\n"


def smi_table(topo: Topology, host: int = 0) -> dict[str, Any]:
    """The matrix as data: devices, classes and per-direction bottleneck GB/s for every pair."""
    devs = (topo.gpus(host) or topo.nodes(NodeKind.PROC, host)) + topo.nics(host)
    names = [topo.label(d).split("/")[-1] for d in devs]
    return {
        "devices": names,
        "classes": [[topo.path_class_smi(a, c) for c in devs] for a in devs],
        "bw_GBps": [[None if a == c else round(topo.bottleneck_GBps(a, c), 3) for c in devs] for a in devs],
    }

