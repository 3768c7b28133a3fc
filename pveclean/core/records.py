"""Plain data passed between discover -> plan -> stop -> verify -> report."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from pveclean.core.cgpaths import in_tree as in_tree  # the one cgroup-path test
from pveclean.core.verdicts import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

Clock = Callable[[], float]  # seconds on a clock that never goes back (time.monotonic)


class Deadline:
    """One bound for a whole run, on the clock it is given (the host passes time.monotonic:
    see host/clock.start_deadline). The run's one clock: every wait and read is cut to it,
    and the time it keeps back at the end (`reserve`, for the report and its last NVML
    query) is handed out here, never computed by a caller."""

    def __init__(self, seconds: float, clock: Clock, reserve: float = 0.0) -> None:
        self.clock = clock
        self.start = clock()
        self.end = self.start + seconds
        self.reserve = reserve

    def keeping(self, reserve: float) -> Deadline:
        """The same deadline (its start and end), keeping `reserve` s back at its end."""
        kept = copy.copy(self)
        kept.reserve = reserve
        return kept

    @property
    def work_end(self) -> float:
        """When the run's work (discovery, stops, verification) ends: `reserve` before end."""
        return self.end - self.reserve

    def work_left(self) -> float:
        return max(0.0, self.work_end - self.clock())

    def remaining(self) -> float:
        return max(0.0, self.end - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.clock() >= self.end

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
    # only these GPUs (NVML indices; `devices` then names only their /dev/nvidiaN): the
    # hand-off of a GPU to a VM stops its holders, not the container's others
    gpu_indices: frozenset[int] | None = None


@dataclass
class HostView:
    """One scan of a container's cgroup tree from the host: its holders and processes."""

    holders: dict[int, Holder]
    statuses: dict[int, ProcStatus]
    tree: dict[int, str]
    init_pid: int | None
    # host PID -> why part of what it holds could not be judged (an fd table or maps past
    # its cap, an fd whose stat failed, an io_uring ring whose files were not listed)
    unjudged: dict[int, list[str]] = field(default_factory=dict)
    # holder's host PID -> the device numbers of the GPU nodes it holds (its `devices`)
    rdevs: dict[int, frozenset[int]] = field(default_factory=dict)

    def unjudged_problems(self, most: int = 20) -> list[str]:
        """One problem per process that could not be judged whole (any rules out `clean`),
        at most `most` of them and a line that counts the rest."""
        out = [f"PID {pid}: {'; '.join(why[:3])}{' ...' if len(why) > 3 else ''}"
               for pid, why in sorted(self.unjudged.items())[:most]]
        if len(self.unjudged) > most:
            out.append(f"{len(self.unjudged) - most} more processes could not be judged "
                       "whole (fds, io_uring files or mappings not judged)")
        return out


@dataclass(frozen=True)
class GpuDevices:
    """The device numbers that count as GPU devices on this host."""

    rdevs: dict[int, str]  # st_rdev -> host path
    majors: frozenset[int]  # whole majors (from /proc/devices names nvidia*)

    def matches(self, rdev: int) -> bool:
        return rdev in self.rdevs or (rdev >> 8 & 0xFFF) in self.majors

    def __bool__(self) -> bool:
        return bool(self.rdevs or self.majors)


@dataclass(frozen=True)
class ProcIdentity:
    """What makes a PID the same process: the PID and its start time in clock ticks."""

    pid: int
    starttime: int


class DeviceHow(StrEnum):
    """How a process holds a GPU node, as the kernel told it."""

    FD = "fd"  # an open fd (/proc/PID/fd)
    MMAP = "mmap"  # a mapping (/proc/PID/maps)
    URING = "io_uring fixed file"  # a file registered with an io_uring ring
    NAMED = "named"  # a path without its device number: the probe's, an older report's


LEAK_SLACK_MIB = 64  # allocations NVML shows without a process: allocator slack, contexts


def iso(t: float) -> str:
    """2026-12-03T06:53:12.253+00:00: a report's start, a map's time."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


MORE = "…"  # what a cut text or list ends in (see core/bounds.py)


@dataclass(frozen=True)
class DeviceUse:
    """One GPU node a process holds: its path (None: the fd's link could not be read, the fd
    number names it), its device number, and how it is held. str() is the report's label:
    "/dev/nvidia0 (195:0)", "... (mmap 195:0)", "... (io_uring fixed file, 195:0)"."""

    path: str | None
    major: int | None = None
    minor: int | None = None
    how: DeviceHow = DeviceHow.NAMED
    fd: str | None = None

    @classmethod
    def named(cls, path: str) -> DeviceUse:
        return cls(path)

    @property
    def name(self) -> str:
        return self.path if self.path is not None else f"fd {self.fd}"

    @property
    def number(self) -> tuple[int, int] | None:
        """(major, minor) where the label shows "M:m" at its end as an fd's or a mapping's."""
        if self.major is None or self.minor is None or self.how is DeviceHow.URING:
            return None
        return self.major, self.minor

    @property
    def word(self) -> str:
        """Its path's first word, as the tables show it."""
        return self.path.split(" ", 1)[0] if self.path is not None else "fd"

    @property
    def short(self) -> str:
        """As the container table shows it: NVIDIA's by what follows /dev/nvidia (`0`, `ctl`,
        `uvm`, `caps/nvidia-cap1`), any other path's first word whole."""
        word = self.word
        rest = word.removeprefix("/dev/nvidia")
        return word if rest == word or not rest else rest.lstrip("-")

    def __str__(self) -> str:
        if self.major is None or self.minor is None or self.how is DeviceHow.NAMED:
            return self.name
        number = f"{self.major}:{self.minor}"
        if self.how is DeviceHow.MMAP:
            return f"{self.name} (mmap {number})"
        if self.how is DeviceHow.URING:
            return f"{self.name} (io_uring fixed file, {number})"
        return f"{self.name} ({number})"


def device_labels(devices: Iterable[DeviceUse], more: int = 0) -> list[str]:
    """The report's `devices`: each label, then "…+N more" for those not listed."""
    return [*map(str, devices), *([f"{MORE}+{more} more"] if more else [])]


def more_column(more: int) -> list[str]:
    """A table's word for the device paths not listed: "…+N"."""
    return [f"{MORE}+{more}"] if more else []


@dataclass
class Holder:
    """A process of the container that holds a GPU node or GPU memory, and what was done to it."""

    host_pid: int
    starttime: int
    ct_pid: int | None
    name: str
    exe: str | None
    argv: tuple[str, ...]  # /proc/PID/cmdline's arguments, exactly (the report's `cmdline`)
    uid: int
    user: str
    state: str
    ppid: int
    cgroup: str
    devices: list[DeviceUse] = field(default_factory=list)
    devices_more: int = 0  # device paths not listed (the scan's or a report's cap)
    gpu_memory_mib: dict[int, int | None] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    protected: str | None = None  # reason this one is never signalled
    outcome: Outcome | None = None
    signals: list[Sent] = field(default_factory=list)
    wchan: str | None = None
    respawned_by: str | None = None
    round: int = 0
    unit: str | None = None  # systemd unit in its container (from the cgroup path; untrusted)
    frozen: bool = False  # its cgroup was frozen when it was last seen (a survivor's)

    @property
    def shown_state(self) -> str:
        """Its state as a report shows it: `D`, or `D (frozen)`."""
        return f"{self.state} (frozen)" if self.frozen else self.state

    def note(self, text: str) -> None:
        """Record in its signal record why it was not signalled (or not given a grace)."""
        self.signals.append(Sent(note=text))

    @property
    def identity(self) -> ProcIdentity:
        return ProcIdentity(self.host_pid, self.starttime)

    def add_source(self, source: str) -> None:
        if source not in self.sources:
            self.sources.append(source)

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "host_pid": self.host_pid,
            "ct_pid": self.ct_pid,
            "name": self.name,
            "exe": self.exe,
            "cmdline": list(self.argv),
            "user": self.user,
            "state": self.shown_state,
            "ppid": self.ppid,
            "cgroup": self.cgroup,
            "unit": self.unit,
            "devices": device_labels(self.devices, self.devices_more),
            "gpu_memory_mib": {int(k): v for k, v in sorted(self.gpu_memory_mib.items())},
            "sources": self.sources,
            "outcome": str(self.outcome) if self.outcome is not None else None,
            "signals": [str(s) for s in self.signals],
        }
        if self.protected:
            d["protected"] = self.protected
        if self.wchan:
            d["wchan"] = self.wchan
        if self.respawned_by:
            d["respawned_by"] = self.respawned_by
        if self.round:
            d["round"] = self.round
        return d


