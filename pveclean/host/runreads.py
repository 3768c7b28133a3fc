"""One run's reads, bounded by its deadline, in two workers that work at once: NVML's (forked
first thing, see prelude.py) and the scan's (/proc and cgroup reads; forked from the parent on
its first call, when the scan is imported). The transport is reads.Reader; the merges of what
the sources say are core/discovery's; here is the order they are asked in, and NVML's state
over one run (NvmlSession): what went wrong, whether it may be asked again, GPU memory when
discovery began, and the GPUs it could not answer for."""

from __future__ import annotations

from collections.abc import Callable

from pveclean.core import records
from pveclean.core.discovery import merge_nvml, nvml_source, only_gpus
from pveclean.core.gpufaults import GpuWatch, config_minors, with_faults
from pveclean.core.gpunodes import gpu_minors
from pveclean.core.records import (
    Deadline,
    GpuMemory,
    Holder,
    HostView,
    NvmlProcesses,
    Scope,
    Source,
)
from pveclean.host import worker
from pveclean.host.nvml import gpu_memory, gpu_processes, w_memory, w_processes
from pveclean.host.procscan import w_nvml_pids, w_rescan, w_scan
from pveclean.host.reads import Reader, Unread
from pveclean.host.worker import WorkerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from pveclean.core.stopping import Rejection

    T = TypeVar("T")

MEMORY, PROCESSES = "NVML memory query", "NVML process query"  # what each is called
Answer = tuple[list[Holder], list[tuple[int, str | None, str | None]]]  # w_nvml_pids'


class NvmlSession:
    """NVML over one run, asked in its worker: `error` says what went wrong (the first
    error an answer carried, or the query that did not answer); once NVML hung or took no
    request it is asked nothing more (an answer that carried an error leaves the others to
    be judged on their own)."""

    def __init__(self, wk: worker.Worker, deadline: Deadline, stall: float, on: bool,
                 timeout: float) -> None:
        self.reader = Reader(wk, stall, [], "", min_wait=0.05)
        self.deadline, self.on, self.timeout = deadline, on, timeout
        self.error: str | None = None if on else "disabled"
        self._gone = not on

    def send(self, fn: Callable[..., object], end: float, what: str) -> bool:
        """Ask NVML's worker and go on; False when NVML is off or hung before."""
        if self._gone:
            return False
        try:
            self.reader.send(fn, self.deadline.cap(self.timeout), end=end, what=what,
                             skipping=False)
        except Unread as unread:
            self.error = f"{what} did not answer: {unread.exc}"
            self._gone = True
            return False
        return True

    def receive(self, what: str) -> Any:
        """The answer of send(); None when NVML failed or hung (then asked no more)."""
        if self._gone:  # hung since it was asked: not waited for
            self.reader.forget()
            return None
        try:
            value, err = self.reader.receive()
        except Unread as unread:
            self._gone = True
            if isinstance(unread.exc, WorkerError):  # hung: stalled, did not finish in time
                self.error = f"{what} did not answer ({unread.exc.why}; its reader was killed)"
            else:
                self.error = str(unread)
            return None
        if err:
            self.error = self.error or err
        return value

    def memory(self) -> list[GpuMemory] | None:
        """The answer of send(w_memory, ...)."""
        rows = self.receive(MEMORY)
        return None if rows is None else gpu_memory(rows)

    def processes(self, asked: bool = True) -> NvmlProcesses | None:
        """The answer of send(w_processes, ...), when `asked`."""
        rows = self.receive(PROCESSES) if asked else None
        return None if rows is None else gpu_processes(rows)


