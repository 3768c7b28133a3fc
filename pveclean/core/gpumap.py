"""`pveclean gpus`' map of the host as typed records: which process holds which GPU, under
which owner, the memory no process accounts for, the GPUs passed to VMs. The map is built
here (pure) from what the host's and the containers' scans and NVML gave; `GpuMap.as_dict()`
is `pveclean gpus --json`'s document, made only where it is printed."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from pveclean.core.gpunodes import NVIDIA_MAJOR as NVIDIA_MAJOR
from pveclean.core.gpunodes import major_minor as major_minor
from pveclean.core.gpunodes import makedev as makedev
from pveclean.core.gpunodes import sort_nodes
from pveclean.core.notjudged import NotJudged
from pveclean.core.owners import Owner, OwnerKind
from pveclean.core.pci import PciAddress
from pveclean.core.records import (  # LEAK_SLACK_MIB: the post-stop hook's slack
    LEAK_SLACK_MIB,
    DeviceUse,
    GpuDevices,
    GpuMemory,
    GpuStatus,
    Holder,
    Source,
    device_labels,
    iso,
)

Json = dict[str, object]  # one object of the --json document


# ---- a process that holds a GPU ---------------------------------------------------------
@dataclass(frozen=True)
class GpuProc:
    """One process that holds a GPU node or GPU memory: a container's (made from its scan's
    Holder), the host's, or one only NVML lists."""

    host_pid: int
    name: str
    owner: Owner
    ct_pid: int | None = None
    unit: str | None = None
    cgroup: str | None = None
    devices: tuple[DeviceUse, ...] = ()  # the nodes it holds, for display
    rdevs: frozenset[int] = frozenset()  # the device numbers of those nodes
    memory: Mapping[int, int | None] = field(default_factory=dict)  # GPU index -> MiB
    devices_more: int = 0  # the nodes not in `devices` (the container scan's cap)

    @classmethod
    def of_holder(cls, h: Holder, vmid: int, rdevs: Iterable[int]) -> GpuProc:
        return cls(h.host_pid, full_name(h.name, h.argv), Owner(OwnerKind.CT, vmid), h.ct_pid,
                   h.unit, h.cgroup, tuple(h.devices), frozenset(rdevs),
                   devices_more=h.devices_more)

    def with_memory(self, per_gpu: Mapping[int, int | None]) -> GpuProc:
        return replace(self, memory={**self.memory, **per_gpu})

    def as_dict(self) -> Json:
        return {"host_pid": self.host_pid, "name": self.name, "owner": str(self.owner.kind),
                "vmid": self.owner.vmid, "ct_pid": self.ct_pid, "unit": self.unit,
                "cgroup": self.cgroup, "devices": device_labels(self.devices, self.devices_more),
                "gpu_memory_mib": {int(k): v for k, v in sorted(self.memory.items())}}


@dataclass(frozen=True)
class Nodes:
    """What a process's GPU device numbers are: the N of each /dev/nvidiaN (one GPU each),
    whether it holds a node of no single GPU (nvidiactl, nvidia-uvm, nvidia-caps), and the
    device numbers that can be tied to neither (a GPU major whose node this host lacks)."""

    minors: frozenset[int] = frozenset()
    shared: bool = False
    untied: frozenset[int] = frozenset()


def nodes_of(rdevs: Iterable[int], devices: GpuDevices) -> Nodes:
    return Nodes(*sort_nodes(rdevs, devices))


@dataclass(frozen=True)
class Placed:
    """A process with what its device numbers say (see Nodes)."""

    proc: GpuProc
    nodes: Nodes

    def on(self, g: GpuMemory) -> bool:
        return g.index in self.proc.memory or (g.minor is not None and g.minor in
                                               self.nodes.minors)


@dataclass(frozen=True)
class GpuHolding:
    """One process on one GPU, with the memory NVML gives it there (None: not told)."""

    proc: GpuProc
    memory_mib: int | None

    @property
    def owner(self) -> Owner:
        return self.proc.owner

    def as_dict(self) -> Json:
        return {**self.proc.as_dict(), "memory_mib": self.memory_mib}


