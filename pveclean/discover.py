"""Discovery: which processes of one container hold GPU devices or GPU memory.

Three sources, each recorded on the holders it saw: the host view (the container's cgroup
tree, then /proc/PID/fd and /proc/PID/maps), the in-namespace probe (`pct exec`), and NVML.
Only the container's own processes are read, so the cost does not grow with the host.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import probe, procfs
from .model import Discovery, GpuDevices, Holder
from .nvml import Nvml, NvmlUnavailable
from .pct import PctMissing, start_pct, wait_pct


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def cap(self, timeout: float) -> float:
        """`timeout`, cut to what is left of the run (never zero: one last short try)."""
        return min(timeout, max(self.remaining(), 0.05))


@dataclass
class Scope:
    """Everything discovery needs to know about the target."""

    vmid: int
    cgroup_dir: Path
    devices: GpuDevices
    protect: frozenset[str]
    probe_patterns: list[str] = field(default_factory=list)
    running: bool = True


def protected_name(comm: str, exe: str | None, cmdline: str,
                   protect: frozenset[str]) -> str | None:
    """The protected name this process carries. comm is cut to 15 characters by the kernel
    ("nvidia-persiste"), so the executable's and argv[0]'s base names count too. Only for
    host processes: a container's root chooses its processes' names (see _protect_reason)."""
    for name in protect:
        if comm == name or comm == name[:15]:
            return name
    argv0 = cmdline.split(" ", 1)[0]
    for path in (exe, argv0):
        if path and os.path.basename(path.removesuffix(" (deleted)")) in protect:
            return os.path.basename(path.removesuffix(" (deleted)"))
    return None


def _protect_reason(st: procfs.ProcStatus, scope: Scope, exe: str | None,
                    cmdline: str) -> str | None:
    if len(st.nspid) < 2:
        name = protected_name(st.name, exe, cmdline, scope.protect)
        return "in the host's PID namespace" + (f", protected name '{name}'" if name else "")
    if scope.running and st.nspid[1] == 1:
        return "the container's PID 1"
    # `protect` never exempts a container's process: its name, exe path and argv[0] are
    # whatever the container's root chose (`exec -a nvidia-persistenced`). docs/security.md
    return None


def make_holder(st: procfs.ProcStatus, rel_cgroup: str, scope: Scope) -> Holder:
    exe, cmdline = procfs.exe(st.pid), procfs.cmdline(st.pid)
    return Holder(
        host_pid=st.pid,
        starttime=st.starttime,
        ct_pid=st.nspid[1] if len(st.nspid) >= 2 else None,
        name=st.name,
        exe=exe,
        cmdline=cmdline,
        uid=st.uid,
        user=procfs.user_name(st.uid),
        state=st.state,
        ppid=st.ppid,
        cgroup=f"/lxc/{scope.vmid}/{rel_cgroup}".rstrip("/.").replace("/./", "/"),
        protected=_protect_reason(st, scope, exe, cmdline),
    )


@dataclass
class HostView:
    holders: dict[int, Holder]
    statuses: dict[int, procfs.ProcStatus]
    tree: dict[int, str]
    init_pid: int | None


def scan_host(scope: Scope) -> HostView:
    tree = procfs.tree_pids(scope.cgroup_dir)
    holders: dict[int, Holder] = {}
    statuses: dict[int, procfs.ProcStatus] = {}
    init_pid = None
    cache = procfs.ScanCache()
    for pid, rel in tree.items():
        st = procfs.read_status(pid)
        if st is None:
            continue  # exited while we looked
        statuses[pid] = st
        if scope.running and len(st.nspid) >= 2 and st.nspid[1] == 1:
            init_pid = pid
        if st.state == "Z" and not procfs.live_threads(pid):
            continue  # a zombie holds nothing: its fds and mappings are gone
        # (a zombie leader with live threads holds through them: device_fds reads those)
        fds = procfs.device_fds(pid, scope.devices, cache)
        if fds is None:
            continue
        maps = procfs.device_maps(pid, scope.devices, cache)
        if fds or maps:
            h = make_holder(st, rel, scope)
            h.devices = fds + maps
            h.add_source("host")
            holders[pid] = h
    truncated = getattr(tree, "truncated", None)
    if truncated:
        holders[0] = unwalked(str(truncated), scope)
    return HostView(holders, statuses, tree, init_pid)


def unwalked(reason: str, scope: Scope) -> Holder:
    """Stands for the part of the cgroup tree that was not walked: never signalled, it keeps
    the verdict at `residual` and carries the reason into the report."""
    return Holder(host_pid=0, starttime=0, ct_pid=None, name="(cgroups not walked)", exe=None,
                  cmdline="", uid=0, user="-", state="?", ppid=0,
                  cgroup=f"/lxc/{scope.vmid}", protected=f"not looked at: {reason}")


def start_probe(scope: Scope, pct_command: str) -> subprocess.Popen[bytes]:
    """Start the in-namespace view; it runs while the host view and NVML are read."""
    try:
        return start_pct(pct_command, probe.probe_argv(scope.vmid, scope.probe_patterns))
    except PctMissing as exc:
        raise RuntimeError(str(exc)) from None


def finish_probe(proc: subprocess.Popen[bytes], timeout: float) -> probe.ProbeResult:
    """The probe's result; raises RuntimeError with the reason when it did not work."""
    res = wait_pct(proc, timeout)
    if res.over_limit:
        raise RuntimeError(f"probe output over its limit ({res.over_limit}); ignored")
    if res.returncode is None:
        raise RuntimeError(f"pct exec did not finish within {timeout:.1f} s (frozen container?)")
    parsed = probe.parse_probe(res.stdout)
    if parsed.over_limit:
        raise RuntimeError(f"probe output over its limit ({parsed.over_limit}); ignored")
    if parsed.missing:
        raise RuntimeError(f"the container has no '{parsed.missing}' on pct exec's PATH; "
                           "the probe cannot look")
    if not res.ok or not parsed.complete:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise RuntimeError(f"pct exec failed (exit {res.returncode}): {why}")
    return parsed