class GpuStatus(StrEnum):
    OK = "ok"
    LOST = "lost"  # fallen off the bus: GPU_IS_LOST, Xid 79
    UNAVAILABLE = "unavailable"  # another NVML error


class SourceState(StrEnum):
    """How far one source of a run (host view, NVML, probe, freezer) got."""

    OK = "ok"
    PENDING = "pending"  # started, its answer not merged yet (the probe)
    PARTIAL = "partial"  # some of its answers came
    FAILED = "failed"
    UNAVAILABLE = "unavailable"
    DISABLED = "disabled"
    NOT_RUN = "not run"  # not asked, on purpose (a dry run, a stopped container)
    LATE = "late"  # asked, its answer not used
    DID_NOT_FINISH = "did not finish"


@dataclass(frozen=True)
class Source:
    """One source's state, and the line the report shows for it when it says more."""

    state: SourceState
    text: str | None = None

    def __str__(self) -> str:
        return self.text if self.text is not None else str(self.state)

    @property
    def ok(self) -> bool:
        return self.state is SourceState.OK


class Sig(StrEnum):
    TERM = "SIGTERM"
    KILL = "SIGKILL"


@dataclass(frozen=True)
class Sent:
    """One entry of a holder's signal record: a signal sent `at` s after its stop began (and
    the error that failed it), or a note saying why none was sent."""

    signal: Sig | None = None
    at: float | None = None
    error: str | None = None
    note: str | None = None

    def __str__(self) -> str:
        if self.signal is None:
            return self.note or ""
        text = f"{self.signal} +{self.at or 0.0:.3f}s"
        return f"{text} failed: {self.error}" if self.error is not None else text


