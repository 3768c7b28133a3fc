"""What `pveclean doctor` asks NVML: the driver version its library reports, and each GPU's
minor, PCI address and persistence mode (read through host/persistence.py); and what the
driver itself says of each GPU (/proc/driver/nvidia/gpus/*/information), for a GPU NVML no
longer names (issue 38: a lost GPU keeps its UUID and bus id in a fresh process)."""

from __future__ import annotations

from pveclean.core.doctor import HostGpu
from pveclean.core.gpufaults import DriverGpu
from pveclean.core.pci import PciAddress
from pveclean.host import procfs
from pveclean.host.nvml import Nvml, NvmlUnavailable
from pveclean.host.persistence import persistence_mode


def nvml_facts(nv: Nvml) -> tuple[str | None, list[HostGpu], str | None]:
    """(driver version, the GPUs, why NVML did not answer). Each GPU on its own: one whose
    getters fail is given with what NVML did say."""
    try:
        version = nv.driver_version()
        rows = nv.memory_rows()
    except NvmlUnavailable as exc:
        return None, [], str(exc)
    try:
        buses = nv.pci_bus_ids()
    except NvmlUnavailable:
        buses = {}
    gpus = []
    for row in rows:
        index, minor = row[0], row[6]
        try:
            mode: bool | None = persistence_mode(nv, index)
        except NvmlUnavailable:
            mode = None
        gpus.append(HostGpu(index, minor, buses.get(index), mode))
    return version, gpus, None


def driver_gpus() -> list[DriverGpu]:
    """(UUID, model, bus id, minor) of each GPU in the driver's own
    /proc/driver/nvidia/gpus/<bus id>/information (`GPU UUID:`, `Model:`, `Bus Location:`,
    `Device Minor:`; below the settable /proc root); an entry without a UUID is left out."""
    out: list[DriverGpu] = []
    for name, fields in procfs.driver_gpus_info().items():
        bus = PciAddress.parse(fields.get("Bus Location", "")) or PciAddress.parse(name)
        minor = fields.get("Device Minor", "")
        uuid = fields.get("GPU UUID", "")
        if bus is not None and uuid.startswith(("GPU-", "MIG-")) and uuid.isprintable():
            out.append((uuid[:80], fields.get("Model", "")[:96], bus,
                        int(minor) if minor.isdigit() else None))
    return out
