"""What VM `vmid`'s start will take, read from the host for core/vmdevices: its config (where
qemu-server loads it: the source node's directory during a migration), this node's resource
mappings, sysfs' PCI functions and IOMMU groups, and qemu-server's live reservations.

Reservations (PCI.pm's reserve_pci_usage): a `time:` entry counts while its window is open;
a `pid:` entry only while that VM's QEMU with that PID runs (Helpers::vm_running_locally: the
VM's pidfile names that PID and it lives), not any process that has the PID now.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.core import vmdevices
from pveclean.core.pci import PciAddress, sysfs_order
from pveclean.proxmox import pveconf

NVIDIA_VENDOR = "0x10de"
_NODE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?")  # pve-node


@dataclass
class VmTake:
    """The VM's start as the host reads it now: the endpoints whose drivers it takes (each
    function's driver now), one function per IOMMU group to hand over, and what qemu-server
    will do otherwise (notes; `fails`: the start dies after pre-start, taking nothing)."""

    drivers: dict[PciAddress, str | None] = field(default_factory=dict)
    groups: list[PciAddress] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fails: str | None = None
    nvidia: bool = False  # an NVIDIA function among them: pveclean's to guard


def config_file(pve_dir: Path, vmid: int, migrated_from: str | None) -> Path:
    """Where vm_start loads the config: load_config($vmid, $migratedfrom) reads the source
    node's directory while PVE_MIGRATED_FROM is set."""
    if migrated_from and _NODE.fullmatch(migrated_from):
        return pve_dir / "nodes" / migrated_from / "qemu-server" / f"{vmid}.conf"
    return pve_dir / "qemu-server" / f"{vmid}.conf"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def reservations(run_dir: Path, now: float | None = None
                 ) -> dict[PciAddress, vmdevices.Reservation]:
    """qemu-server's live reservations: PCI id -> its VM and whether it is still starting."""
    out: dict[PciAddress, vmdevices.Reservation] = {}
    text = _read(run_dir / "pci-id-reservations")
    now = time.time() if now is None else now
    for line in text.split("\n"):
        m = re.fullmatch(r"(\S+) (\d+) (time|pid):(\d+)", line.strip())
        addr = PciAddress.parse(m.group(1)) if m else None
        if m is None or addr is None:
            continue
        vmid, kind, value = int(m.group(2)), m.group(3), int(m.group(4))
        if kind == "time":
            live = value > now
        else:
            live = _read(run_dir / f"{vmid}.pid") == str(value) and _alive(value)
        if live:
            out[addr] = vmdevices.Reservation(vmid, starting=kind == "time")
    return out


def _alive(pid: int) -> bool:
    """A process that runs (a zombie's cmdline is empty: vm_running_locally's check_cmdline
    would not take it)."""
    return bool(_read(Path(f"/proc/{pid}/cmdline")))


def qemu_running(run_dir: Path, vmid: int) -> bool:
    """Helpers::vm_running_locally, as far as pveclean needs it: the VM's pidfile names a
    live process."""
    pid = _read(run_dir / f"{vmid}.pid")
    return pid.isdigit() and _alive(int(pid))


def host_pci(pci_root: Path) -> vmdevices.Host:
    """Every PCI function sysfs lists, and those with the nvidia driver's vGPU directory."""
    try:
        names = os.listdir(pci_root)
    except OSError:
        names = []
    funcs = sorted((a for a in map(PciAddress.parse, names) if a is not None), key=sysfs_order)
    return vmdevices.Host(tuple(funcs), frozenset(
        a for a in funcs if (pci_root / str(a) / "nvidia").is_dir()))


def group_of(pci_root: Path, addr: PciAddress) -> tuple[PciAddress, ...]:
    """The endpoints of `addr`'s IOMMU group (bridges, with a pci_bus directory, aside: as
    pci_dev_group_bind_to_vfio); just `addr` when it has no group."""
    try:
        names = sorted(os.listdir(pci_root / str(addr) / "iommu_group" / "devices"))
    except OSError:
        return (addr,)
    return tuple(a for a in map(PciAddress.parse, names)
                 if a is not None and not (pci_root / str(a) / "pci_bus").exists())


def driver_of(pci_root: Path, addr: PciAddress) -> str | None:
    try:
        return os.path.basename(os.readlink(pci_root / str(addr) / "driver"))
    except OSError:
        return None


def read_mappings(path: Path, node: str) -> dict[str, list[tuple[PciAddress, ...]]]:
    """This node's resource mappings (mapping/pci.cfg), each a list of alternatives."""
    return vmdevices.parse_mappings(_read(path), node)


def _lines(conf_lines: list[tuple[str, str]], maps: dict[str, list[tuple[PciAddress, ...]]]
           ) -> list[vmdevices.HostPciLine]:
    return [vmdevices.parse_hostpci(int(k[7:]), v, maps) for k, v in conf_lines
            if re.fullmatch(r"hostpci(\d|1[0-5])", k)]


def unbinds_nvidia(conf_lines: list[tuple[str, str]],
                   maps: dict[str, list[tuple[PciAddress, ...]]], pci_root: Path) -> bool:
    """Whether a start of a VM with this config unbinds an NVIDIA function (its hostpci lines
    as qemu-server takes them, no reservation counted): `driver=keep`, vGPU and mdev lines do
    not."""
    choice = vmdevices.choose(_lines(conf_lines, maps), 0, host_pci(pci_root), {})
    return any(_read(pci_root / str(a) / "vendor") == NVIDIA_VENDOR
               for a in vmdevices.group_endpoints(
                   choice.unbound, {f: group_of(pci_root, f) for f in choice.unbound}))


def w_vm_take(pve_dir: str, vmid: int, pci_sysfs: str, run_dir: str,
              migrated_from: str | None = None) -> VmTake | None:
    """In a worker (/etc/pve is pmxcfs): what VM `vmid`'s start takes; None when it has no
    config where vm_start would read it."""
    pve = Path(pve_dir)
    try:
        text = config_file(pve, vmid, migrated_from).read_text(encoding="utf-8",
                                                               errors="replace")
    except OSError:
        return None
    node = vmdevices.node_name(os.uname().nodename)
    maps = vmdevices.parse_mappings(_read(pve / "mapping" / "pci.cfg"), node)
    lines = _lines(pveconf.parse_vm_config(text, vmid).lines, maps)
    root = Path(pci_sysfs) / "devices"
    choice = vmdevices.choose(lines, vmid, host_pci(root), reservations(Path(run_dir)))
    groups = {f: group_of(root, f) for f in choice.unbound}
    ends = vmdevices.group_endpoints(choice.unbound, groups)
    reps = sorted({g[0] if g else f for f, g in groups.items()}, key=sysfs_order)
    named = set(ends).union(f for t in choice.lines for f in t.functions)
    return VmTake({a: driver_of(root, a) for a in ends}, reps, choice.notes, choice.fails,
                  any(_read(root / str(a) / "vendor") == NVIDIA_VENDOR for a in named))
