"""What `pveclean doctor` asks NVML: the driver version its library reports, and each GPU's
minor, PCI address and persistence mode (read through host/persistence.py)."""

from __future__ import annotations

from pveclean.core.doctor import HostGpu
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
