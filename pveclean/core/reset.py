"""`pveclean reset GPU`: whether one GPU may be reset now, and how. Pure: it judges `pveclean
gpus`' map of the host and what the host says of VMs, MIG and the containers' nodes.

A GPU is reset only when every process that holds it (its device node, a mapping, NVML's
list) is either a container's holder that pveclean may stop (as `pveclean ct` stops it) or
one of the host services it knows how to stop and restart around a reset: NVIDIA's
persistence daemon, DCGM's host engine, Fabric Manager. Anything else refuses, each named:
a host process of any other kind, one pveclean cannot place, a holder of a GPU node that
cannot be tied to a GPU, a GPU NVML cannot read, a GPU on vfio-pci or named by a running
VM (qemu-server's reservation), a container whose config is on another node, a GPU in MIG
mode with instances left."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pveclean.core.gpumap import GpuMap, GpuProc, GpuUse
from pveclean.core.owners import OwnerKind
from pveclean.core.pci import PciAddress
from pveclean.core.text import safe

# process name -> the systemd units that run it (Debian's and NVIDIA's packages)
KNOWN_SERVICES: dict[str, tuple[str, ...]] = {
    "nvidia-persiste": ("nvidia-persistenced.service",),  # comm: 15 characters
    "nvidia-persistenced": ("nvidia-persistenced.service",),
    "nv-hostengine": ("nvidia-dcgm.service", "dcgm.service"),
    "nv-fabricmanager": ("nvidia-fabricmanager.service",),
}


class Decision(StrEnum):
    GO = "go"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Target:
    """The GPU to reset, as NVML and the kernel name it."""

    index: int
    address: PciAddress
    uuid: str
    minor: int | None

    @property
    def driver_pci(self) -> str:
        """As the driver's Xid lines name it: `0000:01:00`."""
        return str(self.address.whole_device)


@dataclass(frozen=True)
class HostFacts:
    """What the host says beside the map: qemu-server's PCI reservations (address -> VMID,
    a whole device's too), the VMs that run now, the containers whose config is on this
    node, and the GPU's MIG mode (None: NVML did not say) with its GPU instances left."""

    reservations: Mapping[PciAddress, int] = field(default_factory=dict)
    running_vms: frozenset[int] = frozenset()
    local_cts: frozenset[int] = frozenset()
    mig_enabled: bool | None = False
    mig_instances: int = 0


@dataclass
class Plan:
    decision: Decision
    target: Target | None
    stop: dict[int, tuple[frozenset[int], frozenset[int]]] = field(default_factory=dict)
    services: list[str] = field(default_factory=list)  # units to stop and restart, in order
    blockers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        t = self.target
        return {"decision": str(self.decision),
                "gpu": None if t is None else {"index": t.index, "pci_bus_id": str(t.address),
                                               "uuid": t.uuid, "minor": t.minor},
                "stop": {str(ct): sorted(idx) for ct, (idx, _m) in sorted(self.stop.items())},
                "services": list(self.services), "blockers": list(self.blockers),
                "notes": list(self.notes)}


def find(gmap: GpuMap, asked: str) -> GpuUse | None:
    """The GPU named by its NVML index, its UUID or its PCI id (any form of it)."""
    text = asked.strip()
    addr = PciAddress.parse(text)
    for g in gmap.gpus:
        if text.isdigit() and g.index == int(text):
            return g
        if g.gpu.uuid and text.lower() == g.gpu.uuid.lower():
            return g
        if addr is not None and g.pci_bus_id is not None and addr.covers(g.pci_bus_id):
            return g
    return None


def _who(p: GpuProc) -> str:
    return f"PID {p.host_pid} {safe(p.name or '?', 40)}"


def service_unit(p: GpuProc) -> str | None:
    """The unit of a host service pveclean knows how to stop and restart, when `p` is one
    (its name and the unit its cgroup says it runs in both known)."""
    units = KNOWN_SERVICES.get(p.name)
    return p.unit if units and p.unit in units else None


