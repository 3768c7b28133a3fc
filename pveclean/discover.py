"""Discovery: which processes of one container hold GPU devices or GPU memory.

Three sources, each recorded on the holders it saw: the host view (the container's cgroup
tree, then /proc/PID/fd and /proc/PID/maps), the in-namespace probe (`pct exec`), and NVML.
Only the container's own processes are read, so the cost does not grow with the host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import procfs, worker
from .model import Discovery, GpuDevices, GpuMemory, Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any

    from . import probe
    from .config import Config
    from .pct import PctReader


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
    from .units import unit_of  # here: a run that finds no holder needs none of units.py

    exe, cmdline = procfs.exe(st.pid), procfs.cmdline(st.pid)
    cgroup = f"/lxc/{scope.vmid}/{rel_cgroup}".rstrip("/.").replace("/./", "/")
    now = procfs.pid_cgroup(st.pid)  # fresher than the walk: a new process moves, then execs
    if procfs.in_tree(now, scope.vmid) and now is not None:
        cgroup = now
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
        cgroup=cgroup,
        protected=_protect_reason(st, scope, exe, cmdline),
        unit=unit_of(cgroup),
    )


@dataclass
class HostView:
    holders: dict[int, Holder]
    statuses: dict[int, procfs.ProcStatus]
    tree: dict[int, str]
    init_pid: int | None


def stall_for(cfg: Config) -> float:
    """How long the /proc reads of one process may take before it counts as hung."""
    return max(0.2, min(1.0, cfg.deadline_seconds * 0.1))


def scan_host(scope: Scope, skip: frozenset[int] = frozenset(),
              stall: float | None = None) -> HostView:
    """The host view. In the worker, each PID is announced before its /proc files are read,
    so a read that hangs (FUSE, NFS, a wedged driver) is pinned to its PID (see worker.py)."""
    tree = procfs.tree_pids(scope.cgroup_dir)
    holders: dict[int, Holder] = {}
    statuses: dict[int, procfs.ProcStatus] = {}
    init_pid = None
    cache = procfs.ScanCache()
    for pid, rel in tree.items():
        if pid in skip:
            continue  # its reads hung in an earlier try
        worker.note(("pid", pid), stall)
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
    from . import probe  # here and in finish_probe: a run that starts no probe needs neither
    from .pct import PctMissing, start_pct

    try:
        return start_pct(pct_command, probe.probe_argv(scope.vmid, scope.probe_patterns))
    except PctMissing as exc:
        raise RuntimeError(str(exc)) from None


def finish_probe(proc: subprocess.Popen[bytes] | PctReader, timeout: float
                 ) -> probe.ProbeResult:
    """The probe's result; raises RuntimeError with the reason when it did not work."""
    from . import probe
    from .pct import PctReader, wait_pct

    if isinstance(proc, PctReader):
        proc.pump(timeout)
        res = proc.result(max(timeout, 0.5))  # its output is complete: it exits right after
    else:
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


def merge_probe(view: HostView, result: probe.ProbeResult, scope: Scope,
                make: Callable[[list[tuple[procfs.ProcStatus, str]]], list[Holder]] | None = None
                ) -> tuple[list[str], list[Holder]]:
    """Map container PIDs to host PIDs through NSpid and cross-check with the host view.
    Returns warnings and the holders only the probe saw (`make` builds them: in the worker)."""
    warnings: list[str] = []
    by_ct_pid = {st.nspid[1]: pid for pid, st in view.statuses.items() if len(st.nspid) >= 2}
    new: list[tuple[procfs.ProcStatus, str]] = []
    paths_of: dict[int, list[str]] = {}
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
            new.append((st, view.tree.get(host_pid, ".")))
            paths_of[host_pid] = list(paths)
            warnings.append(
                f"probe found PID {host_pid} ({st.name}) holding {', '.join(paths)[:300]} "
                "that the host view did not match"
            )
            continue
        h.add_source("probe")
    built = (make or (lambda found: [make_holder(st, rel, scope) for st, rel in found]))(new)
    for h in built:
        h.devices = paths_of.get(h.host_pid, [])
        h.add_source("probe")
        view.holders[h.host_pid] = h
    return warnings, built


