"""GPUs that NVML could not answer for (lost, unavailable): their marks in the records, and
which of them a run on one container cannot vouch for.

NVML is asked per GPU (host/nvml.py): a GPU that fell off the bus (GPU_IS_LOST, Xid 79) or
answers with an error is a record with its status and reason, while the others are used.
What the container held on such a GPU cannot be verified: when the GPU may be one of the
container's, the run says so as a problem (never `clean`); a GPU shown to be another's
changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pveclean.core.lazyre import lazy
from pveclean.core.pci import PciAddress, sysfs_order
from pveclean.core.records import GpuFault, GpuMemory, GpuStatus, NvmlProcesses

Fault = GpuFault  # (status, reason)
_NODE = lazy(r"/dev/nvidia(\d+)")


def config_minors(paths: list[str]) -> set[int] | None:
    """N of each /dev/nvidiaN among a container's configured device paths; None when they
    name none (a bind of the whole /dev, LXC's nvidia mount hook, a config pveclean cannot
    read: any GPU may be the container's)."""
    return {int(m.group(1)) for p in paths if (m := _NODE.fullmatch(p))} or None


def faults_of(gpus: list[GpuMemory] | None) -> dict[int, Fault]:
    return {g.index: (g.status, g.reason or str(g.status)) for g in gpus or [] if not g.ok}


def worst(a: Fault, b: Fault) -> Fault:
    """Two faults of one GPU as one: lost when either says so, both reasons."""
    lost = GpuStatus.LOST in (a[0], b[0])
    status = GpuStatus.LOST if lost else GpuStatus.UNAVAILABLE
    reasons = list(dict.fromkeys((a[1], b[1])))
    return status, "; ".join(reasons)


def with_faults(gpus: list[GpuMemory], faults: Mapping[int, Fault]) -> list[GpuMemory]:
    """The GPUs, each that another answer failed for (its process list) marked with it."""
    out = []
    for g in gpus:
        f = faults.get(g.index)
        if f is not None:
            status, reason = worst((g.status, g.reason or ""), f) if not g.ok else f
            g = dataclasses.replace(g, status=status, reason=reason.strip("; "),
                                    unread=(*g.unread, "processes"))
        out.append(g)
    return out


def unverified(faults: dict[int, Fault], seen: list[GpuMemory], minors: set[int] | None,
               held: set[int]) -> dict[int, str]:
    """GPU index -> problem, for each faulted GPU that may be the container's: its minor
    (N of /dev/nvidiaN, from any answer in `seen`) is one the container's config names
    (`minors`; None: it cannot tell, so every GPU may be) or one its holders held (`held`);
    a GPU whose minor NVML did not give may be the container's when one of those minors
    belongs to no GPU that answered."""
    ok_minors = {g.minor for g in seen if g.ok and g.minor is not None}
    known = {g.index: g.minor for g in seen if g.minor is not None}
    out: dict[int, str] = {}
    for index, (status, reason) in sorted(faults.items()):
        if minors is not None:
            mine = minors | held
            minor = known.get(index)
            if minor is not None and minor not in mine:
                continue
            if minor is None and not mine - ok_minors:
                continue
        out[index] = (f"GPU {index} is {status} ({reason}): NVML cannot tell what the "
                      "container holds on it, so it is not verified free")
    return out


class GpuWatch:
    """One run's GPU faults over its NVML answers (before, process lists, after): `note`
    returns the problems not said yet, one per GPU that may be the container's."""

    def __init__(self, minors: set[int] | None, held: set[int]) -> None:
        self.minors, self.held = minors, held
        self.faults: dict[int, Fault] = {}
        self.seen: list[GpuMemory] = []
        self._said: set[int] = set()

    def note(self, gpus: list[GpuMemory] | None, faults: Mapping[int, Fault]) -> list[str]:
        self.seen += gpus or []
        for index, f in [*faults_of(gpus).items(), *faults.items()]:
            self.faults[index] = worst(self.faults[index], f) if index in self.faults else f
        new = {i: text for i, text in unverified(self.faults, self.seen, self.minors,
                                                 self.held).items() if i not in self._said}
        self._said |= set(new)
        return list(new.values())


def unchecked(gpus: list[GpuMemory], procs: NvmlProcesses, minors: set[int]) -> list[str]:
    """Why a post-stop leak check passed over a GPU that may be the container's (`minors`:
    its configured ones; empty: any): NVML could not read it or list its processes."""
    faults = {**procs.faults, **faults_of(gpus)}
    minor_of = {g.index: g.minor for g in gpus}
    out = [f"GPU {i} is {status} ({reason}): its memory is not checked for leaks"
           for i, (status, reason) in sorted(faults.items())
           if not minors or minor_of.get(i) is None or minor_of[i] in minors]
    na = sorted({i for per in procs.by_pid.values() for i, m in per.items() if m is None}
                - set(faults))
    return out + [f"GPU {i}: NVML reports a process's memory on it as not available: its "
                  "memory is not checked for leaks (not judged)" for i in na
                  if not minors or minor_of.get(i) is None or minor_of[i] in minors]


# ---- issue 38: a lost GPU keeps what was last known of it ----------------------------------
Known = dict[int, tuple[str, str, "PciAddress | None"]]  # GPU index -> (UUID, name, bus id)


def with_known(gpus: list[GpuMemory], buses: Mapping[int, PciAddress], known: Known
               ) -> tuple[list[GpuMemory], dict[int, PciAddress]]:
    """The GPUs and bus ids, each GPU NVML no longer names (lost, a getter that failed)
    given the UUID, name and bus id last known for its index in `known` (this session's
    earlier answers), which learns those of every GPU NVML named this time."""
    out, bus_ids = [], dict(buses)
    for g in gpus:
        prev = known.get(g.index)
        if g.uuid and (prev is None or prev[0] != g.uuid or g.index in bus_ids):
            known[g.index] = (g.uuid, g.name, bus_ids.get(g.index))
        elif prev is not None and g.uuid in ("", prev[0]):
            g = dataclasses.replace(g, uuid=prev[0], name=g.name or prev[1])
            if prev[2] is not None:
                bus_ids.setdefault(g.index, prev[2])
        out.append(g)
    return out, bus_ids


# a GPU as the driver's own /proc/driver/nvidia/gpus/<bus>/information gives it: (UUID, model,
# bus id, minor); read by host/nvmlfacts.py, for GPUs NVML no longer names (a fresh process)
DriverGpu = tuple[str, str, PciAddress, "int | None"]


def from_driver(gpus: list[GpuMemory], buses: Mapping[int, PciAddress],
                driver: list[DriverGpu]) -> tuple[list[GpuMemory], dict[int, PciAddress]]:
    """The GPUs and bus ids, each GPU NVML did not name (no UUID: lost, a failed getter)
    given the UUID, model, bus id and minor of the driver's entry with its minor, else its
    bus id; the GPUs left and the entries no named GPU has are paired in PCI order when they
    are as many (NVML numbers GPUs in PCI bus order)."""
    bus_ids = dict(buses)
    named = {g.uuid for g in gpus if g.uuid} | {bus_ids[g.index] for g in gpus
                                                  if g.uuid and g.index in bus_ids}
    free = [d for d in sorted(driver, key=lambda d: sysfs_order(d[2]))
            if d[0] not in named and d[2] not in named]
    by_minor = {d[3]: d for d in free if d[3] is not None}
    by_bus = {d[2]: d for d in free}
    unnamed = sorted((g for g in gpus if not g.uuid), key=lambda g: g.index)
    found: dict[int, DriverGpu | None] = {
        g.index: (by_minor.get(g.minor) if g.minor is not None else None)
        or (by_bus.get(bus_ids[g.index]) if g.index in bus_ids else None) for g in unnamed}
    rest = [g for g in unnamed if found[g.index] is None]
    left = [d for d in free if d not in found.values()]
    if rest and len(rest) == len(left):
        found.update({g.index: d for g, d in zip(rest, left, strict=True)})
    out = []
    for g in gpus:
        d = found.get(g.index)
        if d is not None:
            g = dataclasses.replace(g, uuid=d[0], name=g.name or d[1],
                                    minor=d[3] if g.minor is None else g.minor)
            bus_ids.setdefault(g.index, d[2])
        out.append(g)
    return out, bus_ids
