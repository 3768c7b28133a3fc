"""Plain data passed between discover -> plan -> stop -> verify -> report."""

from __future__ import annotations

from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Exit codes, documented in the README and `pveclean --help`.
EXIT_OK = 0  # clean, nothing to do, dry run
EXIT_RESIDUAL = 1  # holders or their GPU memory remain (residual, leaked)
EXIT_USAGE = 2  # bad arguments or config
EXIT_ACCESS = 3  # container does not exist, pct or cgroup access failed
EXIT_REPORT = 4  # the cleanup ran but its report could not be written
EXIT_BUSY = 5  # another run holds this container's lock
# `pveclean hook CT pre-start` only: a deliberate refusal to start (pre_start_policy: refuse
# with holders left, or a chained hookscript that failed). The shim fails the start on this
# code alone; any other status (a crash, a missing interpreter) is a warning and exit 0.
# 75 is EX_TEMPFAIL in sysexits.h; nothing else in pveclean uses it.
EXIT_REFUSE = 75

VERDICT_EXIT = {
    "clean": EXIT_OK,
    "nothing-to-do": EXIT_OK,
    "dry-run": EXIT_OK,
    "residual": EXIT_RESIDUAL,
    "leaked": EXIT_RESIDUAL,
    "error": EXIT_ACCESS,
    "busy": EXIT_BUSY,
}


# The PATH Proxmox runs hooks and `pct exec` under (and pct's own lookup of a bare command).
HOOK_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"


class PvecleanError(Exception):
    """An error with a one-line message for the admin and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ACCESS) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


@dataclass
class Holder:
    host_pid: int
    starttime: int
    ct_pid: int | None
    name: str
    exe: str | None
    cmdline: str
    uid: int
    user: str
    state: str
    ppid: int
    cgroup: str
    devices: list[str] = field(default_factory=list)
    gpu_memory_mib: dict[int, int | None] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    protected: str | None = None  # reason this one is never signalled
    outcome: str | None = None
    signals: list[str] = field(default_factory=list)
    wchan: str | None = None
    respawned_by: str | None = None
    round: int = 0
    unit: str | None = None  # systemd unit in its container (from the cgroup path; untrusted)

    @property
    def identity(self) -> ProcIdentity:
        return ProcIdentity(self.host_pid, self.starttime)

    def add_source(self, source: str) -> None:
        if source not in self.sources:
            self.sources.append(source)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "host_pid": self.host_pid,
            "ct_pid": self.ct_pid,
            "name": self.name,
            "exe": self.exe,
            "cmdline": self.cmdline,
            "user": self.user,
            "state": self.state,
            "ppid": self.ppid,
            "cgroup": self.cgroup,
            "unit": self.unit,
            "devices": self.devices,
            "gpu_memory_mib": {int(k): v for k, v in sorted(self.gpu_memory_mib.items())},
            "sources": self.sources,
            "outcome": self.outcome,
            "signals": self.signals,
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


@dataclass
class GpuMemory:
    index: int
    uuid: str
    name: str
    total_mib: int
    reserved_mib: int | None
    used_mib: int
    minor: int | None = None  # N of /dev/nvidiaN


@dataclass
class Discovery:
    """The result of one discovery pass over one container."""

    holders: list[Holder]
    running: bool
    init_pid: int | None
    tree_pids: int
    sources: dict[str, str]  # source -> "ok" or why it did not run
    warnings: list[str] = field(default_factory=list)
    other_holders: list[dict[str, Any]] = field(default_factory=list)
    # Why the run cannot vouch for the whole tree: PIDs whose /proc reads hung, a scan that
    # did not finish. Any entry rules out a `clean` verdict.
    problems: list[str] = field(default_factory=list)
    probe: Any = None  # the in-namespace probe, still running (merged when it arrives)
    scanned: bool = True  # False: the host scan did not finish; the holders are unknown
    view: Any = None  # discover.HostView of the first scan (maps probe PIDs to host PIDs)
