"""The sections a phase adds to a run's report, beside those every report has
(core/reportparts.py): post-stop's leaks and its brief of the pre-stop run, what --stop-units
did, and the holders past a report's caps. Their own module, imported where they are made, so
that a run that adds none does not define them at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from pveclean.core.reportparts import Plain, more_line


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
