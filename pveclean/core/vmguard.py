"""A VM's start with an NVIDIA GPU passed through: who holds that GPU, and what the start may
do about it (`vm_gpu_policy`). Pure: it judges `pveclean gpus`' map of the host.

qemu-server binds a passed-through GPU to vfio-pci at the VM's start (PCI.pm's
prepare_pci_device, after the pre-start hook): a GPU some process still holds through the
nvidia driver makes that unbind hang or fail, or the start fails "device busy". So every
holder of the VM's GPUs is named: a container's may be stopped (policy `stop-containers`),
the host's never (only one named in `vm_gpu_allow_host` may stay), another running VM's
never, and one that cannot be told (an unknown owner, a GPU NVML cannot read, a process
holding a GPU driver node whose device number ties it to no GPU, a tree, process or part of
the host the look could not read whole: `GpuMap.not_judged`) is no innocent: it refuses the
start.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from pveclean.core.gpumap import GpuMap, GpuProc, GpuUse, VmConflict, VmName
from pveclean.core.owners import OwnerKind
from pveclean.core.pci import HostPci, PciAddress, sysfs_order
from pveclean.core.text import safe


class Decision(StrEnum):
    CLEAR = "clear"  # nothing holds the VM's GPUs
    STOP = "stop-containers"  # only containers' holders, and the policy stops them
    REFUSE = "refuse"


@dataclass(frozen=True)
class Target:
    """One GPU of the VM as the host has it now."""

    address: PciAddress  # a function, 0000:18:00.0
    index: int | None = None  # NVML's, when the nvidia driver has it
    minor: int | None = None  # N of /dev/nvidiaN


@dataclass
class Plan:
    """What a VM's start does about the holders of its GPUs."""

    decision: Decision
    targets: list[Target]
    # container -> (GPU indices, minors) of the VM's GPUs its holders hold
    stop: dict[int, tuple[frozenset[int], frozenset[int]]] = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)  # each with the command that frees it
    notes: list[str] = field(default_factory=list)  # persistence, containers to mind
    # GPU indices whose only host holder is nvidia-persistenced: persistence off for each
    persistence: frozenset[int] = frozenset()

    def as_dict(self) -> dict[str, object]:
        return {"decision": str(self.decision),
                "gpus": [{"pci_bus_id": str(t.address), "index": t.index, "minor": t.minor}
                         for t in self.targets],
                "stop": {str(ct): sorted(idx) for ct, (idx, _) in sorted(self.stop.items())},
                "blockers": list(self.blockers), "notes": list(self.notes),
                **({"persistence_off": sorted(self.persistence)} if self.persistence else {})}


def _holder(proc: GpuProc, mib: int | None = None) -> str:
    held = f", {mib} MiB" if mib is not None else ""
    return f"PID {proc.host_pid} {safe(proc.name or '?', 40)}{held}"


PERSISTENCED = "nvidia-persistenced"  # holds every GPU's node; NVML tells it to let one go


def _allowed(proc: GpuProc, allow_host: Iterable[str]) -> bool:
    """A host process vm_gpu_allow_host names: it may stay only while it holds none of the
    VM's GPUs (a holder of a GPU's node makes the driver's unbind wait: the start hangs)."""
    return proc.owner.kind is OwnerKind.HOST and proc.name in allow_host


def _persistenced(proc: GpuProc) -> bool:
    return proc.owner.kind is OwnerKind.HOST and proc.name == PERSISTENCED


@dataclass
class _Found:
    """What the look at the VM's GPUs found, as plan builds it."""

    policy: str
    stop: dict[int, tuple[set[int], set[int]]] = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    persistence: set[int] = field(default_factory=set)
    daemon: dict[int, str] = field(default_factory=dict)  # GPU index -> its line