class Reads:
    """The parent's side of every read of one run (see the module's docstring). The host scan
    runs while NVML lists its processes. A PID whose reads stall is skipped (and named in
    `problems`); a scan that does not finish by the deadline ends as `None`."""

    def __init__(self, nvml_worker: worker.Worker, deadline: Deadline, stall: float,
                 nvml_on: bool, nvml_timeout: float, scan: worker.Worker | None = None
                 ) -> None:
        self.nvml_worker = nvml_worker
        self.worker = scan or worker.Worker()  # the scan's; forked on its first call
        self._own_scan = scan is None
        self.deadline, self.stall = deadline, stall
        self.problems: list[str] = []
        self.scan = Reader(self.worker, stall, self.problems, "not scanned, not signalled")
        self.nvml = NvmlSession(nvml_worker, deadline, stall, nvml_on, nvml_timeout)
        self.before: list[GpuMemory] | None = None  # GPU memory when discovery began
        self.gpus: GpuWatch | None = None  # GPUs NVML could not answer for (see host())
        # one line per GPU that may be the container's and NVML could not answer for: its
        # memory is not judged (the verdict `not-judged`, never `clean`; issue 38)
        self.unjudged: list[str] = []

    @property
    def nvml_error(self) -> str | None:
        return self.nvml.error

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

    def _scan(self, scope: Scope, end: float, what: str,
              quiet: dict[int, int] | None = None) -> HostView | str:
        """The host view, or why there is none (a problem is recorded); `quiet`: see
        procscan.scan_host."""
        try:
            view: HostView = (self.scan.call(w_scan, scope, end=end, what=what) if quiet is None
                              else self.scan.call(w_rescan, scope, quiet, end=end, what=what))
            self.problems += view.unjudged_problems()  # not judged is not innocent
            return view
        except Unread as unread:
            if not unread.hung:
                self.problems.append(str(unread))
                return "failed"
            self.problems.append(f"{what} did not finish within "
                                 f"{self.deadline.elapsed():.1f} s of the run: "
                                 f"{unread.doing}")
            return "did not finish"

    def identities(self, holders: list[Holder], scope: Scope, end: float
                   ) -> list[Rejection | None]:
        """pidfds.check_identities of `holders`: why each may not be signalled, or None; a
        PID whose reads hang is not signalled."""
        from pveclean.core.stopping import NotProven, Rejection
        from pveclean.host import pidfds  # a stop only: a run that stops nothing needs neither
        try:
            out: list[Rejection | None] = self.scan.call(
                pidfds.check_identities, holders, scope.vmid, scope.devices, scope.running,
                end=end, what="identity check")
            return out
        except Unread as unread:
            if not unread.hung:
                self.problems.append(str(unread))
                return [Rejection(NotProven.UNCHECKED, f"identity check failed ({unread.exc}); "
                                  "not signalled")] * len(holders)
            self.problems.append(f"identity check did not finish before the deadline: "
                                 f"{unread.doing}")
            return [Rejection(NotProven.UNCHECKED, "identity check did not finish before the "
                              "deadline; not signalled")] * len(holders)

    def host(self, scope: Scope, end: float, scan_end: float | None = None,
             hold: Callable[[], None] | None = None
             ) -> tuple[HostView | None, list[records.OtherUser], Source, list[Holder]]:
        """(host view with NVML merged, other GPU users, NVML status, holders NVML alone
        names). NVML's memory (kept in `before`) and process lists are read first, then
        `hold()` (the freezer) and the scan: the container is frozen while its tree is read,
        never while NVML is waited for. The scan ends by `scan_end` (default `end`); when it
        does not finish, NVML's list is still used: each NVML process whose own cgroup is in
        the container's tree is a holder (the fourth item), proven and stopped as any other."""
        memory_asked = self.nvml.send(w_memory, end, MEMORY)
        asked = self.nvml.send(w_processes, end, PROCESSES)
        if memory_asked:
            self.before = self.nvml.memory()
        procs = only_gpus(self.nvml.processes(asked), scope)
        if hold is not None:
            hold()
        view = self._scan(scope, end if scan_end is None else scan_end, "host scan")
        failed = view if isinstance(view, str) else None
        status = nvml_source(procs is not None, self.nvml.on, self.nvml.error, failed)
        if isinstance(view, str):
            if procs is None:
                return None, [], status, []
            alone = HostView({}, {}, {}, None)
            others = merge_nvml(alone, procs, self._nvml_reader(scope, end))
            return None, others, status, sorted(alone.holders.values(),
                                                key=lambda h: h.host_pid)
        if procs is None:
            return view, [], status, []
        # each GPU judged on its own: one NVML could not answer for is marked, and a problem
        # when it may be the container's
        held = {m for pid in view.holders for m in gpu_minors(view.rdevs.get(pid, ()),
                                                              scope.devices)}
        self.gpus = GpuWatch(config_minors(scope.probe_patterns), held)
        self.unjudged += self.gpus.note(self.before, procs.faults)
        if self.before is not None and procs.faults:
            self.before = with_faults(self.before, procs.faults)
        return view, merge_nvml(view, procs, self._nvml_reader(scope, end)), status, []

    def _nvml_reader(self, scope: Scope, end: float
                     ) -> Callable[[list[tuple[records.ProcStatus, str]], list[int]], Answer]:
        """merge_nvml's `read`: w_nvml_pids in the scan's worker."""

        def read(found: list[tuple[records.ProcStatus, str]], unseen: list[int]) -> Answer:
            got = self.call(w_nvml_pids, found, unseen, scope, end=end,
                            what="reading NVML's processes")
            return got if isinstance(got, tuple) else ([], [])

        return read

    def rescan(self, scope: Scope, known: set[int], end: float,
               quiet: dict[int, int] | None = None, scanned: bool = True,
               hold: Callable[[], None] | None = None
               ) -> tuple[HostView, set[int]] | None:
        """The container's holders now, and the NVML processes that are ours: NVML's
        processes whose own cgroup is in the tree are holders too. `quiet`: processes known
        to hold nothing, whose fds and maps are not read again (procscan.scan_host).
        `scanned` False: discovery's scan did not finish, so none is tried again: only NVML
        is looked at (the verdict stays residual with the scan's problem). `hold()` (the
        freezer) comes after NVML's answer, before the scan, as in host()."""
        asked = self.nvml.send(w_processes, end, PROCESSES)
        procs = only_gpus(self.nvml.processes(asked), scope)
        if hold is not None:
            hold()
        view: HostView | str = HostView({}, {}, {}, None)
        if scanned:
            view = self._scan(scope, end, "verification scan", quiet)
        if isinstance(view, str):
            return None
        if procs is not None and procs.by_pid:
            merge_nvml(view, procs, self._nvml_reader(scope, end))
        # A PID of ours that NVML still lists has not released its memory yet.
        listed = procs.by_pid if procs is not None else {}
        nvml_pids = {p for p in listed if p in view.statuses or p in known
                     or p in view.holders}
        return view, nvml_pids

    def memory(self, end: float) -> list[GpuMemory] | None:
        """GPU memory now (after a run: a GPU lost since `before` is a problem of the run
        when it may be the container's)."""
        gpus = self.nvml.memory() if self.nvml.send(w_memory, end, MEMORY) else None
        if self.gpus is not None:
            self.unjudged += self.gpus.note(gpus, {})
        return gpus

    def processes(self, end: float) -> NvmlProcesses | None:
        """NVML's processes now (the post-stop leak check)."""
        return self.nvml.processes(self.nvml.send(w_processes, end, PROCESSES))

    def call(self, fn: Callable[..., T], *args: object, end: float, what: str) -> T | None:
        """Any other read (each PID noted without a bound of its own: nothing to skip); None
        when it gave no answer (why goes to `problems`)."""
        try:
            return self.scan.call(fn, *args, end=end, what=what, skipping=False)
        except Unread as unread:
            self.problems.append(f"{what} did not finish: {unread.doing}" if unread.hung
                                 else str(unread))
            return None
