"""The sections of a run's report as typed records: each says itself as the report's plain
values (`as_dict`, keys in their fixed order) only where a file, JSON, the journal or metrics
text is written."""

from __future__ import annotations

from dataclasses import dataclass

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


Sources = dict[str, Source]  # source (host, nvml, probe, freeze) -> how far it got


def sources_dict(sources: Sources) -> dict[str, Plain]:
    return {name: str(s) for name, s in sources.items()}

