"""What a VM's hostpci lines really take at its start, as qemu-server decides it after the
pre-start hook (src/PVE/QemuServer/PCI.pm). Pure: sysfs, the reservations and the mapping
file are read by the adapters and come in as records.

- parse_hostpci: a `hostpciN` value (the property string `pve-qm-hostpci`, strict: a value
  qemu-server cannot parse passes nothing through, its start dies after pre-start);
- parse_mappings: /etc/pve/mapping/pci.cfg, only this node's `map` entries (PVE::Mapping::PCI
  get_node_mapping: a `map` without `node=`, `id=` or `path=` is invalid and skipped), each
  one alternative, in `map` order;
- choose: choose_hostpci_devices: a line with one alternative takes it; with several, the
  first whose ids no earlier line of the VM uses and no other VM has reserved (reserve_pci_usage
  refuses a live `time:` or `pid:` reservation of another VM);
- the kind (prepare_pci_device): `driver=keep` and an NVIDIA vGPU (`mdev=nvidia-NN` on a device
  with the driver's `nvidia` sysfs directory, kernel 6.8+) do nothing to the driver; `mdev=`
  creates a mediated device on a parent that stays on its driver (and is not reserved); only
  the rest is unbound, and then the whole IOMMU group (pci_dev_group_bind_to_vfio);
- node_name: PVE::INotify::nodename, the kernel host name up to its first dot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pveclean.core.lazyre import lazy
from pveclean.core.pci import PciAddress, sysfs_order

MAX_HOSTPCI = 16  # PCI.pm's $MAX_HOSTPCI_DEVICES
_PCIRE = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
_HOST = lazy(rf"{_PCIRE}(?:;{_PCIRE})*")
_MAP_PATH = lazy(r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?")
_KEYS = frozenset({"host", "mapping", "rombar", "romfile", "pcie", "x-vga", "legacy-igd",
                   "mdev", "vendor-id", "device-id", "sub-vendor-id", "sub-device-id",
                   "driver"})


def node_name(uname_node: str) -> str:
    """This machine's Proxmox node name (PVE::INotify::nodename: the host name before its
    first dot): what `map ... node=` and /etc/pve/nodes/<node> are matched against."""
    return uname_node.split(".", 1)[0]


class Kind(StrEnum):
    VFIO = "vfio"  # unbound from its driver, the whole IOMMU group to vfio-pci
    KEEP = "driver=keep"  # neither reset nor rebound: the admin's driver stays
    VGPU = "vgpu"  # NVIDIA vGPU on an SR-IOV function: the nvidia driver keeps it
    MDEV = "mdev"  # a mediated device on a parent that stays on its driver


@dataclass(frozen=True)
class HostPciLine:
    """One hostpciN line as PCI.pm's parse_hostpci reads it: its alternatives (each a list of
    ids as written: a whole device or functions), or the reason it passes nothing."""

    index: int
    alternatives: tuple[tuple[PciAddress, ...], ...] = ()
    mdev: str | None = None
    keep: bool = False
    error: str | None = None  # qemu-server's non-strict parse drops the line: passes nothing
    fatal: str | None = None  # parse_hostpci dies: the whole start fails after pre-start


def _props(value: str) -> dict[str, str] | str:
    """PVE::JSONSchema::parse_property_string for hostpci: `key=value` pairs, the first bare
    word `host`; a problem as a string."""
    out: dict[str, str] = {}
    for part in value.split(","):
        key, eq, val = part.partition("=")
        if not eq:
            key, val = "host", part
        if key not in _KEYS:
            return f"unknown property {key!r}"
        if key in out:
            return f"duplicate property {key!r}"
        out[key] = val
    return out


def parse_hostpci(index: int, value: str, mappings: Mapping[str, list[tuple[PciAddress, ...]]]
                  ) -> HostPciLine:
    """hostpci`index`'s value; `mappings`: this node's resource mappings (parse_mappings)."""
    props = _props(value.strip())
    if isinstance(props, str):
        return HostPciLine(index, error=props)
    if props.get("driver", "vfio") not in ("vfio", "keep"):
        return HostPciLine(index, error=f"driver {props['driver']!r} is neither vfio nor keep")
    host, mapping = props.get("host"), props.get("mapping")
    if host is not None and not _HOST.fullmatch(host):
        return HostPciLine(index, error=f"{host!r} is no PCI id")
    if host is not None and mapping is not None:
        return HostPciLine(index, fatal="Cannot set both 'host' and 'mapping'.")
    if mapping is not None:
        alts = tuple(mappings.get(mapping, ()))
        if not alts:
            return HostPciLine(index, fatal=f"PCI device mapping not found for '{mapping}'")
    elif host is not None:
        alts = (tuple(a for a in map(PciAddress.parse, host.split(";")) if a is not None),)
    else:
        return HostPciLine(index, fatal="Either 'host' or 'mapping' must be set.")
    return HostPciLine(index, alts, props.get("mdev"), props.get("driver") == "keep")


def parse_mappings(text: str, node: str) -> dict[str, list[tuple[PciAddress, ...]]]:
    """mapping/pci.cfg: each mapping's alternatives on `node`, in `map` order (a `map` with
    no `node=`, `id=` or a valid `path=` is invalid: PVE::Mapping::PCI skips it)."""
    out: dict[str, list[tuple[PciAddress, ...]]] = {}
    name = None
    for line in text.split("\n"):  # as PVE::SectionConfig splits
        if line and not line[0].isspace():
            name = line.strip()
            continue
        words = line.split(None, 1)
        if name is None or len(words) != 2 or words[0] != "map":
            continue
        props = dict(kv.split("=", 1) for kv in words[1].split(",") if "=" in kv)
        paths = props.get("path", "").lower().split(";")
        if (props.get("node") != node or "id" not in props
                or not all(_MAP_PATH.fullmatch(p) for p in paths)):
            continue
        out.setdefault(name, []).append(
            tuple(a for a in map(PciAddress.parse, paths) if a is not None))
    return out


@dataclass(frozen=True)
class Reservation:
    """A live entry of qemu-server's pci-id-reservations: its VM, and whether that VM is still
    starting (`time:`, the window open) or runs (`pid:` of that VM's running QEMU)."""

    vmid: int
    starting: bool = False


@dataclass(frozen=True)
class Taken:
    """What one hostpci line takes at the start: its kind, the functions (as sysfs lists them)
    of the chosen alternative, and what is uncertain or wrong about it."""

    index: int
    kind: Kind
    functions: tuple[PciAddress, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class Choice:
    """choose's answer: each line's Taken, the functions that will be unbound (VFIO lines
    only), and the lines that pass nothing (with why)."""

    lines: list[Taken] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    fails: str | None = None  # the start dies before any device is prepared: nothing taken

    @property
    def unbound(self) -> list[PciAddress]:
        if self.fails is not None:
            return []
        seen = {f for t in self.lines if t.kind is Kind.VFIO for f in t.functions}
        return sorted(seen, key=sysfs_order)

    @property
    def notes(self) -> list[str]:
        return [f"hostpci{t.index}: {n}" for t in self.lines for n in t.notes] + self.dropped


@dataclass(frozen=True)
class Host:
    """What sysfs says, for choose: every PCI function there is, and those with the nvidia
    driver's vGPU directory (`<dev>/nvidia`)."""

    functions: tuple[PciAddress, ...]
    vgpu_capable: frozenset[PciAddress] = frozenset()

    def expand(self, ids: tuple[PciAddress, ...]) -> tuple[PciAddress, ...]:
        """SysFSTools::lspci for each id: a whole device is each of its functions."""
        return tuple(f for i in ids for f in sorted(self.functions, key=sysfs_order)
                     if i.covers(f))


def _kind(line: HostPciLine, first: PciAddress | None, host: Host) -> Kind:
    if line.mdev is not None and first in host.vgpu_capable and re.fullmatch(
            r"nvidia-\d+", line.mdev):
        return Kind.VGPU
    if line.mdev is not None:
        return Kind.MDEV
    return Kind.KEEP if line.keep else Kind.VFIO


def _free(ids: tuple[PciAddress, ...], vmid: int, used: set[PciAddress],
          reservations: Mapping[PciAddress, Reservation]) -> tuple[bool, str | None]:
    """Whether choose_hostpci_devices may take this alternative, and a note when another VM's
    start in progress holds it (that start may still fail: the choice is then uncertain)."""
    if used.intersection(ids):
        return False, None
    for f in ids:
        r = reservations.get(f, reservations.get(f.whole_device))
        if r is not None and r.vmid != vmid:
            why = "being started" if r.starting else "running"
            return False, (f"{f} is reserved by VM {r.vmid} ({why})"
                           + (": if that start fails first, qemu-server takes it instead"
                              if r.starting else ""))
    return True, None


def _choose_line(line: HostPciLine, vmid: int, host: Host, used: set[PciAddress],
                 reservations: Mapping[PciAddress, Reservation]) -> Taken | str:
    """One line's Taken, or (a str) why the start dies there."""
    for alt in line.alternatives:
        for i in alt:
            if not host.expand((i,)):
                return f"no PCI device found for '{i}'"
    alts = [host.expand(a) for a in line.alternatives]
    if line.mdev is not None and any(len(a) > 1 for a in alts):
        return "cannot use mediated device with multifunction device"
    kind = _kind(line, alts[0][0], host)
    if kind is Kind.MDEV:  # chosen later, at the mdev's creation; never reserved
        return Taken(line.index, kind, tuple(a[0] for a in alts))
    if len(alts) == 1:
        if used.intersection(alts[0]):
            return f"device '{min(used.intersection(alts[0]), key=sysfs_order)}' assigned " \
                   "more than once"
        used.update(alts[0])
        return Taken(line.index, kind, alts[0])
    notes: list[str] = []
    for alt in alts:
        ok, note = _free(alt, vmid, used, reservations)
        if note:
            notes.append(note)
        if ok:
            used.update(alt)
            return Taken(line.index, kind, alt, tuple(notes))
    return f"could not find a free device for 'hostpci{line.index}'"


def choose(lines: list[HostPciLine], vmid: int, host: Host,
           reservations: Mapping[PciAddress, Reservation]) -> Choice:
    """What VM `vmid`'s hostpci lines take if it starts now (choose_hostpci_devices, in
    hostpci order)."""
    out = Choice()
    used: set[PciAddress] = set()
    for line in sorted(lines, key=lambda x: x.index):
        if line.error is not None:
            out.dropped.append(f"hostpci{line.index}: qemu-server drops it "
                               f"({line.error}): passes nothing")
            continue
        got = line.fatal or _choose_line(line, vmid, host, used, reservations)
        if isinstance(got, str):
            out.fails = out.fails or f"hostpci{line.index}: {got}"
        else:
            out.lines.append(got)
            if got.kind is not Kind.VFIO:
                out.dropped.append(f"hostpci{got.index}: {got.kind}: the driver keeps "
                                   f"{', '.join(map(str, got.functions))}; not guarded")
    return out


def group_endpoints(functions: list[PciAddress],
                    groups: Mapping[PciAddress, tuple[PciAddress, ...]]) -> list[PciAddress]:
    """Every endpoint of the IOMMU groups of `functions` (`groups`: a function -> its group's
    endpoints, bridges aside): what pci_dev_group_bind_to_vfio unbinds."""
    seen = {e for f in functions for e in groups.get(f, (f,))}
    return sorted(seen, key=sysfs_order)
