"""Discovery: which processes of one container hold GPU devices or GPU memory.

Three sources, each recorded on the holders it saw: the host view (the container's cgroup
tree, then /proc/PID/fd and /proc/PID/maps), the in-namespace probe (`pct exec`), and NVML.
Only the container's own processes are read, so the cost does not grow with the host.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from pveclean.core import records
from pveclean.core.cgpaths import ct_path
from pveclean.core.records import Holder, HostView, NvmlProcesses, Scope

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.config import Config
    from pveclean.proxmox import probe


def protected_name(comm: str, exe: str | None, argv: tuple[str, ...],
                   protect: frozenset[str]) -> str | None:
    """The protected name this process carries. comm is cut to 15 characters by the kernel
    ("nvidia-persiste"), so the executable's and argv[0]'s base names count too. Only for
    host processes: a container's root chooses its processes' names (see protect_reason)."""
    cut = comm.encode("utf-8", "surrogateescape")
    for name in protect:
        if comm == name or cut == name.encode("utf-8", "surrogatepass")[:15]:
            return name
    for path in (exe, argv[0] if argv else None):
        if path and posixpath.basename(path.removesuffix(" (deleted)")) in protect:
            return posixpath.basename(path.removesuffix(" (deleted)"))
    return None


def protect_reason(st: records.ProcStatus, scope: Scope, exe: str | None,
                   argv: tuple[str, ...]) -> str | None:
    if st.refused:  # identifies nothing: never signalled, and the verdict says so
        return f"not identified: {st.refused}"
    if len(st.nspid) < 2:
        name = protected_name(st.name, exe, argv, scope.protect)
        return "in the host's PID namespace" + (f", protected name '{name}'" if name else "")
    if scope.running and st.nspid[1] == 1:
        return "the container's PID 1"
    # `protect` never exempts a container's process: its name, exe path and argv[0] are
    # whatever the container's root chose (`exec -a nvidia-persistenced`). docs/security.md
    return None


def stall_for(cfg: Config) -> float:
    """How long the /proc reads of one process may take before it counts as hung."""
    return max(0.2, min(1.0, cfg.deadline_seconds * 0.1))


def unwalked(reason: str, scope: Scope) -> Holder:
    """Stands for the part of the cgroup tree that was not walked: never signalled, it keeps
    the verdict at `residual` and carries the reason into the report."""
    return Holder(host_pid=0, starttime=0, ct_pid=None, name="(cgroups not walked)", exe=None,
                  argv=(), uid=0, user="-", state="?", ppid=0,
                  cgroup=ct_path(scope.vmid), protected=f"not looked at: {reason}")


def merge_probe(view: HostView, result: probe.ProbeResult, scope: Scope,
                make: Callable[[list[tuple[records.ProcStatus, str]]], list[Holder]]
                ) -> tuple[list[str], list[Holder]]:
    """Map container PIDs to host PIDs through NSpid and cross-check with the host view.
    Returns warnings and the holders only the probe saw (`make` builds them: in the worker).
    The container's PID 1 is never taken from the probe (its output is the tenant's)."""
    warnings: list[str] = []
    by_ct_pid = {st.nspid[1]: pid for pid, st in view.statuses.items() if len(st.nspid) >= 2}
    new: list[tuple[records.ProcStatus, str]] = []
    paths_of: dict[int, list[records.DeviceUse]] = {}
    unknown = [p for p in sorted(result.holders) if p not in by_ct_pid]
    if unknown:  # one line, however many the probe invents
        warnings.append(
            f"probe named {len(unknown)} container PID(s) that no process of the container's "
            f"cgroup tree has (exited, or outside the tree): "
            f"{', '.join(map(str, unknown[:10]))}{' ...' if len(unknown) > 10 else ''}"
        )
    for ct_pid, paths in sorted(result.holders.items()):
        host_pid = by_ct_pid.get(ct_pid)
        if host_pid is None:
            continue
        if ct_pid == 1:  # the tenant's shell answers for the probe: it cannot make a holder
            warnings.append(
                "probe named the container's PID 1 as a GPU holder; ignored: the container's "
                "PID 1 is never signalled, and whether it holds a GPU is the host view's and "
                "NVML's to say")
            continue
        h = view.holders.get(host_pid)
        if h is None:
            st = view.statuses[host_pid]
            new.append((st, view.tree.get(host_pid, ".")))
            paths_of[host_pid] = [records.DeviceUse.named(p) for p in paths]
            warnings.append(
                f"probe found PID {host_pid} ({st.name}) holding {', '.join(paths)[:300]} "
                "that the host view did not match"
            )
            continue
        h.add_source("probe")
    built = make(new)
    for h in built:
        h.devices = paths_of.get(h.host_pid, [])
        h.add_source("probe")
        view.holders[h.host_pid] = h
    return warnings, built


def only_gpus(procs: NvmlProcesses | None, scope: Scope) -> NvmlProcesses | None:
    """NVML's processes with memory on the scope's GPUs, when it names some (a VM's hand-off),
    and those GPUs' faults."""
    keep = scope.gpu_indices
    if procs is None or keep is None:
        return procs
    return NvmlProcesses(
        {pid: {i: m for i, m in per.items() if i in keep}
         for pid, per in procs.by_pid.items() if any(i in keep for i in per)},
        {i: f for i, f in procs.faults.items() if i in keep})


def nvml_source(answered: bool, on: bool, error: str | None, scan_failed: str | None
                ) -> records.Source:
    """The report's `nvml` source: ok, disabled, or unavailable and why; not asked when the
    host scan failed (`scan_failed`: how) before NVML was asked at all."""
    state = records.SourceState
    if answered:
        return records.Source(state.OK)
    if not on:
        return records.Source(state.DISABLED)
    if scan_failed is not None and not error:
        return records.Source(state.NOT_RUN, f"not asked: the host scan {scan_failed}")
    return records.Source(state.UNAVAILABLE, f"unavailable: {error}")


def merge_nvml(view: HostView, procs: NvmlProcesses,
               read: Callable[[list[tuple[records.ProcStatus, str]], list[int]],
                              tuple[list[Holder], list[tuple[int, str | None, str | None]]]]
               ) -> list[records.OtherUser]:
    """Attach NVML memory to the container's holders; return GPU users outside it. `read`
    makes holders of the container's other NVML processes, those the walk saw and those it
    did not whose own cgroup is in the container's tree (membership is the process's own
    /proc/PID/cgroup, not the walk), and names the GPU users outside it (w_nvml_pids: /proc
    reads, in the scan's worker); asked only when there are any."""
    found: list[tuple[records.ProcStatus, str]] = []
    unseen: list[int] = []
    by_pid = procs.by_pid
    for pid, per_gpu in sorted(by_pid.items()):
        h = view.holders.get(pid)
        if h is not None:
            h.gpu_memory_mib.update(per_gpu)
            h.add_source("nvml")
        elif pid in view.statuses:
            found.append((view.statuses[pid], view.tree.get(pid, ".")))
        else:
            unseen.append(pid)
    if not found and not unseen:
        return []
    built, named = read(found, unseen)
    for h in built:
        h.gpu_memory_mib.update(by_pid[h.host_pid])
        h.add_source("nvml")
        view.holders[h.host_pid] = h
    return [records.OtherUser(pid, name, cgroup, {int(k): v for k, v in by_pid[pid].items()})
            for pid, name, cgroup in named]


def stall_problem(pid: int, stall: float, consequence: str) -> str:
    return (f"PID {pid}: reading its /proc files did not finish within {stall:.1f} s (a file "
            f"on a hung FUSE/NFS mount, or a process stuck in a driver call); {consequence}")


def doing(note: object) -> str:
    if isinstance(note, tuple) and note[0] == "pid":
        return f"it was reading /proc/{note[1]}"
    if isinstance(note, tuple) and note[0] == "nvml":
        return f"it was waiting for the NVML {note[1]}"
    return "it was starting"
