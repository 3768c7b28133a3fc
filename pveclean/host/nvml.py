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
    from typing import Any, TypeVar

    from pveclean.core.records import GpuMemory

    T = TypeVar("T")


# index, uuid, name, total MiB, reserved MiB (None: NVML cannot tell), used MiB, minor
MemoryRow = tuple[int, str, str, int, "int | None", int, "int | None"]

MIB = 1024 * 1024


def nvml_allowance(timeout: float) -> float:
    """How long a worker may be silent in NVML: init, then the query, each bounded by the
    adapter's timeout."""
    return 2 * timeout + 0.5


class NvmlUnavailable(Exception):
    """NVML cannot be used in this run; the message says why, in one line."""


def _call_with_timeout(fn: Callable[[], T], timeout: float, what: str) -> T:
    import threading  # here: NVML is asked in the run's worker, never in its parent

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"nvml-{what}", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    if thread.is_alive():
        raise NvmlUnavailable(f"NVML {what} did not answer within {timeout:.1f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


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
        self._handles: list[tuple[int, Any]] = []

    @classmethod
    def for_run(cls, library: str | None, deadline_seconds: float) -> Nvml:
        """A session whose calls may use at most a fifth of the run (5 s at most)."""
        return cls(library, timeout=min(5.0, deadline_seconds * 0.2))

    @staticmethod
    def settings(library: str | None, deadline_seconds: float) -> dict[str, Any]:
        """What a worker's state() needs for its session (see `in_worker`)."""
        return {"nvml_library": library,
                "nvml_timeout": Nvml.for_run(library, deadline_seconds).timeout}

    @classmethod
    def in_worker(cls, state: dict[str, Any]) -> Nvml:
        """The worker's one session, made from its settings on first use."""
        if "nvml" not in state:
            state["nvml"] = cls(state.get("nvml_library"), state.get("nvml_timeout", 5.0))
        nv: Nvml = state["nvml"]
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

        def init() -> list[tuple[int, Any]]:
            if self.library and getattr(pynvml, "nvmlLib", None) is None:
                import ctypes

                pynvml.nvmlLib = ctypes.CDLL(self.library)
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            return [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]

        try:
            self._handles = _call_with_timeout(init, self.timeout, "init")
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

    def memory(self, timeout: float | None = None) -> list[GpuMemory]:
        return gpu_memory(self.memory_rows(timeout))

    def memory_rows(self, timeout: float | None = None) -> list[MemoryRow]:
        def q(nv: Any) -> list[MemoryRow]:
            out: list[MemoryRow] = []
            for index, h in self._handles:
                reserved: int | None = None
                try:
                    info = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                    reserved = int(info.reserved) // MIB
                except (TypeError, AttributeError, nv.NVMLError):
                    info = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                uuid = nv.nvmlDeviceGetUUID(h)
                try:
                    minor: int | None = int(nv.nvmlDeviceGetMinorNumber(h))
                except nv.NVMLError:
                    minor = None
                out.append((
                    index,
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    name.decode() if isinstance(name, bytes) else str(name),
                    int(info.total) // MIB,  # total
                    reserved,
                    int(info.used) // MIB,  # used
                    minor,
                ))
            return out

        return self._query("memory query", q, timeout)

    def pci_bus_ids(self, timeout: float | None = None) -> dict[int, str]:
        """GPU index -> PCI bus id as sysfs names it (`0000:01:00.0`); GPUs whose id NVML
        cannot give are left out."""

        def q(nv: Any) -> dict[int, str]:
            out: dict[int, str] = {}
            for index, h in self._handles:
                try:
                    bus = nv.nvmlDeviceGetPciInfo(h).busId
                except nv.NVMLError:
                    continue
                bus = bus.decode() if isinstance(bus, bytes) else str(bus)
                # NVML pads the domain to 8 digits (00000000:01:00.0); sysfs uses 4
                dom, _, rest = bus.lower().partition(":")
                out[index] = f"{dom[-4:]}:{rest}" if rest else bus.lower()
            return out

        return self._query("PCI query", q, timeout)

    def processes(self, timeout: float | None = None) -> dict[int, dict[int, int | None]]:
        """Host PID -> {GPU index: MiB or None when NVML cannot tell}."""

        def q(nv: Any) -> dict[int, dict[int, int | None]]:
            found: dict[int, dict[int, int | None]] = {}
            for index, h in self._handles:
                for getter in (
                    nv.nvmlDeviceGetComputeRunningProcesses,
                    nv.nvmlDeviceGetGraphicsRunningProcesses,
                ):
                    for p in getter(h):
                        used = p.usedGpuMemory
                        mib = None if used is None or used >= 2**63 else int(used) // MIB
                        per = found.setdefault(int(p.pid), {})
                        if per.get(index) is None:
                            per[index] = mib
            return found

        return self._query("process query", q, timeout)


def gpu_memory(rows: list[MemoryRow]) -> list[GpuMemory]:
    from pveclean.core.records import GpuMemory

    return [GpuMemory(*row) for row in rows]


# ---- the NVML worker's side (see prelude.py); module-level so that they pickle ------------
def w_warm(settings: dict[str, object], init: bool) -> None:
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


def w_processes(timeout: float) -> tuple[dict[int, dict[int, int | None]] | None, str | None]:
    worker.note(("nvml", "process query"), nvml_allowance(timeout))
    try:
        return Nvml.in_worker(worker.state()).processes(timeout=timeout), None
    except NvmlUnavailable as exc:
        return None, str(exc)
