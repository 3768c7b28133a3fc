"""Hand-built typed maps of the host (core/gpumap's records), for the tests of their readers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pveclean.core.gpumap import (
    GpuHolding,
    GpuMap,
    GpuProc,
    GpuUse,
    ScanStats,
    VfioGpu,
    VmConflict,
    VmName,
)
from pveclean.core.owners import Owner, OwnerKind
from pveclean.core.pci import HostPci, PciAddress
from pveclean.core.records import GpuMemory, Source, SourceState
from pveclean.core.reportread import devices_of


def owner(kind: str, vmid: int | None = None) -> Owner:
    return Owner(OwnerKind(kind), vmid if kind == "ct" else None)


def proc(pid: int, kind: str = "ct", vmid: int | None = None, name: str = "python3",
         **kw: object) -> GpuProc:
    if "devices" in kw:  # the map's labels, as `gpus --json` writes them
        devices, kw["devices_more"] = devices_of(kw["devices"])
        kw["devices"] = tuple(devices)
    return GpuProc(pid, name, owner(kind, vmid), **kw)  # type: ignore[arg-type]


def row(pid: int, kind: str, vmid: int | None = None, name: str = "python3",
        mib: int | None = 1000, **kw: object) -> GpuHolding:
    return GpuHolding(proc(pid, kind, vmid, name, **kw), mib)


def use(index: int, bus: str | None, rows: Iterable[GpuHolding] = (), *,
        minor: int | None = -1, status: str = "ok", reason: str | None = None,
        leak_mib: int = 0, unaccounted_mib: int | None = 0, total: int = 81559,
        used: int = 0, reserved: int | None = 0, name: str = "NVIDIA H100",
        uuid: str = "GPU-x", by_owner: Iterable[tuple[Owner, int]] = ()) -> GpuUse:
    g = GpuMemory(index, uuid, name, total, reserved, used,
                  index if minor == -1 else minor, status, reason)
    return GpuUse(g, None if bus is None else pci(bus), tuple(rows), tuple(by_owner),
                  unaccounted_mib, leak_mib)


def gmap(gpus: Iterable[GpuUse] = (), *, vfio: Iterable[VfioGpu] = (),
         conflicts: Iterable[VmConflict] = (), hostnames: Mapping[int, str] | None = None,
         other: Iterable[GpuProc] = (), untied: Iterable[GpuProc] = (),
         warnings: Iterable[str] = (), seconds: float = 0.0, nvml: str = "ok",
         host: str = "h", time: float = 0.0,
         scanned: Iterable[int] = (), skipped: Iterable[int] = ()) -> GpuMap:
    state = SourceState.OK if nvml == "ok" else SourceState.UNAVAILABLE
    return GpuMap(host, time, tuple(gpus), tuple(other), tuple(vfio), tuple(conflicts),
                  dict(hostnames or {}), ScanStats(tuple(scanned), tuple(skipped), 0, 0,
                                                   seconds),
                  Source(SourceState.OK), Source(state, None if nvml == "ok" else nvml),
                  tuple(warnings), tuple(untied))


def vfio(bus: str, driver: str | None = "vfio-pci", vms: Iterable[tuple[int, str]] = (),
         device: str = "10de:2330") -> VfioGpu:
    return VfioGpu(pci(bus), device, driver, tuple(VmName(v, n) for v, n in vms))


def pci(text: str) -> PciAddress:
    """A PCI address the tests write as sysfs, hostpci or NVML do."""
    addr = PciAddress.parse(text)
    assert addr is not None, text
    return addr


def pcis(*texts: str) -> list[PciAddress]:
    return [pci(t) for t in texts]


def hostpci(vmid: int, address: str, name: str = "") -> HostPci:
    """One id of VM `vmid`'s hostpci lines (`01:00`: the whole device)."""
    return HostPci(vmid, name, pci(address))