@dataclass
class GpuMemory:
    """One GPU's memory as NVML reads it (or why it could not)."""

    index: int
    uuid: str
    name: str
    total_mib: int
    reserved_mib: int | None
    used_mib: int
    minor: int | None = None  # N of /dev/nvidiaN
    # the figures of a GPU that is not ok are not NVML's, and `reason` says why
    status: GpuStatus = GpuStatus.OK
    reason: str | None = None
    unread: tuple[str, ...] = ()  # the getters that failed (handle, memory, name, uuid, minor)

    @property
    def ok(self) -> bool:
        return self.status == GpuStatus.OK

    @property
    def figures_read(self) -> bool:
        """Whether total and used MiB are NVML's: a GPU that is ok, or one whose failed
        getters (nvitop's NA) were others than its handle and memory. Never a verdict: a GPU
        that is not ok stays not judged; its figures are only shown."""
        return self.ok or (bool(self.unread) and not {"handle", "memory"} & set(self.unread))


GpuFault = tuple[GpuStatus, str]  # why NVML could not answer for one GPU: (status, reason)


@dataclass(frozen=True)
class NvmlProcesses:
    """NVML's answer to "who has memory on the GPUs": host PID -> {GPU index: MiB, None where
    NVML cannot tell (nvitop's NA)}, each GPU asked on its own; `faults`: GPU index -> why
    its process list could not be given (that GPU is not judged, the others are). A query
    that gave no answer at all is None in its place, its reason said by who asked."""

    by_pid: Mapping[int, Mapping[int, int | None]] = field(default_factory=dict)
    faults: Mapping[int, GpuFault] = field(default_factory=dict)


@dataclass(frozen=True)
class OtherUser:
    """A GPU user outside the container: named in the report, never signalled."""

    host_pid: int
    name: str | None
    cgroup: str | None
    gpu_memory_mib: dict[int, int | None]

    def as_dict(self) -> dict[str, object]:
        return {"host_pid": self.host_pid, "name": self.name, "cgroup": self.cgroup,
                "gpu_memory_mib": {int(k): v for k, v in self.gpu_memory_mib.items()}}


@dataclass
class Discovery:
    """The result of one discovery pass over one container."""

    holders: list[Holder]
    running: bool
    init_pid: int | None
    tree_pids: int
    sources: dict[str, Source]  # source (host, nvml, probe, freeze) -> how far it got
    warnings: list[str] = field(default_factory=list)
    other_holders: list[OtherUser] = field(default_factory=list)
    # Why the run cannot vouch for the whole tree: PIDs whose /proc reads hung, a scan that
    # did not finish. Any entry rules out a `clean` verdict.
    problems: list[str] = field(default_factory=list)
    probe: Any = None  # the in-namespace probe, still running (merged when it arrives)
    scanned: bool = True  # False: the host scan did not finish; the holders are unknown
    view: HostView | None = None  # the HostView of the first scan (maps probe PIDs to host PIDs)




@dataclass(frozen=True)
class ProcStatus:
    """The fields of /proc/PID/status and stat a run identifies a process by."""

    pid: int
    name: str
    state: str
    ppid: int
    uid: int
    nspid: tuple[int, ...]
    starttime: int
    refused: str | None = None  # why its status identifies nothing (not as the kernel writes)
