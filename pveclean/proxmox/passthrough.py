"""GPUs passed to VMs: NVIDIA PCI devices not on the nvidia driver, and the VMs whose
`hostpci` lines (or PCI resource mappings) name them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from pveclean.core.gpumap import VfioGpu, VmName
from pveclean.core.pci import HostPci, PciAddress
from pveclean.core.vmdevices import node_name, parse_mappings
from pveclean.proxmox import pveconf

PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"


# ---- VMs: GPUs bound to vfio-pci ----------------------------------------------------------
def _pci_ids(text: str) -> list[PciAddress]:
    """Each id of a hostpci `host` value: `01:00` means every function of 0000:01:00
    (qemu-server's PCIRE); text that is no address is passed."""
    return [a for a in map(PciAddress.parse, text.split(";")) if a is not None]


def this_node() -> str:
    """This machine's Proxmox node name (PVE::INotify::nodename: no domain)."""
    return node_name(os.uname().nodename)


def read_pci_mappings(path: Path, node: str) -> dict[str, list[tuple[PciAddress, ...]]]:
    """Resource mappings (/etc/pve/mapping/pci.cfg) on `node`, read as the VM hand-off reads
    them (vmdevices.parse_mappings: a `map` PVE::Mapping::PCI skips passes nothing here
    either); a file that cannot be read: none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return parse_mappings(text, node)


def hostpci_ids(lines: list[tuple[str, str]],
                mappings: dict[str, list[tuple[PciAddress, ...]]]) -> list[PciAddress]:
    """Each id a VM config's hostpciN lines name, by address or through a resource mapping
    (a whole device: its `function` None)."""
    out: list[PciAddress] = []
    for k, v in lines:
        if not re.fullmatch(r"hostpci\d+", k):
            continue
        opts = v.split(",")
        host = next((o for o in opts if "=" not in o), None)
        kv = dict(o.split("=", 1) for o in opts if "=" in o)
        out += _pci_ids(host or kv.get("host", ""))
        for alternative in mappings.get(kv.get("mapping", ""), []):
            out += alternative
    return out


def vm_passthrough(qemu_dir: Path, mappings: dict[str, list[tuple[PciAddress, ...]]]
                   ) -> list[HostPci]:
    """Each id of every hostpci line of every VM."""
    out: list[HostPci] = []
    for conf in _configs(qemu_dir, pveconf.parse_vm_config):
        name = conf.get("name") or ""
        out += [HostPci(conf.vmid, name, a) for a in hostpci_ids(conf.lines, mappings)]
    return out


def _configs(directory: Path, parse: Callable[[str, int], pveconf.CtConfig]
             ) -> Iterator[pveconf.CtConfig]:
    """Each `<vmid>.conf` of a guest directory, parsed; one that cannot be read is passed."""
    try:
        files = sorted(p for p in directory.glob("*.conf") if p.stem.isdigit())
    except OSError:
        return
    for path in files:
        try:
            yield parse(path.read_text(encoding="utf-8", errors="replace"), int(path.stem))
        except (OSError, ValueError):
            continue


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def vfio_gpus(pci_root: Path, qemu_dir: Path, mapping_file: Path) -> list[VfioGpu]:
    """NVIDIA display devices not driven by the nvidia driver: bound to vfio-pci (passed to
    a VM), another driver, or none. NVML does not see them."""
    out: list[VfioGpu] = []
    try:
        devs = sorted(pci_root.iterdir())
    except OSError:
        return out
    refs = None
    for d in devs:
        if _read(d / "vendor") != NVIDIA_VENDOR or not _read(d / "class").startswith("0x03"):
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(d / "driver"))
        except OSError:
            driver = None
        if driver == "nvidia":
            continue
        if refs is None:
            refs = vm_passthrough(qemu_dir, read_pci_mappings(mapping_file, this_node()))
        addr = PciAddress.parse(d.name)
        if addr is None:
            continue
        vms = sorted({(r.vmid, r.name) for r in refs if r.address.covers(addr)})
        out.append(VfioGpu(addr, f"10de:{_read(d / 'device')[2:]}", driver,
                           tuple(VmName(v, n) for v, n in vms)))
    return out


# ---- one VM's start ------------------------------------------------------------------------
def w_keeping(ct_dir: str, minors: dict[int, PciAddress]) -> dict[int, list[PciAddress]]:
    """In a worker: container -> the addresses among `minors` (GPU minor -> PCI address) that
    its config grants (a grant of every GPU counts for each); its next start takes them."""
    out: dict[int, list[PciAddress]] = {}
    for conf in _configs(Path(ct_dir), pveconf.parse_config):
        g = conf.gpu()
        hit = [a for m, a in sorted(minors.items())
               if g.any and (g.minors is None or g.allow_all or m in g.minors)]
        if hit:
            out[conf.vmid] = hit
    return out
