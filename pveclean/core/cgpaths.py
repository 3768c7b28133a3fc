"""Container cgroup paths as the kernel writes them in /proc/PID/cgroup: LXC's trees, whether a
path is a container's (in_tree), and a container's paths (ct_path, rel_path). Whose a path is
(an Owner) is core/owners.py's: a run's scan needs the paths only, and each record costs every
hook run its import."""

from __future__ import annotations

from enum import StrEnum


class Layout(StrEnum):
    """Which of LXC's cgroup trees a path lies in."""

    PVE = "lxc"  # /lxc/<vmid>/...: Proxmox's containers
    MONITOR = "lxc.monitor"  # /lxc.monitor/<vmid>: the host's lxc-start monitor
    PAYLOAD = "lxc.payload"  # /lxc.payload.<name>: plain LXC's default
    NONE = ""  # the host's own


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