def merge_nvml(view: HostView, procs: dict[int, dict[int, int | None]],
               read: Callable[[list[tuple[procfs.ProcStatus, str]], list[int]],
                              tuple[list[Holder], list[tuple[int, str | None, str | None]]]]
               ) -> list[dict[str, object]]:
    """Attach NVML memory to the container's holders; return GPU users outside it. `read`
    makes holders of the container's other NVML processes and names the GPU users outside it
    (w_nvml_pids: /proc reads, in the scan's worker); asked only when there are any."""
    found: list[tuple[procfs.ProcStatus, str]] = []
    outside: list[int] = []
    for pid, per_gpu in sorted(procs.items()):
        h = view.holders.get(pid)
        if h is not None:
            h.gpu_memory_mib.update(per_gpu)
            h.add_source("nvml")
        elif pid in view.statuses:
            found.append((view.statuses[pid], view.tree.get(pid, ".")))
        else:
            outside.append(pid)
    if not found and not outside:
        return []
    built, named = read(found, outside)
    for h in built:
        h.gpu_memory_mib.update(procs[h.host_pid])
        h.add_source("nvml")
        view.holders[h.host_pid] = h
    return [{"host_pid": pid, "name": name, "cgroup": cgroup,
             "gpu_memory_mib": {int(k): v for k, v in procs[pid].items()}}
            for pid, name, cgroup in named]


# ---- reads made in the scan's worker (see worker.py); module-level so they pickle --------
def w_scan(scope: Scope, skip: frozenset[int], stall: float) -> HostView:
    return scan_host(scope, skip, stall)


