"""The parent's side of every read made in a forked worker: bounded by the run's deadline, a
PID whose reads stall is skipped, named and the read asked again without it."""

from __future__ import annotations

import time
from collections.abc import Callable

from pveclean.core import records
from pveclean.core.discovery import doing, merge_nvml, stall_problem
from pveclean.core.records import (
    Deadline,
    GpuMemory,
    Holder,
    HostView,
    Scope,
)
from pveclean.host import worker
from pveclean.host.procscan import stalled_on, w_nvml_pids, w_scan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


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
        from pveclean.host.nvml import gpu_memory, w_memory, w_processes

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

        def read(found: list[tuple[records.ProcStatus, str]], outside: list[int]
                 ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
            got = self.call(w_nvml_pids, found, outside, scope, end=end,
                            what="reading NVML's processes")
            return got if isinstance(got, tuple) else ([], [])

        return view, merge_nvml(view, procs, read), "ok"

    def rescan(self, scope: Scope, known: set[int], end: float
               ) -> tuple[HostView, set[int]] | None:
        """The container's holders now, and the NVML processes that are ours."""
        from pveclean.host.nvml import w_processes

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
        from pveclean.host.nvml import gpu_memory, w_memory

        rows = self._nvml(w_memory, end, "NVML memory query")
        return None if rows is None else gpu_memory(rows)

    def processes(self, end: float) -> dict[int, dict[int, int | None]] | None:
        from pveclean.host.nvml import w_processes

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

UNBOUNDED_READ = 30.0  # s: a reader's bound when the caller sets none (tests, in-process use)


def _left(end: float | None) -> float:
    return UNBOUNDED_READ if end is None else max(end - time.monotonic(), 0.0)


class Reader:
    """A forked reader of /proc for `gpus`, as the scan worker of a run (discover.Reads):
    a PID whose reads stall past `stall` (a process wedged in the GPU driver blocks a read
    of its maps or cmdline; a hung FUSE or NFS mount) is skipped from then on and named, and
    the read is asked again without it, until `end` (monotonic)."""

    def __init__(self, end: float | None, stall: float, problems: list[str]) -> None:
        from pveclean.host.worker import Worker

        self.worker = Worker(marks=True)
        self.end, self.stall, self.problems = end, stall, problems
        self.skip: set[int] = set()
        self._sent: tuple[Callable[..., Any], tuple[Any, ...], str] | None = None

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> None:
        """Ask fn(*args, skip, stall) and go on; receive() takes the answer."""
        self._sent = (fn, args, what)
        self.worker.send(fn, *args, frozenset(self.skip), self.stall, timeout=_left(self.end),
                         what=what)

    def receive(self) -> Any:
        """The answer to send(), read again without each PID that stalled; None (and a
        problem said) when it did not finish by `end` or failed."""
        from pveclean.host.worker import RemoteError, WorkerError

        if self._sent is None:
            raise RuntimeError("Reader.receive() without a send()")  # a bug of the caller
        fn, args, what = self._sent
        while True:
            try:
                return self.worker.receive(_left(self.end), what, stall=self.stall)
            except WorkerError as exc:
                pid = stalled_on(exc)
                if pid is None:
                    self.problems.append(f"{exc} ({doing(exc.note)})")  # deadline, or it died
                    return None
                self.skip.add(pid)
                self.problems.append(stall_problem(pid, self.stall, "not looked at"))
            except RemoteError as exc:  # a bug, not a hang: said, never a traceback
                self.problems.append(f"{what} failed: {exc}")
                return None
            try:
                self.send(fn, args, what)
            except WorkerError:
                self.problems.append(f"{what} did not finish in time")
                return None

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
        self.send(fn, args, what)
        return self.receive()

    def close(self) -> None:
        self.worker.close()
