"""Which Proxmox task runs a hook phase: a stop that kills the container, or a shutdown that
is the guest's own.

The hookscript gets only the VMID and the phase. Every caller of `PVE::LXC::vm_stop` runs in
a task that `PVE::RESTEnvironment::fork_worker` started, CLI calls included, and a worker
names itself `task UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:` ($0, seen in
/proc/PID/cmdline); `exec_hookscript` runs the script as that worker's child. The task type
says how vm_stop was called: `vm_stop($vmid, 1)` (kill) by vzstop, vzdestroy, vzrollback and
vzmtunnel; `vm_stop($vmid, 0, $timeout)` (lxc-stop --nokill: the guest shuts down, or the
task dies "container did not stop") by vzshutdown, vzreboot, vzmigrate, vzdump and
everything that goes through vm_shutdown (stopall, HA). The tenant cannot name these
processes: they are the host's, above the hook.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pveclean.host import procfs

KILLING = frozenset({"vzstop", "vzdestroy", "vzrollback", "vzmtunnel"})
MAX_DEPTH = 8  # ancestors looked at: the hook's shell, pveclean's own wrapper, the worker


@dataclass(frozen=True)
class Task:
    """A Proxmox task, from its UPID."""

    upid: str
    type: str
    id: str
    user: str

    @property
    def kills(self) -> bool:
        """Its vm_stop kills the container (no clean shutdown to wait for)."""
        return self.type in KILLING


def parse_upid(text: str) -> Task | None:
    """A task from a worker's title `task UPID:...` (PVE::UPID::decode's fields)."""
    if not text.startswith("task UPID:"):
        return None
    upid = text[5:].split(" ", 1)[0]
    fields = upid.split(":")
    if len(fields) < 9 or not fields[5]:
        return None
    return Task(upid, fields[5], fields[6], fields[7])


def running_task(pid: int | None = None) -> Task | None:
    """The Proxmox task among the ancestors of `pid` (this process by default), or None when
    none runs it (a manual `lxc-stop`, a test)."""
    pid = os.getppid() if pid is None else _parent(pid)
    for _ in range(MAX_DEPTH):
        if pid is None or pid <= 1:
            return None
        raw = procfs.read_bytes(procfs.path(pid, "cmdline"), 512)
        first = (raw or b"").split(b"\0", 1)[0].decode("utf-8", "replace")
        task = parse_upid(first)
        if task is not None:
            return task
        pid = _parent(pid)
    return None


def _parent(pid: int) -> int | None:
    st = procfs.read_status(pid)
    return st.ppid if st is not None else None
