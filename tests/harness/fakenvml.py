"""Controller for the fake NVML library (``tests/harness/fakenvml/fakenvml.c``).

The C library is a stand-in ``libnvidia-ml.so.1`` that the unmodified nvidia-ml-py (``pynvml``)
loads instead of the driver's NVML.  It re-reads a text state file on every API call, so a test
can change GPUs, per-process memory, leaks and failures at any moment through this class.

The state file is ``fakenvml.state`` beside the built ``.so`` (found by the library itself with
``dladdr``, so it works with a cleared environment) unless ``FAKE_NVML_STATE`` names another one.

Only the standard library is used, so this file can also be loaded standalone by path.

Example::

    fake = FakeNvml(tmp_path)
    fake.build()
    fake.add_gpu(0)
    fake.set_process(0, pid, 2048)
    subprocess.run([...], env={**os.environ, **fake.env()})
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LIB_NAME", "SOURCE", "STATE_NAME", "FakeGpu", "FakeNvml", "FakeProcess"]

SOURCE = Path(__file__).resolve().parent / "fakenvml" / "fakenvml.c"
LIB_NAME = "libnvidia-ml.so.1"
STATE_NAME = "fakenvml.state"

_KINDS = ("compute", "graphics")


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    name: str
    total_mib: int
    reserved_mib: int
    minor: int


@dataclass(frozen=True)
class FakeProcess:
    gpu: int
    pid: int
    mib: int | None  # None: NVML reports the per-process memory as "not available"
    kind: str = "compute"
    counted_mib: int = 0  # with mib None: MiB still counted in the GPU's used memory


def _token(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value) or "#" in value:
        raise ValueError(f"{what} must be non-empty without whitespace or '#': {value!r}")
    return value


def _error_token(error: str | int) -> str:
    if isinstance(error, bool):
        raise TypeError("error must be an NVML error name or code")
    if isinstance(error, int):
        if error < 0:
            raise ValueError(f"negative NVML error code: {error}")
        return str(error)
    name = _token(error, "error name").upper()
    return name.removeprefix("NVML_ERROR_")


def _non_negative(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int: {value!r}")
    return value


@dataclass
class FakeNvml:
    """Owns one build directory: the fake ``libnvidia-ml.so.1`` and its state file."""

    directory: Path
    gpus: dict[int, FakeGpu] = field(default_factory=dict)
    processes: dict[tuple[int, int], FakeProcess] = field(default_factory=dict)
    leaks: dict[int, int] = field(default_factory=dict)
    init_error_code: str | None = None
    hang_seconds: float | None = None
    proc_query_error_code: str | None = None

    def __post_init__(self) -> None:
        self.directory = Path(self.directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write()

    # -- paths -----------------------------------------------------------------------------

    @property
    def lib_path(self) -> Path:
        return self.directory / LIB_NAME

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_NAME

    def env(self) -> dict[str, str]:
        """Environment additions that make ``CDLL("libnvidia-ml.so.1")`` load the fake."""
        return {"LD_LIBRARY_PATH": str(self.directory)}

    # -- build -----------------------------------------------------------------------------

    def build(self) -> Path:
        """Compile the library into the directory (skipped when the .so is newer than the .c)."""
        lib = self.lib_path
        if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
            return lib
        cc = os.environ.get("CC") or "gcc"
        compiler = shutil.which(cc)
        if compiler is None:
            raise RuntimeError(
                f"cannot build the fake NVML library: C compiler {cc!r} not found on PATH"
            )
        fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".so", dir=self.directory)
        os.close(fd)
        cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, str(SOURCE), "-ldl"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise RuntimeError(
                    f"building the fake NVML library failed ({' '.join(cmd)}):\n{result.stderr}"
                )
            os.replace(tmp, lib)  # atomic: a concurrent loader never sees a partial .so
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return lib

    # -- state -----------------------------------------------------------------------------

    def add_gpu(
        self,
        index: int,
        uuid: str | None = None,
        name: str = "NVIDIA-H100-80GB-HBM3",
        total_mib: int = 81559,
        reserved_mib: int = 512,
        minor: int | None = None,
    ) -> FakeGpu:
        """Add (or replace) GPU ``index``; ``minor`` is N of /dev/nvidiaN (default: index)."""
        _non_negative(index, "index")
        if index >= 64:
            raise ValueError("the fake supports GPU indices 0..63")
        _non_negative(total_mib, "total_mib")
        _non_negative(reserved_mib, "reserved_mib")
        if reserved_mib > total_mib:
            raise ValueError("reserved_mib exceeds total_mib")
        if uuid is None:
            uuid = f"GPU-fa4e0000-0000-4000-8000-{index:012x}"
        gpu = FakeGpu(
            index=index,
            uuid=_token(uuid, "uuid"),
            name=_token(name, "name"),
            total_mib=total_mib,
            reserved_mib=reserved_mib,
            minor=_non_negative(index if minor is None else minor, "minor"),
        )
        self.gpus[index] = gpu
        self.write()
        return gpu

    def set_process(
        self,
        gpu: int,
        pid: int,
        mib: int | None,
        kind: str = "compute",
        counted_mib: int = 0,
    ) -> None:
        """Give host ``pid`` ``mib`` MiB on ``gpu`` (counted only while the pid is alive).

        ``mib=None`` makes NVML report usedGpuMemory as not available; ``counted_mib`` is then
        still added to the GPU's used memory while the process lives.
        """
        _non_negative(gpu, "gpu")
        if _non_negative(pid, "pid") == 0:
            raise ValueError("pid must be positive")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}: {kind!r}")
        if mib is not None:
            _non_negative(mib, "mib")
        _non_negative(counted_mib, "counted_mib")
        self.processes[(gpu, pid)] = FakeProcess(gpu, pid, mib, kind, counted_mib)
        self.write()

    def remove_process(self, gpu: int, pid: int) -> None:
        self.processes.pop((gpu, pid), None)
        self.write()

    def leak(self, gpu: int, mib: int) -> None:
        """Set the MiB allocated on ``gpu`` by no process (replaces the previous value)."""
        _non_negative(gpu, "gpu")
        if _non_negative(mib, "mib"):
            self.leaks[gpu] = mib
        else:
            self.leaks.pop(gpu, None)
        self.write()

    def clear_leaks(self) -> None:
        self.leaks.clear()
        self.write()

    def init_error(self, error: str | int | None) -> None:
        """Make nvmlInit* fail with an NVML error name (``DRIVER_NOT_LOADED``) or code."""
        self.init_error_code = None if error is None else _error_token(error)
        self.write()

    def hang(self, seconds: float | None) -> None:
        """Make every API call (init included) sleep ``seconds`` first."""
        if seconds is not None and not 0 <= seconds < 1e6:
            raise ValueError(f"hang seconds out of range: {seconds!r}")
        self.hang_seconds = seconds or None
        self.write()

    def proc_query_error(self, error: str | int | None) -> None:
        """Make the running-process calls fail with an NVML error name or code."""
        self.proc_query_error_code = None if error is None else _error_token(error)
        self.write()

    def render(self) -> str:
        lines = ["# fake NVML state, written by tests/harness/fakenvml.py"]
        if self.init_error_code is not None:
            lines.append(f"init_error {self.init_error_code}")
        if self.hang_seconds is not None:
            lines.append(f"hang {self.hang_seconds!r}")
        if self.proc_query_error_code is not None:
            lines.append(f"proc_query_error {self.proc_query_error_code}")
        for g in sorted(self.gpus.values(), key=lambda g: g.index):
            lines.append(
                f"gpu {g.index} {g.uuid} {g.name} {g.total_mib} {g.reserved_mib} {g.minor}"
            )
        for p in self.processes.values():
            if p.mib is not None:
                used = str(p.mib)
            elif p.counted_mib:
                used = f"na:{p.counted_mib}"
            else:
                used = "na"
            lines.append(f"proc {p.gpu} {p.pid} {used} {p.kind}")
        for gpu, mib in sorted(self.leaks.items()):
            lines.append(f"leak {gpu} {mib}")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """Atomically rewrite the state file (temp file + rename)."""
        fd, tmp = tempfile.mkstemp(prefix=".fakenvml.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(self.render())
            os.replace(tmp, self.state_path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
