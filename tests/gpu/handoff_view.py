"""`make gpu-check` on a GPU that is not ours to reconfigure (a shared test machine): how
pveclean's VM hook reads each NVIDIA GPU's hand-off, read-only. For every NVIDIA display
function: its IOMMU group's endpoints (proxmox/vmtake.group_of, bridges aside, as
pci_dev_group_bind_to_vfio), each endpoint's driver (vmtake.driver_of), whether the driver
offers vGPU (`<dev>/nvidia`, vmtake.host_pci) and the GPU's persistence mode through NVML
(host/persistence.py). Nothing is reset, unbound or changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pveclean.core.pci import PciAddress
from pveclean.proxmox import vmtake


def view(pci_root: Path, persistence: Callable[[PciAddress], str]) -> list[str]:
    """One line per NVIDIA display function, then one per endpoint of its group."""
    host = vmtake.host_pci(pci_root)
    out = []
    for a in host.functions:
        d = pci_root / str(a)
        vendor = (d / "vendor").read_text().strip() if (d / "vendor").exists() else ""
        cls = (d / "class").read_text().strip() if (d / "class").exists() else ""
        if vendor != vmtake.NVIDIA_VENDOR or cls[:4] != "0x03":
            continue
        out.append(f"{a}: driver {vmtake.driver_of(pci_root, a) or '-'}, persistence "
                   f"{persistence(a)}, vGPU {'yes' if a in host.vgpu_capable else 'no'}")
        for e in vmtake.group_of(pci_root, a):
            out.append(f"  group endpoint {e}: driver {vmtake.driver_of(pci_root, e) or '-'}")
    return out


def nvml_persistence(library: str | None) -> Callable[[PciAddress], str]:
    """The persistence mode of the GPU at an address, through NVML (read only)."""
    from pveclean.host.nvml import Nvml, NvmlUnavailable
    from pveclean.host.persistence import persistence_mode

    nv = Nvml(library, 5.0)

    def mode(addr: PciAddress) -> str:
        try:
            for index, bus in nv.pci_bus_ids().items():
                if bus == addr:
                    return "on" if persistence_mode(nv, index) else "off"
        except NvmlUnavailable as exc:
            return f"unknown ({exc})"
        return "unknown (NVML does not list it)"

    return mode


def main(library: str | None = None) -> int:
    lines = view(Path("/sys/bus/pci/devices"), nvml_persistence(library))
    print("\n".join(lines) or "no NVIDIA display function here")
    return 0 if lines else 1