def _holders(where: str, g: GpuUse, allow_host: list[str], found: _Found) -> None:
    """Each holder of GPU `g`: a container's to stop (or a blocker), the persistence daemon's
    node let go by turning persistence off for `g` alone, any other host process a blocker
    (allowed or not: it holds the node), one that cannot be placed a blocker."""
    for row in g.processes:
        owner, text = row.owner, _holder(row.proc, row.memory_mib)
        if owner.kind is OwnerKind.CT and owner.vmid is not None:
            ct = owner.vmid
            if found.policy == "stop-containers":
                idx, mins = found.stop.setdefault(ct, (set(), set()))
                idx.add(g.index)
                if g.minor is not None:
                    mins.add(g.minor)
            else:
                found.blockers.append(f"{where} is held by CT {ct}: {text}: "
                                      f"`pveclean ct {ct}` or `pct stop {ct}`")
        elif _persistenced(row.proc):
            found.persistence.add(g.index)
            found.daemon[g.index] = f"{where}: held by {text}"
        elif _allowed(row.proc, allow_host):
            found.blockers.append(
                f"{where} is held by host process {text}: vm_gpu_allow_host lets pass only "
                "processes that do not hold the GPU (the driver's unbind waits for this one: "
                "the start would hang): stop it")
        elif owner.kind is OwnerKind.HOST:
            found.blockers.append(f"{where} is held by a host process: {text}: stop it "
                                  "(`systemctl stop` its unit)")
        else:
            found.blockers.append(f"{where} is held by a process pveclean cannot place: "
                                  f"{text}: look with `pveclean gpus`")


def _untied(gmap: GpuMap, allow_host: list[str]) -> list[str]:
    """Holders of a GPU node that cannot be tied to a GPU: any may hold the VM's; and each
    part of the host the look could not read whole: what it holds cannot be told."""
    out = [f"{_holder(p)} holds a GPU node pveclean cannot tie to a GPU "
           f"({p.owner.label}): look with `pveclean gpus`"
           for p in gmap.untied if not _allowed(p, allow_host)]
    return out + [f"{n.owner.label}: {safe(n.what, 60)} could not be read whole, so what it "
                  f"holds cannot be told ({safe(n.why, 200)}): look with `pveclean gpus`"
                  for n in gmap.not_judged]


@dataclass(frozen=True)
class VmStart:
    """What the host says of VM `vmid`'s start, beside the GPU map: its NVIDIA GPU functions
    (`addresses`), qemu-server's live reservations (PCI.pm's pci-id-reservations: PCI id ->
    VMID), the containers whose configs still pass one of them (`keeping`: their next start
    would take it back), and each address's driver now (sysfs), where known."""

    vmid: int
    addresses: list[PciAddress]
    reservations: dict[PciAddress, int] = field(default_factory=dict)  # a whole device's too
    keeping: dict[int, list[PciAddress]] = field(default_factory=dict)
    drivers: dict[PciAddress, str | None] = field(default_factory=dict)


