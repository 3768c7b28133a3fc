"""A defensive NVML adapter: never raises, never hangs past its timeout.

NVML calls into the driver; a wedged GPU can make them block. Each query runs in a daemon
thread and is abandoned after its timeout, so the run's deadline always holds.

A run asks NVML in its own worker (see worker.py and prelude.py), forked before the run's
imports: this module and what its worker functions (w_*) import stay lean (no dataclasses,
no pveclean.core.records), and their answers are plain tuples the parent turns into the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from pveclean.host import worker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from threading import Thread
    from types import ModuleType
    from typing import Any, TypedDict, TypeVar

    from pveclean.core.pci import PciAddress
    from pveclean.core.records import GpuMemory, NvmlProcesses

    T = TypeVar("T")

    class NvmlSettings(TypedDict):
        """A worker's NVML settings (Worker(**settings): its state()))."""

        nvml_library: str | None
        nvml_timeout: float


# index, uuid, name, total MiB, reserved MiB (None: NVML cannot tell), used MiB, minor,
# status ("ok"; "lost": the GPU fell off the bus; "unavailable": another NVML error), and
# why when not ok, and the getters that failed (nvitop's NA: the rest was read and is kept).
MemoryRow = tuple[int, str, str, int, "int | None", int, "int | None", str, "str | None",
                  tuple[str, ...]]
Fault = tuple[str, str]  # (status, reason) of one GPU that NVML could not answer for

MIB = 1024 * 1024
ABANDONED: list[Thread] = []  # the calls given up on: still in the driver while alive
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED: a getter this GPU does not have
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: the driver lacks the symbol
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST: fallen off the bus (Xid 79)
INSUFFICIENT_SIZE = 7
# The process getters, newest first: a driver before R510 has no _v3 (pynvml then raises
# NVMLLibraryMismatchError for the unversioned name), one before R450 no _v2 either.
PROC_GETTERS = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
                "nvmlDeviceGetComputeRunningProcesses"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3",
                 "nvmlDeviceGetGraphicsRunningProcesses_v2",
                 "nvmlDeviceGetGraphicsRunningProcesses"),
}


# NVML's process lists as the worker sends them: host PID -> {GPU index: MiB, None when NVML
# cannot tell}, and GPU index -> Fault for each GPU whose list NVML could not give. The
# parent makes them a records.NvmlProcesses (gpu_processes).
ProcessRows = tuple[dict[int, dict[int, "int | None"]], dict[int, Fault]]


def pci_id(bus: str | bytes) -> PciAddress | None:
    """NVML's PCI bus id (the domain padded to 8 digits: 00000000:01:00.0, 00010000:01:00.0)
    as a record; its text is sysfs' name (at least 4 domain digits, every digit of a wider
    one: 10000:01:00.0, Intel VMD). None: NVML gave no address."""
    from pveclean.core.pci import PciAddress  # here: NVML's own worker stays without dataclasses

    return PciAddress.parse(bus.decode("ascii", "replace") if isinstance(bus, bytes) else bus)


def fault_of(exc: BaseException, what: str) -> Fault:
    """The status and reason of a getter's failure: GPU_IS_LOST is `lost`, any other error
    (UNKNOWN, TIMEOUT, a library mismatch) `unavailable`."""
    lost = getattr(exc, "value", None) == GPU_IS_LOST
    return ("lost" if lost else "unavailable", f"{what}: {_describe(exc)}")


def merged(faults: list[Fault]) -> Fault:
    """One status for several failed getters of one GPU: lost when any says so."""
    status = "lost" if any(s == "lost" for s, _ in faults) else "unavailable"
    return status, "; ".join(dict.fromkeys(r for _, r in faults))

def nvml_allowance(timeout: float) -> float:
    """How long a worker may be silent in NVML: init, then the query, each bounded by the
    adapter's timeout."""
    return 2 * timeout + 0.5


class NvmlUnavailable(Exception):
    """NVML cannot be used in this run; the message says why, in one line."""


def _call_with_timeout(fn: Callable[[], T], timeout: float, what: str) -> T:
    import threading  # here: NVML is asked in the run's worker, never in its parent

    value: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            value.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name=f"nvml-{what}", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    if thread.is_alive():  # abandoned, maybe stuck in the driver for good
        ABANDONED.append(thread)
        worker.park_self()
        raise NvmlUnavailable(f"NVML {what} did not answer within {timeout:.1f} s")
    if error:
        raise error[0]
    return value[0]


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return f"{name[len('NVMLError_'):]} ({exc})"
    return f"{name}: {exc}"


