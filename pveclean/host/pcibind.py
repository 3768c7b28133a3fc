"""Handing a GPU's whole IOMMU group from its driver (nvidia, snd_hda_intel for the audio
function) to vfio-pci through sysfs, and back: each step verified through the device's
`driver` link, and what was done undone, last first, when a later step fails.

The kernel's way (Documentation/ABI/testing/sysfs-bus-pci): `driver_override` names the one
driver that may bind the device, `driver/unbind` lets it go, `drivers_probe` binds it again,
now to the override. qemu-server binds to vfio-pci by `new_id` at the VM's start
(pve-common's SysFSTools::pci_dev_bind_to_vfio), which then finds the group bound already;
it never gives a GPU back to nvidia after the VM stops. An unbind of a GPU something still
holds blocks in the driver: callers run this in a worker bounded by the run's deadline.
Every sysfs write goes through Sysfs.write, so tests lay out a sysfs root and play the
kernel's part there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

VFIO = "vfio-pci"


class BindError(Exception):
    """A step failed; the message says which, in one line."""


class Sysfs:
    """/sys/bus/pci, or a root the tests lay out."""

    def __init__(self, root: str | Path = "/sys/bus/pci") -> None:
        self.root = Path(root)

    def dev(self, addr: str) -> Path:
        return self.root / "devices" / addr

    def write(self, path: Path, text: str) -> None:
        try:
            with open(path, "w", encoding="ascii") as fh:
                fh.write(text)
        except OSError as exc:
            raise BindError(f"writing {text.strip() or 'nothing'!r} to {path}: "
                            f"{exc.strerror or exc}") from None

    def driver(self, addr: str) -> str | None:
        try:
            return os.path.basename(os.readlink(self.dev(addr) / "driver"))
        except OSError:
            return None

    def group(self, addr: str) -> list[str]:
        """The functions of `addr`'s IOMMU group that are endpoints (a bridge or root port,
        which has a pci_bus directory, is never bound: as SysFSTools does)."""
        try:
            names = sorted(os.listdir(self.dev(addr) / "iommu_group" / "devices"))
        except OSError as exc:
            raise BindError(f"{addr}: no IOMMU group ({exc.strerror}): is the IOMMU on?"
                            ) from None
        return [n for n in names if not (self.dev(n) / "pci_bus").exists()]


@dataclass
class Handoff:
    """What bind_group did: each function's driver before, in order (None: none)."""

    address: str
    before: dict[str, str | None] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"pci_bus_id": self.address, "drivers_before": dict(self.before),
                "steps": list(self.steps)}


def _to_vfio(fs: Sysfs, fn: str, steps: list[str]) -> None:
    now = fs.driver(fn)
    fs.write(fs.dev(fn) / "driver_override", f"{VFIO}\n")
    steps.append(f"{fn}: driver_override {VFIO}")
    if now is not None and now != VFIO:
        fs.write(fs.dev(fn) / "driver" / "unbind", fn)
        steps.append(f"{fn}: unbound from {now}")
    if fs.driver(fn) is None:
        fs.write(fs.root / "drivers_probe", fn)
        steps.append(f"{fn}: probed")
    got = fs.driver(fn)
    if got != VFIO:
        raise BindError(f"{fn}: bound to {got or 'no driver'}, not {VFIO}")


def _restore(fs: Sysfs, fn: str, was: str | None, steps: list[str]) -> None:
    """`fn` back on driver `was` (None: none), its override cleared."""
    fs.write(fs.dev(fn) / "driver_override", "\n")
    steps.append(f"{fn}: driver_override cleared")
    now = fs.driver(fn)
    if now == was:
        return
    if now is not None:
        fs.write(fs.dev(fn) / "driver" / "unbind", fn)
        steps.append(f"{fn}: unbound from {now}")
    if was is not None:
        fs.write(fs.root / "drivers" / was / "bind", fn)
        steps.append(f"{fn}: bound to {was}")
    got = fs.driver(fn)
    if got != was:
        raise BindError(f"{fn}: on {got or 'no driver'}, not {was or 'none'}")


def bind_group(fs: Sysfs, addr: str) -> Handoff:
    """Every endpoint of `addr`'s IOMMU group to vfio-pci. On a failure what was moved is
    given back (give_back) and BindError says what failed (and what could not be undone)."""
    h = Handoff(addr)
    for fn in fs.group(addr):
        h.before[fn] = fs.driver(fn)
    done: list[str] = []
    try:
        for fn in h.before:
            done.append(fn)
            _to_vfio(fs, fn, h.steps)
    except BindError as exc:
        undo = Handoff(addr, {f: h.before[f] for f in done})
        left = give_back(fs, undo)
        extra = f"; undoing it failed too: {'; '.join(left)}" if left else "; undone"
        raise BindError(f"{exc}{extra}") from None
    return h


def give_back(fs: Sysfs, h: Handoff) -> list[str]:
    """Each function back to the driver it had (last first); returns what failed, one line
    each (empty: all back)."""
    failed = []
    for fn, was in reversed(list(h.before.items())):
        try:
            _restore(fs, fn, was, h.steps)
        except BindError as exc:
            failed.append(str(exc))
    return failed


def w_bind(fs: Sysfs, addr: str) -> Handoff | str:
    """bind_group in a worker: a BindError comes back as its line."""
    try:
        return bind_group(fs, addr)
    except BindError as exc:
        return str(exc)


def w_give_back(fs: Sysfs, h: Handoff) -> list[str]:
    return give_back(fs, h)
