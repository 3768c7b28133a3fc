"""Whose a process is, from its cgroup path: the one parser of the paths LXC and Proxmox lay
out (`/lxc/<vmid>/...` a Proxmox container's, `/lxc.monitor/<vmid>` its monitor on the host,
`/lxc.payload.<name>` a plain LXC container's), as the kernel writes them in /proc/PID/cgroup."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class OwnerKind(StrEnum):
    CT = "ct"  # a Proxmox container (its VMID known)
    HOST = "host"  # the host's own cgroups, plain LXC containers' included
    UNKNOWN = "unknown"  # no cgroup could be read: cannot be told, so never innocent


class Layout(StrEnum):
    """Which of LXC's cgroup trees a path lies in."""

    PVE = "lxc"  # /lxc/<vmid>/...: Proxmox's containers
    MONITOR = "lxc.monitor"  # /lxc.monitor/<vmid>: the host's lxc-start monitor
    PAYLOAD = "lxc.payload"  # /lxc.payload.<name>: plain LXC's default
    NONE = ""  # the host's own


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


_PLACE = re.compile(r"/(?:(lxc|lxc\.monitor)/|(lxc\.payload)\.)([0-9]+)(?:/|$)")


def place(cgroup: str) -> Place:
    """The tree of a cgroup path and its number: `/lxc/129/ns/init.scope` -> (PVE, 129)."""
    m = _PLACE.match(cgroup)
    if m is None:
        return Place(Layout.NONE)
    return Place(Layout(m.group(1) or m.group(2)), int(m.group(3)))


def owner_of(cgroup: str | None) -> Owner:
    """The owner of a process whose cgroup path is `cgroup` (None: it could not be read)."""
    return UNKNOWN if cgroup is None else place(cgroup).owner


def in_tree(cgroup: str | None, vmid: int) -> bool:
    """Whether `cgroup` is container `vmid`'s cgroup or below it (the exact path: `/lxc/0129`
    is no container's)."""
    own = f"/{Layout.PVE}/{vmid}"
    return cgroup is not None and (cgroup == own or cgroup.startswith(f"{own}/"))


def ct_path(vmid: int, rel: str = ".") -> str:
    """The cgroup path of container `vmid`'s cgroup `rel` (relative to the container's own:
    "." is its own, "ns/init.scope" one below), as the kernel writes it."""
    return f"/{Layout.PVE}/{vmid}/{rel}".rstrip("/.").replace("/./", "/")


def rel_path(cgroup: str | None, vmid: int) -> str | None:
    """`cgroup` relative to container `vmid`'s own ("." for its own), None outside it."""
    if cgroup is None or not in_tree(cgroup, vmid):
        return None
    return cgroup[len(f"/{Layout.PVE}/{vmid}") + 1:] or "."


def is_ct_dir(name: str) -> bool:
    """Whether a directory `name` in LXC's lxc/ cgroup is a Proxmox container's (a VMID)."""
    return place(f"/{Layout.PVE}/{name}").layout is Layout.PVE
