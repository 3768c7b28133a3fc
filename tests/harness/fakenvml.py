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
# what gpu_error can fail ("persistence": the mode's getter and setter)
GETTERS = ("handle", "memory", "info", "minor", "procs", "pci", "persistence")
PROC_VERSIONS = ("v3", "v2")  # process getters an old driver lacks (v2: v3 too)


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
    instance: tuple[int, int] | None = None  # MIG (GPU instance, compute instance) of this row


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
    # (gpu, pid, kind, MIG instance or None) -> one row of the GPU's process lists
    processes: dict[tuple[int, int, str, tuple[int, int] | None], FakeProcess] = field(
        default_factory=dict)
    leaks: dict[int, int] = field(default_factory=dict)
    init_error_code: str | None = None
    hang_seconds: float | None = None
    stuck_path: str | None = None
    proc_query_error_code: str | None = None
    gpu_errors: dict[tuple[int, str], str] = field(default_factory=dict)  # (gpu, getter)
    pci_domains: dict[int, int] = field(default_factory=dict)
    missing: str | None = None  # "v3" or "v2": the process getters an old driver lacks
    # GPU index -> persistence mode on; the library appends a line when NVML changes it
    persistence: dict[int, bool] = field(default_factory=dict)
    # GPU index -> MIG devices (MIG mode on); the `mig` directive
    mig: dict[int, int] = field(default_factory=dict)
    # Built without these process getter symbols at all (a driver before R510: ("v3",));
    # the library's build is then kept apart from a full one by its flags.
    without: tuple[str, ...] = ()
    # what nvmlSystemGetDriverVersion reports (None: the library's 550.127.05)
    driver_version: str | None = None
    # how much of the state file is this object's own (its last render, or lines it has
    # already absorbed): only what the library or a stand-in appended after that is news
    absorbed: int = field(default=0, repr=False)
    # GPU index -> (seconds or "inf", steps): a dead holder's memory given back that late
    releases: dict[int, tuple[str, int]] = field(default_factory=dict)
    # PID -> when the library first saw it dead (its appended "died" lines, kept on rewrite)
    died: dict[int, float] = field(default_factory=dict)

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
        """Compile the library into the directory (skipped when the .so is newer than the .c
        and was built with the same `without`)."""
        lib = self.lib_path
        flags = [f"-DFAKE_NVML_NO_{v.upper()}" for v in self.without if v in PROC_VERSIONS]
        stamp = self.directory / ".build-flags"
        try:
            same = stamp.read_text() == " ".join(flags)
        except OSError:
            same = not flags
        if same and lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
            return lib
        cc = os.environ.get("CC") or "gcc"
        compiler = shutil.which(cc)
        if compiler is None:
            raise RuntimeError(
                f"cannot build the fake NVML library: C compiler {cc!r} not found on PATH"
            )
        fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".so", dir=self.directory)
        os.close(fd)
        cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wall", *flags, "-o", tmp, str(SOURCE),
               "-ldl"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise RuntimeError(
                    f"building the fake NVML library failed ({' '.join(cmd)}):\n{result.stderr}"
                )
            os.replace(tmp, lib)  # atomic: a concurrent loader never sees a partial .so
            stamp.write_text(" ".join(flags))
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
        instance: tuple[int, int] | None = None,
    ) -> None:
        """Give host ``pid`` ``mib`` MiB on ``gpu`` (counted only while the pid is alive).

        ``mib=None`` makes NVML report usedGpuMemory as not available; ``counted_mib`` is then
        still added to the GPU's used memory while the process lives. ``instance``: the MIG
        (GPU instance, compute instance) of this row; a PID may have one row per instance,
        each listed and counted (without it, the PID's one row of this kind on the GPU is
        replaced). A PID in both lists (compute and graphics) has its memory counted twice
        by the fake: give one of the rows ``mib`` and the other None for NVML's C+G row.
        """
        _non_negative(gpu, "gpu")
        if _non_negative(pid, "pid") == 0:
            raise ValueError("pid must be positive")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}: {kind!r}")
        if mib is not None:
            _non_negative(mib, "mib")
        _non_negative(counted_mib, "counted_mib")
        if instance is not None:
            instance = (_non_negative(instance[0], "gi"), _non_negative(instance[1], "ci"))
        self.processes[(gpu, pid, kind, instance)] = FakeProcess(gpu, pid, mib, kind,
                                                                 counted_mib, instance)
        self.write()

    def remove_process(self, gpu: int, pid: int) -> None:
        """Remove every row of ``pid`` on ``gpu`` (each MIG instance's too)."""
        for key in [k for k in self.processes if k[:2] == (gpu, pid)]:
            del self.processes[key]
        self.write()

    def leak(self, gpu: int, mib: int) -> None:
        """Set the MiB allocated on ``gpu`` by no process (replaces the previous value)."""
        _non_negative(gpu, "gpu")
        self._absorb_library_changes()  # an earlier reset must not free this new leak
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

    def stuck(self, path: str | Path | None) -> None:
        """Make every API call stat() `path` first: on a hung FUSE mount (hangfs) the caller
        is stuck in the kernel, beyond SIGKILL, as in a wedged GPU driver (None: no more)."""
        if path is not None and (len(str(path)) > 255 or any(c.isspace() for c in str(path))):
            raise ValueError(f"stuck path must be short and without blanks: {path!r}")
        self.stuck_path = None if path is None else str(path)
        self.write()

    def proc_query_error(self, error: str | int | None) -> None:
        """Make the running-process calls fail with an NVML error name or code."""
        self.proc_query_error_code = None if error is None else _error_token(error)
        self.write()

    def gpu_error(self, gpu: int, getter: str, error: str | int | None) -> None:
        """Make one getter of GPU ``gpu`` fail with an NVML error (None: answer again).
        ``getter``: handle, memory, info (name and UUID), minor, procs (every process call)
        or pci. The other GPUs and getters answer."""
        _non_negative(gpu, "gpu")
        if getter not in GETTERS:
            raise ValueError(f"getter must be one of {GETTERS}: {getter!r}")
        if error is None:
            self.gpu_errors.pop((gpu, getter), None)
        else:
            self.gpu_errors[(gpu, getter)] = _error_token(error)
        self.write()

    def set_persistence(self, gpu: int, enabled: bool) -> None:
        """GPU ``gpu``'s persistence mode, as the host's boot (or nvidia-smi -pm) left it."""
        self._absorb_library_changes()  # the library's earlier change must not undo this one
        self.persistence[_non_negative(gpu, "gpu")] = enabled
        self.write()

    def persistence_of(self, gpu: int) -> bool:
        """GPU ``gpu``'s persistence mode now, including what NVML's setter changed."""
        self._absorb_library_changes()
        return self.persistence.get(gpu, False)

    def _absorb_library_changes(self) -> None:
        """The persistence lines nvmlDeviceSetPersistenceMode appended (the last wins), so
        that a rewrite of the file keeps them."""
        try:
            text = self.state_path.read_text(encoding="ascii")
        except FileNotFoundError:
            return
        news, self.absorbed = text[self.absorbed :], len(text)
        for line in news.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "persistence" and words[1].isdigit():
                self.persistence[int(words[1])] = words[2] == "on"
            if len(words) == 3 and words[0] == "died" and words[1].isdigit():
                self.died.setdefault(int(words[1]), float(words[2]))
            if len(words) == 2 and words[0] == "reset" and words[1].isdigit():
                self.leaks.pop(int(words[1]), None)  # a reset (the nvidia-smi stand-in's)

    def set_mig(self, gpu: int, devices: int | None) -> None:
        """GPU ``gpu`` in MIG mode with ``devices`` MIG devices (None: MIG off)."""
        if devices is None:
            self.mig.pop(_non_negative(gpu, "gpu"), None)
        else:
            self.mig[_non_negative(gpu, "gpu")] = _non_negative(devices, "devices")
        self.write()

    def reset(self, gpu: int) -> None:
        """What the driver's reset of ``gpu`` does to NVML's view: its leak is freed (the
        nvidia-smi stand-in appends the same `reset` line the library reads)."""
        with open(self.state_path, "a", encoding="ascii") as fh:
            fh.write(f"reset {_non_negative(gpu, 'gpu')}\n")
        self._absorb_library_changes()

    def set_driver_version(self, version: str | None) -> None:
        """The driver version NVML reports (None: the library's default, 550.127.05)."""
        self.driver_version = None if version is None else _token(version, "driver version")
        self.write()

    def lose(self, gpu: int, getters: tuple[str, ...] = GETTERS) -> None:
        """GPU ``gpu`` fell off the bus (Xid 79): its ``getters`` answer GPU_IS_LOST, while
        init and the other GPUs work, as with the driver's NVML."""
        for getter in getters:
            self.gpu_error(gpu, getter, "GPU_IS_LOST")

    def pci_domain(self, gpu: int, domain: int) -> None:
        """The PCI domain of ``gpu``'s bus id (0x10000 and above: behind Intel VMD)."""
        _non_negative(gpu, "gpu")
        if _non_negative(domain, "domain") > 0xFFFFFFFF:
            raise ValueError("a PCI domain has at most 32 bits")
        self.pci_domains[gpu] = domain
        self.write()

    def old_driver(self, missing: str | None) -> None:
        """Answer as a driver without the ``missing`` process getters: "v3" (before R510),
        "v2" (v2 and v3), None (a current driver). pynvml then sees FUNCTION_NOT_FOUND, as
        for a symbol the library lacks (see `without` for a build that lacks them)."""
        if missing is not None and missing not in PROC_VERSIONS:
            raise ValueError(f"missing must be one of {PROC_VERSIONS} or None: {missing!r}")
        self.missing = missing
        self.write()

    def release(self, gpu: int, seconds: float | None, steps: int = 1) -> None:
        """A dead holder's memory on ``gpu`` stays allocated, under no process, ``seconds``
        after the library first sees it dead (``math.inf``: never given back; None: freed
        with the process, as by default), falling in ``steps`` equal steps, as a real
        driver gives memory back after the process is gone."""
        _non_negative(gpu, "gpu")
        if seconds is None:
            self.releases.pop(gpu, None)
        elif not seconds >= 0 or _non_negative(steps, "steps") == 0:
            raise ValueError(f"release needs seconds >= 0 and steps >= 1: {seconds!r}, {steps}")
        else:
            self.releases[gpu] = ("inf" if seconds == float("inf") else repr(float(seconds)),
                                  steps)
        self.write()

    def render(self) -> str:
        lines = ["# fake NVML state, written by tests/harness/fakenvml.py"]
        if self.init_error_code is not None:
            lines.append(f"init_error {self.init_error_code}")
        if self.hang_seconds is not None:
            lines.append(f"hang {self.hang_seconds!r}")
        if self.stuck_path is not None:
            lines.append(f"stuck {self.stuck_path}")
        if self.proc_query_error_code is not None:
            lines.append(f"proc_query_error {self.proc_query_error_code}")
        if self.missing is not None:
            lines.append(f"missing {self.missing}")
        for (gpu, getter), code in sorted(self.gpu_errors.items()):
            lines.append(f"gpu_error {gpu} {getter} {code}")
        for gpu, on in sorted(self.persistence.items()):
            lines.append(f"persistence {gpu} {'on' if on else 'off'}")
        for gpu, domain in sorted(self.pci_domains.items()):
            lines.append(f"pci_domain {gpu} {domain:x}")
        if self.driver_version is not None:
            lines.append(f"driver_version {self.driver_version}")
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
            mig = f" {p.instance[0]} {p.instance[1]}" if p.instance is not None else ""
            lines.append(f"proc {p.gpu} {p.pid} {used} {p.kind}{mig}")
        for gpu, mib in sorted(self.leaks.items()):
            lines.append(f"leak {gpu} {mib}")
        for gpu, (secs, steps) in sorted(self.releases.items()):
            lines.append(f"release {gpu} {secs} {steps}")
        lines += [f"died {pid} {at:.6f}" for pid, at in sorted(self.died.items())]
        for gpu, devices in sorted(self.mig.items()):
            lines.append(f"mig {gpu} {devices}")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """Atomically rewrite the state file (temp file + rename)."""
        self._absorb_library_changes()
        fd, tmp = tempfile.mkstemp(prefix=".fakenvml.", suffix=".tmp", dir=self.directory)
        try:
            rendered = self.render()
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(rendered)
            os.replace(tmp, self.state_path)
            self.absorbed = len(rendered)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
