"""The sections of a run's report as typed records: each says itself as the report's plain
values (`as_dict`, keys in their fixed order) only where a file, JSON, the journal or metrics
text is written."""

from __future__ import annotations

from dataclasses import dataclass, field

from pveclean.core.records import GpuStatus, Source

Plain = object  # a value of the report's plain form: str, int, float, bool, None, a list or dict

MORE = "…"


def more_line(count: int) -> str:
    """The entry that ends a list cut at its share of the report (core/bounds.py)."""
    return f"{MORE} {count} more not listed"


@dataclass(frozen=True)
class GpuRow:
    """One GPU's memory before and after the run; a figure NVML could not give is None, and
    a GPU it could not read (before or after) has its `status` and `reason`."""

    index: int
    minor: int | None
    uuid: str
    name: str
    total_mib: int | None
    reserved_mib: int | None
    used_before_mib: int | None
    used_after_mib: int | None
    freed_mib: int | None
    status: GpuStatus | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Plain]:
        d: dict[str, Plain] = {
            "index": self.index, "minor": self.minor, "uuid": self.uuid, "name": self.name,
            "total_mib": self.total_mib, "reserved_mib": self.reserved_mib,
            "used_before_mib": self.used_before_mib, "used_after_mib": self.used_after_mib,
            "freed_mib": self.freed_mib}
        if self.status is not None:
            d["status"] = str(self.status)
            d["reason"] = self.reason
        return d


@dataclass(frozen=True)
class Settings:
    """The settings a run ran with, as its report shows them."""

    grace_seconds: float
    deadline_seconds: float
    config: str | None

    def as_dict(self) -> dict[str, Plain]:
        return {"grace_seconds": self.grace_seconds, "deadline_seconds": self.deadline_seconds,
                "config": self.config}


@dataclass(frozen=True)
class Leak:
    """GPU memory no live process accounts for (a post-stop's)."""

    index: int
    uuid: str
    unaccounted_mib: int
    hint: str

    def as_dict(self) -> dict[str, Plain]:
        return {"index": self.index, "uuid": self.uuid, "unaccounted_mib": self.unaccounted_mib,
                "hint": self.hint}


@dataclass(frozen=True)
class PreStopBrief:
    """What the last pre-stop report of a stop said, in a post-stop's report."""

    start: str | None
    verdict: str | None
    freed_mib: int | None

    def as_dict(self) -> dict[str, Plain]:
        return {"start": self.start, "verdict": self.verdict, "freed_mib": self.freed_mib}


@dataclass(frozen=True)
class UnitStop:
    """What --stop-units did with one unit: `action` None until it is decided."""

    unit: str
    holders: list[int]
    action: str | None = None
    detail: str | None = None
    processes_left: int | None = None
    looked: bool = False  # its cgroup was counted after `systemctl stop` (processes_left)
    holders_more: int = 0  # PIDs past the report's share (core/bounds.py)

    def as_dict(self) -> dict[str, Plain]:
        holders: list[Plain] = list(self.holders)
        if self.holders_more:
            holders.append(more_line(self.holders_more))
        d: dict[str, Plain] = {"unit": self.unit, "holders": holders}
        if self.looked:
            d["processes_left"] = self.processes_left
        if self.action is not None:
            d["action"] = self.action
            d["detail"] = self.detail
        return d


@dataclass(frozen=True)
class UnitStops:
    """What --stop-units did: per unit, the command it ran (or would run), a note when it
    stopped none, and `systemctl`'s exit when it ran (None: it timed out)."""

    units: list[UnitStop] = field(default_factory=list)
    command: str | None = None
    note: str | None = None
    ran: bool = False
    exit: int | None = None
    units_more: int = 0  # units past the report's share (core/bounds.py)

    def stopped(self) -> set[str]:
        return {u.unit for u in self.units if u.action == "stopped"}

    def as_dict(self) -> dict[str, Plain]:
        units: list[Plain] = [u.as_dict() for u in self.units]
        if self.units_more:
            units.append(more_line(self.units_more))
        d: dict[str, Plain] = {"units": units, "command": self.command, "note": self.note}
        if self.ran:
            d["exit"] = self.exit
        return d


@dataclass(frozen=True)
class NotListed:
    """The holders past a report's caps (core/bounds.py), summarized."""

    count: int
    outcomes: dict[str, int]
    host_pids: str  # as ranges: 1000-1299, 1400
    names: dict[str, int]  # the most frequent, and how many have each
    gpu_memory_mib: dict[int, int]
    why: str

    def as_dict(self) -> dict[str, Plain]:
        return {"count": self.count, "outcomes": dict(self.outcomes),
                "host_pids": self.host_pids, "names": dict(self.names),
                "gpu_memory_mib": dict(self.gpu_memory_mib), "why": self.why}


Sources = dict[str, Source]  # source (host, nvml, probe, freeze) -> how far it got


def sources_dict(sources: Sources) -> dict[str, Plain]:
    return {name: str(s) for name, s in sources.items()}

