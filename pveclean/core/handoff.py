"""A VM's record of the IOMMU groups its pre-start handed to vfio-pci (vm_gpu_rebind), so
that they come back to their drivers however the VM ends. Pure: the state file is read and
written by commands/vmhook.py.

qemu-server never gives a GPU back, runs no post-stop when a start fails after pre-start, and
may run post-stop late (`qm cleanup` forked by qmeventd), when another VM may already start
with the group. So:
- one record per IOMMU group, merged with what is there (merge): each function keeps the
  oldest driver that was not vfio-pci; a later start that finds the group on vfio-pci never
  overwrites it;
- a give-back leaves, and keeps in the record, a group that another VM has reserved or whose
  /dev/vfio/<group> is open (split);
- a group that could not be given back stays in the record, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VFIO = "vfio-pci"


@dataclass(frozen=True)
class GroupHandoff:
    """One IOMMU group handed to vfio-pci: a function of it (`address`) and each endpoint's
    driver before (None: none), in the order they were moved."""

    address: str
    before: tuple[tuple[str, str | None], ...]

    @property
    def functions(self) -> list[str]:
        return [f for f, _ in self.before]

    @classmethod
    def of(cls, item: object) -> GroupHandoff | None:
        """A record file's item (pcibind.Handoff.as_dict()); None when it is not one."""
        if not isinstance(item, dict):
            return None
        addr, before = item.get("pci_bus_id"), item.get("drivers_before")
        if not isinstance(addr, str) or not isinstance(before, dict):
            return None
        return cls(addr, tuple((str(f), None if d is None else str(d))
                               for f, d in before.items()))

    def as_dict(self) -> dict[str, object]:
        return {"pci_bus_id": self.address, "drivers_before": dict(self.before)}


def merge(old: list[GroupHandoff], new: list[GroupHandoff]) -> list[GroupHandoff]:
    """The record after a hand-off: groups already recorded keep their entry, each function
    its oldest non-vfio driver (a later start found it on vfio-pci already); a new group is
    added. Two groups sharing a function are one."""
    out: list[GroupHandoff] = []
    for g in old + new:
        i = next((k for k, o in enumerate(out) if set(o.functions) & set(g.functions)), None)
        if i is None:
            out.append(g)
            continue
        have = dict(out[i].before)
        for fn, drv in g.before:
            if fn not in have or (have[fn] in (None, VFIO) and drv not in (None, VFIO)):
                have[fn] = drv
        out[i] = GroupHandoff(out[i].address, tuple(have.items()))
    return out


def split(records: list[GroupHandoff], busy: Mapping[str, str]
          ) -> tuple[list[GroupHandoff], list[tuple[GroupHandoff, str]]]:
    """The groups to give back now, and those to keep (with why): a group is kept whole when
    any function of it is `busy` (function -> why: another VM's reservation, an open
    /dev/vfio group)."""
    give: list[GroupHandoff] = []
    keep: list[tuple[GroupHandoff, str]] = []
    for g in records:
        why = [f"{fn}: {busy[fn]}" for fn in g.functions if fn in busy]
        if why:
            keep.append((g, "; ".join(why)))
        else:
            give.append(g)
    return give, keep