class Nvml:
    """Lazily initialised NVML session. `error` is set once NVML proved unusable."""

    def __init__(self, library: str | None = None, timeout: float = 5.0) -> None:
        self.library = library
        self.timeout = timeout
        self.error: str | None = None
        self._nv: Any = None
        self._count = 0
        self._handles: dict[int, Any] = {}  # GPU index -> handle, once NVML gave one
        self._proc_start = 0  # the newest process getter this driver has (PROC_GETTERS)

    @classmethod
    def for_run(cls, library: str | None, deadline_seconds: float) -> Nvml:
        """A session whose calls may use at most a fifth of the run (5 s at most)."""
        return cls(library, timeout=min(5.0, deadline_seconds * 0.2))

    @staticmethod
    def settings(library: str | None, deadline_seconds: float) -> NvmlSettings:
        """What a worker's state() needs for its session (see `in_worker`)."""
        return {"nvml_library": library,
                "nvml_timeout": Nvml.for_run(library, deadline_seconds).timeout}

    @classmethod
    def in_worker(cls, state: worker.State) -> Nvml:
        """The worker's one session, made from its settings on first use."""
        nv = state.get("nvml")
        if nv is None:
            nv = state["nvml"] = cls(state.get("nvml_library"), state.get("nvml_timeout", 5.0))
        return nv

    def warm(self) -> None:
        """Load the library and init NVML now (the first query then only asks); a failure
        is kept in `error`, as a query would keep it."""
        with contextlib.suppress(NvmlUnavailable):
            self._init()

    def _init(self) -> Any:
        if self._nv is not None:
            return self._nv
        if self.error:
            raise NvmlUnavailable(self.error)
        try:
            import pynvml
        except ImportError:
            self.error = "nvidia-ml-py (pynvml) is not installed"
            raise NvmlUnavailable(self.error) from None

        def init() -> int:
            if self.library and getattr(pynvml, "nvmlLib", None) is None:
                import ctypes

                pynvml.nvmlLib = ctypes.CDLL(self.library)
            pynvml.nvmlInit()
            count: int = pynvml.nvmlDeviceGetCount()
            for index in range(count):  # each GPU on its own: a lost one loses only itself
                self._handle(pynvml, index)  # (one that fails is asked again by each query)
            return count

        try:
            self._count = _call_with_timeout(init, self.timeout, "init")
        except NvmlUnavailable as exc:
            self.error = str(exc)
            raise
        except OSError as exc:
            self.error = f"cannot load NVML library: {exc}"
            raise NvmlUnavailable(self.error) from None
        except Exception as exc:
            self.error = f"NVML init failed: {_describe(exc)}"
            raise NvmlUnavailable(self.error) from None
        self._nv = pynvml
        return pynvml

    def _query(self, what: str, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        nv = self._init()
        try:
            return _call_with_timeout(lambda: fn(nv), timeout or self.timeout, what)
        except NvmlUnavailable as exc:
            self.error = str(exc)  # a hung driver stays hung: do not ask again this run
            self._nv = None
            raise
        except Exception as exc:
            raise NvmlUnavailable(f"NVML {what} failed: {_describe(exc)}") from None

    def _handle(self, nv: Any, index: int) -> tuple[Any, Fault | None]:
        """GPU `index`'s handle, or why NVML gave none (asked again by the next query)."""
        if index in self._handles:
            return self._handles[index], None
        try:
            self._handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # GPU_IS_LOST, UNKNOWN, TIMEOUT...: this GPU only
            return None, fault_of(exc, "handle")
        return self._handles[index], None

    def device_call(self, index: int, what: str, fn: Callable[[ModuleType, object], T],
                    timeout: float | None = None) -> T:
        """fn(pynvml, handle of GPU `index`), bounded as every query; a GPU with no handle,
        or a call that fails, raises NvmlUnavailable naming the GPU and why."""

        def q(nv: ModuleType) -> tuple[list[T], Fault | None]:
            h, fault = self._handle(nv, index)
            return ([], fault) if h is None else ([fn(nv, h)], None)

        value, fault = self._query(what, q, timeout)
        if fault is not None:
            raise NvmlUnavailable(f"NVML {what} of GPU {index}: {fault[1]}")
        return value[0]

    def driver_version(self, timeout: float | None = None) -> str:
        """The driver version NVML's library reports (nvmlSystemGetDriverVersion)."""
        v = self._query("driver version", lambda nv: nv.nvmlSystemGetDriverVersion(), timeout)
        return v.decode() if isinstance(v, bytes) else str(v)

    def memory(self, timeout: float | None = None) -> list[GpuMemory]:
        return gpu_memory(self.memory_rows(timeout))

    def memory_rows(self, timeout: float | None = None) -> list[MemoryRow]:
        """One row per GPU NVML counts, each read on its own: a GPU whose getters fail is a
        row with its status and reason, the others are read as ever."""

        def q(nv: Any) -> list[MemoryRow]:
            return [self._memory_row(nv, index) for index in range(self._count)]

        return self._query("memory query", q, timeout)

    def _memory_row(self, nv: Any, index: int) -> MemoryRow:
        h, fault = self._handle(nv, index)
        if h is None:
            assert fault is not None
            return (index, "", "", 0, None, 0, None, *fault, ("handle",))
        faults: list[Fault] = []
        unread: list[str] = []
        total = used = 0
        reserved: int | None = None
        try:
            try:
                info = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                reserved = int(info.reserved) // MIB
            except (TypeError, AttributeError, nv.NVMLError):
                info = nv.nvmlDeviceGetMemoryInfo(h)
            total, used = int(info.total) // MIB, int(info.used) // MIB
        except Exception as exc:
            faults.append(fault_of(exc, "memory"))
            unread.append("memory")
            reserved = None
        text = {}
        for what, getter in (("name", nv.nvmlDeviceGetName), ("uuid", nv.nvmlDeviceGetUUID)):
            try:
                v = getter(h)
                text[what] = v.decode() if isinstance(v, bytes) else str(v)
            except Exception as exc:
                faults.append(fault_of(exc, what))
                unread.append(what)
                text[what] = ""
        minor: int | None = None
        try:
            minor = int(nv.nvmlDeviceGetMinorNumber(h))
        except Exception as exc:
            if getattr(exc, "value", None) != NOT_SUPPORTED:
                faults.append(fault_of(exc, "minor"))
                unread.append("minor")
        status, reason = merged(faults) if faults else ("ok", None)
        return (index, text["uuid"], text["name"], total, reserved, used, minor, status, reason,
                tuple(unread))

    def pci_bus_ids(self, timeout: float | None = None) -> dict[int, PciAddress]:
        """GPU index -> PCI address (`0000:01:00.0`, `10000:01:00.0` as sysfs names them);
        GPUs whose id NVML cannot give are left out."""

        def q(nv: Any) -> dict[int, PciAddress]:
            out: dict[int, PciAddress] = {}
            for index in range(self._count):
                h, _ = self._handle(nv, index)
                try:
                    bus = nv.nvmlDeviceGetPciInfo(h).busId if h is not None else None
                except Exception:
                    continue
                addr = None if bus is None else pci_id(bus if isinstance(bus, bytes) else str(bus))
                if addr is not None:
                    out[index] = addr
            return out

        return self._query("PCI query", q, timeout)

    def processes(self, timeout: float | None = None) -> NvmlProcesses:
        return gpu_processes(self.process_rows(timeout))

    def process_rows(self, timeout: float | None = None) -> ProcessRows:
        """Host PID -> {GPU index: MiB or None when NVML cannot tell}, each GPU asked on its
        own (the faults name those that did not answer). A PID with several rows in one list
        (one per MIG instance) has their sum; one in both lists (compute and graphics) the
        larger figure, which is the same memory seen twice."""

        def q(nv: Any) -> ProcessRows:
            found: dict[int, dict[int, int | None]] = {}
            faults: dict[int, Fault] = {}
            for index in range(self._count):
                h, fault = self._handle(nv, index)
                if h is None:
                    assert fault is not None
                    faults[index] = fault
                    continue
                try:
                    lists = [self._process_list(nv, h, kind) for kind in PROC_GETTERS]
                except Exception as exc:
                    faults[index] = fault_of(exc, "process list")
                    continue
                for pid, mib in _per_pid(lists).items():
                    found.setdefault(pid, {})[index] = mib
            return found, faults

        return self._query("process query", q, timeout)

    def _process_list(self, nv: Any, h: Any, kind: str) -> list[tuple[int, int | None]]:
        """(PID, MiB or None) of each row of one of a GPU's process lists, through the
        newest getter the driver has (v3, else v2, else v1): a getter the driver lacks is
        FUNCTION_NOT_FOUND, or NVMLLibraryMismatchError, or absent from an older pynvml."""
        names = PROC_GETTERS[kind]
        while True:
            name = names[self._proc_start]
            try:
                if self._proc_start == len(names) - 1:
                    return _v1_rows(nv, name, h)
                return [(int(p.pid), _mib(p.usedGpuMemory)) for p in getattr(nv, name)(h)]
            except Exception as exc:
                missing = (isinstance(exc, AttributeError)
                           or type(exc).__name__ == "NVMLLibraryMismatchError"
                           or getattr(exc, "value", None) == FUNCTION_NOT_FOUND)
                if not missing or self._proc_start == len(names) - 1:
                    raise
                self._proc_start += 1  # the driver lacks it: older getters from now on


def _mib(used: int | None) -> int | None:
    return None if used is None or used >= 2**63 else int(used) // MIB


def _per_pid(lists: list[list[tuple[int, int | None]]]) -> dict[int, int | None]:
    """A PID's MiB on one GPU: its rows in one list summed (MIG: one row per instance; None
    when any row cannot tell), the larger of the lists (None only when every list cannot)."""
    out: dict[int, int | None] = {}
    for rows in lists:
        sums: dict[int, int | None] = {}
        for pid, mib in rows:
            if pid in sums:
                prev = sums[pid]
                sums[pid] = None if prev is None or mib is None else prev + mib
            else:
                sums[pid] = mib
        for pid, mib in sums.items():
            if pid not in out or out[pid] is None:
                out[pid] = mib
            elif mib is not None:
                out[pid] = max(out[pid] or 0, mib)
    return out


def _v1_rows(nv: Any, name: str, h: Any) -> list[tuple[int, int | None]]:
    """The unversioned (v1) process getter, which nvidia-ml-py no longer calls: its rows are
    nvmlProcessInfo_v1_t (pid, usedGpuMemory), without the MIG instance ids."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    fn = nv._nvmlGetFunctionPointer(name)
    count = ctypes.c_uint(0)
    ret = fn(h, ctypes.byref(count), None)
    if ret == 0:
        return []
    if ret != INSUFFICIENT_SIZE:
        raise nv.NVMLError(ret)
    count.value = count.value * 2 + 5
    rows = (Info * count.value)()
    nv._nvmlCheckReturn(fn(h, ctypes.byref(count), rows))
    return [(int(rows[i].pid), _mib(rows[i].usedGpuMemory)) for i in range(count.value)]


def gpu_memory(rows: list[MemoryRow]) -> list[GpuMemory]:
    """The worker's rows as the model (in the parent: the worker imports no records)."""
    from pveclean.core.records import GpuMemory, GpuStatus

    return [GpuMemory(*row[:7], status=GpuStatus(row[7]), reason=row[8], unread=row[9])
            for row in rows]


def gpu_processes(rows: ProcessRows) -> NvmlProcesses:
    """The worker's process lists as the model."""
    from pveclean.core.records import GpuStatus, NvmlProcesses

    by_pid, faults = rows
    return NvmlProcesses(by_pid, {i: (GpuStatus(status), reason)
                                  for i, (status, reason) in faults.items()})


# ---- the NVML worker's side (see prelude.py); module-level so that they pickle ------------
def w_warm(settings: NvmlSettings, init: bool) -> None:
    """The worker's settings, and NVML's init ahead of the run's first query (which then
    only asks)."""
    state = worker.state()
    state.update(settings)
    if not init:
        return
    nv = Nvml.in_worker(state)
    worker.note(("nvml", "init"), nvml_allowance(nv.timeout))
    nv.warm()


def w_memory(timeout: float) -> tuple[list[MemoryRow] | None, str | None]:
    worker.note(("nvml", "memory query"), nvml_allowance(timeout))
    try:
        return Nvml.in_worker(worker.state()).memory_rows(timeout=timeout), None
    except NvmlUnavailable as exc:
        return None, str(exc)


def w_processes(timeout: float) -> tuple[ProcessRows | None, str | None]:
    worker.note(("nvml", "process query"), nvml_allowance(timeout))
    try:
        return Nvml.in_worker(worker.state()).process_rows(timeout=timeout), None
    except NvmlUnavailable as exc:
        return None, str(exc)
