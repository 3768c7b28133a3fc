"""The cgroup v1 freezer, on hosts that still mount it beside cgroup v2 (hybrid): a task
frozen there does not even die of SIGKILL until it is thawed, so a tenant that freezes its
own holder in the container's v1 freezer cgroup made it survive every run. What is frozen in
the container's own v1 tree (`/lxc/<vmid>/...`, the same layout as v2) is thawed before its
tasks are signalled, and said; a v1 cgroup outside the container's tree (the host's, an
admin's) is never touched."""

from __future__ import annotations

import os
from collections.abc import Iterable

from pveclean.core.cgpaths import ct_path, in_tree
from pveclean.host import cgroupfs, procfs

STATE, SELF = "freezer.state", "freezer.self_freezing"


def _freezer_path(pid: int) -> str | None:
    for _num, controllers, path in cgroupfs.read_cgroups(pid) or ():
        if "freezer" in controllers.split(","):
            return path
    return None


def _read(path: str) -> str:
    return (procfs.read_text(path, 64) or "").strip()


def thaw_in_tree(pids: Iterable[int], vmid: int, root: str | None = None) -> list[str]:
    """Thaw each v1 freezer cgroup in container `vmid`'s tree that freezes one of `pids`
    (itself or an ancestor below the container's level that froze itself); one line per
    cgroup thawed, or that could not be. Nothing where no v1 freezer is mounted."""
    root = root if root is not None else cgroupfs._mount_of("cgroup", "freezer")
    if root is None:
        return []
    top = ct_path(vmid)
    said: list[str] = []
    done: set[str] = set()
    for pid in pids:
        path = _freezer_path(pid)
        if path is None or not in_tree(path, vmid) or _read(f"{root}{path}/{STATE}") not in (
                "FROZEN", "FREEZING"):
            continue
        level = path
        while in_tree(level, vmid) and level not in done:
            done.add(level)
            if _read(f"{root}{level}/{SELF}") == "1":
                said.append(_thaw(f"{root}{level}", level, pid))
            if level == top:
                break
            level = os.path.dirname(level)
    return said


def _thaw(where: str, shown: str, pid: int) -> str:
    try:
        with open(f"{where}/{STATE}", "w", encoding="ascii") as fh:
            fh.write("THAWED")
    except OSError as exc:
        return (f"PID {pid} is frozen by the v1 freezer cgroup {shown[:200]} of the container; "
                f"thawing it failed ({exc.strerror}): SIGKILL waits for a thaw")
    return (f"PID {pid} was frozen by the v1 freezer cgroup {shown[:200]} of the container: "
            "thawed before it was signalled")
