"""The parent's side of every read made in a forked worker, by one policy: a PID whose
reads stall is skipped, named, and the read asked again without it until its end; whatever
else keeps an answer away (the end, a dead worker, an exception there) is an Unread."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pveclean.core import records
from pveclean.core.discovery import doing, merge_nvml, stall_problem
from pveclean.core.gpufaults import GpuWatch, config_minors, with_faults
from pveclean.core.gpumap import nodes_of
from pveclean.core.records import (
    Deadline,
    GpuMemory,
    Holder,
    HostView,
    Scope,
)
from pveclean.host import pidfds, worker
from pveclean.host.nvml import gpu_memory, w_memory, w_processes
from pveclean.host.procscan import w_nvml_pids, w_rescan, w_scan
from pveclean.host.worker import RemoteError, WorkerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNBOUNDED_READ = 30.0  # s: a read's bound when the caller sets no end (tests, in-process use)


def _left(end: float | None) -> float:
    return UNBOUNDED_READ if end is None else max(end - time.monotonic(), 0.0)


def stalled_on(exc: WorkerError) -> int | None:
    """The PID a worker's stall is pinned to (its last note or mark), or None: the end
    passed, or the worker died."""
    n = exc.note
    return int(n[1]) if exc.stalled and isinstance(n, tuple) and n[0] == "pid" else None


class Unread(Exception):
    """A read that gave no answer: it `hung` (its end passed, the worker died or did not take
    the request: `doing` says what it was on), or it raised in the worker (a bug: said,
    never a traceback). str() is the problem as `gpus` names it."""

    def __init__(self, what: str, exc: WorkerError | RemoteError, resent: bool = False) -> None:
        self.what, self.exc = what, exc
        self.hung = isinstance(exc, WorkerError)
        self.doing = doing(exc.note) if isinstance(exc, WorkerError) else ""
        if not self.hung:
            message = f"{what} failed: {exc}"
        elif resent:  # asked again after a stall, and that could not be sent
            message = f"{what} did not finish in time"
        else:
            message = f"{exc} ({self.doing})"
        super().__init__(message)


@dataclass(frozen=True)
class _Asked:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    end: float | None
    what: str
    skipping: bool


class Reader:
    """Reads in one forked worker, by the one stall policy. A read asked with `skipping` gets
    the PIDs to skip and the stall bound as its last two arguments, fn(*args, skip, stall),
    and announces each PID before reading its files (worker.note or worker.mark). When the
    worker stalls on one PID past `stall` (a process wedged in the GPU driver blocks a read of
    its maps or cmdline; a hung FUSE or NFS mount), the PID joins `skip`, is named in
    `problems` with `consequence`, and the read is asked again without it, until its end
    (monotonic; None: UNBOUNDED_READ). Anything else that keeps the answer away raises Unread
    and loses the worker's other reads under way."""

    def __init__(self, wk: worker.Worker, stall: float, problems: list[str], consequence: str,
                 min_wait: float = 0.0) -> None:
        self.worker, self.stall, self.problems = wk, stall, problems
        self.consequence = consequence
        self.min_wait = min_wait  # s a receive() waits at least: an answer already there
        self.skip: set[int] = set()
        self._asked: list[_Asked] = []  # sent, not yet received; oldest first

    def send(self, fn: Callable[..., Any], *args: Any, end: float | None, what: str,
             skipping: bool = True) -> None:
        """Ask and go on (so that two workers work at once); receive() takes the answers,
        oldest first. Unread when the worker does not take the request."""
        asked = _Asked(fn, args, end, what, skipping)
        try:
            self._ask(asked)
        except WorkerError as exc:
            raise Unread(what, exc) from None
        self._asked.append(asked)

    def _ask(self, a: _Asked) -> None:
        extra = (frozenset(self.skip), self.stall) if a.skipping else ()
        self.worker.send(a.fn, *a.args, *extra, timeout=_left(a.end), what=a.what)

    def receive(self) -> Any:
        """The answer to the oldest send() not yet received, asked again without each PID that
        stalled; Unread when there is none by its end."""
        if not self._asked:
            raise RuntimeError("Reader.receive() without a send()")  # a bug of the caller
        a = self._asked[0]
        while True:
            try:
                value = self.worker.receive(max(_left(a.end), self.min_wait), a.what,
                                            stall=self.stall)
                self._asked.pop(0)
                return value
            except RemoteError as exc:  # the worker lives on: the others are still under way
                self._asked.pop(0)
                raise Unread(a.what, exc) from None
            except WorkerError as exc:  # the worker was killed: every read under way is lost
                pid = stalled_on(exc) if a.skipping else None
                if pid is None:
                    self._asked.clear()
                    raise Unread(a.what, exc) from None
                self.skip.add(pid)
                self.problems.append(stall_problem(pid, self.stall, self.consequence))
            try:
                for again in self._asked:
                    self._ask(again)
            except WorkerError as exc:
                self._asked.clear()
                raise Unread(a.what, exc, resent=True) from None

    def call(self, fn: Callable[..., Any], *args: Any, end: float | None, what: str,
             skipping: bool = True) -> Any:
        """send() and receive(): the answer, or Unread."""
        self.send(fn, *args, end=end, what=what, skipping=skipping)
        return self.receive()

    def forget(self) -> None:
        """Nobody will receive the reads under way: the worker reads past their answers."""
        self.worker.forget()
        self._asked.clear()

    def close(self) -> None:
        self.worker.close()


