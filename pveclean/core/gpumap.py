"""`pveclean gpus`' attribution: which process holds which GPU, under which owner, and the
memory no process accounts for."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from pveclean.core.records import GpuDevices, GpuMemory, Holder
from pveclean.core.report import LEAK_SLACK_MIB  # the post-stop hook's, for the same memory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_RDEV = re.compile(r"\((?:mmap )?(\d+):(\d+)\)$")
_NODE = re.compile(r"nvidia(\d+)")


@dataclass
class Proc:
    """One process that holds a GPU node or GPU memory."""

    host_pid: int
    name: str
    owner: str  # "ct", "host" or "unknown"
    vmid: int | None = None
    ct_pid: int | None = None
    unit: str | None = None
    cgroup: str | None = None
    devices: list[str] = field(default_factory=list)
    minors: set[int] = field(default_factory=set)  # N of each /dev/nvidiaN it holds
    memory: dict[int, int | None] = field(default_factory=dict)  # GPU index -> MiB

    def as_dict(self) -> dict[str, Any]:
        return {"host_pid": self.host_pid, "name": self.name, "owner": self.owner,
                "vmid": self.vmid, "ct_pid": self.ct_pid, "unit": self.unit,
                "cgroup": self.cgroup, "devices": self.devices,
                "gpu_memory_mib": {int(k): v for k, v in sorted(self.memory.items())}}


def proc_of_holder(h: Holder, vmid: int) -> Proc:
    return Proc(h.host_pid, full_name(h.name, h.argv), "ct", vmid, h.ct_pid, h.unit, h.cgroup,
                list(h.devices))


def minors_held(p: Proc, devices: GpuDevices) -> set[int]:
    return minors_of(p.devices, devices)


def minors_of(held: list[str], devices: GpuDevices) -> set[int]:
    """N of each /dev/nvidiaN among a holder's devices ("PATH (MAJOR:MINOR)")."""
    found = set()
    for d in held:
        m = _RDEV.search(d)
        if not m:
            continue
        major, minor = int(m.group(1)), int(m.group(2))
        path = devices.rdevs.get(makedev(major, minor))
        n = _NODE.fullmatch(posixpath.basename(path)) if path else None
        if n:
            found.add(int(n.group(1)))
        elif path is None and major == 195 and minor < 254:  # /dev/nvidiaN on any host
            found.add(minor)
    return found


def gpu_indices(p: Proc, gpus: list[GpuMemory]) -> set[int]:
    return {g.index for g in gpus if g.index in p.memory or
            (g.minor is not None and g.minor in p.minors)}


def owner_order(p: Proc) -> tuple[int, int, int]:
    return (0 if p.owner == "ct" else 1, p.vmid or 0, p.host_pid)


def _mem_key(row: dict[str, Any]) -> tuple[int, int]:
    mib = row["memory_mib"]
    return (-(mib if mib is not None else -1), row["host_pid"])


def gpu_entry(g: GpuMemory, bus: str | None, procs: Any) -> dict[str, Any]:
    rows = []
    accounted, unknown = 0, False
    for p in procs:
        on = g.index in p.memory or (g.minor is not None and g.minor in p.minors)
        if not on:
            continue
        mib = p.memory.get(g.index)
        if g.index in p.memory:
            if mib is None:
                unknown = True
            else:
                accounted += mib
        rows.append({**p.as_dict(), "memory_mib": mib})
    rows.sort(key=_mem_key)
    owners: dict[str, int] = {}
    for r in rows:
        key = owner_label(r)
        owners[key] = owners.get(key, 0) + (r["memory_mib"] or 0)
    unaccounted = None
    if g.reserved_mib is not None and not unknown and g.ok:  # a GPU NVML could not read: no
        unaccounted = max(g.used_mib - accounted, 0)  # figure to judge, so never a leak
    leak = unaccounted if unaccounted is not None and unaccounted > LEAK_SLACK_MIB else 0
    entry = {"index": g.index, "name": g.name, "uuid": g.uuid, "pci_bus_id": bus,
             "minor": g.minor, "total_mib": g.total_mib if g.ok else None,
             "used_mib": g.used_mib if g.ok else None,
             "reserved_mib": g.reserved_mib, "processes": rows,
             "by_owner_mib": dict(sorted(owners.items(), key=lambda kv: -kv[1])),
             "unaccounted_mib": unaccounted, "leak_mib": leak, "status": g.status}
    if not g.ok:
        entry["reason"] = g.reason
    return entry


def owner_label(p: dict[str, Any]) -> str:
    if p["owner"] == "ct":
        return f"CT {p['vmid']}"
    return "host" if p["owner"] == "host" else "unknown"


def full_name(comm: str, argv: tuple[str, ...]) -> str:
    """The kernel cuts comm to 15 characters ("nvidia-persiste"): show argv[0]'s base name
    when it continues comm."""
    argv0 = posixpath.basename(argv[0]) if argv else ""
    cut = comm.encode("utf-8", "surrogateescape")  # 15 bytes, maybe cut inside a character
    whole = argv0.encode("utf-8", "surrogateescape")
    return argv0 if len(cut) == 15 and whole.startswith(cut) else comm


def makedev(major: int, minor: int) -> int:
    """os.makedev without the os module: glibc's encoding of a device number."""
    return ((minor & 0xFF) | ((major & 0xFFF) << 8) | ((minor & ~0xFF) << 12)
            | ((major & ~0xFFF) << 32))
