"""The systemd units a container's GPU holders run in, grouped for a unit stop (UnitInfo):
asked by proxmox/guestunits.py only, which a run imports when there are units to stop or
holders to annotate, so a run with nothing to stop makes no such record (each costs every
hook run its import). The unit names themselves are core/units.py's."""

from __future__ import annotations

from dataclasses import dataclass

from pveclean.core.units import refusal, unit_cgroup

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.records import Holder


@dataclass
class UnitInfo:
    """A systemd unit inside a container that runs GPU holders."""

    unit: str
    cgroup: str | None  # the unit's own cgroup path on the host
    pids: list[int]
    refused: str | None = None


def units_of(holders: list[Holder], init_unit: str | None) -> dict[str, UnitInfo]:
    """The units the holders run in, who runs in each, and why a unit is never stopped."""
    found: dict[str, UnitInfo] = {}
    for h in holders:
        if not h.unit:
            continue
        info = found.setdefault(h.unit, UnitInfo(h.unit, unit_cgroup(h.cgroup or "", h.unit),
                                                 [], refusal(h.unit, init_unit)))
        info.pids.append(h.host_pid)
        if h.protected and info.refused is None:
            info.refused = f"it runs a protected holder (PID {h.host_pid}: {h.protected})"
    return found