def only_gpus(procs: Any, scope: Scope) -> Any:
    """NVML's processes with memory on the scope's GPUs, when it names some (a VM's hand-off);
    the list's faults are kept."""
    if procs is None or scope.gpu_indices is None:
        return procs
    kept = type(procs)()
    kept.update({pid: {i: m for i, m in per.items() if i in scope.gpu_indices}
                 for pid, per in procs.items() if any(i in scope.gpu_indices for i in per)})
    if hasattr(procs, "faults"):
        kept.faults = {i: f for i, f in procs.faults.items() if i in scope.gpu_indices}
    return kept


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
        self.problems: list[str] = []
        self.scan = Reader(self.worker, stall, self.problems, "not scanned, not signalled")
        self.nvml = Reader(nvml_worker, stall, [], "", min_wait=0.05)
        self.nvml_error: str | None = None if nvml_on else "disabled"
        # NVML hung or took no request: asked nothing more (an answer that carried an error
        # leaves the others to be judged on their own)
        self._nvml_gone = not nvml_on
        self.before: list[GpuMemory] | None = None  # GPU memory when discovery began
        self.gpus: GpuWatch | None = None  # GPUs NVML could not answer for (see host())

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
                   ) -> list[str | None]:
        """pidfds.check_identities of `holders`: why each may not be signalled, or None; a
        PID whose reads hang is not signalled."""
        try:
            out: list[str | None] = self.scan.call(
                pidfds.check_identities, holders, scope.vmid, scope.devices, scope.running,
                end=end, what="identity check")
            return out
        except Unread as unread:
            if not unread.hung:
                self.problems.append(str(unread))
                return [f"identity check failed ({unread.exc}); not signalled"] * len(holders)
            self.problems.append(f"identity check did not finish before the deadline: "
                                 f"{unread.doing}")
            return ["identity check did not finish before the deadline; not signalled"
                    ] * len(holders)

    def _nvml_send(self, fn: Callable[..., Any], end: float, what: str) -> bool:
        """Ask NVML's worker and go on; False when NVML is off or hung before."""
        if self._nvml_gone:
            return False
        try:
            self.nvml.send(fn, self.deadline.cap(self.nvml_timeout), end=end, what=what,
                           skipping=False)
        except Unread as unread:
            self.nvml_error = f"{what} did not answer: {unread.exc}"
            self._nvml_gone = True
            return False
        return True

    def _nvml_receive(self, what: str) -> Any:
        """The answer of _nvml_send; None when NVML failed or hung (then asked no more)."""
        if self._nvml_gone:  # hung since it was asked: not waited for
            self.nvml.forget()
            return None
        try:
            value, err = self.nvml.receive()
        except Unread as unread:
            self._nvml_gone = True
            if unread.hung:  # "NVML ...: stalled", "...: did not finish in time"
                why = str(unread.exc).removeprefix(f"{what}: ")
                self.nvml_error = f"{what} did not answer ({why}; its reader was killed)"
            else:
                self.nvml_error = str(unread)
            return None
        if err:
            self.nvml_error = self.nvml_error or err
        return value

    def _nvml(self, fn: Callable[..., Any], end: float, what: str) -> Any:
        """One NVML query; once NVML hung, none is asked again."""
        return self._nvml_receive(what) if self._nvml_send(fn, end, what) else None

    def host(self, scope: Scope, end: float, scan_end: float | None = None,
             hold: Callable[[], None] | None = None
             ) -> tuple[HostView | None, list[dict[str, object]], str, list[Holder]]:
        """(host view with NVML merged, other GPU users, NVML status, holders NVML alone
        names). NVML's memory (kept in `before`) and process lists are read first, then
        `hold()` (the freezer) and the scan: the container is frozen while its tree is read,
        never while NVML is waited for. The scan ends by `scan_end` (default `end`); when it
        does not finish, NVML's list is still used: each NVML process whose own cgroup is in
        the container's tree is a holder (the fourth item), proven and stopped as any other."""
        memory_asked = self._nvml_send(w_memory, end, "NVML memory query")
        asked = self._nvml_send(w_processes, end, "NVML process query")
        if memory_asked:
            rows = self._nvml_receive("NVML memory query")
            self.before = None if rows is None else gpu_memory(rows)
        procs = only_gpus(self._nvml_receive("NVML process query") if asked else None, scope)
        if hold is not None:
            hold()
        view = self._scan(scope, end if scan_end is None else scan_end, "host scan")
        status = ("ok" if procs is not None else "disabled" if not self.nvml_on
                  else f"unavailable: {self.nvml_error}")
        if isinstance(view, str):
            if procs is None:
                return None, [], (status if self.nvml_error or not self.nvml_on
                                  else f"not asked: the host scan {view}"), []
            alone = HostView({}, {}, {}, None)
            others = merge_nvml(alone, procs, self._nvml_reader(scope, end))
            return None, others, status, sorted(alone.holders.values(),
                                                key=lambda h: h.host_pid)
        if procs is None:
            return view, [], status, []
        # each GPU judged on its own: one NVML could not answer for is marked, and a problem
        # when it may be the container's
        faults = getattr(procs, "faults", {})
        held = {m for pid in view.holders for m in nodes_of(view.rdevs.get(pid, ()),
                                                            scope.devices).minors}
        self.gpus = GpuWatch(config_minors(scope.probe_patterns), held)
        self.problems += self.gpus.note(self.before, faults)
        if self.before is not None and faults:
            self.before = with_faults(self.before, faults)
        return view, merge_nvml(view, procs, self._nvml_reader(scope, end)), "ok", []

    def _nvml_reader(self, scope: Scope, end: float) -> Callable[..., Any]:
        """merge_nvml's `read`: w_nvml_pids in the scan's worker."""

        def read(found: list[tuple[records.ProcStatus, str]], unseen: list[int]
                 ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
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
        asked = self._nvml_send(w_processes, end, "NVML process query")
        procs = only_gpus(self._nvml_receive("NVML process query") if asked else None, scope)
        if hold is not None:
            hold()
        view: HostView | str = HostView({}, {}, {}, None)
        if scanned:
            view = self._scan(scope, end, "verification scan", quiet)
        if isinstance(view, str):
            return None
        if procs:
            merge_nvml(view, procs, self._nvml_reader(scope, end))
        # A PID of ours that NVML still lists has not released its memory yet.
        nvml_pids = {p for p in procs or () if p in view.statuses or p in known
                     or p in view.holders}
        return view, nvml_pids

    def memory(self, end: float) -> list[GpuMemory] | None:
        """GPU memory now (after a run: a GPU lost since `before` is a problem of the run
        when it may be the container's)."""
        rows = self._nvml(w_memory, end, "NVML memory query")
        gpus = None if rows is None else gpu_memory(rows)
        if self.gpus is not None:
            self.problems += self.gpus.note(gpus, {})
        return gpus

    def processes(self, end: float) -> dict[int, dict[int, int | None]] | None:

        procs: dict[int, dict[int, int | None]] | None = self._nvml(
            w_processes, end, "NVML process query")
        return procs

    def call(self, fn: Callable[..., Any], *args: Any, end: float, what: str) -> Any:
        """Any other read (each PID noted without a bound of its own: nothing to skip); None
        when it gave no answer (why goes to `problems`)."""
        try:
            return self.scan.call(fn, *args, end=end, what=what, skipping=False)
        except Unread as unread:
            self.problems.append(f"{what} did not finish: {unread.doing}" if unread.hung
                                 else str(unread))
            return None