@dataclass(frozen=True)
class GpuUse:
    """One GPU on the nvidia driver and who uses it."""

    gpu: GpuMemory
    pci_bus_id: PciAddress | None
    processes: tuple[GpuHolding, ...]
    by_owner: tuple[tuple[Owner, int], ...]  # MiB per owner, the largest first
    unaccounted_mib: int | None  # None: cannot be told
    leak_mib: int  # beyond allocator slack, else 0

    @property
    def index(self) -> int:
        return self.gpu.index

    @property
    def minor(self) -> int | None:
        return self.gpu.minor

    @property
    def ok(self) -> bool:
        return self.gpu.ok

    @property
    def status(self) -> GpuStatus:
        return GpuStatus(self.gpu.status)

    @property
    def total_mib(self) -> int | None:
        return self.gpu.total_mib if self.gpu.figures_read else None

    @property
    def used_mib(self) -> int | None:
        return self.gpu.used_mib if self.gpu.figures_read else None

    def as_dict(self) -> Json:
        g = self.gpu
        entry: Json = {
            "index": g.index, "name": g.name, "uuid": g.uuid,
            "pci_bus_id": None if self.pci_bus_id is None else str(self.pci_bus_id),
            "minor": g.minor, "total_mib": self.total_mib, "used_mib": self.used_mib,
            "reserved_mib": g.reserved_mib, "processes": [p.as_dict() for p in self.processes],
            "by_owner_mib": {o.label: mib for o, mib in self.by_owner},
            "unaccounted_mib": self.unaccounted_mib, "leak_mib": self.leak_mib,
            "status": g.status}
        if not g.ok:
            entry["reason"] = g.reason
        if g.unread:  # the getters NVML failed (N/A); what the others read is kept above
            entry["unread"] = list(g.unread)
        return entry


def _mem_key(row: GpuHolding) -> tuple[int, int]:
    mib = row.memory_mib
    return (-(mib if mib is not None else -1), row.proc.host_pid)


def gpu_use(g: GpuMemory, bus: PciAddress | None, placed: Iterable[Placed]) -> GpuUse:
    """GPU `g` and the processes on it: by its memory (NVML) or its node (the scans)."""
    rows = []
    accounted, unknown = 0, False
    for p in placed:
        if not p.on(g):
            continue
        mib = p.proc.memory.get(g.index)
        if g.index in p.proc.memory:
            if mib is None:
                unknown = True
            else:
                accounted += mib
        rows.append(GpuHolding(p.proc, mib))
    rows.sort(key=_mem_key)
    owners: dict[Owner, int] = {}
    for r in rows:
        owners[r.owner] = owners.get(r.owner, 0) + (r.memory_mib or 0)
    unaccounted = None
    if g.reserved_mib is not None and not unknown and g.ok:  # a GPU NVML could not read: no
        unaccounted = max(g.used_mib - accounted, 0)  # figure to judge, so never a leak
    leak = unaccounted if unaccounted is not None and unaccounted > LEAK_SLACK_MIB else 0
    return GpuUse(g, bus, tuple(rows), tuple(sorted(owners.items(), key=lambda kv: -kv[1])),
                  unaccounted, leak)


def owner_order(p: GpuProc) -> tuple[int, int, int]:
    return (0 if p.owner.kind is OwnerKind.CT else 1, p.owner.vmid or 0, p.host_pid)


# ---- what else the map holds ----------------------------------------------------------------
@dataclass(frozen=True)
class VmName:
    """A VM the map names: its VMID and name."""

    vmid: int
    name: str

    def as_dict(self) -> Json:
        return {"vmid": self.vmid, "name": self.name}


@dataclass(frozen=True)
class VfioGpu:
    """An NVIDIA GPU not on the nvidia driver (vfio-pci: passed to a VM; another; none)."""

    pci_bus_id: PciAddress
    device: str  # 10de:XXXX
    driver: str | None
    vms: tuple[VmName, ...]  # those whose hostpci lines name it

    def as_dict(self) -> Json:
        return {"pci_bus_id": str(self.pci_bus_id), "device": self.device, "driver": self.driver,
                "vms": [v.as_dict() for v in self.vms]}


