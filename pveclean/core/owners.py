"""Whose a process is, from its cgroup path: the one parser of the paths LXC and Proxmox lay
out (`/lxc/<vmid>/...` a Proxmox container's, `/lxc.monitor/<vmid>` its monitor on the host,
`/lxc.payload.<name>` a plain LXC container's), as the kernel writes them in /proc/PID/cgroup."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# the paths themselves (a run's scan needs no more): core/cgpaths.py
from pveclean.core.cgpaths import Layout as Layout
from pveclean.core.cgpaths import ct_path as ct_path
from pveclean.core.cgpaths import in_tree as in_tree
from pveclean.core.cgpaths import rel_path as rel_path
from pveclean.core.lazyre import lazy


class OwnerKind(StrEnum):
    CT = "ct"  # a Proxmox container (its VMID known)
    HOST = "host"  # the host's own cgroups, plain LXC containers' included
    UNKNOWN = "unknown"  # no cgroup could be read: cannot be told, so never innocent


@dataclass(frozen=True)
class Owner:
    """Whose a process is: a container (with its VMID), the host, or unknown."""

    kind: OwnerKind
    vmid: int | None = None  # CT only

    @property
    def label(self) -> str:
        """How every renderer names it: `CT 129`, `host`, `unknown`."""
        return f"CT {self.vmid}" if self.kind is OwnerKind.CT else str(self.kind)


HOST = Owner(OwnerKind.HOST)
UNKNOWN = Owner(OwnerKind.UNKNOWN)


@dataclass(frozen=True)
class Place:
    """Where a cgroup path lies: its tree and the number LXC named it by (a VMID for PVE)."""

    layout: Layout
    number: int | None = None

    @property
    def owner(self) -> Owner:
        if self.layout is Layout.PVE and self.number is not None:
            return Owner(OwnerKind.CT, self.number)
        return HOST


_PLACE = lazy(r"/(?:(lxc|lxc\.monitor)/|(lxc\.payload)\.)([0-9]+)(?:/|$)")


def place(cgroup: str) -> Place:
    """The tree of a cgroup path and its number: `/lxc/129/ns/init.scope` -> (PVE, 129)."""
    m = _PLACE.match(cgroup)
    if m is None:
        return Place(Layout.NONE)
    return Place(Layout(m.group(1) or m.group(2)), int(m.group(3)))


def owner_of(cgroup: str | None) -> Owner:
    """The owner of a process whose cgroup path is `cgroup` (None: it could not be read)."""
    return UNKNOWN if cgroup is None else place(cgroup).owner


def is_ct_dir(name: str) -> bool:
    """Whether a directory `name` in LXC's lxc/ cgroup is a Proxmox container's (a VMID)."""
    return place(f"/{Layout.PVE}/{name}").layout is Layout.PVE
