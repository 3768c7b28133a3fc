"""A PCI address as a record: parsed once where the outside writes it (a VM's hostpci line,
qemu-server's reservations, a sysfs device name, NVML's bus id), compared as numbers after.

The forms read: sysfs' `0000:01:00.0` (a domain of 4 digits, or every digit of a wider one:
Intel VMD's `10000:01:00.0`), NVML's `00000000:01:00.0` (the domain padded to 8), and
hostpci's (qemu-server's PCIRE) `01:00.0` or a whole device `01:00` (every function of it),
each with or without its domain (0 when left out)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pveclean.core.lazyre import lazy

_ADDRESS = lazy(r"(?:([0-9a-f]{4,}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-9a-f]))?")


@dataclass(frozen=True)
class PciAddress:
    """One PCI function (`function` set), or a whole device (`function` None: each of its
    functions, as hostpci's `01:00` names them)."""

    domain: int
    bus: int
    device: int
    function: int | None = None

    @classmethod
    def parse(cls, text: str) -> PciAddress | None:
        """The address in sysfs', NVML's or hostpci's text (any case, blanks around it);
        None when the text is no PCI address."""
        m = _ADDRESS.fullmatch(text.strip().lower())
        if not m:
            return None
        dom, bus, dev, fn = m.groups()
        return cls(int(dom or "0", 16), int(bus, 16), int(dev, 16),
                   None if fn is None else int(fn, 16))

    @property
    def whole_device(self) -> PciAddress:
        """The device this address is a function of (itself when it names the whole one)."""
        return replace(self, function=None)

    def same_device(self, other: PciAddress) -> bool:
        return self.whole_device == other.whole_device

    def covers(self, other: PciAddress) -> bool:
        """Whether `other` is this address, or a function of the whole device it names."""
        return self == other if self.function is not None else self.same_device(other)

    def __str__(self) -> str:
        """As sysfs names it (`0000:01:00.0`; a whole device `0000:01:00`)."""
        dev = f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"
        return dev if self.function is None else f"{dev}.{self.function:x}"

    @property
    def nvml(self) -> str:
        """As NVML and dcgm-exporter write it: `00000000:01:00.0`."""
        fn = "" if self.function is None else f".{self.function:x}"
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}{fn}"


def sysfs_order(address: PciAddress) -> str:
    """The sort key that lists addresses as their sysfs names sort."""
    return str(address)


@dataclass(frozen=True)
class HostPci:
    """One id of a VM config's hostpciN line (by address or through a resource mapping)."""

    vmid: int
    name: str  # the VM's
    address: PciAddress
