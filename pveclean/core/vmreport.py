"""The VM hook's report (kind: vm): what a VM's pre-start found and did about the holders of
its GPUs, or what its post-stop gave back. `as_dict()` is the report file's document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pveclean.core.report import iso
from pveclean.core.vmguard import Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Moved(Protocol):
        """A GPU's IOMMU group handed to vfio-pci (host/pcibind.Handoff)."""

        def as_dict(self) -> dict[str, object]: ...

Json = dict[str, object]


class VmVerdict(StrEnum):
    CLEAR = "clear"  # nothing held the VM's GPUs
    STOPPED = "stopped"  # the containers' holders were stopped, the GPUs verified free
    REFUSED = "refused"  # a holder the policy may not stop: the start refused
    RESIDUAL = "residual"  # stopped, yet something still holds a GPU: the start refused
    GIVEN_BACK = "given-back"  # post-stop: the GPUs handed back to their drivers
    GIVE_BACK_FAILED = "give-back failed"  # post-stop: one could not be (its record kept)
    PENDING = ""  # not decided yet


@dataclass(frozen=True)
class CtStop:
    """One container's holders stopped for the VM: its run's verdict and report file."""

    verdict: str
    report: str | None

    def as_dict(self) -> Json:
        return {"verdict": self.verdict, "report": self.report}


@dataclass(frozen=True)
class VmReport:
    """The report of a VM's hook phase (kind: vm)."""

    vmid: int
    phase: str  # pre-start, post-stop
    host: str
    started: float  # Unix time: the report's `time` and its file name's (set at the end)
    policy: str
    verdict: VmVerdict = VmVerdict.PENDING
    plan: Plan | None = None  # pre-start's
    stopped: Mapping[int, CtStop] = field(default_factory=dict)  # pre-start's, by container
    rebind: Mapping[str, Moved | str] | None = None  # address -> what moved, or why not
    given_back: Mapping[str, list[str]] | None = None  # post-stop's: address -> failures

    def with_stop(self, ct: int, stop: CtStop) -> VmReport:
        return replace(self, stopped={**self.stopped, ct: stop})

    def with_rebind(self, rebind: Mapping[str, Moved | str]) -> VmReport:
        return replace(self, rebind=dict(rebind))

    def finished(self, verdict: VmVerdict, at: float) -> VmReport:
        return replace(self, verdict=verdict, started=at)

    def as_dict(self) -> Json:
        d: Json = {"pveclean_report": 1, "kind": "vm", "vmid": self.vmid, "phase": self.phase,
                   "verdict": str(self.verdict), "host": self.host, "time": iso(self.started),
                   "policy": self.policy}
        if self.plan is not None:
            d["plan"] = self.plan.as_dict()
            d["containers"] = {str(ct): s.as_dict() for ct, s in self.stopped.items()}
        if self.rebind is not None:
            d["rebind"] = {a: {"error": m} if isinstance(m, str) else m.as_dict()
                           for a, m in self.rebind.items()}
        if self.given_back is not None:
            d["given_back"] = {a: failed or "ok" for a, failed in self.given_back.items()}
        return d