def merge_probe(view: HostView, result: probe.ProbeResult, scope: Scope) -> list[str]:
    """Map container PIDs to host PIDs through NSpid and cross-check with the host view."""
    warnings: list[str] = []
    by_ct_pid = {st.nspid[1]: pid for pid, st in view.statuses.items() if len(st.nspid) >= 2}
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
        h = view.holders.get(host_pid)
        if h is None:
            st = view.statuses[host_pid]
            h = make_holder(st, view.tree.get(host_pid, "."), scope)
            h.devices = list(paths)
            view.holders[host_pid] = h
            warnings.append(
                f"probe found PID {host_pid} ({st.name}) holding {', '.join(paths)[:300]} that the "
                "host view did not match"
            )
        h.add_source("probe")
    return warnings


def merge_nvml(
    view: HostView, procs: dict[int, dict[int, int | None]], scope: Scope
) -> list[dict[str, object]]:
    """Attach NVML memory to the container's holders; return GPU users outside it."""
    others: list[dict[str, object]] = []
    for pid, per_gpu in sorted(procs.items()):
        h = view.holders.get(pid)
        if h is None and pid in view.statuses:
            st = view.statuses[pid]
            if st.state == "Z" and not procfs.live_threads(pid):
                continue  # an exited process: NVML lists it until the driver lets go
            h = make_holder(st, view.tree.get(pid, "."), scope)
            view.holders[pid] = h
        if h is not None:
            h.gpu_memory_mib.update(per_gpu)
            h.add_source("nvml")
            continue
        st2 = procfs.read_status(pid)
        others.append(
            {
                "host_pid": pid,
                "name": st2.name if st2 else None,
                "cgroup": procfs.pid_cgroup(pid),
                "gpu_memory_mib": {int(k): v for k, v in per_gpu.items()},
            }
        )
    return others


def discover(
    scope: Scope,
    nvml: Nvml | None,
    pct_command: str | None,
    deadline: Deadline,
    probe_timeout: float = 10.0,
) -> Discovery:
    sources = {"host": "ok"}
    warnings: list[str] = []
    running = scope.running
    probing: subprocess.Popen[bytes] | None = None
    if pct_command is None:
        sources["probe"] = "disabled in config"
    elif not running:
        sources["probe"] = "container not running"
    else:
        try:
            probing = start_probe(scope, pct_command)
        except RuntimeError as exc:
            sources["probe"] = f"failed: {exc}"
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    view = scan_host(scope)
    others: list[dict[str, object]] = []
    if nvml is None:
        sources["nvml"] = "disabled"
    else:
        try:
            procs = nvml.processes(timeout=deadline.cap(nvml.timeout))
            others = merge_nvml(view, procs, scope)
            sources["nvml"] = "ok"
        except NvmlUnavailable as exc:
            sources["nvml"] = f"unavailable: {exc}"
    if probing is not None:
        timeout = min(probe_timeout, max(deadline.remaining() * 0.3, 0.05))
        try:
            warnings += merge_probe(view, finish_probe(probing, timeout), scope)
            sources["probe"] = "ok"
        except RuntimeError as exc:
            sources["probe"] = f"failed: {exc}"
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    holders = sorted(view.holders.values(), key=lambda h: h.host_pid)
    return Discovery(holders, running, view.init_pid, len(view.tree), sources, warnings, others)