def _holders(g: GpuUse, facts: HostFacts, plan: Plan) -> None:
    where = f"GPU {g.index}"
    for row in g.processes:
        p, owner = row.proc, row.owner
        if owner.kind is OwnerKind.CT and owner.vmid is not None:
            if owner.vmid not in facts.local_cts:
                plan.blockers.append(f"{where} is held by CT {owner.vmid} ({_who(p)}), whose "
                                     "config is not on this node: it cannot be stopped here")
                continue
            idx, mins = plan.stop.get(owner.vmid, (frozenset(), frozenset()))
            plan.stop[owner.vmid] = (idx | {g.index},
                                     mins | ({g.minor} if g.minor is not None else set()))
        elif owner.kind is OwnerKind.HOST and service_unit(p) is not None:
            unit = service_unit(p)
            if unit is not None and unit not in plan.services:
                plan.services.append(unit)
        elif owner.kind is OwnerKind.HOST:
            plan.blockers.append(f"{where} is held by a host process {_who(p)}"
                                 f"{' (' + safe(p.unit, 60) + ')' if p.unit else ''}: pveclean "
                                 "does not stop host processes; stop it first")
        else:
            plan.blockers.append(f"{where} is held by a process pveclean cannot place: "
                                 f"{_who(p)}; look with `pveclean gpus`")


def _vm_and_mig(g: GpuUse, addr: PciAddress, facts: HostFacts, plan: Plan) -> None:
    vm = facts.reservations.get(addr, facts.reservations.get(addr.whole_device))
    if vm is not None:
        state = "running" if vm in facts.running_vms else "reserved by qemu-server"
        plan.blockers.append(f"GPU {g.index} ({addr}) belongs to VM {vm} ({state}): never "
                             "reset under a VM")
    if facts.mig_enabled is None:
        plan.blockers.append(f"GPU {g.index}: NVML did not say whether MIG is on; not reset")
    elif facts.mig_enabled and facts.mig_instances:
        plan.blockers.append(f"GPU {g.index} is in MIG mode with {facts.mig_instances} GPU "
                             "instance(s): destroy them first (nvidia-smi mig -dgi)")


def plan(gmap: GpuMap, asked: str, facts: HostFacts, vfio: Iterable[PciAddress] = ()
         ) -> Plan:
    """What `pveclean reset ASKED` may do on the host `gmap` shows."""
    addr = PciAddress.parse(asked.strip())
    if addr is not None and any(addr.covers(v) for v in vfio):
        vm = facts.reservations.get(addr, facts.reservations.get(addr.whole_device))
        whose = f"VM {vm}'s" if vm is not None else "a VM's"
        return Plan(Decision.REFUSE, None, blockers=[
            f"GPU {asked} is on vfio-pci ({whose}): never reset by pveclean"])
    g = find(gmap, asked)
    if g is None or g.pci_bus_id is None:
        return Plan(Decision.REFUSE, None, blockers=[
            f"no GPU {safe(asked, 60)} on the nvidia driver here (`pveclean gpus` lists them)"])
    target = Target(g.index, g.pci_bus_id, g.gpu.uuid or "", g.minor)
    out = Plan(Decision.REFUSE, target)
    if not g.ok:
        out.blockers.append(f"GPU {g.index} is {g.status}: NVML cannot tell who holds it")
    _vm_and_mig(g, g.pci_bus_id, facts, out)
    _holders(g, facts, out)
    out.blockers += [f"{_who(p)} ({p.owner.label}) holds a GPU node pveclean cannot tie to a "
                     "GPU: look with `pveclean gpus`" for p in gmap.untied]
    if g.leak_mib and not g.processes:
        out.notes.append(f"GPU {g.index} has {g.leak_mib} MiB no process accounts for: the "
                         "reset frees it")
    if not out.blockers:
        out.decision = Decision.GO
    return out
