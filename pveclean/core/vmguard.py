"""A VM's start with an NVIDIA GPU passed through: who holds that GPU, and what the start may
do about it (`vm_gpu_policy`). Pure: it judges `pveclean gpus`' map of the host.

qemu-server binds a passed-through GPU to vfio-pci at the VM's start (PCI.pm's
prepare_pci_device, after the pre-start hook): a GPU some process still holds through the
nvidia driver makes that unbind hang or fail, or the start fails "device busy". So every
holder of the VM's GPUs is named: a container's may be stopped (policy `stop-containers`),
the host's never (only one named in `vm_gpu_allow_host` may stay), another running VM's
never, and one that cannot be told (an unknown owner, a GPU NVML cannot read) is no
innocent: it refuses the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pveclean.core.text import safe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Decision(StrEnum):
    CLEAR = "clear"  # nothing holds the VM's GPUs
    STOP = "stop-containers"  # only containers' holders, and the policy stops them
    REFUSE = "refuse"


@dataclass(frozen=True)
class Target:
    """One GPU of the VM as the host has it now."""

    address: str  # sysfs PCI name, 0000:18:00.0
    index: int | None = None  # NVML's, when the nvidia driver has it
    minor: int | None = None  # N of /dev/nvidiaN


@dataclass
class Plan:
    decision: Decision
    targets: list[Target]
    # container -> (GPU indices, minors) of the VM's GPUs its holders hold
    stop: dict[int, tuple[frozenset[int], frozenset[int]]] = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)  # each with the command that frees it
    notes: list[str] = field(default_factory=list)  # allowed holders, containers to mind

    def as_dict(self) -> dict[str, Any]:
        return {"decision": str(self.decision),
                "gpus": [{"pci_bus_id": t.address, "index": t.index, "minor": t.minor}
                         for t in self.targets],
                "stop": {str(ct): sorted(idx) for ct, (idx, _) in sorted(self.stop.items())},
                "blockers": list(self.blockers), "notes": list(self.notes)}


def _holder(row: dict[str, Any]) -> str:
    mib = row.get("memory_mib")
    held = f", {mib} MiB" if isinstance(mib, int) else ""
    return f"PID {row.get('host_pid')} {safe(str(row.get('name') or '?'), 40)}{held}"


def plan(vmid: int, addresses: list[str], gpus_map: dict[str, Any],
         reservations: dict[str, int], policy: str, allow_host: list[str],
         keeping: dict[int, list[str]] | None = None,
         drivers: dict[str, str | None] | None = None) -> Plan:
    """What the start of VM `vmid` may do about the holders of `addresses` (its NVIDIA GPU
    functions). `gpus_map`: `pveclean gpus --json`'s data; `reservations`: PCI id -> VMID of
    qemu-server's live reservations (PCI.pm's pci-id-reservations); `keeping`: container ->
    the VM's GPU addresses its config still passes (its next start would take them back);
    `drivers`: each address's driver now (sysfs), where known."""
    wanted = {a.lower() for a in addresses}
    rows = {str(g.get("pci_bus_id") or "").lower(): g for g in gpus_map.get("gpus", [])}
    targets: list[Target] = []
    blockers: list[str] = []
    notes: list[str] = []
    stop: dict[int, tuple[set[int], set[int]]] = {}
    for addr in sorted(wanted):
        other = reservations.get(addr, reservations.get(addr.rsplit(".", 1)[0]))
        if other is not None and other != vmid:
            blockers.append(f"GPU {addr} is in use by VM {other} (vfio-pci): `qm stop {other}`")
        g = rows.get(addr)
        if g is None:  # not on the nvidia driver (vfio-pci already), or NVML does not see it
            targets.append(Target(addr))
            if (drivers or {}).get(addr) == "nvidia":
                nvml = (gpus_map.get("sources") or {}).get("nvml", "?")
                blockers.append(f"GPU {addr} is on the nvidia driver but NVML does not list "
                                f"it (NVML: {safe(nvml, 120)}): who holds it cannot be told; "
                                "look with `pveclean gpus`")
            continue
        index, minor = g.get("index"), g.get("minor")
        targets.append(Target(addr, index, minor))
        where = f"GPU {index} ({addr})"
        if g.get("status", "ok") != "ok":
            blockers.append(f"{where} is {g.get('status')}: NVML cannot tell who holds it; "
                            "look with `pveclean gpus`")
        for row in g.get("processes", []):
            owner, ct = row.get("owner"), row.get("vmid")
            if owner == "ct" and isinstance(ct, int):
                if policy == "stop-containers":
                    idx, mins = stop.setdefault(ct, (set(), set()))
                    idx.add(index)
                    if minor is not None:
                        mins.add(minor)
                else:
                    blockers.append(f"{where} is held by CT {ct}: {_holder(row)}: "
                                    f"`pveclean ct {ct}` or `pct stop {ct}`")
            elif owner == "host" and str(row.get("name") or "") in allow_host:
                notes.append(f"{where}: host process {_holder(row)} allowed by "
                             "vm_gpu_allow_host, left running")
            elif owner == "host":
                blockers.append(f"{where} is held by a host process: {_holder(row)}: stop it "
                                "(`systemctl stop` its unit) or allow it in vm_gpu_allow_host")
            else:
                blockers.append(f"{where} is held by a process pveclean cannot place: "
                                f"{_holder(row)}: look with `pveclean gpus`")
        leak = g.get("leak_mib") or 0
        if leak and not g.get("processes"):
            blockers.append(f"{where} has {leak} MiB that no process accounts for; look with "
                            "`pveclean gpus`")
    for ct, addrs in sorted((keeping or {}).items()):
        notes.append(f"CT {ct}'s config passes {', '.join(sorted(addrs))} too: its next start "
                     "takes the GPU back")
    frozen = {ct: (frozenset(i), frozenset(m)) for ct, (i, m) in stop.items()}
    decision = (Decision.REFUSE if blockers else Decision.STOP if frozen else Decision.CLEAR)
    return Plan(decision, targets, frozen if decision is Decision.STOP else {}, blockers,
                notes)