@dataclass(frozen=True)
class VmConflict:
    """A GPU a VM's config passes through while a container or the host holds it."""

    gpu: int
    pci_bus_id: PciAddress
    vms: tuple[VmName, ...]
    containers: tuple[int, ...]
    host_holders: int
    next_vm_start: str  # what the VM hook would do at that VM's start

    def as_dict(self) -> Json:
        return {"gpu": self.gpu, "pci_bus_id": str(self.pci_bus_id),
                "vms": [v.as_dict() for v in self.vms], "containers": list(self.containers),
                "host_holders": self.host_holders, "next_vm_start": self.next_vm_start}


@dataclass(frozen=True)
class ScanStats:
    """What the map's look at the host covered, and how long it took."""

    containers_scanned: tuple[int, ...]
    containers_skipped_no_gpu: tuple[int, ...]
    host_processes: int
    host_holders: int
    seconds: float
    host_processes_settled: int | None = None  # None: the host's processes were not read

    def as_dict(self) -> Json:
        d: Json = {"containers_scanned": list(self.containers_scanned),
                   "containers_skipped_no_gpu": list(self.containers_skipped_no_gpu),
                   "host_processes": self.host_processes, "host_holders": self.host_holders,
                   "seconds": self.seconds}
        if self.host_processes_settled is not None:
            d["host_processes_settled"] = self.host_processes_settled
        return d


@dataclass(frozen=True)
class GpuMap:
    """One look at the host (`pveclean gpus`)."""

    host: str
    time: float  # Unix time of the look
    gpus: tuple[GpuUse, ...]
    other_holders: tuple[GpuProc, ...]  # holding GPU nodes but no single GPU
    vfio: tuple[VfioGpu, ...]
    vm_conflicts: tuple[VmConflict, ...]
    hostnames: Mapping[int, str]  # VMID -> hostname ("": none or unknown)
    scan: ScanStats
    host_source: Source
    nvml: Source
    warnings: tuple[str, ...]
    # holders whose GPU nodes could not be tied to a GPU (their device numbers): none may
    # be taken for no holder of a VM's GPU
    untied: tuple[GpuProc, ...] = ()
    # what the look could not read whole (a tree, a process, the host's processes): never
    # innocent, each blocks a VM's start (core/notjudged.py)
    not_judged: tuple[NotJudged, ...] = ()

    def with_conflicts(self, rows: Iterable[VmConflict]) -> GpuMap:
        return replace(self, vm_conflicts=tuple(rows))

    def as_dict(self) -> Json:
        return {
            "pveclean_gpus": 1,
            "host": self.host,
            "time": iso(self.time),
            "gpus": [g.as_dict() for g in self.gpus],
            "other_holders": [p.as_dict() for p in self.other_holders],
            "vfio": [v.as_dict() for v in self.vfio],
            "vm_conflicts": [c.as_dict() for c in self.vm_conflicts],
            "containers": {str(v): {"hostname": self.hostnames[v]}
                           for v in sorted(self.hostnames)},
            "scan": self.scan.as_dict(),
            "sources": {"host": str(self.host_source), "nvml": str(self.nvml)},
            "warnings": list(self.warnings),
            **({"not_judged": [n.as_dict() for n in self.not_judged]}
               if self.not_judged else {}),
        }


def place_all(procs: Iterable[GpuProc], devices: GpuDevices) -> list[Placed]:
    return [Placed(p, nodes_of(p.rdevs, devices)) for p in procs]


def full_name(comm: str, argv: tuple[str, ...]) -> str:
    """The kernel cuts comm to 15 characters ("nvidia-persiste"): show argv[0]'s base name
    when it continues comm."""
    argv0 = posixpath.basename(argv[0]) if argv else ""
    cut = comm.encode("utf-8", "surrogateescape")  # 15 bytes, maybe cut inside a character
    whole = argv0.encode("utf-8", "surrogateescape")
    return argv0 if len(cut) == 15 and whole.startswith(cut) else comm