def w_nvml_pids(found: list[tuple[procfs.ProcStatus, str]], outside: list[int], scope: Scope
                ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
    """merge_nvml's reads: holders of the container's processes NVML lists (a zombie is left
    out: NVML lists an exited process until the driver lets go), and the name and cgroup of
    each GPU user outside the container."""
    built = []
    for st, rel in found:
        worker.note(("pid", st.pid), None)
        if st.state == "Z" and not procfs.live_threads(st.pid):
            continue
        built.append(make_holder(st, rel, scope))
    named: list[tuple[int, str | None, str | None]] = []
    for pid in outside:
        worker.note(("pid", pid), None)
        st2 = procfs.read_status(pid)
        named.append((pid, st2.name if st2 else None, procfs.pid_cgroup(pid)))
    return built, named


def w_make_holders(found: list[tuple[procfs.ProcStatus, str]], scope: Scope) -> list[Holder]:
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


def stalled_on(exc: worker.WorkerError) -> int | None:
    """The PID a worker's stall is pinned to (its last note or mark), or None: the deadline
    passed, or the worker died."""
    n = exc.note
    return int(n[1]) if exc.stalled and isinstance(n, tuple) and n[0] == "pid" else None


def stall_problem(pid: int, stall: float, consequence: str) -> str:
    return (f"PID {pid}: reading its /proc files did not finish within {stall:.1f} s (a file "
            f"on a hung FUSE/NFS mount, or a process stuck in a driver call); {consequence}")


class Reads:
    """The parent's side of every read, bounded by the run's deadline, in two workers that
    work at once: NVML's (forked first thing, see prelude.py) and the scan's (/proc and
    cgroup reads; forked from the parent on its first call, when the scan is imported). The
    host scan runs while NVML lists its processes. A PID whose reads stall is skipped (and
    named in `problems`); a scan that does not finish by the deadline ends as `None`."""

    def __init__(self, nvml_worker: worker.Worker, deadline: Deadline, stall: float,
                 nvml_on: bool, nvml_timeout: float, scan: worker.Worker | None = None
                 ) -> None:
        self.nvml_worker = nvml_worker
        self.worker = scan or worker.Worker()  # the scan's; forked on its first call
        self._own_scan = scan is None
        self.deadline, self.stall = deadline, stall
        self.nvml_on, self.nvml_timeout = nvml_on, nvml_timeout
        self.skip: set[int] = set()
        self.problems: list[str] = []
        self.nvml_error: str | None = None if nvml_on else "disabled"
        self.before: list[GpuMemory] | None = None  # GPU memory when discovery began

    def close(self) -> None:
        """Close the scan's worker if Reads forked it (the caller's workers are the caller's:
        NVML's always, the scan's when it passed one)."""
        if self._own_scan:
            self.worker.close()

    def __enter__(self) -> Reads:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def killed(self) -> list[str]:
        """Why each worker killed in this run was killed."""
        return self.nvml_worker.killed + self.worker.killed

    def _nvml_t(self) -> float:
        return self.deadline.cap(self.nvml_timeout)

    def stalled_pid(self, exc: worker.WorkerError) -> bool:
        """A stall on one PID: skip it from now on. Else (the deadline): False."""
        pid = stalled_on(exc)
        if pid is None:
            return False
        self.skip.add(pid)
        self.problems.append(stall_problem(pid, self.stall, "not scanned, not signalled"))
        return True

    def _scan(self, scope: Scope, end: float, what: str) -> HostView | str:
        """The host view, or why there is none (a problem is recorded)."""
        while True:
            try:
                view: HostView = self.worker.call(w_scan, scope, frozenset(self.skip),
                                                  self.stall, timeout=end - time.monotonic(),
                                                  what=what)
                return view
            except worker.WorkerError as exc:
                if self.stalled_pid(exc):
                    continue
                self.problems.append(f"{what} did not finish within "
                                     f"{self.deadline.elapsed():.1f} s of the run: "
                                     f"{doing(exc.note)}")
                return "did not finish"
            except worker.RemoteError as exc:  # a bug, not a hang: said, never a traceback
                self.problems.append(f"{what} failed: {exc}")
                return "failed"

    def _nvml_send(self, fn: Callable[..., Any], end: float, what: str) -> bool:
        """Ask NVML's worker and go on; False when NVML is off or failed before."""
        if self.nvml_error is not None:
            return False
        try:
            self.nvml_worker.send(fn, self._nvml_t(), timeout=end - time.monotonic(),
                                  what=what)
        except worker.WorkerError as exc:
            self.nvml_error = f"{what} did not answer: {exc}"
            return False
        return True

    def _nvml_receive(self, end: float, what: str) -> Any:
        """The answer of _nvml_send; None when NVML failed or hung (it is asked no more)."""
        if self.nvml_error is not None:  # failed since it was asked: not waited for
            self.nvml_worker.forget()
            return None
        try:
            value, err = self.nvml_worker.receive(max(end - time.monotonic(), 0.05), what)
        except worker.WorkerError as exc:  # "NVML ...: stalled", "...: did not finish in time"
            why = str(exc).removeprefix(f"{what}: ")
            self.nvml_error = f"{what} did not answer ({why}; its reader was killed)"
            return None
        except worker.RemoteError as exc:  # a bug, not a hang
            self.nvml_error = f"{what} failed: {exc}"
            return None
        if err:
            self.nvml_error = err
        return value

    def _nvml(self, fn: Callable[..., Any], end: float, what: str) -> Any:
        """One NVML query; once NVML failed or hung, none is asked again."""
        return self._nvml_receive(end, what) if self._nvml_send(fn, end, what) else None

    def host(self, scope: Scope, end: float
             ) -> tuple[HostView | None, list[dict[str, object]], str]:
        """(host view with NVML merged, other GPU users, NVML status). NVML's memory and
        process lists are asked first and read after the scan; the memory is kept in
        `before`."""
        from .nvml import gpu_memory, w_memory, w_processes

        memory_asked = self._nvml_send(w_memory, end, "NVML memory query")
        asked = self._nvml_send(w_processes, end, "NVML process query")
        view = self._scan(scope, end, "host scan")
        if memory_asked:
            rows = self._nvml_receive(end, "NVML memory query")
            self.before = None if rows is None else gpu_memory(rows)
        if isinstance(view, str):
            self.nvml_worker.forget()  # not needed now; the run asks it nothing more
            return None, [], (f"unavailable: {self.nvml_error}" if self.nvml_error
                              else f"not asked: the host scan {view}")
        procs = self._nvml_receive(end, "NVML process query") if asked else None
        if procs is None:
            return view, [], ("disabled" if not self.nvml_on
                              else f"unavailable: {self.nvml_error}")

        def read(found: list[tuple[procfs.ProcStatus, str]], outside: list[int]
                 ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
            got = self.call(w_nvml_pids, found, outside, scope, end=end,
                            what="reading NVML's processes")
            return got if isinstance(got, tuple) else ([], [])

        return view, merge_nvml(view, procs, read), "ok"

    def rescan(self, scope: Scope, known: set[int], end: float
               ) -> tuple[HostView, set[int]] | None:
        """The container's holders now, and the NVML processes that are ours."""
        from .nvml import w_processes

        asked = self._nvml_send(w_processes, end, "NVML process query")
        view = self._scan(scope, end, "verification scan")
        if isinstance(view, str):
            self.nvml_worker.forget()
            return None
        procs = self._nvml_receive(end, "NVML process query") if asked else None
        # A PID of ours that NVML still lists has not released its memory yet.
        nvml_pids = {p for p in procs or () if p in view.statuses or p in known}
        return view, nvml_pids

    def memory(self, end: float) -> list[GpuMemory] | None:
        from .nvml import gpu_memory, w_memory

        rows = self._nvml(w_memory, end, "NVML memory query")
        return None if rows is None else gpu_memory(rows)

    def processes(self, end: float) -> dict[int, dict[int, int | None]] | None:
        from .nvml import w_processes

        procs: dict[int, dict[int, int | None]] | None = self._nvml(
            w_processes, end, "NVML process query")
        return procs

    def call(self, fn: object, *args: object, end: float, what: str) -> object | None:
        """Any other read; None when it did not finish (the reason goes to `problems`)."""
        try:
            return self.worker.call(fn, *args, timeout=end - time.monotonic(),  # type: ignore
                                    what=what)
        except worker.WorkerError as exc:
            self.problems.append(f"{what} did not finish: {doing(exc.note)}")
            return None
        except worker.RemoteError as exc:
            self.problems.append(f"{what} failed: {exc}")
            return None


def doing(note: object) -> str:
    if isinstance(note, tuple) and note[0] == "pid":
        return f"it was reading /proc/{note[1]}"
    if isinstance(note, tuple) and note[0] == "nvml":
        return f"it was waiting for the NVML {note[1]}"
    return "it was starting"


def discover(
    scope: Scope,
    reads: Reads,
    pct_command: str | None,
    deadline: Deadline,
    end: float,
    no_probe: str = "disabled in config",
) -> Discovery:
    """Host view and NVML decide; the probe is started here and left running (the run
    merges it when it arrives, see run.py): it never holds up a stop or a verdict."""
    sources = {"host": "ok"}
    warnings: list[str] = []
    running = scope.running
    probing: PctReader | None = None
    if pct_command is None:
        sources["probe"] = no_probe
    elif not running:
        sources["probe"] = "container not running"
    else:
        from .pct import PctReader

        try:
            probing = PctReader(start_probe(scope, pct_command))
            sources["probe"] = "pending"
        except RuntimeError as exc:
            sources["probe"] = f"failed: {exc}"
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    view, others, nvml_status = reads.host(scope, end)
    sources["nvml"] = nvml_status
    if view is None:
        sources["host"] = "did not finish"
        return Discovery([], running, None, len(procfs.tree_pids(scope.cgroup_dir)), sources,
                         warnings, [], list(reads.problems), probing, scanned=False)
    holders = sorted(view.holders.values(), key=lambda h: h.host_pid)
    return Discovery(holders, running, view.init_pid, len(view.tree), sources, warnings, others,
                     list(reads.problems), probing, view=view)