def still_held(addresses: list[str], gpus_map: dict[str, Any], allow_host: list[str]
               ) -> list[str]:
    """After the stop: each of the VM's GPUs that a process (other than an allowed host one)
    or memory no process accounts for still holds, one line each."""
    wanted = {a.lower() for a in addresses}
    out = []
    for g in gpus_map.get("gpus", []):
        addr = str(g.get("pci_bus_id") or "").lower()
        if addr not in wanted:
            continue
        rows = [r for r in g.get("processes", [])
                if not (r.get("owner") == "host" and str(r.get("name") or "") in allow_host)]
        if rows:
            out.append(f"GPU {g.get('index')} ({addr}) still held: "
                       + "; ".join(_holder(r) for r in rows[:5]))
        elif g.get("leak_mib"):
            out.append(f"GPU {g.get('index')} ({addr}): {g.get('leak_mib')} MiB still "
                       "allocated with no process")
        elif g.get("status", "ok") != "ok":
            out.append(f"GPU {g.get('index')} ({addr}) is {g.get('status')}: not verified")
    return out


def conflicts(gpus_map: dict[str, Any], vm_refs: list[tuple[int, str, str, bool]],
              policy: str, allow_host: list[str] | None = None) -> list[dict[str, Any]]:
    """For `pveclean gpus` and `status`: each GPU on the nvidia driver that a VM's config
    passes through (`vm_refs`: passthrough.vm_passthrough's rows) while a container or the
    host holds it, with what that VM's next start would do under `policy`."""
    out = []
    for g in gpus_map.get("gpus", []):
        addr = str(g.get("pci_bus_id") or "").lower()
        vms = sorted({(v, n) for v, n, prefix, whole in vm_refs
                      if addr and (addr.startswith(prefix) if whole else addr == prefix)})
        holders = g.get("processes", [])
        if not vms or not holders:
            continue
        cts = sorted({r["vmid"] for r in holders if r.get("owner") == "ct"})
        others = [r for r in holders if r.get("owner") != "ct"
                  and not (r.get("owner") == "host"
                           and str(r.get("name") or "") in (allow_host or []))]
        would = ("refuse" if policy != "stop-containers" or others
                 else f"stop CT {', '.join(map(str, cts))}'s holders of it")
        out.append({"gpu": g.get("index"), "pci_bus_id": addr,
                    "vms": [{"vmid": v, "name": n} for v, n in vms], "containers": cts,
                    "host_holders": len(others), "next_vm_start": would})
    return out
