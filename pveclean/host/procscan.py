"""The host view of one container: its cgroup tree's processes and the GPU nodes each holds,
read in the scan's worker (the w_* functions run there)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial

from pveclean.core import records
from pveclean.core.bounds import ReadBudget, bound_holder, cap_devices, cut_device
from pveclean.core.cgpaths import ct_path, in_tree, rel_path
from pveclean.core.discovery import protect_reason, unwalked
from pveclean.core.records import GpuDevices, Holder, HostView, Scope
from pveclean.core.units import unit_of
from pveclean.host import cgroupfs, devnodes, procfs, worker


def make_holder(st: records.ProcStatus, rel_cgroup: str, scope: Scope) -> Holder:

    exe, argv = procfs.exe(st.pid), procfs.argv(st.pid)
    cgroup = ct_path(scope.vmid, rel_cgroup)
    now = cgroupfs.pid_cgroup(st.pid)  # fresher than the walk: a new process moves, then execs
    if in_tree(now, scope.vmid) and now is not None:
        cgroup = now
    return bound_holder(Holder(  # its strings cut where read: 2,000 holders stay small
        host_pid=st.pid,
        starttime=st.starttime,
        ct_pid=st.nspid[1] if len(st.nspid) >= 2 else None,
        name=st.name,
        exe=exe,
        argv=argv,
        uid=st.uid,
        user=procfs.user_name(st.uid),
        state=st.state,
        ppid=st.ppid,
        cgroup=cgroup,
        protected=protect_reason(st, scope, exe, argv),
        unit=unit_of(cgroup),
    ))


def judge_each(pids: Iterable[int], devices: GpuDevices, skip: frozenset[int],
               announce: Callable[[int], devnodes.Progress],
               admit: Callable[[int], bool] | None = None, tenant: bool = True
               ) -> Iterator[tuple[int, devnodes.Judged]]:
    """The one per-process loop of both scans, a container's tree (scan_host) and the host's
    processes (hostscan.w_host_share): each PID not in `skip` (its reads hung in an earlier
    try) is announced to the worker before its /proc files are read, so a read that hangs is
    pinned to it (`announce` returns the progress call for long tables), let through
    `admit`, and its GPU nodes judged. Yields (PID, what it holds and could not judge)."""
    cache = devnodes.ScanCache(tenant)  # tenant False: the host's own (ScanCache.tenant)
    for pid in pids:
        if pid in skip:
            continue
        progress = announce(pid)
        if admit is not None and not admit(pid):
            continue
        got = devnodes.judge(pid, devices, cache, progress)
        if got is not None:
            yield pid, got


class _Tree:
    """What scan_host reads of each process of a container's tree before its fds and maps:
    its status (kept for the view), whether it is the container's init, and whether it is
    to be judged at all (see admit)."""

    def __init__(self, scope: Scope, quiet: dict[int, int] | None,
                 stall: float | None) -> None:
        self.scope, self.quiet, self.stall = scope, quiet, stall
        self.statuses: dict[int, records.ProcStatus] = {}
        self.init_pid: int | None = None
        self.unjudged: dict[int, list[str]] = {}
        # (PID, start time) -> why: a process past a cap and holding nothing in what was
        # read, kept for the worker's later scans of this run (a tenant's bloat costs the
        # run once)
        self.capped: dict[tuple[int, int], list[str]] = worker.state().setdefault("capped", {})

    def announce(self, pid: int) -> devnodes.Progress:
        worker.note(("pid", pid), self.stall)
        return partial(worker.note, ("pid", pid), self.stall)

    def admit(self, pid: int) -> bool:
        st = procfs.read_status(pid)
        if st is None:
            return False  # exited while we looked
        self.statuses[pid] = st
        if self.scope.running and len(st.nspid) >= 2 and st.nspid[1] == 1:
            self.init_pid = pid
        if self.quiet is not None and self.quiet.get(pid) == st.starttime:
            return False
        if st.state == "Z" and not procfs.live_threads(pid):
            return False  # a zombie holds nothing: its fds and mappings are gone
        # (a zombie leader with live threads holds through them: judge_fds reads those)
        if (pid, st.starttime) in self.capped:  # not read again: see scan_host
            self.unjudged[pid] = self.capped[pid, st.starttime]
            return False
        return True


def scan_host(scope: Scope, skip: frozenset[int] = frozenset(),
              stall: float | None = None, quiet: dict[int, int] | None = None) -> HostView:
    """The host view. In the worker, each PID is announced before its /proc files are read,
    so a read that hangs (FUSE, NFS, a wedged driver) is pinned to its PID (see worker.py).
    `quiet`: PID -> start time of processes known to hold nothing (a verification look): their
    fds and maps are not read again while the PID is the same process."""
    tree = cgroupfs.tree_pids(scope.cgroup_dir)
    holders: dict[int, Holder] = {}
    rdevs: dict[int, frozenset[int]] = {}
    look = _Tree(scope, quiet, stall)
    budget = ReadBudget()  # past a few MB of strings, each holder's are cut short
    for pid, got in judge_each(tree, scope.devices, skip, look.announce, look.admit):
        st = look.statuses[pid]
        if got.unjudged:
            look.unjudged[pid] = got.unjudged
        if got.capped and not got.held:  # a verification rescan of this run reads it no
            look.capped[pid, st.starttime] = got.unjudged  # more: it keeps the run residual
        if got.held:
            h = make_holder(st, tree[pid], scope)
            h.devices, h.devices_more = cap_devices(got.held)  # each device kept; bounded
            h.devices = [cut_device(d) for d in h.devices]  # each label cut where read
            h = budget.keep(h)
            h.add_source("host")
            holders[pid] = h
            rdevs[pid] = frozenset(got.rdevs)
    truncated = getattr(tree, "truncated", None)
    if truncated:
        holders[0] = unwalked(str(truncated), scope)
    return HostView(holders, look.statuses, tree, look.init_pid, look.unjudged, rdevs)


# ---- reads made in the scan's worker (see worker.py); module-level so they pickle --------
def w_scan(scope: Scope, skip: frozenset[int], stall: float) -> HostView:
    return scan_host(scope, skip, stall)


def w_rescan(scope: Scope, quiet: dict[int, int] | None, skip: frozenset[int], stall: float
             ) -> HostView:
    return scan_host(scope, skip, stall, quiet)


def w_nvml_pids(found: list[tuple[records.ProcStatus, str]], unseen: list[int], scope: Scope
                ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
    """merge_nvml's reads: holders of the container's processes NVML lists (a zombie is left
    out: NVML lists an exited process until the driver lets go), and the name and cgroup of
    each GPU user outside the container. An NVML process the walk did not see belongs to the
    container when its own cgroup says so (one hopping from cgroup to cgroup, one started
    after the walk): it is a holder like the others."""
    built = []
    for st, rel in found:
        worker.note(("pid", st.pid), None)
        if st.state == "Z" and not procfs.live_threads(st.pid):
            continue
        built.append(make_holder(st, rel, scope))
    named: list[tuple[int, str | None, str | None]] = []
    for pid in unseen:
        worker.note(("pid", pid), None)
        cg = cgroupfs.pid_cgroup(pid)
        st2 = procfs.read_status(pid)
        below = rel_path(cg, scope.vmid)
        if st2 is not None and below is not None:
            if st2.state != "Z" or procfs.live_threads(pid):
                built.append(make_holder(st2, below, scope))
            continue  # a zombie of the container holds nothing: neither ours nor another's
        named.append((pid, st2.name if st2 else None, cg))
    return built, named


def w_make_holders(found: list[tuple[records.ProcStatus, str]], scope: Scope) -> list[Holder]:
    out = []
    for st, rel in found:
        worker.note(("pid", st.pid), None)
        out.append(make_holder(st, rel, scope))
    return out


def w_parents(ppids: list[int]) -> dict[int, str]:
    out = {}
    for ppid in ppids:
        worker.note(("pid", ppid), None)
        st = procfs.read_status(ppid)
        if st:
            out[ppid] = f"{st.name} (host PID {ppid})"
    return out
