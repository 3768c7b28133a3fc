"""Which IOMMU groups a process has open through /dev/vfio/<group> (QEMU holds its VM's
groups there): a group in use is never given back to its drivers. Read from /proc's fd links,
each unreadable process passed."""

from __future__ import annotations

import os
from pathlib import Path


def group_of(pci_devices: Path, fn: str) -> str | None:
    """The IOMMU group number of PCI function `fn` (its iommu_group link), None without."""
    try:
        return os.path.basename(os.readlink(pci_devices / fn / "iommu_group"))
    except OSError:
        return None


def open_groups(groups: set[str], proc: str = "/proc") -> set[str]:
    """The groups of `groups` whose /dev/vfio/<group> some process has open."""
    wanted = {f"/dev/vfio/{g}": g for g in groups}
    found: set[str] = set()
    if not wanted:
        return found
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted:
                found.add(wanted[target])
    return found