def plan(start: VmStart, gmap: GpuMap, policy: str, allow_host: list[str]) -> Plan:
    """What the start may do about the holders of its GPUs in `gmap`, `pveclean gpus`' map,
    under `policy` (vm_gpu_policy) and vm_gpu_allow_host."""
    vmid, reservations, drivers = start.vmid, start.reservations, start.drivers
    wanted = set(start.addresses)
    rows = {g.pci_bus_id: g for g in gmap.gpus if g.pci_bus_id is not None}
    targets: list[Target] = []
    found = _Found(policy)
    blockers, notes = found.blockers, found.notes
    for addr in sorted(wanted, key=sysfs_order):
        other = reservations.get(addr, reservations.get(addr.whole_device))
        if other is not None and other != vmid:
            blockers.append(f"GPU {addr} is in use by VM {other} (vfio-pci): `qm stop {other}`")
        g = rows.get(addr)
        if g is None:  # not on the nvidia driver (vfio-pci already), or NVML does not see it
            targets.append(Target(addr))
            if drivers.get(addr) == "nvidia":
                blockers.append(f"GPU {addr} is on the nvidia driver but NVML does not list "
                                f"it (NVML: {safe(str(gmap.nvml), 120)}): who holds it cannot "
                                "be told; look with `pveclean gpus`")
            continue
        targets.append(Target(addr, g.index, g.minor))
        where = f"GPU {g.index} ({addr})"
        if not g.ok:
            blockers.append(f"{where} is {g.status}: NVML cannot tell who holds it (not "
                            "judged); look with `pveclean gpus`")
        _holders(where, g, allow_host, found)
        if g.leak_mib and not g.processes:
            blockers.append(f"{where} has {g.leak_mib} MiB that no process accounts for; look "
                            "with `pveclean gpus`")
    if any(t.index is not None for t in targets):  # a GPU the nvidia driver has
        blockers += _untied(gmap, allow_host)
    for ct, addrs in sorted(start.keeping.items()):
        passed = ", ".join(sorted(map(str, addrs)))
        notes.append(f"CT {ct}'s config passes {passed} too: its next start takes the GPU back")
    frozen = {ct: (frozenset(i), frozenset(m)) for ct, (i, m) in found.stop.items()}
    decision = (Decision.REFUSE if blockers else Decision.STOP if frozen else Decision.CLEAR)
    then = ("would be turned off for this GPU alone" if decision is Decision.REFUSE
            else "is turned off for this GPU alone, and back on when it comes back")
    notes[:0] = [f"{line}: persistence mode {then}" for _, line in sorted(found.daemon.items())]
    return Plan(decision, targets, frozen if decision is Decision.STOP else {}, blockers,
                notes, frozenset(found.persistence) if decision is not Decision.REFUSE
                else frozenset())


def still_held(addresses: list[PciAddress], gmap: GpuMap, allow_host: list[str]
               ) -> list[str]:
    """After the stop: each of the VM's GPUs that a process (other than an allowed host one)
    or memory no process accounts for still holds, one line each."""
    wanted = set(addresses)
    out = []
    for g in gmap.gpus:
        addr = g.pci_bus_id
        if addr not in wanted:
            continue
        rows = list(g.processes)  # an allowed host process holding it holds it too
        if rows:
            out.append(f"GPU {g.index} ({addr}) still held: "
                       + "; ".join(_holder(r.proc, r.memory_mib) for r in rows[:5]))
        elif g.leak_mib:
            out.append(f"GPU {g.index} ({addr}): {g.leak_mib} MiB still allocated with no "
                       "process")
        elif not g.ok:
            out.append(f"GPU {g.index} ({addr}) is {g.status}: NVML did not answer for it "
                       "(not judged)")
    if any(g.pci_bus_id in wanted for g in gmap.gpus):
        out += [f"still held: {line}" for line in _untied(gmap, allow_host)]
    return out


def conflicts(gpus: Iterable[GpuUse], vm_refs: list[HostPci],
              policy: str, allow_host: list[str] | None = None) -> list[VmConflict]:
    """For `pveclean gpus` and `status`: each GPU on the nvidia driver that a VM's config
    passes through (`vm_refs`: passthrough.vm_passthrough's rows) while a container or the
    host holds it, with what that VM's next start would do under `policy`."""
    out = []
    for g in gpus:
        addr = g.pci_bus_id
        vms = sorted({(r.vmid, r.name) for r in vm_refs
                      if addr is not None and r.address.covers(addr)})
        if addr is None or not vms or not g.processes:
            continue
        cts = sorted({r.owner.vmid for r in g.processes
                      if r.owner.kind is OwnerKind.CT and r.owner.vmid is not None})
        others = [r for r in g.processes if r.owner.kind is not OwnerKind.CT
                  and not _persistenced(r.proc)]
        would = ("refuse" if policy != "stop-containers" or others
                 else f"stop CT {', '.join(map(str, cts))}'s holders of it")
        out.append(VmConflict(g.index, addr, tuple(VmName(v, n) for v, n in vms), tuple(cts),
                              len(others), would))
    return out
